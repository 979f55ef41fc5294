"""`cdc-router run`'s /readyz on the real stack: 503 until the router has joined its group, while
/healthz already answers 200 (QA 66-b: a rollout that took /healthz for readiness stopped old
pods before the new ones joined, and every aggregate waited up to 28 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import suppress
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.pipeline import REPO
from tests.integration.support import StackEndpoints, free_ports, unique

pytestmark = pytest.mark.integration


def answer(port: int, path: str) -> tuple[int, str] | None:
    """(status, body) of GET 127.0.0.1:port/path; None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return None


def wait_for(port: int, path: str, wanted: tuple[int, str], timeout_s: float) -> float:
    """Seconds until GET path answers `wanted`; fails after `timeout_s`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if answer(port, path) == wanted:
            return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"{path} on {port} never answered {wanted} in {timeout_s} s: "
                         f"last {answer(port, path)}")


def test_readyz_waits_for_the_join_while_a_stopped_member_holds_the_rebalance(
        stack: StackEndpoints, tmp_path: Path) -> None:
    name = unique("ready")
    dashed = name.replace("_", "-")
    source = f"{dashed}.public.outbox"
    topics = [source, f"{dashed}-orders", f"{dashed}-dlq", f"{dashed}-dedup"]
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, 2 if topic == source else 1, 1)
                                       for topic in topics]).values():
        future.result(timeout=30)
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({
        # A session long past a Python start on a loaded host (review 66: at 10 s the second
        # router's start could outlast the frozen member, and /readyz be 200 at once).
        "kafka": {"bootstrap_servers": stack.bootstrap_servers,
                  "consumer": {"session.timeout.ms": 45000}},
        "source": {"topics": [source], "group_id": name},
        "routes": [{"topic": f"{dashed}-orders"}],
        "dead_letter": {"topic": f"{dashed}-dlq"},
        "dedup": {"changelog_topic": f"{dashed}-dedup"}}))
    ports = free_ports(2)
    routers: list[subprocess.Popen[bytes]] = []

    def start(instance: str, port: int) -> None:
        routers.append(subprocess.Popen(
            [sys.executable, "-m", "cdc_router", "run", "-c", str(config), "--metrics-port",
             str(port), "--instance-id", instance], cwd=REPO, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL))

    try:
        start("first", ports[0])
        wait_for(ports[0], "/readyz", (200, "ready\n"), 90)
        # The first member stopped (a frozen pod): the second's join waits for its session
        # timeout (45 s), and the second is alive but not in its group meanwhile.
        os.kill(routers[0].pid, signal.SIGSTOP)
        start("second", ports[1])
        wait_for(ports[1], "/healthz", (200, "ok\n"), 90)
        assert answer(ports[1], "/readyz") == (503, "not in its group yet\n")
        waited = wait_for(ports[1], "/readyz", (200, "ready\n"), 120)
        assert waited > 3, waited  # it waited for the group, not for its own start
    finally:
        for router in routers:
            with suppress(ProcessLookupError):
                os.kill(router.pid, signal.SIGCONT)
                router.terminate()
        for router in routers:
            with suppress(subprocess.TimeoutExpired):
                router.wait(timeout=60)
        for future in admin.delete_topics(topics).values():
            with suppress(Exception):
                future.result(timeout=30)
