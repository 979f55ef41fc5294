"""The stack under test: its endpoints, its processes (by pid file), its Connect REST API."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import psycopg

from cdc_router.local import process
from cdc_router.local.config import (
    StackConfig,
    connect_properties,
    kafka_properties,
    load_saved,
    to_properties,
)
from cdc_router.local.stack import java_command, process_marker
from tests.chaos.verifier import HangingAbort, end_offset

REPO = Path(__file__).resolve().parents[2]
POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"


@dataclass(frozen=True)
class Endpoints:
    bootstrap: str
    connect_url: str
    dsn: str
    home: Path

    @classmethod
    def from_env(cls) -> Endpoints:
        """The usual CDC_ROUTER_* variables, else the local stack's defaults."""
        home = Path(os.environ.get("CDC_ROUTER_HOME", REPO / ".cdc-router")).resolve()
        saved = load_saved(home)
        return cls(
            os.environ.get("CDC_ROUTER_BOOTSTRAP_SERVERS",
                           saved.bootstrap_servers if saved else "127.0.0.1:19092"),
            os.environ.get("CDC_ROUTER_CONNECT_URL",
                           saved.connect_url if saved else "http://127.0.0.1:18083"),
            os.environ.get("CDC_ROUTER_PG_DSN", saved.postgres_dsn if saved else
                           "postgresql://postgres:postgres@127.0.0.1:15432/postgres"),
            home)


class LocalStack:
    """The parts of a `cdc-router local` stack, killed by the pids in its pid files."""

    def __init__(self, home: Path) -> None:
        saved = load_saved(home)
        if saved is None:
            raise SystemExit(f"chaos: no local stack under {home} (no stack.json): the "
                             "campaign kills and restarts its processes; start it with "
                             "`cdc-router local up --home DIR` and set CDC_ROUTER_HOME=DIR")
        self.config: StackConfig = saved

    def pid(self, part: str) -> int:
        pid = process.read_pid(self.config.pid_path(part))  # type: ignore[arg-type]
        if pid is None or not process.is_running(pid, process_marker(self.config)):
            raise RuntimeError(f"chaos: {part} of {self.config.home} is not running")
        return pid

    def log_size(self, part: str) -> int:
        path = self.config.log_path(part)  # type: ignore[arg-type]
        return path.stat().st_size if path.exists() else 0

    def keep_log(self, part: str, since: int, to: Path) -> None:
        """Copy what `part` logged from byte `since` on to `to`: the stack's home may go (a CI
        clone), the run's workdir stays (CI, stop 48: Kafka's view of a hanging transaction was
        lost with it)."""
        path = self.config.log_path(part)  # type: ignore[arg-type]
        if path.exists():
            with path.open("rb") as log:
                log.seek(since if since <= path.stat().st_size else 0)
                to.write_bytes(log.read())

    def signal(self, part: str, sig: signal.Signals) -> int:
        pid = self.pid(part)
        os.kill(pid, sig)
        return pid

    def wait_dead(self, pid: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while process.is_running(pid, process_marker(self.config)) and time.monotonic() < deadline:
            time.sleep(0.1)

    def up(self, port_wait_s: float = 180) -> None:
        """`cdc-router local up`: restarts what is not running, with its data. A port still
        held is asked for again for `port_wait_s`: a client reconnecting to a killed part may
        hold its port for a while (QA 31-e saw a minute, in the ephemeral range)."""
        deadline = time.monotonic() + port_wait_s
        while True:
            result = subprocess.run(
                [sys.executable, "-m", "cdc_router", "local", "up", "--home",
                 str(self.config.home)], capture_output=True, text=True, cwd=REPO, check=False)
            if result.returncode == 0:
                return
            if "already in use" not in result.stderr or time.monotonic() > deadline:
                raise RuntimeError(f"chaos: local up failed: {result.stderr.strip()[-500:]}")
            time.sleep(2)


    def abort_hanging_transactions(self) -> list[HangingAbort]:
        """Abort the transactions `kafka-transactions find-hanging` lists; what was aborted.

        Kafka 4.3.0 once left one in `connect-offsets` after a kill -9 (README, operations):
        Connect's exactly-once task then never starts. This is the remedy README gives the
        operator, with a 1-minute bound (the tool's default is 15) so the campaign goes on.
        Each abort keeps the tool's row and the partition's end offset just after it: the
        verifier reads that range back (CI, stop 48: an abort on the router's own changelog).
        """
        found = self._transactions("find-hanging", "--broker-id",
                                   kafka_properties(self.config)["node.id"],
                                   "--max-transaction-timeout", "1")
        aborted = []
        for row in hanging_transactions(found):
            try:
                self._transactions("abort", "--topic", row.topic, "--partition",
                                   str(row.partition), "--start-offset", str(row.start_offset))
            except RuntimeError as error:
                # Listed, then ended before the abort (its producer came back and finished
                # it, or the coordinator timed it out): nothing hangs (CI rehearsal 17).
                if "Could not find any open transactions" in str(error):
                    continue
                raise
            aborted.append(replace(row, end_offset=end_offset(
                self.config.bootstrap_servers, row.topic, row.partition)))
        return aborted

    def _transactions(self, *args: str) -> str:
        command = java_command(self.config, 256, "org.apache.kafka.tools.TransactionsCommand",
                               "--bootstrap-server", self.config.bootstrap_servers, *args)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"chaos: kafka-transactions {args[0]} failed: "
                               f"{(result.stderr or result.stdout).strip()[-500:]}")
        return result.stdout


def hanging_transactions(output: str) -> list[HangingAbort]:
    """Each row of the table `find-hanging` printed (tab-separated, under a header naming its
    columns), amid the log lines the tool prints before it with the stack's log4j
    configuration; end_offset is not known yet (-1)."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines)
              if line.split("\t")[0].strip() == "Topic" and "StartOffset" in line]
    if not starts:
        return []
    header = [column.strip() for column in lines[starts[0]].split("\t")]
    columns = ("Topic", "Partition", "StartOffset", "ProducerId", "ProducerEpoch")
    at = {name: header.index(name) for name in columns}
    rows = [[cell.strip() for cell in line.split("\t")] for line in lines[starts[0] + 1:]]
    return [HangingAbort(row[at["Topic"]], int(row[at["Partition"]]),
                         int(row[at["StartOffset"]]), int(row[at["ProducerId"]]),
                         int(row[at["ProducerEpoch"]]))
            for row in rows if len(row) >= len(header) - 1
            and all(row[at[name]].isdigit() for name in columns[1:])]


class Connect:
    """Kafka Connect's REST API, just what the campaign needs."""

    def __init__(self, url: str) -> None:
        self.url = url

    def put(self, name: str, config: dict[str, str]) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                reply = httpx.put(f"{self.url}/connectors/{name}/config", json=config,
                                  timeout=60)
                if reply.status_code in (200, 201):
                    return
                detail = reply.text
            except httpx.HTTPError as error:
                detail = str(error)
            if time.monotonic() > deadline:
                raise RuntimeError(f"chaos: registering {name} at {self.url}: {detail[:500]}")
            time.sleep(2)

    def delete(self, name: str) -> None:
        httpx.delete(f"{self.url}/connectors/{name}", timeout=60)

    def state(self, name: str) -> dict[str, Any] | None:
        try:
            reply = httpx.get(f"{self.url}/connectors/{name}/status", timeout=10)
        except httpx.HTTPError:
            return None
        return reply.json() if reply.status_code == 200 else None

    def failed_tasks(self, name: str) -> list[dict[str, Any]]:
        status = self.state(name) or {}
        return [t for t in status.get("tasks", []) if t.get("state") == "FAILED"]

    def restart_failed(self, name: str) -> None:
        httpx.post(f"{self.url}/connectors/{name}/restart",
                   params={"includeTasks": "true", "onlyFailed": "true"}, timeout=60)

    def restart_all(self, name: str) -> None:
        httpx.post(f"{self.url}/connectors/{name}/restart",
                   params={"includeTasks": "true"}, timeout=60)

    def wait_running(self, name: str, timeout_s: float = 240) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.state(name) or {}
            tasks = status.get("tasks", [])
            if (status.get("connector", {}).get("state") == "RUNNING" and tasks
                    and all(t.get("state") == "RUNNING" for t in tasks)):
                return True
            time.sleep(1)
        return False


def debezium_config(dsn: str, table: str, prefix: str, *, exactly_once: bool) -> dict[str, str]:
    """A Debezium connector for the run's outbox table (slot and publication named alike)."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    config = {
        "connector.class": POSTGRES_CONNECTOR, "tasks.max": "1",
        "database.hostname": str(params.get("host", "127.0.0.1")),
        "database.port": str(params.get("port", 5432)),
        "database.user": str(params["user"]), "database.password": str(params["password"]),
        "database.dbname": str(params["dbname"]), "topic.prefix": prefix,
        "plugin.name": "pgoutput", "slot.name": table, "publication.name": table,
        "publication.autocreate.mode": "disabled", "table.include.list": f"public.{table}",
        "snapshot.mode": "no_data", "tombstones.on.delete": "false",
        "skipped.operations": "u,d,t", "message.prefix.exclude.list": ".*",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "time.precision.mode": "adaptive_time_microseconds",
    }
    if exactly_once:
        config |= {"exactly.once.support": "required", "transaction.boundary": "poll"}
    return config


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class AtLeastOnceWorker:
    """A second Connect worker without exactly-once source support that flushes offsets
    rarely, so that a kill -9 makes Debezium replay what it sent since its last flush."""

    def __init__(self, stack: StackConfig, workdir: Path, name: str) -> None:
        self._stack = stack
        self._workdir = workdir
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.topics = [f"{name}-configs", f"{name}-offsets", f"{name}-status"]
        self.properties = workdir / f"{name}.properties"
        self.properties.write_text(to_properties({
            **connect_properties(stack), "group.id": name,
            "config.storage.topic": self.topics[0], "offset.storage.topic": self.topics[1],
            "status.storage.topic": self.topics[2],
            "exactly.once.source.support": "disabled",
            "offset.flush.interval.ms": "600000",
            "listeners": self.url, "rest.advertised.port": str(port)}))
        self.pid = 0

    def start(self) -> None:
        self.pid = process.spawn(
            java_command(self._stack, 512, "org.apache.kafka.connect.cli.ConnectDistributed",
                         str(self.properties)),
            log_path=self._workdir / "connect-alo.log", pid_path=self._workdir / "alo.pid",
            env=dict(os.environ))
        process.wait_until(self._healthy, name="at-least-once Connect worker", timeout_s=240,
                           pid=self.pid, marker=str(self.properties),
                           log_path=self._workdir / "connect-alo.log")

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        while process.is_running(self.pid, str(self.properties)):
            time.sleep(0.05)

    def stop(self) -> None:
        if self.pid:
            process.stop(self.pid, str(self.properties))

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/connector-plugins", timeout=3).status_code == 200
        except httpx.HTTPError:
            return False


def wait_slot_released(dsn: str, slot: str, timeout_s: float = 120) -> None:
    """Wait until no connector streams from `slot` (a deleted task lets go of it late)."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                               (slot,)).fetchone()
            if row is None or not row[0]:
                return
            time.sleep(0.5)
    raise RuntimeError(f"chaos: replication slot {slot} still active after {timeout_s}s")


def drop_run(dsn: str, table: str, ledger: str) -> None:
    """Drop the run's slot, publication and tables (a forgotten slot holds WAL for ever)."""
    wait_slot_released(dsn, table)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE slot_name = %s", (table,))
        conn.execute(f"DROP PUBLICATION IF EXISTS {table}")
        conn.execute(f"DROP TABLE IF EXISTS public.{table}, public.{ledger}")
