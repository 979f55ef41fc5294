"""What one benchmark run creates on the shared stack, named for that run, and removes again.

Every table, publication, replication slot, role, connector, topic and consumer group starts
with the run's name (`bench_<hex>` in Postgres, `bench-<hex>` in Kafka and Connect), so that
runs by other people never collide, and `close()` removes them all, whatever failed before.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import yaml
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_router.config.load import load_config
from cdc_router.config.relay import DEFAULT_SEQ_COLUMN, DEFAULT_TXID_COLUMN
from cdc_router.connect import ConnectClient, load_spec
from cdc_router.outbox import CaptureSetup, OutboxSchema, init_outbox, init_steps, new_event_id
from cdc_router.outbox.relay_columns import relay_columns_ddl
from cdc_router.postgres import table_identifier
from cdc_router.router.topics import TopicAdmin
from tests.integration.support import StackEndpoints, drop_slot

REPO = Path(__file__).resolve().parents[2]
CONNECTOR_FILE = REPO / "connectors" / "outbox-connector.json"
# The Connect worker resolves ${env:CDC_ROUTER_DB_PASSWORD} from its own environment, which
# `cdc-router local up` sets to this variable's value or, by default, "debezium".
ROLE_PASSWORD = os.environ.get("CDC_ROUTER_DB_PASSWORD", "debezium")
EVENT_ROUTER = "io.debezium.transforms.outbox.EventRouter"
BULK_CHUNK = 5000  # rows per bulk transaction: Debezium sees 100k rows as 20 commits


def endpoints_from_env() -> StackEndpoints:
    """The stack named by the variables the integration tests use, or the local defaults."""
    return StackEndpoints(
        os.environ.get("CDC_ROUTER_BOOTSTRAP_SERVERS", "127.0.0.1:19092"),
        os.environ.get("CDC_ROUTER_CONNECT_URL", "http://127.0.0.1:18083"),
        os.environ.get("CDC_ROUTER_PG_DSN",
                       "postgresql://postgres:postgres@127.0.0.1:15432/postgres"))


class BenchStack:
    """The run's objects on the shared stack; close() removes every one of them."""

    def __init__(self, stack: StackEndpoints, workdir: Path) -> None:
        self.stack = stack
        self.workdir = workdir
        self.name = f"bench_{uuid.uuid4().hex[:8]}"
        self.dashed = self.name.replace("_", "-")
        self.role = f"{self.name}_dbz"
        self.heartbeat_table = f"public.{self.name}_hb"
        self.connect = ConnectClient(stack.connect_url)
        self.admin = TopicAdmin({"bootstrap.servers": stack.bootstrap_servers})
        self._connectors: dict[str, str] = {}  # connector name -> its slot
        self._publications: list[str] = []
        self._tables: list[str] = [self.heartbeat_table]
        self._groups: list[str] = []
        self._processes: list[subprocess.Popen[bytes]] = []

    # -- Postgres -------------------------------------------------------------------------

    def outbox(self, suffix: str) -> str:
        """A captured outbox `public.<run>_<suffix>` with its own insert-only publication, set
        up by `outbox init` (shared heartbeat table and replication role); the table's name."""
        table = f"public.{self.name}_{suffix}"
        publication = f"{self.name}_{suffix}"
        self._tables.append(table)
        self._publications.append(publication)
        with psycopg.connect(self.stack.postgres_dsn) as conn:
            init_outbox(conn, OutboxSchema(table=table),
                        CaptureSetup(publication, self.heartbeat_table, self.role),
                        replication_password=ROLE_PASSWORD)
        return table

    def polled_table(self, suffix: str) -> str:
        """An outbox with a `published` flag, for the polling relays (no publication)."""
        table = self._plain_outbox(suffix)
        identifier = table_identifier(table)
        with psycopg.connect(self.stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL(
                "ALTER TABLE {} ADD COLUMN published boolean NOT NULL DEFAULT false").format(
                identifier))
            conn.execute(psycopg.sql.SQL("CREATE INDEX ON {} (created_at)").format(identifier))
        return table

    def _plain_outbox(self, suffix: str) -> str:
        """The outbox table `outbox init` creates, without publication or role; its name."""
        table = f"public.{self.name}_{suffix}"
        self._tables.append(table)
        create = next(step for step in init_steps(OutboxSchema(table=table), CaptureSetup())
                      if step.label == f"table {table}")
        with psycopg.connect(self.stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(create.statement)
        return table

    def relay_table(self, suffix: str) -> str:
        """An outbox with the columns `cdc-router relay` needs (`outbox init --relay`)."""
        table = self._plain_outbox(suffix)
        with psycopg.connect(self.stack.postgres_dsn, autocommit=True) as conn:
            for statement in relay_columns_ddl(table, DEFAULT_TXID_COLUMN, DEFAULT_SEQ_COLUMN):
                conn.execute(statement)
        return table

    def bulk_insert(self, table: str, rows: int) -> float:
        """Insert `rows` outbox rows, BULK_CHUNK a transaction; the seconds it took.

        One INSERT a row, as applications write their outbox, and not COPY: COPY writes many
        rows in one WAL record, which pgoutput hands over as changes sharing one LSN, and a
        Debezium task restarted between two of them skips the rest (seen on this stack: 18
        rows lost when Postgres was restarted during a run).
        """
        started = time.monotonic()
        insert = psycopg.sql.SQL("INSERT INTO {} (id, aggregatetype, aggregateid, type, payload)"
                                 " VALUES (%s, %s, %s, %s, %s)").format(table_identifier(table))
        with psycopg.connect(self.stack.postgres_dsn) as conn:
            for start in range(0, rows, BULK_CHUNK):
                with conn.transaction(), conn.cursor() as cursor:
                    cursor.executemany(insert, [outbox_row(new_event_id(), seq) for seq in
                                                range(start, min(rows, start + BULK_CHUNK))])
        return time.monotonic() - started

    def steady_insert(self, tables: list[str], rate: float, seconds: float) -> dict[str, float]:
        """One row a transaction at `rate` rows/s for `seconds`, the same row (same id) into
        every table in that transaction; row id -> wall-clock time right after COMMIT returned."""
        commits: dict[str, float] = {}
        inserts = [psycopg.sql.SQL("INSERT INTO {} (id, aggregatetype, aggregateid, type, payload)"
                                   " VALUES (%s, %s, %s, %s, %s)").format(table_identifier(table))
                   for table in tables]
        with psycopg.connect(self.stack.postgres_dsn) as conn:
            started = time.monotonic()
            for seq in range(int(rate * seconds)):
                # Rows are due on a fixed schedule; one that is late goes out at once.
                delay = started + seq / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                row = outbox_row(new_event_id(), seq)
                with conn.transaction():
                    for insert in inserts:
                        conn.execute(insert, row)
                commits[row[0]] = time.time()
        return commits

    # -- Kafka Connect --------------------------------------------------------------------

    def connector(self, suffix: str, table: str, **overrides: str) -> str:
        """Register connectors/outbox-connector.json for `table` (own name, slot, publication,
        topic prefix `<run>-<suffix>`) with `overrides`, wait for RUNNING; its name."""
        name = f"{self.dashed}-{suffix}"
        slot = f"{self.name}_{suffix}"
        params = psycopg.conninfo.conninfo_to_dict(self.stack.postgres_dsn)
        env = {"CONNECTOR_NAME": name, "DB_HOST": str(params.get("host", "127.0.0.1")),
               "DB_PORT": str(params.get("port", 5432)), "DB_NAME": str(params["dbname"]),
               "DB_USER": self.role, "PUBLICATION": table.split(".")[1], "SLOT_NAME": slot,
               "OUTBOX_TABLE": table, "TOPIC_PREFIX": name,
               "HEARTBEAT_TABLE": self.heartbeat_table}
        spec = load_spec(CONNECTOR_FILE, env)
        self._connectors[name] = slot
        self.connect.put_config(name, {**spec.config, **overrides})
        self.connect.wait_for_state(name, "RUNNING", timeout=120)
        return name

    def pause(self, connector: str) -> None:
        self.connect.pause(connector)
        self.connect.wait_for_state(connector, "PAUSED", timeout=60, poll_interval=0.2)

    def resume(self, connector: str) -> None:
        self.connect.resume(connector)

    # -- Kafka ----------------------------------------------------------------------------

    def topic(self, name: str, partitions: int = 1) -> str:
        """Create a topic of the run (its name must start with the run's name); its name."""
        assert name.startswith(self.dashed), name  # close() finds the run's topics by prefix
        for future in self.admin.admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(timeout=30)
        return name

    def group(self, suffix: str) -> str:
        name = f"{self.dashed}-{suffix}"
        self._groups.append(name)
        return name

    # -- processes ------------------------------------------------------------------------

    def router_config(self, suffix: str, raw: str, guarantee: str) -> tuple[Path, str]:
        """A router.yaml reading `raw` into `<run>-<suffix>` (4 partitions), its topics
        created; (config path, destination topic)."""
        return self._config(suffix, {"source": {"topics": [raw], "group_id": self.group(suffix)},
                                     "delivery": {"guarantee": guarantee}})

    def _config(self, suffix: str, sections: dict[str, Any],
                env: dict[str, str] | None = None) -> tuple[Path, str]:
        """A router.yaml with one route into `<run>-<suffix>`, its dead-letter topic and
        changelog, plus `sections`; its topics created; (config path, destination topic)."""
        destination = f"{self.dashed}-{suffix}"
        path = self.workdir / f"{suffix}.yaml"
        path.write_text(yaml.safe_dump({
            "kafka": {"bootstrap_servers": self.stack.bootstrap_servers},
            "routes": [{"topic": destination}],
            "dead_letter": {"topic": f"{destination}-dlq"},
            "dedup": {"changelog_topic": f"{destination}-dedup"},
            "topics": [{"name": destination, "partitions": 4}],
            **sections,
        }))
        config = load_config(path, env=env).config
        self.admin.apply(self.admin.plan(config.topic_specs()))
        return path, destination

    def relay_config(self, suffix: str, table: str) -> tuple[Path, str]:
        """A router.yaml for `cdc-router relay` on `table` into `<run>-<suffix>` (4
        partitions), cleanup delete; its topics created; (config path, destination topic)."""
        return self._config(suffix, {"source": {"group_id": self.group(suffix)},
                                     "relay": {"table": table},
                                     "cleanup": {"mode": "delete", "table": table}},
                            env=self._relay_env())

    def start_cdc_relay(self, config: Path, timeout_s: float = 120) -> int:
        """`cdc-router relay` as a process of its own (its DSN from the environment); returns
        once it holds the table's lock and has read its position back."""
        return self._start_logged(
            ["-m", "cdc_router", "relay", "-c", str(config), "--instance-id",
             f"{self.dashed}-relay", "--metrics-port", "0"], self.workdir / "cdc-relay.log",
            "event=relay_started", timeout_s, env=self._relay_env())

    def _relay_env(self) -> dict[str, str]:
        """The relay's DSN and its cleanup's, as a deployment sets them: by environment."""
        return {"CDC_ROUTER__RELAY__DSN": self.stack.postgres_dsn,
                "CDC_ROUTER__CLEANUP__DSN": self.stack.postgres_dsn}

    def start_router(self, config: Path, instance: str, timeout_s: float = 120) -> int:
        """`cdc-router run` as a process of its own; returns once it has its partitions."""
        return self._start_logged(
            ["-m", "cdc_router", "run", "-c", str(config), "--instance-id",
             f"{self.dashed}-{instance}", "--metrics-port", "0"],
            self.workdir / f"{instance}.log", "event=assigned", timeout_s)

    def _start_logged(self, args: list[str], log_path: Path, ready: str, timeout_s: float,
                      env: dict[str, str] | None = None) -> int:
        """Spawn a process and wait until its log says `ready` (once more than before)."""
        before = log_path.read_text().count(ready) if log_path.exists() else 0
        process = self._spawn(args, log_path, env=env)
        deadline = time.monotonic() + timeout_s
        while log_path.read_text(errors="replace").count(ready) <= before:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{args[1:4]} never logged {ready}; its log ends:\n{tail}")
            time.sleep(0.1)
        return process.pid

    def start_relay(self, kind: str, table: str, topic: str) -> int:
        process = self._spawn(["-m", "tests.bench.relays", kind, "--dsn",
                               self.stack.postgres_dsn, "--table", table, "--topic", topic,
                               "--bootstrap", self.stack.bootstrap_servers],
                              self.workdir / f"relay-{kind}.log")
        return process.pid

    def _spawn(self, args: list[str], log_path: Path,
               env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log:
            process = subprocess.Popen([sys.executable, *args], stdout=log,
                                       stderr=subprocess.STDOUT, cwd=REPO,
                                       env={**os.environ, **(env or {})})
        self._processes.append(process)
        return process

    def stop(self, pid: int) -> None:
        """SIGTERM one of our processes by its pid and wait for it to finish its batch."""
        for process in self._processes:
            if process.pid == pid and process.poll() is None:
                os.kill(pid, signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.kill(pid, signal.SIGKILL)
                    process.wait(timeout=30)

    # -- removal --------------------------------------------------------------------------

    def close(self) -> list[str]:
        """Remove everything the run created; what could not be removed, one line each."""
        problems: list[str] = []
        for process in self._processes:
            self._attempt(problems, f"stopping pid {process.pid}", self.stop, process.pid)
        for name, slot in self._connectors.items():
            self._attempt(problems, f"deleting connector {name}", self._remove_connector, name)
            self._attempt(problems, f"dropping slot {slot}", drop_slot,
                          self.stack.postgres_dsn, slot)
        self._attempt(problems, "dropping tables, publications, role", self._drop_postgres)
        self._attempt(problems, "deleting topics and groups", self._drop_kafka)
        self.connect.close()
        return problems

    def _remove_connector(self, name: str) -> None:
        # Stopped first, so that its offsets can be removed too: Connect keeps them after a
        # delete, in the shared worker's offsets topic.
        self.connect.stop(name)
        self.connect.wait_for_state(name, "STOPPED", timeout=60, poll_interval=0.5)
        self.connect.reset_offsets(name)
        self.connect.delete(name)

    @staticmethod
    def _attempt(problems: list[str], what: str, action: Any, *args: Any) -> None:
        try:
            action(*args)
        except Exception as error:  # one failure must not keep the rest in place
            problems.append(f"{what}: {type(error).__name__}: {error}")

    def _drop_postgres(self) -> None:
        with psycopg.connect(self.stack.postgres_dsn, autocommit=True) as conn:
            for publication in self._publications:
                conn.execute(psycopg.sql.SQL("DROP PUBLICATION IF EXISTS {}").format(
                    psycopg.sql.Identifier(publication)))
            for table in self._tables:
                conn.execute(psycopg.sql.SQL("DROP TABLE IF EXISTS {}").format(
                    table_identifier(table)))
            if conn.execute("SELECT FROM pg_roles WHERE rolname = %s",
                            (self.role,)).fetchone() is not None:
                role = psycopg.sql.Identifier(self.role)
                conn.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(role))
                conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(role))

    def _drop_kafka(self) -> None:
        delete_topics(self.admin.admin, [self.dashed, f"__debezium-heartbeat.{self.dashed}"])
        delete_groups(self.admin.admin, self._groups)


def delete_topics(admin: AdminClient, prefixes: list[str]) -> None:
    """Delete every topic whose name starts with one of `prefixes`."""
    topics = [topic for topic in admin.list_topics(timeout=30).topics
              if topic.startswith(tuple(prefixes))]
    for future in (admin.delete_topics(topics).values() if topics else ()):
        future.result(timeout=60)


def delete_groups(admin: AdminClient, groups: list[str], timeout_s: float = 60) -> None:
    """Delete those of `groups` that exist, waiting for static members to time out."""
    existing = {group.group_id for group in admin.list_consumer_groups().result().valid}
    groups = [group for group in groups if group in existing]
    # The router's members are static (group.instance.id): leaving does not remove them, the
    # broker does after session.timeout.ms (10 s), and until then the group is not empty.
    deadline = time.monotonic() + timeout_s
    while groups:
        left = []
        for group, future in admin.delete_consumer_groups(groups).items():
            try:
                future.result(timeout=30)
            except KafkaException as error:
                if (error.args[0].code() != KafkaError.NON_EMPTY_GROUP
                        or time.monotonic() > deadline):
                    raise
                left.append(group)
        groups = left
        if groups:
            time.sleep(2)


def outbox_row(event_id: str, seq: int) -> tuple[str, str, str, str, str]:
    """(id, aggregatetype, aggregateid, type, payload) of the benchmark's row number `seq`."""
    return (event_id, "Order", f"order-{seq % 500}", "OrderPaid",
            json.dumps({"order": seq % 500, "seq": seq, "total": "12.50"}))


def leftover_objects(stack: StackEndpoints, prefix: str) -> list[str]:
    """Slots, publications, tables and connectors whose name starts with `prefix`."""
    found = []
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        for query in ("SELECT slot_name FROM pg_replication_slots",
                      "SELECT pubname FROM pg_publication",
                      "SELECT tablename FROM pg_tables WHERE schemaname = 'public'",
                      "SELECT rolname FROM pg_roles"):
            found += [str(row[0]) for row in conn.execute(query) if str(row[0]).startswith(prefix)]
    with ConnectClient(stack.connect_url) as connect:
        found += [name for name in connect.list() if name.startswith(prefix.replace("_", "-"))]
    return found
