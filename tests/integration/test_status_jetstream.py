"""`cdc-router status` on a real nats-server (QA 54-d F-8): a declared stream missing is a
critical line saying to run `streams apply`, a healthy stream shows its messages and limits,
and NATS down is the JetStream section's `cannot check it`, not the router's stall later."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from tests.integration.nats_server import nats_server
from tests.integration.pipeline import REPO
from tests.integration.support import StackEndpoints, status_json

pytestmark = pytest.mark.integration


def _jetstream_lines(document: dict[str, Any]) -> list[str]:
    return [f"{p['level']}: {p['message']}" for p in document["problems"]
            if p["component"] == "jetstream"]


def _publish(url: str, subject: str, count: int) -> None:
    async def publish() -> None:
        client = await nats.connect(url)
        try:
            for n in range(count):
                await client.jetstream().publish(subject, b"{}", headers={
                    "Nats-Msg-Id": f"status-{n}"})
        finally:
            await client.close()

    asyncio.run(publish())


def test_status_says_a_missing_stream_a_healthy_one_and_nats_down(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with nats_server(tmp_path / "nats") as server:
        config = tmp_path / "router.yaml"
        config.write_text(yaml.safe_dump({
            "source": {"topics": ["status-js.public.outbox"], "group_id": "status-js"},
            "routes": [{"nats": {"subject": "status.{type}"}}],
            "dead_letter": {"topic": "status-js.dlq"},
            "dedup": {"changelog_topic": "status-js.dedup"},
            "nats": {"url": server.url, "streams": [
                {"name": "STATUS", "subjects": ["status.>"], "max_msgs": 100}]}}))
        missing = status_json(stack, config)
        assert missing["status"] == "critical"
        assert missing["jetstream"]["answered"] is True
        assert [(s["name"], s["exists"]) for s in missing["jetstream"]["streams"]] == [
            ("STATUS", False)]
        [line] = _jetstream_lines(missing)
        assert line.startswith(f"critical: stream STATUS (status.>) does not exist on NATS "
                               f"at {server.url}: ") and \
            line.endswith("run `cdc-router streams apply -c <config>`")

        applied = subprocess.run([sys.executable, "-m", "cdc_router", "streams", "apply", "-c",
                                  str(config), "--yes"], capture_output=True, text=True,
                                 cwd=REPO, check=False, timeout=60)
        assert applied.returncode == 0, applied.stderr
        _publish(server.url, "status.OrderPaid", 3)
        healthy = status_json(stack, config)
        assert _jetstream_lines(healthy) == []
        (stream,) = healthy["jetstream"]["streams"]
        assert (stream["exists"], stream["messages"], stream["max_msgs"], stream["max_bytes"],
                stream["discard"], stream["changes"], stream["refused"]) == (
            True, 3, 100, -1, "old", {}, None)
        assert stream["bytes"] > 0

        server.stop()
        down = status_json(stack, config)
        assert down["status"] == "critical"
        assert (down["jetstream"]["answered"], down["jetstream"]["streams"]) == (False, [])
        [line] = _jetstream_lines(down)
        assert line.startswith(f"critical: cannot check it: cannot connect to NATS at "
                               f"{server.url} (") and line.endswith("is nats-server running?")
