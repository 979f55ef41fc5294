"""A whole outbox pipeline on the real stack for one test: table, connector, topics, routers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from click.testing import CliRunner, Result
from confluent_kafka import Message
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from cdc_router.cli import main
from cdc_router.connect.client import ConnectClient
from cdc_router.errors import ConnectError
from tests.integration.support import (
    StackEndpoints,
    create_outbox_table,
    debezium_config,
    drop_outbox_table,
    drop_slot,
    read_to_end,
    read_topic,
    unique,
    wait_connector_running,
)

REPO = Path(__file__).resolve().parents[2]
Row = tuple[str, str, str, Any]  # aggregate type, aggregate id, event type, payload
_ASSIGNED = "event=assigned"  # the router's log line once it has its raw partitions


@dataclass
class Pipeline:
    """Names and handles of one test's pipeline; every name is unique to the test."""

    stack: StackEndpoints
    workdir: Path
    name: str
    table: str
    raw_topic: str
    orders_topic: str
    events_topic: str
    dlq_topic: str
    changelog_topic: str
    config_path: Path
    routers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def insert(self, rows: Sequence[Row], per_transaction: int = 200,
               table: str | None = None) -> list[str]:
        """Insert outbox rows in transactions of `per_transaction` into the pipeline's table
        (or `table`, public.<table>, an outbox of the same columns); their ids, in order."""
        ids = []
        with psycopg.connect(self.stack.postgres_dsn) as conn:
            for start in range(0, len(rows), per_transaction):
                chunk = rows[start:start + per_transaction]
                params = []
                for aggregate_type, aggregate_id, event_type, payload in chunk:
                    event_id = str(uuid.uuid4())
                    ids.append(event_id)
                    params.append((event_id, aggregate_type, aggregate_id, event_type,
                                   payload if isinstance(payload, str) else json.dumps(payload)))
                with conn.cursor() as cursor:
                    cursor.executemany(
                        f"INSERT INTO public.{table or self.table} (id, aggregatetype, "
                        "aggregateid, type, payload) VALUES (%s, %s, %s, %s, %s::jsonb)", params)
                conn.commit()
        return ids

    def start_router(self, instance: str = "a", *extra: str, wait: bool = False) -> int:
        """Start `cdc-router run` as its own process; returns its pid.

        With `wait`, return only once it has its partitions (its log says `event=assigned`),
        so that a kill timed from here hits a running router, not an interpreter starting up
        (which takes seconds on a busy machine).
        """
        assigned_before = self.router_log(instance).count(_ASSIGNED)
        log = open(self.workdir / f"router-{instance}.log", "ab")  # noqa: SIM115 (child's)
        process = subprocess.Popen(
            [sys.executable, "-m", "cdc_router", "run", "-c", str(self.config_path),
             "--instance-id", f"{self.name}-{instance}", "--metrics-port", "0", *extra],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ})
        self.routers[instance] = process
        if wait:
            self._wait_assigned(instance, assigned_before)
        return process.pid

    def _wait_assigned(self, instance: str, before: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while self.router_log(instance).count(_ASSIGNED) <= before:
            if self.routers[instance].poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"router {instance} got no partitions:\n"
                                     f"{self.router_log(instance)[-3000:]}")
            time.sleep(0.1)

    def kill_router(self, instance: str = "a", sig: int = signal.SIGKILL) -> int:
        """Signal a router by its pid and wait for it; its exit code."""
        process = self.routers.pop(instance)
        os.kill(process.pid, sig)
        return process.wait(timeout=60)

    def status(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`cdc-router status` of this pipeline (its config and connector) against the stack;
        `args` come last, so that an option given again there wins."""
        return subprocess.run(
            [sys.executable, "-m", "cdc_router", "status", "-c", str(self.config_path),
             "--connector", self.name.replace("_", "-"), "--connect-url", self.stack.connect_url,
             "--dsn", self.stack.postgres_dsn, "--bootstrap-servers",
             self.stack.bootstrap_servers, *args],
            capture_output=True, text=True, cwd=REPO, check=False, timeout=120)

    def cli(self, *args: str) -> Result:
        """`cdc-router ARGS` in this process, with the stack's Connect and Postgres."""
        return CliRunner().invoke(main, list(args), env={
            "CDC_ROUTER_CONNECT_URL": self.stack.connect_url,
            "CDC_ROUTER_PG_DSN": self.stack.postgres_dsn})

    def router_log(self, instance: str = "a") -> str:
        path = self.workdir / f"router-{instance}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def read(self, topic: str, count: int, timeout_s: float = 240) -> list[Message]:
        """The first `count` records of `topic` as they arrive (fewer after `timeout_s`)."""
        return read_topic(self.stack.bootstrap_servers, topic, count, timeout_s)

    def read_all(self, topic: str, settle_s: float = 5) -> list[Message]:
        """Everything committed on `topic` once `settle_s` have passed, to the end offsets.

        The wait lets late writes (a duplicate after the expected records, a transaction being
        committed) land first; the read itself stops at the end offsets, not on a quiet spell.
        """
        time.sleep(settle_s)
        return read_to_end(self.stack.bootstrap_servers, topic)


def set_topic_config(pipe: Pipeline, topic: str, name: str, value: str) -> None:
    """Set one config of a topic of the pipeline (e.g. a small max.message.bytes)."""
    admin = AdminClient({"bootstrap.servers": pipe.stack.bootstrap_servers})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def apply_topics(pipe: Pipeline) -> None:
    """`cdc-router topics apply` for the pipeline's config."""
    applied = subprocess.run([sys.executable, "-m", "cdc_router", "topics", "apply", "-c",
                              str(pipe.config_path), "--yes"], capture_output=True, text=True,
                             cwd=REPO, check=False)
    assert applied.returncode == 0, applied.stdout + applied.stderr


def _config(pipeline: Pipeline, partitions: int, extra: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "kafka": {"bootstrap_servers": pipeline.stack.bootstrap_servers},
        "source": {"topics": [pipeline.raw_topic], "group_id": pipeline.name},
        "routes": [
            {"match": {"aggregate_type": "Order*"}, "topic": pipeline.orders_topic},
            {"topic": pipeline.events_topic},
        ],
        "dead_letter": {"topic": pipeline.dlq_topic},
        "dedup": {"changelog_topic": pipeline.changelog_topic},
        "topics": [{"name": pipeline.orders_topic, "partitions": partitions},
                   {"name": pipeline.events_topic, "partitions": partitions}],
    }
    for key, value in extra.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


@contextmanager
def pipeline(stack: StackEndpoints, workdir: Path, *, partitions: int = 4,
             config: dict[str, Any] | None = None,
             connector: dict[str, str] | None = None,
             connect_url: str | None = None, raw_partitions: int = 1) -> Iterator[Pipeline]:
    """Set up table, publication, raw topic, connector, destination topics; tear all down."""
    name = unique("p")
    dashed = name.replace("_", "-")
    pipe = Pipeline(stack, workdir, name, table=name, raw_topic=f"{dashed}.public.{name}",
                    orders_topic=f"{dashed}-orders", events_topic=f"{dashed}-events",
                    dlq_topic=f"{dashed}-dlq", changelog_topic=f"{dashed}-dedup",
                    config_path=workdir / "router.yaml")
    pipe.config_path.write_text(yaml.safe_dump(_config(pipe, partitions, config or {})))
    create_outbox_table(stack.postgres_dsn, name)
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    # One raw partition keeps the commit order; the router spreads events by aggregate.
    for future in admin.create_topics([NewTopic(pipe.raw_topic, raw_partitions, 1)]).values():
        future.result(timeout=30)
    apply_topics(pipe)
    # Overrides may name the run's table as {table} (e.g. message.key.columns).
    overrides = {key: value.replace("{table}", name) for key, value in (connector or {}).items()}
    connector_config = debezium_config(stack, name=name, prefix=dashed, **overrides)
    connect = connect_url or stack.connect_url
    client = ConnectClient(connect)  # a call again on a 409 (see support.connector)
    client.put_config(dashed, connector_config)  # raises with Connect's message when refused
    try:
        wait_connector_running(connect, dashed)
        yield pipe
    finally:
        for instance in list(pipe.routers):
            with suppress(ProcessLookupError, subprocess.TimeoutExpired):
                pipe.kill_router(instance, signal.SIGTERM)
        with suppress(ConnectError):
            client.delete(dashed)
        client.close()
        drop_slot(stack.postgres_dsn, name)
        drop_outbox_table(stack.postgres_dsn, name)
        topics = [pipe.raw_topic, pipe.orders_topic, pipe.events_topic, pipe.dlq_topic,
                  pipe.changelog_topic]
        for future in admin.delete_topics(topics).values():
            with suppress(Exception):
                future.result(timeout=30)
