"""Cleanup of delivered outbox rows on the real stack: delete, retention, crashes, outages."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from confluent_kafka import OFFSET_BEGINNING, Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from prometheus_client import CollectorRegistry
from psycopg import sql

from cdc_router.cli import main
from cdc_router.config.cleanup import CleanupSettings
from cdc_router.errors import ConfigError
from cdc_router.local import process
from cdc_router.local.config import load_saved
from cdc_router.outbox.table import OutboxSchema
from cdc_router.outbox.tools import outbox_stats
from cdc_router.router.cleanup import OutboxCleaner
from cdc_router.router.values import Delivered
from tests.integration.pipeline import REPO, Pipeline, pipeline
from tests.integration.support import (
    StackEndpoints,
    create_outbox_table,
    drop_outbox_table,
    unique,
)

pytestmark = pytest.mark.integration


def _orders(count: int) -> list[tuple[str, str, str, dict[str, int]]]:
    return [("Order", f"order-{i % 50}", "OrderPaid", {"seq": i}) for i in range(count)]


def _cleanup(stack: StackEndpoints, **extra: object) -> dict[str, object]:
    return {"cleanup": {"dsn": stack.postgres_dsn, "interval_ms": 100, **extra}}


def _remaining(pipe: Pipeline) -> set[str]:
    with psycopg.connect(pipe.stack.postgres_dsn) as conn:
        rows = conn.execute(f"SELECT id::text FROM public.{pipe.table}").fetchall()
    return {row[0] for row in rows}


def _wait_until_empty(pipe: Pipeline, timeout_s: float = 60) -> set[str]:
    deadline = time.monotonic() + timeout_s
    left = _remaining(pipe)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _remaining(pipe)
    return left


def test_delete_empties_the_table_and_deletes_never_reach_kafka(stack: StackEndpoints,
                                                                tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, config=_cleanup(stack, mode="delete")) as pipe:
        _point_cleanup_at(pipe)
        pipe.start_router()
        ids = pipe.insert(_orders(10_000))
        assert len(pipe.read(pipe.orders_topic, 10_000)) == 10_000
        left = _wait_until_empty(pipe)
        raw = pipe.read_all(pipe.raw_topic, settle_s=3)
    assert left == set(), f"{len(left)} rows left; router log:\n{pipe.router_log()[-2000:]}"
    assert len(raw) == len(ids), "the deletes appeared on the raw topic"
    assert {json.loads(r.value())["op"] for r in raw} == {"c"}


def test_retention_removes_rows_after_it_and_not_before(stack: StackEndpoints,
                                                        tmp_path: Path) -> None:
    config = _cleanup(stack, mode="retention", retention_ms=2_000, batch_size=50)
    with pipeline(stack, tmp_path, config=config) as pipe:
        _point_cleanup_at(pipe)
        pipe.start_router()
        pipe.insert(_orders(300), per_transaction=10)
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            created = dict(conn.execute(
                f"SELECT id::text, created_at FROM public.{pipe.table}").fetchall())
            gone_at = {}
            deadline = time.monotonic() + 60
            while len(gone_at) < len(created) and time.monotonic() < deadline:
                now, = conn.execute("SELECT now() AT TIME ZONE 'UTC'").fetchone()
                present = {row[0] for row in conn.execute(
                    f"SELECT id::text FROM public.{pipe.table}").fetchall()}
                for event_id in created.keys() - present - gone_at.keys():
                    gone_at[event_id] = now
                time.sleep(0.1)
    assert len(gone_at) == len(created), "rows older than the retention were not removed"
    early = [i for i, t in gone_at.items() if (t - created[i]).total_seconds() < 2.0]
    assert early == [], f"{len(early)} rows removed before 2 s"


# Kill timings are random but replayable: a failure message names the seed.
SEED = int(os.environ.get("CDC_ROUTER_TEST_SEED", "20240612"))


def _committed_keys(pipe: Pipeline, topic: str, timeout_s: float = 60) -> set[str]:
    """Keys of every record committed on `topic` so far, read by assigned partitions.

    The end is the last stable offset: everything committed below the oldest open transaction
    (a killed router's stays open until its successor fences it). No idle clock, no group.
    """
    bootstrap = pipe.stack.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
    futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest()
                                  for p in partitions},
                                 isolation_level=IsolationLevel.READ_COMMITTED,
                                 request_timeout=30)
    ends = {tp.partition: future.result().offset for tp, future in futures.items()}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("keys"),
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    keys: set[str] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                if not message.error():
                    keys.add((message.key() or b"").decode())
            behind = [tp for tp in consumer.position(
                [TopicPartition(topic, p) for p in ends]) if tp.offset < ends[tp.partition]]
            if not behind or all(consumer.get_watermark_offsets(tp, timeout=10)[0]
                                 >= ends[tp.partition] for tp in behind):
                return keys
            assert time.monotonic() < deadline, f"{topic} not read to its end in {timeout_s}s"
    finally:
        consumer.close()


def _assert_only_delivered_rows_gone(pipe: Pipeline, ids: list[str], when: str) -> None:
    # In this order: the ids first (a writer thread may fill the list only now, after the
    # table was read: its rows would look gone), then the table, then the destination (a row
    # deleted after the table was read was delivered before the destination is read).
    written = set(ids)
    left = _remaining(pipe)
    delivered = _committed_keys(pipe, pipe.orders_topic)
    gone = written - left
    assert gone <= delivered, f"{when}: {len(gone - delivered)} rows deleted before delivery"


def test_kill_9_during_delete_never_removes_an_undelivered_row_and_leaks_none(
        stack: StackEndpoints, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    with pipeline(stack, tmp_path, config=_cleanup(stack, mode="delete")) as pipe:
        _point_cleanup_at(pipe)
        pipe.start_router(wait=True)
        ids: list[str] = []
        rows = _orders(10_000)

        def write() -> None:  # ids published per committed transaction, not all at the end
            for start in range(0, len(rows), 100):
                ids.extend(pipe.insert(rows[start:start + 100]))

        writer = threading.Thread(target=write)
        writer.start()
        for kill in range(5):
            time.sleep(rng.uniform(0.5, 2.0))
            pipe.kill_router()
            _assert_only_delivered_rows_gone(pipe, ids, f"seed {SEED}, kill {kill}")
            pipe.start_router(wait=True)
        writer.join()
        assert len(pipe.read(pipe.orders_topic, 10_000)) == 10_000
        # The backlog is drained: every row is delivered, so none may stay, not even those a
        # killed instance had committed but not deleted (the sweep reads them back).
        left = _wait_until_empty(pipe, timeout_s=120)
        delivered = _committed_keys(pipe, pipe.orders_topic)
    assert set(ids) - left <= delivered
    assert left == set(), (f"seed {SEED}: {len(left)} delivered rows stay in the outbox; "
                           f"router log:\n{pipe.router_log()[-2000:]}")


def _count(pipe: Pipeline) -> int:
    with psycopg.connect(pipe.stack.postgres_dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM public.{pipe.table}").fetchone()
    assert row is not None
    return int(row[0])


def test_rows_a_killed_router_delivered_are_deleted_after_all(stack: StackEndpoints,
                                                              tmp_path: Path) -> None:
    # Each kill lands while the router is deleting rows it has just committed: those ids
    # lived only in the killed process's memory; the next instance reads them back from the
    # changelog. The backlog is captured first, so that every life of the router routes.
    # 60,000 rows: a life routes until its first deletes show, plus a moment; on a run where
    # the cleanup's first deletes came late, two lives routed all of 20,000.
    rng = random.Random(SEED)
    total = 60_000
    with pipeline(stack, tmp_path, config=_cleanup(stack, mode="delete")) as pipe:
        _point_cleanup_at(pipe)
        ids = pipe.insert(_orders(total), 500)
        assert len(pipe.read(pipe.raw_topic, total)) == total
        kills = 0
        for kill in range(5):
            pipe.start_router()
            before = _count(pipe)
            deadline = time.monotonic() + 120
            while _count(pipe) == before and time.monotonic() < deadline:
                time.sleep(0.05)
            if _count(pipe) == 0:
                break  # all routed already: nothing left to kill during
            time.sleep(rng.uniform(0.05, 0.3))
            pipe.kill_router()
            kills += 1
            _assert_only_delivered_rows_gone(pipe, ids, f"seed {SEED}, kill {kill}")
        pipe.start_router()
        assert len(pipe.read(pipe.orders_topic, total)) == total
        left = _wait_until_empty(pipe, timeout_s=120)
    assert kills >= 3, f"seed {SEED}: the router was killed only {kills} times while routing"
    assert left == set(), (f"seed {SEED}: {len(left)} delivered rows stay in the outbox after "
                           f"{kills} kills; router log:\n{pipe.router_log()[-2000:]}")


@pytest.mark.parametrize("mode", ["delete", "retention"])
def test_a_row_dated_in_the_future_holds_up_no_delete_and_dead_letters_stay(
        stack: StackEndpoints, tmp_path: Path, mode: str) -> None:
    # 50 minutes ahead: still within the broker's message.timestamp.after.max.ms (1 hour), so
    # the row is delivered (and, with a retention, stays: it is not old enough). The oversized
    # row is dead-lettered: its id is in the changelog, which the sweep reads, and its row must
    # stay all the same.
    retention = {"retention_ms": 2_000} if mode == "retention" else {}
    config = {**_cleanup(stack, mode=mode, **retention), "delivery": {"max_payload_bytes": 1000}}
    with pipeline(stack, tmp_path, config=config) as pipe:
        _point_cleanup_at(pipe)
        pipe.start_router()
        ids = pipe.insert(_orders(100))
        future = str(uuid.uuid4())
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"INSERT INTO public.{pipe.table} (id, aggregatetype, aggregateid, "
                         "type, payload, created_at) VALUES (%s, 'Order', 'order-x', "
                         "'OrderPaid', '{}', (now() AT TIME ZONE 'UTC') + interval '50 minutes')",
                         (future,))
        ids += pipe.insert([("Order", "order-y", "OrderPaid", {"pad": "x" * 2000})]) + \
            pipe.insert(_orders(100))
        poison = ids[100]
        expected = {poison} if mode == "delete" else {poison, future}
        assert len(pipe.read(pipe.orders_topic, 201)) == 201
        assert len(pipe.read(pipe.dlq_topic, 1)) == 1
        deadline = time.monotonic() + 60
        left = _remaining(pipe)
        while left != expected and time.monotonic() < deadline:
            time.sleep(0.2)
            left = _remaining(pipe)
        time.sleep(3)  # a sweep that would wrongly delete the dead-lettered row has had time
        left = _remaining(pipe)
    assert left == expected, f"{len(left)} rows left; router log:\n{pipe.router_log()[-2000:]}"


@pytest.mark.exclusive  # it stops the shared Postgres
def test_postgres_outage_routing_goes_on_and_cleanup_catches_up(stack: StackEndpoints,
                                                                tmp_path: Path) -> None:
    home = Path(os.environ.get("CDC_ROUTER_HOME", REPO / ".cdc-router")).resolve()
    local = load_saved(home)
    if local is None or local.postgres_dsn != stack.postgres_dsn:
        pytest.skip("needs the local stack, whose Postgres this test stops")
    with pipeline(stack, tmp_path, config=_cleanup(stack, mode="delete")) as pipe:
        _point_cleanup_at(pipe)
        ids = pipe.insert(_orders(5_000))
        assert len(pipe.read(pipe.raw_topic, 5_000)) == 5_000  # captured before the outage
        pid = process.read_pid(local.pid_path("postgres"))
        assert pid is not None
        process.stop(pid, str(local.home), sig=signal.SIGINT)
        stopped_at = time.monotonic()
        try:
            pipe.start_router()
            routed = pipe.read(pipe.orders_topic, 5_000, timeout_s=90)  # a slow start too
            time.sleep(max(0.0, 30 - (time.monotonic() - stopped_at)))
        finally:
            subprocess.run([sys.executable, "-m", "cdc_router", "local", "up", "--home",
                            str(home)], check=True, capture_output=True, cwd=REPO)
        assert len(routed) == 5_000, "routing stopped while Postgres was down"
        left = _wait_until_empty(pipe, timeout_s=90)
        log = pipe.router_log()
    assert left == set(), f"{len(left)} of {len(ids)} rows left after Postgres came back"
    assert "event=cleanup_failed" in log


@pytest.mark.parametrize(("cleanup", "outbox", "expected"), [
    ({"table": "public.no_such_outbox"}, {},
     "field 'cleanup.table': the outbox table does not exist (or is not readable) "
     "(got 'public.no_such_outbox')"),
    ({}, {"id": "event_id"}, "field 'source.outbox.id': the outbox table public.{table} has "
     "no column 'event_id' (got 'event_id'); name the table's column (it has id, "),
    ({"mode": "retention", "retention_ms": 1000}, {"created_at": "occurred_at"},
     "field 'source.outbox.created_at': the outbox table public.{table} has no column "
     "'occurred_at'"),
    # Review 43-2: both were taken for an outage, warned of, and retried for ever.
    ({"dsn": "wrong password"}, {}, "field 'cleanup.dsn': Postgres refuses the cleanup: "),
    ({"dsn": "may only read"}, {}, "field 'cleanup.table': the connection's role may not "
     "DELETE from the outbox table (or SELECT its columns) (got 'public.{table}'); GRANT "
     "SELECT, DELETE ON it TO that role"),
])
def test_a_cleanup_table_or_column_postgres_lacks_stops_run_at_start_with_one_line(
        stack: StackEndpoints, tmp_path: Path, cleanup: dict[str, object],
        outbox: dict[str, str], expected: str) -> None:
    # Review 43: the worker retried the DELETE for ever ("app.outbox does not exist") while
    # routing went on and the outbox grew; the warning named no setting.
    table = unique("cl")
    create_outbox_table(stack.postgres_dsn, table)
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {table} LOGIN PASSWORD 'reader'")
        conn.execute(f"GRANT SELECT ON public.{table} TO {table}")
    role = {"wrong password": {"password": "wrong"},
            "may only read": {"user": table, "password": "reader"}}.get(str(cleanup.get("dsn")))
    if role is not None:
        cleanup = {**cleanup, "dsn": psycopg.conninfo.make_conninfo(stack.postgres_dsn, **role)}
    config = {"kafka": {"bootstrap_servers": stack.bootstrap_servers},
              "source": {"topics": [f"{table}.public.{table}"], "group_id": table,
                         "outbox": outbox},
              "routes": [{"topic": f"{table}-events"}],
              "cleanup": {"mode": "delete", "dsn": stack.postgres_dsn,
                          "table": f"public.{table}", **cleanup}}
    path = tmp_path / "router.yaml"
    path.write_text(json.dumps(config))
    try:
        result = subprocess.run(
            [sys.executable, "-m", "cdc_router", "run", "-c", str(path), "--metrics-port", "0"],
            capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    finally:
        drop_outbox_table(stack.postgres_dsn, table)
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {table}")
    assert result.returncode == 1, result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ") and expected.format(table=table) in error, result.stderr
    assert "Traceback" not in result.stderr


def _point_cleanup_at(pipe: Pipeline) -> None:
    import yaml

    config = yaml.safe_load(pipe.config_path.read_text())
    config["cleanup"]["table"] = f"public.{pipe.table}"
    pipe.config_path.write_text(yaml.safe_dump(config))


def _created_table(dsn: str, name: str) -> sql.Identifier:
    table = sql.Identifier("public", name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),"
                             " created_at timestamp(6) NOT NULL)").format(table))
    return table


def _drop(dsn: str, table: sql.Identifier) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(table))


# The table as the user writes it: lower case, mixed case as is, mixed case in SQL's quotes.
SPELLINGS = [("purge_{}", "public.{}"), ("Purge_{}", "public.{}"), ("Purge_{}", 'public."{}"')]


@pytest.mark.parametrize(("name", "spelling"), SPELLINGS)
def test_outbox_stats_and_purge_remove_only_older_rows(stack: StackEndpoints, name: str,
                                                       spelling: str) -> None:
    name = name.format(f"{os.getpid()}_{random.randrange(10**6)}")
    table = _created_table(stack.postgres_dsn, name)
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {} (created_at) SELECT (now() AT TIME ZONE 'UTC')"
                             " - make_interval(hours => g) FROM generate_series(1, 30) g"
                             ).format(table))
        conn.execute(sql.SQL("INSERT INTO {} (created_at) SELECT now() AT TIME ZONE 'UTC'"
                             " FROM generate_series(1, 5)").format(table))
    env = {**os.environ, "CDC_ROUTER_PG_DSN": stack.postgres_dsn}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cdc_router", "outbox", *args, "--table",
                               spelling.format(name)], capture_output=True, text=True, env=env,
                              cwd=REPO, check=False)

    try:
        stats = cli("stats", "-o", "json")
        assert stats.returncode == 0, stats.stderr
        before = json.loads(stats.stdout)
        dry = cli("purge", "--older-than", "630m", "--dry-run")
        purged = cli("purge", "--older-than", "630m", "--batch-size", "7", "--yes")
        after = json.loads(cli("stats", "-o", "json").stdout)
    finally:
        _drop(stack.postgres_dsn, table)
    assert before["rows"] == 35 and before["oldest_age_s"] > 29 * 3600
    assert "20 rows" in dry.stdout, dry.stdout + dry.stderr
    assert "deleted 20 rows" in purged.stdout, purged.stdout + purged.stderr
    assert after["rows"] == 15 and after["oldest_age_s"] < 10.5 * 3600


def test_outbox_stats_and_purge_of_a_partitioned_outbox(
        stack: StackEndpoints) -> None:
    # QA 53-h F2: the chunked delete matched ctids alone, unique only within one partition: a
    # fresh row at the place of an old row in another partition went too (here 5 counted, 10 gone).
    name = f"purge_part_{os.getpid()}_{random.randrange(10**6)}"
    table = sql.Identifier("public", name)
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id uuid NOT NULL DEFAULT gen_random_uuid(), "
                             "created_at timestamp(6) NOT NULL, PRIMARY KEY (id, created_at)) "
                             "PARTITION BY RANGE (created_at)").format(table))
        for suffix, bounds in (("old", "FROM (MINVALUE) TO ('2020-01-01')"),
                               ("new", "FROM ('2020-01-01') TO (MAXVALUE)")):
            conn.execute(sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES " + bounds).format(
                sql.Identifier("public", f"{name}_{suffix}"), table))
        # Both partitions' rows sit at ctids (0,1), (0,2), ...: the old ones' places are taken
        # in the new partition too.
        conn.execute(sql.SQL("INSERT INTO {} (created_at) SELECT timestamp '2019-06-01' + "
                             "make_interval(days => g) FROM generate_series(1, 5) g").format(table))
        fresh = {row[0] for row in conn.execute(sql.SQL(
            "INSERT INTO {} (created_at) SELECT now() AT TIME ZONE 'UTC' "
            "FROM generate_series(1, 8) RETURNING id::text").format(table))}
    env = {**os.environ, "CDC_ROUTER_PG_DSN": stack.postgres_dsn}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cdc_router", "outbox", *args, "--table",
                               f"public.{name}"], capture_output=True, text=True, env=env,
                              cwd=REPO, check=False)

    try:
        stats = cli("stats", "-o", "json")
        dry = cli("purge", "--older-than", "1d", "--dry-run")
        purged = cli("purge", "--older-than", "1d", "--batch-size", "2", "--yes")
        with psycopg.connect(stack.postgres_dsn) as conn:
            left = {row[0] for row in conn.execute(
                sql.SQL("SELECT id::text FROM {}").format(table))}
    finally:
        _drop(stack.postgres_dsn, table)
    assert "5 rows" in dry.stdout, dry.stdout + dry.stderr
    assert "deleted 5 rows" in purged.stdout, purged.stdout + purged.stderr
    assert left == fresh
    # QA 53-h F1: the root's own size, 0 B; the partitions' (each at least a page of 8 KiB).
    assert json.loads(stats.stdout)["table_bytes"] >= 2 * 8192, stats.stdout + stats.stderr


@pytest.mark.parametrize("column_type", ["timestamp(6)", "timestamptz(6)"])
def test_outbox_purge_deletes_only_the_rows_it_counted_before_asking(
        stack: StackEndpoints, column_type: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The count's cutoff was taken before the question and the delete's after the answer:
    # rows that aged past the window while the person read went too.
    name = f"purge_ask_{os.getpid()}_{random.randrange(10**6)}"
    table = sql.Identifier("public", name)
    now = sql.SQL("now()" if column_type.startswith("timestamptz") else
                  "(now() AT TIME ZONE 'UTC')")
    insert = sql.SQL("INSERT INTO {} (created_at) SELECT {} - %s::interval "
                     "FROM generate_series(1, %s)").format(table, now)
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), "
                             "created_at {} NOT NULL)").format(table, sql.SQL(column_type)))
        conn.execute(insert, ("1 hour", 4))

    def answer_slowly(question: str, yes: bool) -> None:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(insert, ("0 seconds", 3))
        time.sleep(2.5)  # the new rows are older than the 2 s window by the answer

    monkeypatch.setattr("cdc_router.cli.outbox.confirm", answer_slowly)
    try:
        done = CliRunner().invoke(main, ["outbox", "purge", "--dsn", stack.postgres_dsn,
                                         "--table", f"public.{name}", "--older-than", "2s"])
        with psycopg.connect(stack.postgres_dsn) as conn:
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
    finally:
        _drop(stack.postgres_dsn, table)
    assert done.exit_code == 0, done.output
    assert "4 rows" in done.output and "deleted 4 rows" in done.output, done.output
    assert row == (3,)


def test_outbox_purge_of_a_relays_outbox_needs_force(stack: StackEndpoints) -> None:
    # Review 44: the relay deletes each row it delivered, so its outbox's rows are events not
    # delivered yet; purge said "Debezium took each event from the WAL" and lost them.
    name = f"purge_relay_{os.getpid()}_{random.randrange(10**6)}"
    table = sql.Identifier("public", name)
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), "
                             "created_at timestamptz NOT NULL, txid xid8 NOT NULL DEFAULT "
                             "pg_current_xact_id())").format(table))
        conn.execute(sql.SQL("INSERT INTO {} (created_at) SELECT now() - interval '1 hour' "
                             "FROM generate_series(1, 3)").format(table))
    purge = ["outbox", "purge", "--dsn", stack.postgres_dsn, "--table", f"public.{name}",
             "--older-than", "1m", "--yes"]
    try:
        refused = CliRunner().invoke(main, purge)
        dry = CliRunner().invoke(main, [*purge[:-1], "--dry-run"])
        with psycopg.connect(stack.postgres_dsn) as conn:
            kept = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
        forced = CliRunner().invoke(main, [*purge, "--force"])
    finally:
        _drop(stack.postgres_dsn, table)
    assert refused.exit_code != 0 and kept == (3,), refused.output
    assert "relay's outbox" in refused.output and "--force" in refused.output, refused.output
    assert "Traceback" not in refused.output
    assert dry.exit_code == 0 and "3 rows" in dry.output, dry.output
    assert forced.exit_code == 0 and "deleted 3 rows" in forced.output, forced.output


@pytest.mark.parametrize(("name", "spelling"), SPELLINGS[1:])
def test_the_cleaner_deletes_from_a_mixed_case_table(stack: StackEndpoints, name: str,
                                                     spelling: str) -> None:
    name = name.format(f"{os.getpid()}_{random.randrange(10**6)}")
    table, ids, cleaner = _twenty_rows_and_a_cleaner(stack.postgres_dsn, name,
                                                     spelling.format(name))
    left, _ = _clean(cleaner, [Delivered(event_id, "t", None) for event_id in ids[:15]],
                     stack.postgres_dsn, table)
    assert left == set(ids[15:])


def _twenty_rows_and_a_cleaner(dsn: str, name: str, spelling: str
                               ) -> tuple[sql.Identifier, list[str], OutboxCleaner]:
    """A new table `name` of 20 rows created now, their ids, and a delete-mode cleaner of the
    table as `spelling` names it."""
    table = _created_table(dsn, name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = [str(row[0]) for row in conn.execute(sql.SQL(
            "INSERT INTO {} (created_at) SELECT now() AT TIME ZONE 'UTC' FROM "
            "generate_series(1, 20) RETURNING id").format(table))]
    cleaner = OutboxCleaner(CleanupSettings(mode="delete", dsn=dsn, table=spelling,
                                            interval_ms=100),
                            id_column="id", created_at_column="created_at",
                            registry=CollectorRegistry())
    return table, ids, cleaner


def _clean(cleaner: OutboxCleaner, delivered: list[Delivered], dsn: str,
           table: sql.Identifier) -> tuple[set[str], int]:
    """Run `cleaner` on `delivered` until nothing is pending (20 s at most), then drop `table`;
    (the ids left in it, the ids still pending)."""
    cleaner.start()
    try:
        cleaner.delivered(delivered)
        deadline = time.monotonic() + 20
        while cleaner.pending_count() and time.monotonic() < deadline:
            time.sleep(0.1)
        pending = cleaner.pending_count()
    finally:
        cleaner.stop()
        with psycopg.connect(dsn, autocommit=True) as conn:
            left = {str(row[0]) for row in conn.execute(
                sql.SQL("SELECT id FROM {}").format(table))}
        _drop(dsn, table)
    return left, pending


def test_retention_keeps_rows_that_never_age_and_goes_on_deleting_the_others(
        stack: StackEndpoints) -> None:
    # created_at 'infinity' or NULL never grows retention_ms old; before, the cleaner failed on
    # 'infinity' (cannot convert infinity to bigint) and on NULL, and retried that batch for
    # ever; `outbox stats` (and `status`) failed on 'infinity' (cannot subtract infinite
    # timestamps).
    name = f"ageless_{os.getpid()}_{random.randrange(10**6)}"
    table = _created_table(stack.postgres_dsn, name)
    insert = sql.SQL("INSERT INTO {} (created_at) VALUES (%s) RETURNING id").format(table)
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN created_at DROP NOT NULL").format(table))
        ageless = [str(conn.execute(insert, (created,)).fetchone()[0])  # type: ignore[index]
                   for created in ("infinity", None)]
        old = [str(row[0]) for row in conn.execute(sql.SQL(
            "INSERT INTO {} (created_at) SELECT (now() AT TIME ZONE 'UTC') - interval '1 hour' "
            "FROM generate_series(1, 10) RETURNING id").format(table))]
        stats = outbox_stats(conn, OutboxSchema(table=f"public.{name}"))
    cleaner = OutboxCleaner(CleanupSettings(mode="retention", retention_ms=60_000,
                                            dsn=stack.postgres_dsn, table=f"public.{name}",
                                            interval_ms=100),
                            id_column="id", created_at_column="created_at",
                            registry=CollectorRegistry())
    # Due at once by the router's clock (created an hour ago): Postgres's created_at decides.
    hour_ago_ms = int(time.time() * 1000) - 3_600_000
    left, pending = _clean(cleaner, [Delivered(event_id, "t", hour_ago_ms)
                                     for event_id in ageless + old], stack.postgres_dsn, table)
    assert left == set(ageless)
    assert pending == 0, "the rows that never age are not waited for again"
    assert stats.rows == 12 and stats.oldest_age_s is not None and stats.oldest_age_s > 3500


def test_a_timestamptz_created_at_ages_right_in_a_session_outside_utc(
        stack: StackEndpoints) -> None:
    # Compared with `now() AT TIME ZONE 'UTC'`, a timestamptz column was read in the session's
    # TimeZone: in New York, `purge --older-than 1h` deleted rows 10 minutes old, and the
    # retention cleanup deleted rows 5 hours early (review, session 25).
    dsn = psycopg.conninfo.make_conninfo(stack.postgres_dsn,
                                         options="-c TimeZone=America/New_York")
    name = f"zoned_{os.getpid()}_{random.randrange(10**6)}"
    table = sql.Identifier("public", name)
    insert = sql.SQL("INSERT INTO {} (created_at) SELECT now() - %s::interval "
                     "FROM generate_series(1, 10) RETURNING id").format(table)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), "
                             "created_at timestamptz(6) NOT NULL)").format(table))
        old = [str(row[0]) for row in conn.execute(insert, ("2 hours",))]
        young = [str(row[0]) for row in conn.execute(insert, ("10 minutes",))]
        stats = outbox_stats(conn, OutboxSchema(table=f"public.{name}"))
    env = {**os.environ, "CDC_ROUTER_PG_DSN": dsn}
    try:
        assert stats.oldest_age_s is not None and 7100 < stats.oldest_age_s < 7300
        dry = subprocess.run([sys.executable, "-m", "cdc_router", "outbox", "purge", "--table",
                              f"public.{name}", "--older-than", "1h", "--dry-run"],
                             capture_output=True, text=True, env=env, cwd=REPO, check=False)
        assert dry.returncode == 0 and "10 rows" in dry.stdout, dry.stdout + dry.stderr
        cleaner = OutboxCleaner(CleanupSettings(mode="retention", retention_ms=3_600_000,
                                                dsn=dsn, table=f"public.{name}",
                                                interval_ms=100),
                                id_column="id", created_at_column="created_at",
                                registry=CollectorRegistry())
        # Due at once by the router's clock; Postgres's created_at decides.
        day_ago_ms = int(time.time() * 1000) - 86_400_000
        cleaner.start()
        try:
            cleaner.delivered([Delivered(event_id, "t", day_ago_ms) for event_id in old + young])
            deadline = time.monotonic() + 20
            left = set(old)
            while left & set(old) and time.monotonic() < deadline:
                time.sleep(0.1)
                with psycopg.connect(dsn) as conn:
                    left = {str(row[0]) for row in conn.execute(
                        sql.SQL("SELECT id FROM {}").format(table))}
            time.sleep(0.5)  # a few more rounds: the young rows must stay
        finally:
            cleaner.stop()
        with psycopg.connect(dsn) as conn:
            left = {str(row[0]) for row in conn.execute(sql.SQL("SELECT id FROM {}").format(table))}
    finally:
        _drop(stack.postgres_dsn, table)
    assert left == set(young)


def test_ids_the_id_column_cannot_hold_leave_the_rest_of_their_batch_deleted(
        stack: StackEndpoints) -> None:
    # One such id failed the whole DELETE, and every round retried the same batch (review,
    # session 25): a raw topic shared with a table of text ids, say.
    name = f"castless_{os.getpid()}_{random.randrange(10**6)}"
    table, ids, cleaner = _twenty_rows_and_a_cleaner(stack.postgres_dsn, name, f"public.{name}")
    delivered = [Delivered(event_id, "t", None)
                 for event_id in [*ids[:5], "order-17", "nul\x00id", *ids[5:15]]]
    left, pending = _clean(cleaner, delivered, stack.postgres_dsn, table)
    assert left == set(ids[15:]) and pending == 0


def test_rows_a_foreign_key_or_a_trigger_keeps_leave_the_rest_of_their_batch_deleted(
        stack: StackEndpoints) -> None:
    # Review 45: only an id the column cannot hold was tried one by one; a row another table's
    # foreign key points at, or one a trigger refuses to delete, failed its whole batch at
    # every round, and no delivered row was deleted again.
    name = f"kept_{os.getpid()}_{random.randrange(10**6)}"
    table, ids, cleaner = _twenty_rows_and_a_cleaner(stack.postgres_dsn, name, f"public.{name}")
    child = sql.Identifier(f"{name}_child")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (parent uuid REFERENCES {} (id))").format(
            child, table))
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s)").format(child), (ids[3],))
        conn.execute(sql.SQL(
            "CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF OLD.id = '{}' THEN RAISE EXCEPTION 'kept by policy'; END IF; RETURN OLD; END $$"
        ).format(sql.Identifier(f"{name}_keep"), sql.SQL(ids[7])))
        conn.execute(sql.SQL("CREATE TRIGGER keep BEFORE DELETE ON {} FOR EACH ROW "
                             "EXECUTE FUNCTION {}()").format(
            table, sql.Identifier(f"{name}_keep")))
    try:
        left, pending = _clean(cleaner, [Delivered(event_id, "t", None) for event_id in ids[:15]],
                               stack.postgres_dsn, table)
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(child))
            conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}() CASCADE").format(
                sql.Identifier(f"{name}_keep")))
    assert left == {ids[3], ids[7], *ids[15:]} and pending == 0


def test_a_row_locked_elsewhere_holds_the_deletes_with_a_warning_then_they_catch_up(
        stack: StackEndpoints, caplog: pytest.LogCaptureFixture) -> None:
    # QA, session 25: a session holding one row's lock (FOR UPDATE, idle in transaction) held
    # every instance's cleanup for as long as it lasted, with no line in any log.
    name = f"locked_{os.getpid()}_{random.randrange(10**6)}"
    table, ids, cleaner = _twenty_rows_and_a_cleaner(stack.postgres_dsn, name, f"public.{name}")
    with psycopg.connect(stack.postgres_dsn) as holder:
        holder.execute(sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(table),
                       (ids[0],))
        cleaner.start()
        try:
            cleaner.delivered([Delivered(event_id, "t", None) for event_id in ids])
            deadline = time.monotonic() + 30
            while "holds a lock on rows to delete" not in caplog.text:
                assert time.monotonic() < deadline, "no warning while the lock is held"
                time.sleep(0.2)
            holder.rollback()  # the lock goes
            deadline = time.monotonic() + 30
            while cleaner.pending_count() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            cleaner.stop()
    with psycopg.connect(stack.postgres_dsn) as conn:
        left = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
    _drop(stack.postgres_dsn, table)
    assert left == (0,)


def test_an_id_column_whose_type_changes_under_the_cleaner_is_read_again(
        stack: StackEndpoints) -> None:
    # QA, session 26: the types were read once; after ALTER COLUMN id TYPE text every DELETE
    # failed (`text = uuid`) until the router restarted.
    name = f"retyped_{os.getpid()}_{random.randrange(10**6)}"
    table, ids, cleaner = _twenty_rows_and_a_cleaner(stack.postgres_dsn, name, f"public.{name}")

    def drained() -> int:
        deadline = time.monotonic() + 20  # bounds a hang; asserts nothing about speed
        while cleaner.pending_count() and time.monotonic() < deadline:
            time.sleep(0.1)
        return cleaner.pending_count()

    cleaner.start()
    try:
        cleaner.delivered([Delivered(event_id, "t", None) for event_id in ids[:5]])
        assert drained() == 0
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN id TYPE text").format(table))
        cleaner.delivered([Delivered(event_id, "t", None) for event_id in ids[5:15]])
        pending = drained()
    finally:
        cleaner.stop()
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            left = {str(row[0]) for row in conn.execute(
                sql.SQL("SELECT id FROM {}").format(table))}
        _drop(stack.postgres_dsn, table)
    assert left == set(ids[15:]) and pending == 0


def test_a_row_reusing_a_delivered_id_is_dropped_and_deleted_without_a_restart(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 32-a: the replay was dropped, but its row stayed until the next start's sweep.
    with pipeline(stack, tmp_path, config=_cleanup(stack, mode="delete")) as pipe:
        _point_cleanup_at(pipe)
        pipe.start_router(wait=True)
        first = pipe.insert(_orders(3))
        assert len(pipe.read(pipe.orders_topic, 3)) == 3
        assert _wait_until_empty(pipe) == set()
        with psycopg.connect(stack.postgres_dsn) as conn:
            for event_id in first[:2]:  # the ids again, in new rows
                conn.execute(f"INSERT INTO public.{pipe.table} (id, aggregatetype, aggregateid,"
                             " type, payload) VALUES (%s, 'Order', 'order-0', 'OrderPaid', "
                             "'{\"again\": true}')", (event_id,))
        fresh = pipe.insert(_orders(1))  # after them: once it is out, they were read
        delivered = pipe.read(pipe.orders_topic, 4)
        left = _wait_until_empty(pipe)
        settled = pipe.read_all(pipe.orders_topic, settle_s=2)
        log = pipe.router_log()
    assert [r.key().decode() for r in delivered][3:] == fresh
    assert sorted(r.key().decode() for r in settled) == sorted(first + fresh), log[-3000:]
    assert left == set(), f"rows of reused ids stay: {left}; {log[-3000:]}"


@pytest.mark.parametrize(("column_type", "unit", "scale"), [
    ("bigint", "millis", 1), ("bigint", "micros", 1000), ("bigint", "auto", 1),
    ("bigint", "auto", 1000), ("bigint", "auto", 1_000_000)])
def test_retention_ages_an_integer_created_at_in_its_unit(
        stack: StackEndpoints, column_type: str, unit: str, scale: int) -> None:
    # Review 49-b F5: with an integer created_at (source.created_at_unit), every retention
    # DELETE failed, `operator does not exist: bigint < timestamp without time zone`, for ever.
    name = unique("epoch")
    table = sql.Identifier("public", name)
    insert = sql.SQL("INSERT INTO {} (created_at) SELECT ((extract(epoch FROM now()) - %s) "
                     "* 1000)::bigint * %s FROM generate_series(1, 5) RETURNING id").format(table)
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), "
                             "created_at {} NOT NULL)").format(table, sql.SQL(column_type)))
        old = [str(row[0]) for row in conn.execute(insert, (7200, scale))]
        young = [str(row[0]) for row in conn.execute(insert, (600, scale))]
    cleaner = OutboxCleaner(CleanupSettings(mode="retention", retention_ms=3_600_000,
                                            dsn=stack.postgres_dsn, table=f"public.{name}",
                                            interval_ms=100),
                            id_column="id", created_at_column="created_at",
                            created_at_unit=unit, registry=CollectorRegistry())
    try:
        cleaner.check()
        cleaner.start()
        try:  # due at once by the router's clock: Postgres's created_at decides
            cleaner.delivered([Delivered(event_id, "t", int(time.time() * 1000) - 86_400_000)
                               for event_id in old + young])
            deadline, left = time.monotonic() + 20, set(old)
            while left & set(old) and time.monotonic() < deadline:
                time.sleep(0.1)
                left = _ids_in(stack.postgres_dsn, table)
            time.sleep(0.5)  # a few more rounds: the young rows must stay
        finally:
            cleaner.stop()
        left = _ids_in(stack.postgres_dsn, table)
    finally:
        _drop(stack.postgres_dsn, table)
    assert left == set(young)
    assert cleaner.pending_count() == len(young), "the young rows wait for their due time"


def test_retention_refuses_at_start_a_created_at_no_time_compares_with(
        stack: StackEndpoints) -> None:
    name = unique("textual")
    table = sql.Identifier("public", name)
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id uuid PRIMARY KEY, created_at text)").format(
            table))
    cleaner = OutboxCleaner(CleanupSettings(mode="retention", retention_ms=1000,
                                            dsn=stack.postgres_dsn, table=f"public.{name}"),
                            id_column="id", created_at_column="created_at",
                            registry=CollectorRegistry())
    try:
        with pytest.raises(ConfigError, match=r"field 'source.outbox.created_at': cleanup.mode "
                           r"retention compares created_at with Postgres's clock, and "
                           rf"public.{name}.created_at is text .*use cleanup.mode delete"):
            cleaner.check()
    finally:
        _drop(stack.postgres_dsn, table)


def _ids_in(dsn: str, table: sql.Identifier) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {str(row[0]) for row in conn.execute(sql.SQL("SELECT id FROM {}").format(table))}


@pytest.mark.parametrize("scale", [1, 1000, 1_000_000])
def test_outbox_stats_age_an_integer_created_at_and_purge_refuses_it_clearly(
        stack: StackEndpoints, scale: int) -> None:
    # QA 49-h F2: with an integer created_at, `status` and `outbox stats` failed on
    # isfinite(bigint) for ever, and `outbox purge` on `bigint < timestamp`.
    name = unique("epochstats")
    table = sql.Identifier("public", name)
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), "
                             "created_at bigint NOT NULL)").format(table))
        conn.execute(sql.SQL("INSERT INTO {} (created_at) SELECT ((extract(epoch FROM now()) "
                             "- %s) * 1000)::bigint * %s FROM generate_series(1, 3)").format(
            table), (7200, scale))
        stats = outbox_stats(conn, OutboxSchema(table=f"public.{name}"))
    env = {**os.environ, "CDC_ROUTER_PG_DSN": stack.postgres_dsn}
    try:
        assert stats.rows == 3
        assert stats.oldest_age_s is not None and 7100 < stats.oldest_age_s < 7300
        purge = subprocess.run([sys.executable, "-m", "cdc_router", "outbox", "purge", "--table",
                                f"public.{name}", "--older-than", "1h", "--dry-run"],
                               capture_output=True, text=True, env=env, cwd=REPO, check=False)
        assert purge.returncode != 0 and "Traceback" not in purge.stderr
        assert "field 'source.outbox.created_at'" in purge.stderr + purge.stdout
        assert f"public.{name}.created_at is bigint" in purge.stderr + purge.stdout
    finally:
        _drop(stack.postgres_dsn, table)
