"""`cdc-router status` against the stack's real schema registry (QA 55-c F-1): with the
registry killed, `status` said ok while the router's next start would exit 75 in a loop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_router.local import process
from cdc_router.local.config import load_saved
from tests.integration.pipeline import REPO
from tests.integration.support import StackEndpoints, status_json

# Exclusive: it stops the shared stack's registry, which other tests' routers and consumers
# use (run alone, after the others, as test_cleanup's Postgres outage is).
pytestmark = [pytest.mark.integration, pytest.mark.exclusive]


def _registry_lines(document: dict[str, Any]) -> list[str]:
    return [f"{p['level']}: {p['message']}" for p in document["problems"]
            if p["component"] == "registry"]


def test_status_says_the_registry_answers_and_that_it_is_down(
        stack: StackEndpoints, registry_url: str, tmp_path: Path) -> None:
    home = Path(os.environ.get("CDC_ROUTER_HOME", REPO / ".cdc-router")).resolve()
    local = load_saved(home)
    if local is None or local.registry_url != registry_url:
        pytest.skip("needs the local stack, whose registry this test stops")
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({
        "source": {"topics": ["status-sr.public.outbox"], "group_id": "status-sr"},
        "routes": [{"topic": "status-sr.orders"}],
        "dead_letter": {"topic": "status-sr.dlq"},
        "dedup": {"changelog_topic": "status-sr.dedup"},
        "schema_registry": {"url": registry_url}}))
    up = status_json(stack, config)
    assert _registry_lines(up) == []
    assert up["registry"]["answered"] is True and up["registry"]["error"] is None
    assert up["registry"]["url"] == registry_url and up["registry"]["subjects"] >= 0

    pid = process.read_pid(local.pid_path("registry"))
    assert pid is not None
    process.stop(pid, str(home), sig=signal.SIGKILL)
    try:
        down = status_json(stack, config)
    finally:
        subprocess.run([sys.executable, "-m", "cdc_router", "local", "up", "--home", str(home),
                        "--with", "registry"], check=True, capture_output=True, cwd=REPO,
                       timeout=300)
    assert down["status"] == "critical"
    assert down["registry"]["answered"] is False
    [line] = _registry_lines(down)
    assert line.startswith(f"critical: cannot check it: cannot list the subjects: the schema "
                           f"registry at {registry_url} did not answer (")
    assert "the router's next start exits 75" in line
    deadline = time.monotonic() + 60
    while status_json(stack, config)["registry"]["error"] is not None:  # back with `local up`
        assert time.monotonic() < deadline, "the registry did not come back"
        time.sleep(2)
