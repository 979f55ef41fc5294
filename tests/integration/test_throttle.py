"""A broker's produce or fetch quota on the router's client id is said and counted, on the real
stack (kafka/throttle.py; QA 57-a F-4: the router slowed under a produce quota and said only
"Message timed out"; fixer 58-a: a consumer_byte_rate quota stalled its fetches with no word
but librdkafka's request timeouts). The unit tests are tests/unit/test_throttle.py."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cdc_router.local.versions import KAFKA_VERSION
from tests.integration.pipeline import pipeline
from tests.integration.support import StackEndpoints, free_port, scrape, unique

pytestmark = pytest.mark.integration

# Bytes a second the quota lets the router's producer write or its consumer read: its first
# batch of EVENTS events (about 1 kB each, more as raw change events) is several times that.
BYTE_RATE = 2048
EVENTS = 30


def _configs(jar_cache: Path, bootstrap: str, client_id: str, *change: str) -> None:
    """kafka-configs.sh --alter on the quotas of `client_id` alone: never --entity-default,
    which would slow the other test worker's clients. Kafka's own tool, from the stack's jars
    (confluent-kafka 2.16's AdminClient has no alter_client_quotas)."""
    libs = jar_cache / f"kafka-{KAFKA_VERSION}" / "libs"
    java = shutil.which("java")
    if java is None or not libs.is_dir():
        pytest.fail(f"setting a client quota needs java and Kafka's jars under {libs} "
                    "(cdc-router local up puts them there)")
    # A short-lived JVM: its quickest start on a small host.
    done = subprocess.run([java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                           "-cp", f"{libs}/*", "kafka.admin.ConfigCommand",
                           "--bootstrap-server", bootstrap, "--alter", "--entity-type",
                           "clients", "--entity-name", client_id, *change],
                          capture_output=True, text=True, check=False, timeout=180)
    assert done.returncode == 0 and "Completed updating config" in done.stdout, \
        done.stdout + done.stderr


@contextmanager
def quota(jar_cache: Path, bootstrap: str, client_id: str, name: str,
          byte_rate: int) -> Iterator[None]:
    """The quota `name` (producer_byte_rate, consumer_byte_rate) at `byte_rate` on `client_id`
    while the block runs; removed at its end, whatever happened."""
    _configs(jar_cache, bootstrap, client_id, "--add-config", f"{name}={byte_rate}")
    try:
        yield
    finally:
        _configs(jar_cache, bootstrap, client_id, "--delete-config", name)


def _throttled_s(port: int, metric: str) -> float | None:
    """The router's `metric`, None while it does not serve it."""
    text = scrape(port)
    if text is None:
        return None
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(f"{metric} ")]
    return values[0] if values else None


@pytest.mark.parametrize(("name", "requests", "metric"), [
    ("producer_byte_rate", "produce", "cdc_router_produce_throttled_seconds_total"),
    ("consumer_byte_rate", "fetch", "cdc_router_fetch_throttled_seconds_total")])
def test_a_quota_on_the_routers_client_id_is_logged_and_counted(
        stack: StackEndpoints, tmp_path: Path, jar_cache: Path, name: str, requests: str,
        metric: str) -> None:
    client_id = unique("throttled").replace("_", "-")
    settings = {"kafka": {"client_id": client_id}}
    with pipeline(stack, tmp_path, partitions=1, config=settings) as pipe, \
            quota(jar_cache, stack.bootstrap_servers, client_id, name, BYTE_RATE):
        port = free_port()
        pipe.start_router("a", "--metrics-port", str(port), wait=True)
        before = _throttled_s(port, metric)
        pipe.insert([("Order", f"o-{n % 3}", "OrderPlaced", {"n": n, "pad": "x" * 800})
                     for n in range(EVENTS)])
        deadline = time.monotonic() + 120
        lines: list[str] = []
        counted = before
        while time.monotonic() < deadline:
            lines = [line for line in pipe.router_log().splitlines() if "event=throttled" in line]
            counted = _throttled_s(port, metric)
            if lines and counted:
                break
            time.sleep(0.5)
        log = pipe.router_log()
    assert before == 0.0, (before, log[-3000:])
    assert lines, f"no event=throttled line:\n{log[-3000:]}"
    assert "level=WARNING" in lines[0] and f"client_id={client_id} " in lines[0], lines[0]
    assert f"requests={requests} " in lines[0], lines[0]
    assert name in lines[0] and f"--entity-name {client_id}" in lines[0], lines
    assert counted is not None and counted > 0, (counted, log[-3000:])
