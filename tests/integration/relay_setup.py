"""An outbox table with the relay's columns, its topics, and relay processes, for one test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from confluent_kafka.admin import AdminClient

from cdc_router.outbox.relay_columns import relay_columns_ddl
from tests.integration.pipeline import REPO
from tests.integration.support import StackEndpoints, unique

STARTED = "event=relay_started"
WAITING = "event=lock_waiting"


@dataclass
class RelaySetup:
    """Names and processes of one test's relay; every name is unique to the test."""

    stack: StackEndpoints
    workdir: Path
    name: str
    table: str
    orders_topic: str
    dlq_topic: str
    changelog_topic: str
    position_topic: str
    config_path: Path
    relays: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, instance: str) -> int:
        """Start `cdc-router relay` as its own process; returns its pid."""
        log = open(self.workdir / f"relay-{instance}.log", "ab")  # noqa: SIM115 (child's)
        process = subprocess.Popen(
            [sys.executable, "-m", "cdc_router", "relay", "-c", str(self.config_path),
             "--instance-id", instance, "--metrics-port", "0"],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ})
        self.relays[instance] = process
        return process.pid

    def kill(self, instance: str, sig: int = signal.SIGKILL) -> int:
        """Signal a relay by its pid and wait for it; its exit code."""
        process = self.relays.pop(instance)
        os.kill(process.pid, sig)
        return process.wait(timeout=60)

    def log(self, instance: str) -> str:
        path = self.workdir / f"relay-{instance}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for(self, instance: str, line: str, count: int, timeout_s: float = 120) -> float:
        """Wait until `instance`'s log holds `line` `count` times; when it did (monotonic)."""
        deadline = time.monotonic() + timeout_s
        while self.log(instance).count(line) < count:
            process = self.relays.get(instance)
            if process is None or process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"relay {instance} did not log {line!r} x{count}:\n"
                                     f"{self.log(instance)[-3000:]}")
            time.sleep(0.05)
        return time.monotonic()

    def rows_left(self) -> int:
        with psycopg.connect(self.stack.postgres_dsn, autocommit=True) as conn:
            row = conn.execute(f"SELECT count(*) FROM public.{self.table}").fetchone()
        return int(row[0]) if row else -1


def relay_failing(setup: RelaySetup, config: dict[str, Any]) -> tuple[str, str]:
    """Run `cdc-router relay` once with `config` (written next to the test's), expecting it to
    fail at start: (its last stderr line, the whole stderr)."""
    broken = setup.workdir / "broken.yaml"
    broken.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "cdc_router", "relay", "-c", str(broken), "--metrics-port", "0"],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1], result.stderr


def _config(setup: RelaySetup, extra: dict[str, Any]) -> dict[str, Any]:
    dsn = setup.stack.postgres_dsn
    config: dict[str, Any] = {
        "kafka": {"bootstrap_servers": setup.stack.bootstrap_servers},
        "source": {"group_id": setup.name},
        "routes": [{"topic": setup.orders_topic}],
        "dead_letter": {"topic": setup.dlq_topic},
        "dedup": {"changelog_topic": setup.changelog_topic},
        "relay": {"table": f"public.{setup.table}", "dsn": dsn, "poll_interval_ms": 100,
                  "batch_rows": 200, "position_topic": setup.position_topic},
        "cleanup": {"mode": "delete", "table": f"public.{setup.table}", "dsn": dsn,
                    "interval_ms": 200},
        "topics": [{"name": setup.orders_topic, "partitions": 4}],
    }
    for key, value in extra.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


@contextmanager
def relay_setup(stack: StackEndpoints, workdir: Path, *, relay_columns: bool = True,
                config: dict[str, Any] | None = None,
                table: str | None = None) -> Iterator[RelaySetup]:
    """Create the table (with the relay's columns) and the topics; tear all down after.

    With `table`, relay that existing table instead (the caller creates and drops it).
    """
    name = unique("relay")
    dashed = name.replace("_", "-")
    setup = RelaySetup(stack, workdir, name, table=table or name, orders_topic=f"{dashed}-orders",
                       dlq_topic=f"{dashed}-dlq", changelog_topic=f"{dashed}-dedup",
                       position_topic=f"{dashed}.relay-position",
                       config_path=workdir / "router.yaml")
    setup.config_path.write_text(yaml.safe_dump(_config(setup, config or {})))
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        if table is None:
            conn.execute(f"""CREATE TABLE public.{name} (
            id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL,
            type text NOT NULL, payload jsonb NOT NULL, headers jsonb,
            created_at timestamp(6) NOT NULL DEFAULT (now() AT TIME ZONE 'utc'))""")
        if relay_columns and table is None:
            for statement in relay_columns_ddl(f"public.{name}", "txid", "seq"):
                conn.execute(statement)
    applied = subprocess.run([sys.executable, "-m", "cdc_router", "topics", "apply", "-c",
                              str(setup.config_path), "--yes"], capture_output=True, text=True,
                             cwd=REPO, check=False)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    try:
        yield setup
    finally:
        for instance in list(setup.relays):
            with suppress(ProcessLookupError, subprocess.TimeoutExpired):
                setup.kill(instance, signal.SIGTERM)
        if table is None:
            with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
                conn.execute(f"DROP TABLE IF EXISTS public.{name}")
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        topics = [setup.orders_topic, setup.dlq_topic, setup.changelog_topic,
                  setup.position_topic]
        for future in admin.delete_topics(topics).values():
            with suppress(Exception):
                future.result(timeout=30)
