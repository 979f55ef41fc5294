"""RedisDedupStore's keys (no server: the client is a stand-in; the protocol's tests run on a
real Redis in tests/integration/test_redis_store.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from cdc_router.consumer.dedup import DedupKey
from cdc_router.consumer.dedup.redis import RedisDedupStore
from cdc_router.errors import ConfigError


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


@pytest.mark.parametrize(("options", "field"), [
    ({"lease_ms": "60000"}, "lease_ms"),
    ({"lease_ms": float("nan")}, "lease_ms"),
    ({"lease_ms": 0.5}, "lease_ms"),
    ({"lease_ms": 1, "ttl_ms": 1.5}, "ttl_ms"),
    ({"ttl_ms": float("inf")}, "ttl_ms"),
    ({"ttl_ms": 10}, "ttl_ms"),
    ({"ttl_ms": 10**20}, "ttl_ms"),  # reread 52-l F6: Redis refused every done mark
    ({"lease_ms": 10**17, "ttl_ms": 10**17}, "lease_ms"),  # the renewal thread raised
    ({"key_prefix": None}, "key_prefix"),
])
def test_bad_numbers_are_a_config_error_naming_the_field(options: dict[str, Any],
                                                          field: str) -> None:
    # Review 52-c F-med-5: "60000" was a TypeError traceback; a NaN lease or a 1.5 ms TTL was
    # accepted, then Redis refused every claim or done mark and the partition never moved.
    with pytest.raises(ConfigError) as raised:
        RedisDedupStore(Client(), **options)  # type: ignore[arg-type]
    assert raised.value.field == field and "\n" not in str(raised.value)


def test_a_url_instead_of_a_client_is_a_config_error_that_does_not_echo_it() -> None:
    with pytest.raises(ConfigError, match=r"field .client.*Redis\.from_url") as raised:
        RedisDedupStore("redis://:secret@cache:6379/0")  # type: ignore[arg-type]
    assert "secret" not in str(raised.value)
