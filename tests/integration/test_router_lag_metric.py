"""The router's cdc_router_consumer_lag on the real stack (reread 55-r F-1): Debezium's
exactly-once source writes the raw topic in transactions, each ending with a commit marker
that no record holds; once the router has routed and committed everything, the lag of its
partition reads 0, not the 1 a count from the committed offset gives (which
CdcRouterConsumerStuck, lag > 0 with no commit for a minute, took for a stuck router)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.pipeline import pipeline
from tests.integration.support import StackEndpoints, free_port, scrape

pytestmark = pytest.mark.integration


def _lag(port: int, topic: str) -> float | None:
    """The gauge of raw partition 0, None while the router does not serve or has none."""
    for line in (scrape(port) or "").splitlines():
        if line.startswith("cdc_router_consumer_lag{") and f'topic="{topic}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_an_idle_partition_of_a_transactional_raw_topic_has_no_lag(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, partitions=1,
                  connector={"exactly.once.support": "required"}) as pipe:
        port = free_port()
        pipe.start_router("a", "--metrics-port", str(port), wait=True)
        ids = pipe.insert([("Order", f"o-{n}", "OrderPlaced", {"n": n}) for n in range(5)],
                          per_transaction=1)  # five transactions: five commit markers
        assert len(pipe.read(pipe.orders_topic, len(ids))) == len(ids)
        # Delivered: the router commits the batch and reads on to the high watermark.
        seen: list[float | None] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            seen.append(_lag(port, pipe.raw_topic))
            if seen[-1] == 0 and seen[-3:] == [0, 0, 0]:
                break
            time.sleep(1)
        assert seen[-3:] == [0, 0, 0], (seen, pipe.router_log()[-2000:])
