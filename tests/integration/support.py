"""Helpers the integration tests share: Connect registration, slots, raw-topic reads."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
from confluent_kafka import Consumer, Message

POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"


@dataclass(frozen=True)
class StackEndpoints:
    """Addresses of the real stack the integration tests run against."""

    bootstrap_servers: str
    connect_url: str
    postgres_dsn: str


def unique(prefix: str) -> str:
    """A name no other test run uses: tables, slots, topics, connectors, groups."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def wait_connector_running(connect_url: str, name: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        reply = httpx.get(f"{connect_url}/connectors/{name}/status", timeout=5)
        if reply.status_code == 200:
            last = reply.json()
            tasks = last.get("tasks", [])
            if last["connector"]["state"] == "RUNNING" and tasks and all(
                    t["state"] == "RUNNING" for t in tasks):
                return
            if any(t["state"] == "FAILED" for t in tasks):
                raise AssertionError(f"connector {name} failed: {json.dumps(last)[:2000]}")
        time.sleep(0.5)
    raise AssertionError(f"connector {name} not RUNNING after {timeout_s}s: {last}")


def drop_slot(dsn: str, slot: str, timeout_s: float = 60) -> None:
    """Drop a replication slot once its connector has let go of it."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                               (slot,)).fetchone()
            if row is None:
                return
            if not row[0]:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"replication slot {slot} still active")
            time.sleep(0.5)


@contextmanager
def connector(stack: StackEndpoints, name: str, config: dict[str, str]) -> Iterator[None]:
    """Register a connector, wait for RUNNING, and remove it and its slot afterwards."""
    reply = httpx.put(f"{stack.connect_url}/connectors/{name}/config", json=config, timeout=30)
    assert reply.status_code in (200, 201), reply.text
    try:
        wait_connector_running(stack.connect_url, name)
        yield
    finally:
        httpx.delete(f"{stack.connect_url}/connectors/{name}", timeout=30)
        if "slot.name" in config:
            drop_slot(stack.postgres_dsn, config["slot.name"])


def read_topic(bootstrap: str, topic: str, count: int, timeout_s: float = 60,
               isolation: str = "read_committed", idle_s: float | None = None) -> list[Message]:
    """Read `count` records from the start of `topic` (fewer if the timeout passes).

    With `idle_s`, stop as soon as no record has come for that long.
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"),
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": isolation})
    consumer.subscribe([topic])
    records: list[Message] = []
    deadline = time.monotonic() + timeout_s
    last = time.monotonic()
    try:
        while len(records) < count and (time.monotonic() < deadline if idle_s is None
                                        else time.monotonic() - last < idle_s):
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            records.append(message)
            last = time.monotonic()
    finally:
        consumer.close()
    return records


def create_outbox_table(dsn: str, name: str) -> None:
    """An outbox table `public.<name>` and its insert-only publication `<name>`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"""CREATE TABLE public.{name} (
            id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL,
            type text NOT NULL, payload jsonb NOT NULL, headers jsonb,
            created_at timestamp(6) NOT NULL DEFAULT (now() AT TIME ZONE 'utc'))""")
        conn.execute(f"CREATE PUBLICATION {name} FOR TABLE public.{name} "
                     "WITH (publish = 'insert')")


def drop_outbox_table(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP PUBLICATION IF EXISTS {name}")
        conn.execute(f"DROP TABLE IF EXISTS public.{name}")


def debezium_config(stack: StackEndpoints, *, name: str, prefix: str,
                    **extra: str) -> dict[str, str]:
    """A Debezium connector capturing `public.<name>` (slot and publication `<name>`) into
    `<prefix>.public.<name>`, as the superuser of the test stack."""
    params = psycopg.conninfo.conninfo_to_dict(stack.postgres_dsn)
    return {
        "connector.class": POSTGRES_CONNECTOR,
        "database.hostname": "127.0.0.1", "database.port": str(params["port"]),
        "database.user": str(params["user"]), "database.password": str(params["password"]),
        "database.dbname": str(params["dbname"]), "topic.prefix": prefix,
        "plugin.name": "pgoutput", "slot.name": name, "publication.name": name,
        "publication.autocreate.mode": "disabled", "table.include.list": f"public.{name}",
        "snapshot.mode": "no_data", "tombstones.on.delete": "false",
        # Logical decoding messages (another connector's heartbeats) are database-wide.
        "message.prefix.exclude.list": ".*",
        **extra,
    }
