"""`cdc-router status` on the real stack: a healthy pipeline exits 0 and shows every part; a
paused connector makes it exit non-zero with the reason on one line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.pipeline import REPO, Pipeline, pipeline
from tests.integration.support import StackEndpoints

pytestmark = pytest.mark.integration

# Deeper than the router's JSON depth limit (MAX_JSON_DEPTH): this row is dead-lettered.
_POISON = "[" * 3000 + "]" * 3000


def _status(pipe: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    connector = pipe.name.replace("_", "-")
    return subprocess.run(
        [sys.executable, "-m", "cdc_router", "status", "-c", str(pipe.config_path),
         "--connector", connector, "--connect-url", pipe.stack.connect_url,
         "--dsn", pipe.stack.postgres_dsn, "--bootstrap-servers", pipe.stack.bootstrap_servers,
         *args], capture_output=True, text=True, cwd=REPO, check=False, timeout=120)


def _json_status(pipe: Pipeline) -> tuple[int, dict[str, Any]]:
    done = _status(pipe, "-o", "json")
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def routed(stack: StackEndpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """A pipeline whose router has delivered 5 events and dead-lettered one."""
    with pipeline(stack, tmp_path_factory.mktemp("status"), partitions=2) as pipe:
        pipe.start_router(wait=True)
        pipe.insert([("Order", f"o-{i}", "OrderPaid", {"n": i}) for i in range(5)])
        pipe.insert([("Order", "o-poison", "OrderPaid", _POISON)])
        assert len(pipe.read(pipe.orders_topic, 5, timeout_s=120)) == 5
        assert len(pipe.read(pipe.dlq_topic, 1, timeout_s=60)) == 1, pipe.router_log()[-3000:]
        yield pipe


def test_a_healthy_pipeline_exits_0_and_shows_every_part(routed: Pipeline) -> None:
    pipe = routed
    deadline = time.monotonic() + 60
    while True:  # the router's last commit and Connect's offsets may trail the records
        code, report = _json_status(pipe)
        if code == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert code == 0 and report["status"] == "ok", report["problems"]
    assert report["problems"] == []
    (slot,) = report["wal"]["slots"]
    assert slot["name"] == pipe.name and slot["exists"] and slot["active"]
    assert slot["wal_status"] in ("reserved", "extended")
    assert slot["retained_wal_bytes"] >= 0 and slot["flush_lag_bytes"] >= 0
    assert report["wal"]["max_slot_wal_keep_size_bytes"] is not None
    assert report["publication"] == {"error": None, "name": pipe.name, "exists": True,
                                     "tables": [f"public.{pipe.name}"],
                                     "operations": ["insert"]}
    outbox = report["outbox"]
    assert outbox["table"] == f"public.{pipe.name}" and outbox["rows"] == 6
    assert outbox["oldest_age_s"] >= 0 and outbox["size_bytes"] > 0
    connector = report["connector"]
    assert connector["state"] == "RUNNING" and [t["state"] for t in connector["tasks"]] == [
        "RUNNING"]
    router = report["router"]
    assert router["group"] == pipe.name and router["lag"] == 0
    (partition,) = router["partitions"]
    assert partition["topic"] == pipe.raw_topic and partition["committed"] >= 6
    # The commit stamp went through send_offsets_to_transaction into the group's offsets.
    assert partition["last_commit_age_s"] is not None and partition["last_commit_age_s"] < 300
    (member,) = router["members"]
    assert member["instance_id"] == f"{pipe.name}-a"
    assert member["partitions"] == [f"{pipe.raw_topic}[0]"]
    letters = report["dead_letters"]
    assert letters["topic"] == pipe.dlq_topic and letters["count"] == 1 and letters["count_exact"]
    assert letters["newest"]["stage"] in ("decode", "serialize")  # JSON too deep: either
    assert "deep" in letters["newest"]["reason"] and letters["newest"]["age_s"] < 600
    changelog = report["dedup_changelog"]
    assert changelog["topic"] == pipe.changelog_topic and changelog["retained_offsets"] > 0
    text = _status(pipe)
    assert text.returncode == 0 and text.stdout.rstrip().endswith("status: ok"), text.stdout


def test_a_paused_connector_exits_non_zero_and_says_why(routed: Pipeline) -> None:
    pipe = routed
    name = pipe.name.replace("_", "-")
    httpx.put(f"{pipe.stack.connect_url}/connectors/{name}/pause", timeout=30)
    try:
        deadline = time.monotonic() + 60
        while True:
            done = _status(pipe)
            if "is PAUSED" in done.stdout or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert done.returncode in (1, 2), done.stdout
        reasons = [line for line in done.stdout.splitlines() if "is PAUSED" in line]
        assert reasons == [f"warning: connector: connector {name} is PAUSED: no event is "
                           f"captured and its slot retains WAL; `cdc-router connectors resume "
                           f"{name}`"], done.stdout
    finally:
        httpx.put(f"{pipe.stack.connect_url}/connectors/{name}/resume", timeout=30)


def test_an_unreachable_connect_is_one_critical_line_not_a_traceback(routed: Pipeline) -> None:
    done = _status(routed, "--connect-url", "http://127.0.0.1:1")
    assert done.returncode == 2 and "Traceback" not in done.stdout + done.stderr
    assert "critical: connector: cannot check it: Kafka Connect unreachable at " \
           "http://127.0.0.1:1" in done.stdout
