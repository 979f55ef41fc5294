"""A decoder that cannot decode a topic at all stops the consumer with a config error, none of
its records dead-lettered or acknowledged (QA 66-a F-6: a JSON decoder on an Avro topic
dead-lettered 43,700 records in 50 s); a few poison records are letters as before."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cdc_router.consumer.decode_guard import HOLD_S
from cdc_router.errors import ConfigError
from tests.unit.consumer_fakes import DLQ, TOPIC, Harness, Record, dlq_headers, rec


def parse_json(raw: bytes | None) -> Any:
    return json.loads(raw or b"")


def avro(key: str) -> Record:
    """A record in the schema registry's wire format: magic byte 0, schema id 7, Avro body."""
    return (key.encode(), b"\x00\x00\x00\x00\x07\x02\xca\x9a\x01", [("id", key.encode())])


def test_a_decoder_that_fits_no_record_of_the_topic_stops_the_consumer_unacknowledged() -> None:
    h = Harness({0: [avro(f"a{i}") for i in range(80)], 1: [avro(f"b{i}") for i in range(80)]},
                decoder=parse_json)
    with pytest.raises(ConfigError) as stopped:
        h.run()
    text = str(stopped.value)
    assert text.startswith(f"IdempotentConsumer: field 'decoder': the first 100 records of "
                           f"topic {TOPIC!r} all failed to decode with the decoder parse_json "
                           "(UnicodeDecodeError: "), text
    assert "schema id 7" in text  # the reason says the format (PayloadDecoder)
    assert "none of them was dead-lettered or acknowledged; pass the decoder for this topic" \
        in text
    assert "decode_mismatch_limit=0" in text
    assert stopped.value.exit_code == 1
    assert h.producer.sent == []
    assert h.kafka.committed in ({}, {0: 0, 1: 0})  # a restart with the right decoder reads all


def test_a_limit_of_0_dead_letters_each_record_as_before() -> None:
    h = Harness({0: [avro(f"a{i}") for i in range(150)]}, decoder=parse_json,
                decode_mismatch_limit=0)
    h.run()
    assert len(h.producer.sent) == 150
    assert h.kafka.committed == {0: 150}


def test_poison_records_before_the_first_that_decodes_are_letters_in_order() -> None:
    records = [avro("bad-0"), avro("bad-1"), rec("ok-0", {"n": 0}), avro("bad-2"),
               rec("ok-1", {"n": 1})]
    h = Harness({0: records}, decoder=parse_json)
    h.run()
    assert [e.event_id for e in h.effects] == ["ok-0", "ok-1"]
    letters = [dlq_headers(sent)["dlq.source.offset"] for sent in h.producer.sent]
    assert letters == ["0", "1", "3"] and {s["topic"] for s in h.producer.sent} == {DLQ}
    assert h.kafka.committed == {0: 5}


def test_failures_of_another_kind_end_the_hold() -> None:
    # Different decoder exceptions are poison records, not a decoder that fits nothing.
    records = [avro("bad-0"), (b"bad-1", b"not json", [("id", b"bad-1")])] + \
              [avro(f"bad-{i}") for i in range(2, 120)]
    h = Harness({0: records}, decoder=parse_json)
    h.run()
    assert len(h.producer.sent) == 120
    assert h.kafka.committed == {0: 120}


def test_held_records_of_a_quiet_topic_are_letters_after_the_hold() -> None:
    h = Harness({0: [avro("bad-0"), avro("bad-1")]}, decoder=parse_json)
    start = h.clock.now
    h.kafka.on_idle = lambda: h.loop.stop() if h.clock.now - start > HOLD_S + 10 else None
    h.run()
    assert [dlq_headers(sent)["dlq.source.offset"] for sent in h.producer.sent] == ["0", "1"]
    assert h.kafka.committed == {0: 2}


def test_tombstones_are_never_held() -> None:
    h = Harness({0: [(b"t", None, [("id", b"t")])] * 120}, decoder=parse_json)
    h.run()
    assert len(h.producer.sent) == 120


def test_a_tombstone_on_a_partition_nothing_is_held_of_does_not_end_the_hold() -> None:
    # Review 67: partition 0's records held, then partition 1's tombstone (no decoder's
    # verdict) ended the hold of the whole topic, and every record became a letter again.
    h = Harness({0: [avro(f"a{i}") for i in range(80)],
                 1: [(b"t", None, [("id", b"t")])] + [avro(f"b{i}") for i in range(80)]},
                decoder=parse_json)
    with pytest.raises(ConfigError) as stopped:
        h.run()
    assert "the first 100 records of topic" in str(stopped.value)
    assert [dlq_headers(sent)["dlq.source.partition"] for sent in h.producer.sent] == ["1"]
    # Only the tombstone, lettered, is acknowledged: none of the held records.
    assert h.kafka.committed.get(0, 0) == 0 and h.kafka.committed.get(1, 0) <= 1


def test_a_tombstone_on_a_held_partition_still_ends_the_hold() -> None:
    # Its letter would commit past the records held before it: they become letters first.
    h = Harness({0: [avro("a0"), avro("a1"), (b"t", None, [("id", b"t")])]}, decoder=parse_json)
    h.run()
    assert [dlq_headers(sent)["dlq.source.offset"] for sent in h.producer.sent] == ["0", "1", "2"]
    assert h.kafka.committed == {0: 3}
