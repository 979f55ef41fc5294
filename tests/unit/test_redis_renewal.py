"""The Redis dedup store's claim renewal thread (consumer/dedup/redis.py _Renewal), on its own:
the store's behaviour on a real redis-server is tests/integration/test_redis_store.py's."""

from __future__ import annotations

import threading
import time
from typing import Any

from cdc_router.consumer.dedup.redis import _Renewal


def test_the_renewal_thread_renews_held_claims_and_ends_when_none_is_left() -> None:
    # QA 49-h F4: a store dropped without close() kept its renewal thread (and client) for
    # ever; 50 stores, 50 threads.
    renewed: list[tuple[str, bytes]] = []

    def renew(*, keys: list[str], args: list[Any]) -> int:
        renewed.append((keys[0], args[0]))
        return 1

    renewal = _Renewal(renew, lease_ms=30)  # a round every 10 ms
    before = threading.active_count()
    with renewal.held("k", b"processing:t"):
        deadline = time.monotonic() + 10
        while len(renewed) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert renewed[:3] == [("k", b"processing:t")] * 3
        assert threading.active_count() == before + 1
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before  # no claim left: the thread ended
    with renewal.held("k2", b"processing:u"):  # the next claim starts one again
        deadline = time.monotonic() + 10
        while ("k2", b"processing:u") not in renewed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ("k2", b"processing:u") in renewed
    renewal.stop()
    assert threading.active_count() == before
