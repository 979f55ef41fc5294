"""The real stack for integration tests: reuse one named by the environment, or bring it up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_router.local.config import load_saved
from tests.integration.support import StackEndpoints

_ENV = ("CDC_ROUTER_BOOTSTRAP_SERVERS", "CDC_ROUTER_CONNECT_URL", "CDC_ROUTER_PG_DSN")
_REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cdc_router", *args], cwd=_REPO,
                          capture_output=True, text=True, check=False)


@pytest.fixture(scope="session")
def stack() -> Iterator[StackEndpoints]:
    """The stack's addresses. Stops it at the end only if this session started it."""
    if all(os.environ.get(name) for name in _ENV):
        yield StackEndpoints(*(os.environ[name] for name in _ENV))
        return
    home = Path(os.environ.get("CDC_ROUTER_HOME", _REPO / ".cdc-router")).resolve()
    before = _cli("local", "status", "--home", str(home), "-o", "json").stdout
    # Postgres, Kafka and Connect; nats-server is optional and does not count.
    was_running = all(part["state"] == "running" for part in json.loads(before or "[]")
                      if part["part"] != "nats") and bool(before)
    result = _cli("local", "up", "--home", str(home))
    if result.returncode != 0:
        pytest.fail(f"cdc-router local up failed:\n{result.stdout}\n{result.stderr}")
    config = load_saved(home)
    assert config is not None
    yield StackEndpoints(config.bootstrap_servers, config.connect_url, config.postgres_dsn)
    if not was_running and os.environ.get("CDC_ROUTER_KEEP_STACK") != "1":
        _cli("local", "down", "--home", str(home))
