"""JetStream's storage full (nats-server's max_file_store reached) on a real server: the
router's aborts say their cause in the log and on /metrics, where the shipped rule
CdcRouterJetStreamFull reads it (QA 65-b F-1: `status` saw only a stall); room made, the
router goes on by itself."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import nats
import pytest
import yaml
from nats.js.api import StreamConfig

from tests.integration.nats_server import read_stream
from tests.integration.pipeline import pipeline
from tests.integration.support import StackEndpoints, free_port, scrape
from tests.integration.test_nats import _apply_streams
from tests.integration.test_nats_auth import _nats_with

pytestmark = pytest.mark.integration

# The server's whole JetStream file store, filled by a stream of the test's before the events.
MAX_FILE_STORE = 65536


def _aborted(metrics: str, cause: str) -> float:
    found = re.search(rf'^cdc_router_batches_aborted_total{{cause="{cause}"}} (\S+)$', metrics,
                      re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _fill(url: str) -> int:
    """Publish to a stream FILL of our own until the server's store refuses (err_code 10023,
    'insufficient resources'); how many it stored."""
    from nats.js.errors import ServiceUnavailableError

    async def fill() -> int:
        client = await nats.connect(url)
        try:
            js = client.jetstream()
            await js.add_stream(StreamConfig(name="FILL", subjects=["fill"]))
            for stored in range(10_000):
                try:
                    await js.publish("fill", b"f" * 500)
                except ServiceUnavailableError as full:
                    assert full.err_code == 10023, full
                    return stored
            raise AssertionError("the store never filled")
        finally:
            await client.close()

    return asyncio.run(fill())


def _purge(url: str, stream: str) -> None:
    async def purge() -> None:
        client = await nats.connect(url)
        try:
            await client.jetstream().purge_stream(stream)
        finally:
            await client.close()

    asyncio.run(purge())


def test_jetstream_storage_full_aborts_under_their_own_cause_until_there_is_room(
        stack: StackEndpoints, tmp_path: Path) -> None:
    home = tmp_path / "full-nats"
    home.mkdir()
    # A second jetstream block replaces _nats_with's (nats-server's config: the last wins).
    with _nats_with(home, f"jetstream {{ store_dir: \"{home / 'store'}\", "
                          f"max_file_store: {MAX_FILE_STORE} }}\n") as port, \
            pipeline(stack, tmp_path) as pipe:
        url = f"nats://127.0.0.1:{port}"
        prefix = pipe.name.replace("_", "-")
        config = yaml.safe_load(pipe.config_path.read_text())
        config["routes"][0] = {"match": {"aggregate_type": "Order*"},
                               "nats": {"subject": prefix + ".{type}"}}
        stream = _apply_streams(pipe.config_path, config, url, prefix)
        metrics_port = free_port()
        pipe.start_router("a", "--metrics-port", str(metrics_port), wait=True)
        assert _fill(url) > 50
        ids = pipe.insert([("Order", f"o-{i % 7}", "OrderPaid", {"seq": i}) for i in range(50)])
        deadline = time.monotonic() + 120
        while "cause=jetstream_storage_full" not in pipe.router_log() \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        metrics = scrape(metrics_port) or ""
        full_log = pipe.router_log()
        _purge(url, "FILL")  # room: the held batch goes through without a restart
        deadline = time.monotonic() + 120
        while "event=batch_committed_after_aborts" not in pipe.router_log() \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        after_log = pipe.router_log()
        stored = [message.headers.get("Nats-Msg-Id") for message in read_stream(url, stream)]
        letters = pipe.read_all(pipe.dlq_topic, settle_s=0)
    assert "event=batch_aborted cause=jetstream_storage_full consecutive=1" in full_log, \
        full_log[-3000:]
    assert "JetStream's storage is full" in full_log
    assert _aborted(metrics, "jetstream_storage_full") >= 1, metrics
    assert _aborted(metrics, "cluster") == 0, metrics
    assert "event=batch_committed_after_aborts" in after_log, after_log[-3000:]
    assert sorted(stored) == sorted(ids), "each event stored once, once there was room"
    assert letters == [], "storage full is no record's fault: nothing is dead-lettered"
