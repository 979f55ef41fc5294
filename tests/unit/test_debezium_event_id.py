"""The router refuses an event id every idempotent consumer would refuse (QA 54-c F-7)."""

from __future__ import annotations

import pytest

from cdc_router.errors import DecodeError
from tests.unit.test_debezium import MODES, decode_mutated, row_of


@pytest.mark.parametrize("mode", MODES)
def test_an_event_id_holding_nul_is_a_decode_dead_letter(mode: str) -> None:
    # It was routed (on JetStream as `Nats-Msg-Id: abc\x00def`), and the consumers
    # dead-lettered it: "event id in header 'id' holds a NUL byte".
    with pytest.raises(DecodeError, match=r"column 'id' \(event id\) holds a NUL byte, which "
                       r"the idempotent consumer and its dedup stores refuse") as info:
        decode_mutated(f"create_jsonb.{mode}", lambda row: row_of(row).update(id="a\x00b"))
    assert info.value.event_id is None  # the id itself is the trouble: no dlq.event.id
