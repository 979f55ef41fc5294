"""The router's own /metrics says when it reaches no Kafka broker, on the real stack (QA 58-b
F-6: Kafka stopped 73 s, and the router's exposition said nothing: its lag series went with
the assignment revoked at the session timeout, it aborted nothing, no rule could fire).

Only a Kafka that goes away under a router that had its partitions shows it: a router started
against a closed port never gets that far (its start exits 75), and a Kafka of the test's own
would cost a broker's start. So it stops the shared Kafka, by its pid file, and brings it back
(`local up`): exclusive. The unit tests are tests/unit/test_kafka_reachable.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cdc_router.local import process
from cdc_router.local.config import load_saved
from tests.integration.pipeline import REPO, Pipeline, pipeline
from tests.integration.support import StackEndpoints, free_port, scrape

pytestmark = [pytest.mark.integration, pytest.mark.exclusive]  # it stops the shared Kafka

Seen = tuple[float | None, bool]  # cdc_router_kafka_reachable; a lag series of the raw topic


def _seen(port: int, topic: str) -> Seen | None:
    """What the router's /metrics says; None while it does not answer."""
    text = scrape(port)
    if text is None:
        return None
    reachable = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith("cdc_router_kafka_reachable ")]
    lag = any(line.startswith("cdc_router_consumer_lag{") and f'topic="{topic}"' in line
              for line in text.splitlines())
    return (reachable[0] if reachable else None), lag


def _until(pipe: Pipeline, port: int, wanted: Callable[[Seen], bool], timeout_s: float,
           what: str) -> list[Seen | None]:
    """Scrape every half second until `wanted`; what was seen, in order (AssertionError with
    it and the router's log after `timeout_s`)."""
    seen: list[Seen | None] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen.append(_seen(port, pipe.raw_topic))
        if seen[-1] is not None and wanted(seen[-1]):
            return seen
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s:.0f}s; seen (reachable, lag series) "
                         f"{sorted(set(seen), key=str)}; router log:\n"
                         f"{pipe.router_log()[-3000:]}")


def test_the_router_says_it_reaches_no_broker_while_kafka_is_down_and_is_1_again_after(
        stack: StackEndpoints, tmp_path: Path) -> None:
    home = Path(os.environ.get("CDC_ROUTER_HOME", REPO / ".cdc-router")).resolve()
    local = load_saved(home)
    if local is None or local.bootstrap_servers != stack.bootstrap_servers:
        pytest.skip("needs the local stack, whose Kafka this test stops")
    with pipeline(stack, tmp_path, partitions=1) as pipe:
        port = free_port()
        pipe.start_router("a", "--metrics-port", str(port), wait=True)
        # One event routed: the partition has a position, so a lag series (an empty one has
        # none).
        pipe.insert([("Order", "o-1", "OrderPlaced", {"n": 1})])
        assert len(pipe.read(pipe.orders_topic, 1)) == 1
        _until(pipe, port, lambda seen: seen == (1.0, True), 30, "reachable with its partition")
        pid = process.read_pid(local.pid_path("kafka"))
        assert pid is not None
        process.stop(pid, str(local.home))
        stopped_at = time.monotonic()
        try:
            # QA 58-b F-6's state: the partition revoked (no lag series), and the gauge says it.
            during = _until(pipe, port, lambda seen: seen == (0.0, False), 60,
                            "Kafka stopped: reachable 0 and the partition revoked")
            down_s = time.monotonic() - stopped_at
        finally:
            subprocess.run([sys.executable, "-m", "cdc_router", "local", "up", "--home",
                            str(home)], check=True, capture_output=True, cwd=REPO)
        restarted_at = time.monotonic()
        _until(pipe, port, lambda seen: seen == (1.0, True), 90,
               "Kafka back: reachable 1 and the partition assigned again")
        up_s = time.monotonic() - restarted_at
        assert pipe.routers["a"].poll() is None, pipe.router_log()[-3000:]
    print(f"reachable 0 and revoked {down_s:.1f}s after the stop (0 before the revocation: "
          f"{(0.0, True) in during}); 1 again {up_s:.1f}s after Kafka's start")
