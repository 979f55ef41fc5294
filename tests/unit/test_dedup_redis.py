"""RedisDedupStore's keys (no server: the client is a stand-in; the protocol's tests run on a
real Redis in tests/integration/test_redis_store.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from cdc_router.consumer.dedup import DedupKey
from cdc_router.consumer.dedup.redis import RedisDedupStore


class Client:
    def register_script(self, script: str) -> Any:
        return None


def test_keys_keep_their_format_so_stored_marks_are_seen_after_an_upgrade() -> None:
    store = RedisDedupStore(Client())  # type: ignore[arg-type]
    assert store.key(DedupKey("fulfillment", "e1")) == "cdc-router:dedup:fulfillment:e1"


def test_a_group_with_a_colon_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    # Review 46 F8: ("billing:eu", "e1") and ("billing", "eu:e1") share one key.
    store = RedisDedupStore(Client())  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="cdc_router.consumer.dedup.redis"):
        for event_id in ("e1", "e2"):
            store.key(DedupKey("billing:eu", event_id))
        store.key(DedupKey("billing", "e3"))
    [warning] = [record.getMessage() for record in caplog.records]
    assert "event=dedup_group_ambiguous group=billing:eu" in warning
    assert "group billing's (event ids eu:...)" in warning
