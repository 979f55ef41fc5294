"""The real stack for integration tests: reuse one named by the environment, or bring it up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_router.cli.local import default_jar_cache
from cdc_router.local import stack as local_stack
from cdc_router.local.config import OPTIONAL_PARTS, load_saved
from tests.integration.support import StackEndpoints

_ENV = ("CDC_ROUTER_BOOTSTRAP_SERVERS", "CDC_ROUTER_CONNECT_URL", "CDC_ROUTER_PG_DSN")
_REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cdc_router", *args], cwd=_REPO,
                          capture_output=True, text=True, check=False)


def _home() -> Path:
    return Path(os.environ.get("CDC_ROUTER_HOME", _REPO / ".cdc-router")).resolve()


@pytest.fixture(autouse=True)
def _own_nats_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cdc-router local env` of a stack run --with nats exports its server as an override of
    nats.url (CDC_ROUTER__NATS__URL): the JetStream tests run nats-servers of their own, which
    the commands they start (`streams apply`, `run`) would then never reach (session 61: the
    stream was created on the stack's server, and the test's read 'stream not found')."""
    monkeypatch.delenv("CDC_ROUTER__NATS__URL", raising=False)


@pytest.fixture(scope="session")
def stack() -> Iterator[StackEndpoints]:
    """The stack's addresses. Stops it at the end only if this session started it."""
    if all(os.environ.get(name) for name in _ENV):
        yield StackEndpoints(*(os.environ[name] for name in _ENV))
        return
    home = _home()
    before = json.loads(_cli("local", "status", "--home", str(home), "-o", "json").stdout or "[]")
    running = {part["part"] for part in before if part["state"] == "running"}
    # Postgres, Kafka and Connect; the optional parts do not count (a registry this session
    # adds to a running stack is left running with it).
    was_running = bool(before) and all(part["part"] in running for part in before
                                       if part["part"] not in OPTIONAL_PARTS)
    # Not run when all is up: the workers of `pytest -n` each start a session here at once.
    if not (was_running and "registry" in running):
        result = _cli("local", "up", "--with", "registry", "--home", str(home))
        if result.returncode != 0:
            pytest.fail(f"cdc-router local up failed:\n{result.stdout}\n{result.stderr}")
    config = load_saved(home)
    assert config is not None
    yield StackEndpoints(config.bootstrap_servers, config.connect_url, config.postgres_dsn)
    if not was_running and os.environ.get("CDC_ROUTER_KEEP_STACK") != "1":
        _cli("local", "down", "--home", str(home))


@pytest.fixture(scope="session")
def registry_url(stack: StackEndpoints) -> str:
    """The real schema registry's Confluent API: CDC_ROUTER_REGISTRY_URL, else the registry of
    the stack under CDC_ROUTER_HOME (`cdc-router local up --with registry`)."""
    if os.environ.get("CDC_ROUTER_REGISTRY_URL"):
        return os.environ["CDC_ROUTER_REGISTRY_URL"]
    config = load_saved(_home())
    running = config is not None and any(
        part.part == "registry" and part.state == "running"
        for part in local_stack.status(config))
    if config is None or not running:
        pytest.fail(f"no schema registry runs in the stack under {_home()}: run `cdc-router "
                    "local up --with registry` there, or set CDC_ROUTER_REGISTRY_URL")
    return config.registry_url


@pytest.fixture(scope="session")
def jar_cache() -> Path:
    """Where the stack's jars are (the registry's bundle included), for private servers."""
    config = load_saved(_home())
    return config.jar_cache if config is not None else default_jar_cache()
