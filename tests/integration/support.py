"""Helpers the integration tests share: Connect registration, slots, topic reads, seeds."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from cdc_router.connect.client import ConnectClient
from cdc_router.errors import ConnectError
from cdc_router.local.config import StackConfig, load_saved

POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"


@dataclass(frozen=True)
class StackEndpoints:
    """Addresses of the real stack the integration tests run against."""

    bootstrap_servers: str
    connect_url: str
    postgres_dsn: str


def local_stack(stack: StackEndpoints) -> StackConfig | None:
    """The saved config of the local stack under CDC_ROUTER_HOME when the tests run against
    it (a test that stops or reads one of its parts needs its pid files and logs), else None."""
    home = Path(os.environ.get("CDC_ROUTER_HOME", Path(__file__).resolve().parents[2] /
                               ".cdc-router")).resolve()
    local = load_saved(home)
    if local is None or (local.bootstrap_servers, local.connect_url, local.postgres_dsn) != (
            stack.bootstrap_servers, stack.connect_url, stack.postgres_dsn):
        return None
    return local


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
        time.sleep(0.2)  # every test waits here once or more: a coarser poll costs each one
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
            time.sleep(0.2)


@contextmanager
def connector(stack: StackEndpoints, name: str, config: dict[str, str]) -> Iterator[None]:
    """Register a connector, wait for RUNNING, and remove it and its slot afterwards."""
    # ConnectClient makes a call again while Connect answers 409 (a rebalance or another config
    # write in flight: two test workers add and remove connectors at once).
    connect = ConnectClient(stack.connect_url)
    connect.put_config(name, config)  # raises with Connect's message when refused
    try:
        wait_connector_running(stack.connect_url, name)
        yield
    finally:
        with suppress(ConnectError):
            connect.delete(name)
        connect.close()
        if "slot.name" in config:
            drop_slot(stack.postgres_dsn, config["slot.name"])


def _reader(bootstrap: str, isolation: str) -> Consumer:
    """A consumer for assign() only: it never joins its group and commits nothing."""
    return Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"),
                     "enable.auto.commit": False, "isolation.level": isolation,
                     "enable.partition.eof": True})


def _partitions(consumer: Consumer, topic: str, deadline: float) -> list[TopicPartition]:
    """Every partition of `topic` at its beginning, once the topic exists (Connect may still
    be creating it)."""
    while True:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is not None and metadata.error is None and metadata.partitions:
            return [TopicPartition(topic, partition, OFFSET_BEGINNING)
                    for partition in sorted(metadata.partitions)]
        if time.monotonic() > deadline:
            raise AssertionError(f"topic {topic} does not exist: {metadata and metadata.error}")
        time.sleep(0.5)


def _record(message: Message | None) -> Message | None:
    """The record `message` is, or None for nothing, end-of-partition or a transient error."""
    if message is None:
        return None
    error = message.error()
    if error is None:
        return message
    if error.fatal():
        raise AssertionError(f"reading {message.topic()}: {error}")
    return None


def read_topic(bootstrap: str, topic: str, count: int, timeout_s: float = 60,
               isolation: str = "read_committed",
               until: Callable[[Message], bool] | None = None) -> list[Message]:
    """The first `count` records of `topic` (or those up to the first for which `until` holds),
    reading every partition from its beginning as records arrive; fewer if `timeout_s` passes.

    The partitions are assigned, not subscribed to: there is no group join to wait for, so the
    whole timeout goes to reading.
    """
    deadline = time.monotonic() + timeout_s
    consumer = _reader(bootstrap, isolation)
    records: list[Message] = []
    try:
        consumer.assign(_partitions(consumer, topic, deadline))
        while len(records) < count and time.monotonic() < deadline:
            record = _record(consumer.poll(0.5))
            if record is not None:
                records.append(record)
                if until is not None and until(record):
                    break
    finally:
        consumer.close()
    return records


def _watermarks(consumer: Consumer, partition: TopicPartition,
                deadline: float) -> tuple[int, int]:
    """(low, high) of `partition`, retried until `deadline`: a topic just created answers
    NOT_LEADER_FOR_PARTITION until its leader is known (librdkafka does not flag that error
    retriable here)."""
    while True:
        try:
            low, high = consumer.get_watermark_offsets(partition, timeout=10)
            return int(low), int(high)
        except KafkaException:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def read_to_end(bootstrap: str, topic: str, timeout_s: float = 60,
                isolation: str = "read_committed") -> list[Message]:
    """Every record of `topic` below the end offsets it has when called, all partitions.

    Deterministic, unlike "stop after N idle seconds": each partition is read from its
    beginning up to the end offset fetched first (`get_watermark_offsets`; under read_committed
    that is the last stable offset, so an open transaction's records are not waited for).
    Records committed after the call are not included; AssertionError if the end is not
    reached within `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    consumer = _reader(bootstrap, isolation)
    records: list[Message] = []
    try:
        ends = {}
        for partition in _partitions(consumer, topic, deadline):
            low, high = _watermarks(consumer, partition, deadline)
            if high > low:
                ends[partition.partition] = high
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)
                         for partition in ends])
        while ends:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: partitions not read to their end offsets "
                                     f"{ends} in {timeout_s}s")
            message = consumer.poll(0.5)
            if message is None:
                continue
            partition, offset = message.partition(), message.offset()
            if partition not in ends:
                continue
            error = message.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                _record(message)  # raises if fatal; a transient error is retried by the client
                continue
            if error is None and offset < ends[partition]:
                records.append(message)
            # At end of partition the offset is the reader's position (past any transaction
            # markers); after a record it is that record's.
            if (offset if error is not None else offset + 1) >= ends[partition]:
                del ends[partition]
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


SEED_ENV = "CDC_ROUTER_TEST_SEED"


@dataclass(frozen=True)
class ReplaySeed:
    """The seed of a test's random choices (kill timings); str() says how to replay it."""

    value: int

    def random(self) -> random.Random:
        return random.Random(self.value)

    def __str__(self) -> str:
        return f"random seed {self.value} (replay: {SEED_ENV}={self.value})"


def replay_seed(default: int) -> ReplaySeed:
    """`default`, so that every run makes the same choices, unless SEED_ENV names another."""
    text = os.environ.get(SEED_ENV)
    return ReplaySeed(int(text) if text else default)


# Ports for a test's own servers come from below the kernel's ephemeral range (32768 up here):
# a port the kernel picked could be taken, before the server binds it, by an outgoing
# connection of the other test worker. Each xdist worker has a block of its own.
_PORT_BLOCK = 3_000
_PORTS_HANDED: set[int] = set()


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that nothing listens on right now and that
    this process has not handed out before."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    low = 20_000 + (int(worker) % 4 if worker.isdigit() else 0) * _PORT_BLOCK
    rng = random.Random(os.getpid())
    ports: list[int] = []
    for _ in range(10 * _PORT_BLOCK):
        port = rng.randrange(low, low + _PORT_BLOCK)
        if port in _PORTS_HANDED:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _PORTS_HANDED.add(port)
        ports.append(port)
        if len(ports) == count:
            return ports
    raise AssertionError(f"no {count} free ports in {low}-{low + _PORT_BLOCK - 1}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_ports(1)[0]


def scrape(port: int, timeout_s: float = 5) -> str | None:
    """The /metrics text served on 127.0.0.1:`port` (a router's `--metrics-port`), None while
    nothing serves it there (not started yet, exited, or no answer within `timeout_s`)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                    timeout=timeout_s) as answer:
            return answer.read().decode()
    except OSError:
        return None


class WithoutMetadata:
    """A real consumer whose lookups fail, as the changelog reader's did for minutes after a
    broker's kill (QA 38-a O2); its positions and close() are the real consumer's."""

    def __init__(self, real: Consumer) -> None:
        self.real = real

    def _failed(self, *args: object, **kwargs: object) -> None:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: "
                                        "Local: Broker transport failure"))

    list_topics = get_watermark_offsets = _failed

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return self.real.position(partitions)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.real.close()


def status_json(stack: StackEndpoints, config: Path) -> dict[str, Any]:
    """`cdc-router status -c config -o json` against the stack (no connector of its own): its
    document, whose exit_code is the process's."""
    done = subprocess.run(
        [sys.executable, "-m", "cdc_router", "status", "-c", str(config), "-o", "json",
         "--connector", "no-such-connector", "--connect-url", stack.connect_url,
         "--dsn", stack.postgres_dsn, "--bootstrap-servers", stack.bootstrap_servers],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], check=False,
        timeout=120)
    assert done.stdout, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    assert done.returncode == document["exit_code"]
    return document
