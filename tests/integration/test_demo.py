"""`make demo`, README's first command, on the real stack: its recipe, as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from cdc_router.local.config import StackConfig
from tests.integration.support import StackEndpoints, free_port, unique

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_make_demo_routes_both_events_and_ships_the_order_once(stack: StackEndpoints) -> None:
    default = StackConfig(home=REPO / ".cdc-router", jar_cache=REPO)
    if (stack.bootstrap_servers, stack.connect_url, stack.postgres_dsn) != (
            default.bootstrap_servers, default.connect_url, default.postgres_dsn):
        pytest.skip("make demo targets the local stack's default endpoints")
    # -o: the stack is up already (the fixture); the recipe itself runs unchanged.
    result = subprocess.run(["make", "-o", "stack", "-o", "install", "demo"], cwd=REPO,
                            env={**os.environ, "CDC_ROUTER_CONFIG": ""}, capture_output=True,
                            text=True, timeout=300, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert re.search(r"^routed orders\.OrderPaid\[\d+\]@\d+$", output, re.M), output
    assert re.search(r"^routed payments\.confirmed\[\d+\]@\d+$", output, re.M), output
    assert "ce_specversion=1.0" in output
    assert re.search(r"fulfillment: 1 shipment for event \S+ \(2 duplicate deliveries", output), \
        output
    assert "Traceback" not in output


@pytest.fixture
def database(stack: StackEndpoints) -> Iterator[str]:
    """The DSN of a new database of the stack's Postgres, with no outbox in it."""
    name = unique("demo")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield make_conninfo(stack.postgres_dsn, dbname=name)
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _cdc_router(*args: str, kafka: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cdc_router", *args], cwd=REPO,
                          env={**os.environ, "CDC_ROUTER__KAFKA__BOOTSTRAP_SERVERS": kafka},
                          capture_output=True, text=True, timeout=180, check=False)


def test_demo_without_an_outbox_says_so_in_one_line(stack: StackEndpoints, database: str) -> None:
    # Review 50-d F9: psycopg's UndefinedTable was a traceback.
    result = _cdc_router("demo", "-c", "cdc_router/examples/router.yaml", "--dsn", database,
                         kafka=stack.bootstrap_servers)
    assert result.returncode == 1, result.stderr
    dbname = psycopg.conninfo.conninfo_to_dict(database)["dbname"]
    assert re.fullmatch(rf"error: Postgres at \S+/{dbname} has no outbox table public\.outbox: "
                        r"run `cdc-router outbox init --dsn \.\.\.` .*\n", result.stderr), \
        result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_demo_with_kafka_down_writes_no_sample(stack: StackEndpoints, database: str) -> None:
    # Review 50-d F9: the two samples were committed to the outbox before the router failed,
    # and captured whenever a connector was set up later.
    init = _cdc_router("outbox", "init", "--dsn", database, kafka=stack.bootstrap_servers)
    assert init.returncode == 0, init.stderr
    result = _cdc_router("demo", "-c", "cdc_router/examples/router.yaml", "--dsn", database,
                         kafka=f"127.0.0.1:{free_port()}")
    assert result.returncode == 75, result.stderr
    assert "is the cluster at 127.0.0.1:" in result.stderr
    assert "wrote" not in result.stdout
    with psycopg.connect(database) as conn:
        assert conn.execute("SELECT count(*) FROM public.outbox").fetchone() == (0,)
