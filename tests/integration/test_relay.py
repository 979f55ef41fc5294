"""`cdc-router relay` on the real stack: concurrent writers whose commits land out of insert
order, the active relay killed with kill -9 again and again, a standby taking over."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_router.outbox.relay_columns import relay_columns_ddl
from cdc_router.router.destinations import MISSING_RECHECK_S
from tests.integration.pipeline import REPO, pipeline
from tests.integration.relay_setup import (
    STARTED,
    WAITING,
    RelaySetup,
    relay_failing,
    relay_setup,
)
from tests.integration.support import (
    StackEndpoints,
    read_to_end,
    read_topic,
    replay_seed,
    unique,
)

pytestmark = pytest.mark.integration

WRITERS = 8
ROWS_PER_WRITER = 700
KILLS = 4


@dataclass
class _Written:
    """What the writers committed and rolled back, and when each transaction committed."""

    committed: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    commits: list[tuple[float, list[int]]] = field(default_factory=list)  # (when, seqs)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _writer(setup: RelaySetup, number: int, seed: int, written: _Written) -> None:
    """Transactions of 1 to 12 rows, with pauses inside them, a tenth rolled back; each writer
    owns its aggregates, so their events' order is this writer's commit order."""
    rng = random.Random(seed)
    done = 0
    with psycopg.connect(setup.stack.postgres_dsn) as conn:
        while done < ROWS_PER_WRITER:
            ids, seqs = [], []
            for _ in range(min(rng.randint(1, 12), ROWS_PER_WRITER - done)):
                event_id = str(uuid.uuid4())
                row = conn.execute(
                    f"INSERT INTO public.{setup.table} (id, aggregatetype, aggregateid, type, "
                    "payload) VALUES (%s, 'Order', %s, 'OrderPaid', %s::jsonb) RETURNING seq",
                    (event_id, f"w{number}-a{done % 3}", json.dumps(
                        {"writer": number, "n": done}))).fetchone()
                assert row is not None
                ids.append(event_id)
                seqs.append(int(row[0]))
                done += 1
                time.sleep(rng.uniform(0, 0.03))
            if rng.random() < 0.1:
                conn.rollback()
                done -= len(ids)  # the writer's numbers stay dense over committed rows
                with written.lock:
                    written.rolled_back += ids
                continue
            conn.commit()
            with written.lock:
                written.committed += ids
                written.commits.append((time.monotonic(), seqs))


def _out_of_order_commits(commits: list[tuple[float, list[int]]]) -> int:
    """Transactions that committed after one holding a higher seq: the relay's hard case."""
    highest, count = 0, 0
    for _, seqs in sorted(commits):
        if min(seqs) < highest:
            count += 1
        highest = max(highest, max(seqs))
    return count


def test_kill_9_of_the_active_relay_under_concurrent_writers_delivers_each_row_once(
        stack: StackEndpoints, tmp_path: Path) -> None:
    seed = replay_seed(17)
    rng = seed.random()
    written = _Written()
    takeovers: list[float] = []
    with relay_setup(stack, tmp_path) as setup:
        active, started = "a", {"a": 1, "b": 0}  # relay_started lines in each log
        setup.start("a")
        setup.wait_for("a", STARTED, 1)
        setup.start("b")
        setup.wait_for("b", WAITING, 1)
        writers = [threading.Thread(target=_writer, args=(setup, n, seed.value * 100 + n,
                                                          written)) for n in range(WRITERS)]
        for writer in writers:
            writer.start()
        for _ in range(KILLS):
            time.sleep(rng.uniform(1.5, 3.0))
            victim, standby = active, "b" if active == "a" else "a"
            setup.kill(victim)
            killed_at = time.monotonic()
            # The standby takes over: its relay_started comes after the kill.
            took_over_at = setup.wait_for(standby, STARTED, started[standby] + 1)
            started[standby] += 1
            active = standby
            takeovers.append(took_over_at - killed_at)
            waiting = setup.log(victim).count(WAITING)
            setup.start(victim)  # back as the standby
            setup.wait_for(victim, WAITING, waiting + 1)
        for writer in writers:
            writer.join()
        expected = len(written.committed)
        records = read_topic(stack.bootstrap_servers, setup.orders_topic, expected, 240)
        time.sleep(3)  # a duplicate, if any, would land after the expected records
        settled = read_to_end(stack.bootstrap_servers, setup.orders_topic)
        deadline = time.monotonic() + 60
        while setup.rows_left() and time.monotonic() < deadline:
            time.sleep(0.5)
        rows_left = setup.rows_left()
        logs = setup.log("a")[-2000:] + setup.log("b")[-2000:]
    assert expected == WRITERS * ROWS_PER_WRITER
    assert _out_of_order_commits(written.commits) > 20, "the writers' commits were in order"
    assert len(settled) == expected, f"{seed}\n{logs}"
    keys = Counter(record.key().decode() for record in records)
    assert keys == Counter(written.committed), f"each committed row once; {seed}"
    assert not set(keys) & set(written.rolled_back)
    by_aggregate: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for record in settled:
        headers = dict(record.headers())
        body = json.loads(record.value())
        by_aggregate[headers["aggregateid"].decode()].append(
            (record.partition(), record.offset(), body["n"]))
    for aggregate, entries in by_aggregate.items():
        numbers = [n for _, _, n in sorted(entries)]
        assert numbers == sorted(numbers), f"{aggregate} out of commit order; {seed}"
    assert len(takeovers) == KILLS
    print(f"takeovers_s={[round(t, 1) for t in takeovers]} "
          f"out_of_order_commits={_out_of_order_commits(written.commits)}")
    assert max(takeovers) < 30, takeovers
    assert rows_left == 0, "the cleanup deletes every delivered row, kills or not"


def test_a_table_without_the_relay_columns_is_one_line_naming_the_fix(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with relay_setup(stack, tmp_path, relay_columns=False) as setup:
        result = subprocess.run(
            [sys.executable, "-m", "cdc_router", "relay", "-c", str(setup.config_path),
             "--metrics-port", "0"], capture_output=True, text=True, cwd=REPO, timeout=120,
            check=False)
    assert result.returncode == 1
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ") and "column 'txid' of type xid8" in error
    assert "ADD COLUMN IF NOT EXISTS \"txid\" xid8 NOT NULL DEFAULT pg_current_xact_id()" \
        in error


@pytest.mark.parametrize(("change", "expected"), [
    # The relay's own check names it before the cleanup's of the same table (QA 61-a F-5).
    ({"table": "public.no_such_outbox"},
     "field 'relay.table': the outbox table does not exist (or is not readable) (got "
     "'public.no_such_outbox')"),
    ({"dsn": "postgresql://postgres:wrong-password@{host}/postgres"},
     "password authentication failed"),
])
def test_a_relay_table_or_credentials_no_wait_cures_exit_with_one_line(
        stack: StackEndpoints, tmp_path: Path, change: dict[str, str], expected: str) -> None:
    # Both were retried as outages for ever, before the lock, with /healthz answering like a
    # standby's (review, session 25).
    host = psycopg.conninfo.conninfo_to_dict(stack.postgres_dsn)
    with relay_setup(stack, tmp_path) as setup:
        config = yaml.safe_load(setup.config_path.read_text())
        for section in ("relay", "cleanup"):  # the cleanup must name the relay's table
            config[section].update({key: value.format(host=f"{host['host']}:{host['port']}")
                                    for key, value in change.items()})
        error, stderr = relay_failing(setup, config)
    assert error.startswith("error: ") and expected in error, stderr


def test_rows_that_set_txid_are_relayed_seq_is_the_databases_and_init_upgrades_a_table(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA, session 25: rows sharing a seq across a page's end were skipped for good, and a row
    # whose txid was written (an INSERT ... SELECT from an old outbox) was never read. The
    # trigger of `outbox init --relay` sets txid whatever the INSERT says, seq is GENERATED
    # ALWAYS with a unique index, and the relay refuses a table without them.
    insert = ("INSERT INTO public.{} (id, aggregatetype, aggregateid, type, payload{}) "
              "VALUES (%s, 'Order', %s, 'OrderPaid', '{{}}'{})")
    with relay_setup(stack, tmp_path, config={"relay": {"batch_rows": 2}}) as setup:
        ids = [str(uuid.uuid4()) for _ in range(3)]
        with psycopg.connect(stack.postgres_dsn) as conn:
            for n, txid in enumerate(("100", "99999999")):  # done long ago; in the future
                conn.execute(insert.format(setup.table, ", txid", ", %s"), (ids[n], "t", txid))
            conn.execute(insert.format(setup.table, "", ""), (ids[2], "plain"))
        with pytest.raises(psycopg.errors.GeneratedAlways), \
                psycopg.connect(stack.postgres_dsn) as conn:
            conn.execute(insert.format(setup.table, ", seq", ", %s"),
                         (str(uuid.uuid4()), "s", 1_000_000))
        setup.start("a")
        records = read_topic(stack.bootstrap_servers, setup.orders_topic, 3, 60)
        setup.kill("a", signal.SIGTERM)
        # Without the trigger and the unique index, the relay refuses the table ...
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP INDEX public."{setup.table}_seq_key"')
            conn.execute(f'DROP TRIGGER "{setup.table}_txid" ON public."{setup.table}"')
        refused = subprocess.run(
            [sys.executable, "-m", "cdc_router", "relay", "-c", str(setup.config_path),
             "--metrics-port", "0"], capture_output=True, text=True, cwd=REPO, timeout=120,
            check=False)
        # ... and `outbox init --relay` puts them back on the table in use.
        init = subprocess.run(
            [sys.executable, "-m", "cdc_router", "outbox", "init", "--dsn", stack.postgres_dsn,
             "--table", f"public.{setup.table}", "--publication", setup.table, "--relay"],
            capture_output=True, text=True, cwd=REPO, check=False)
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP PUBLICATION IF EXISTS {setup.table}")
        setup.start("b")
        setup.wait_for("b", STARTED, 1)
    assert sorted(record.key().decode() for record in records) == sorted(ids)
    assert refused.returncode == 1
    error = refused.stderr.strip().splitlines()[-1]
    assert "field 'relay.table'" in error and "a valid unique index on 'seq'" in error, error
    assert "the trigger that sets 'txid'" in error and "outbox init --relay" in error
    assert f'CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS "{setup.table}_seq_key"' in error
    assert init.returncode == 0, init.stderr


def test_the_relay_writes_the_records_the_router_writes_from_debezium(
        stack: StackEndpoints, tmp_path: Path) -> None:
    """One table, captured by Debezium and routed by `run`, and read by `relay`: the same key,
    partition, value, headers and timestamp for every event."""
    now = datetime.now(UTC).replace(tzinfo=None)
    rows = [(str(uuid.uuid4()), f"order-{i % 7}", json.dumps(
        {"seq": i, "total": "19.90", "nested": {"list": [1, 2.5, None], "text": "naïve ✓"}}),
             json.dumps({"traceparent": f"00-{i:032x}-{i:016x}-01"}) if i % 2 else None,
             # Recent: a created_at past the topics' retention.ms is dead-lettered.
             (now - timedelta(hours=i % 9, microseconds=i)).strftime("%Y-%m-%d %H:%M:%S.%f"))
            for i in range(200)]
    (tmp_path / "router").mkdir()
    with pipeline(stack, tmp_path / "router") as pipe:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            for statement in relay_columns_ddl(f"public.{pipe.table}", "txid", "seq"):
                conn.execute(statement)
        relay_dir = tmp_path / "relay"
        relay_dir.mkdir()
        with relay_setup(stack, relay_dir, table=pipe.table,
                         config={"cleanup": {"mode": "none"}}) as setup:
            pipe.start_router(wait=True)
            with psycopg.connect(stack.postgres_dsn) as conn, conn.cursor() as cursor:
                cursor.executemany(
                    f"INSERT INTO public.{pipe.table} (id, aggregatetype, aggregateid, type, "
                    "payload, headers, created_at) VALUES (%s, 'Order', %s, 'OrderPaid', "
                    "%s::jsonb, %s::jsonb, %s::timestamp)", rows)
            routed = pipe.read(pipe.orders_topic, len(rows))
            setup.start("a")
            relayed = read_topic(stack.bootstrap_servers, setup.orders_topic, len(rows), 120)
    assert len(relayed) == len(routed) == len(rows)
    by_key = {record.key(): record for record in routed}
    differences = [
        (record.key(), record.value(), twin.value(), record.headers(), twin.headers(),
         record.timestamp(), twin.timestamp())
        for record in relayed
        if (record.partition(), record.value(), record.headers(), record.timestamp()) != (
            (twin := by_key[record.key()]).partition(), twin.value(), twin.headers(),
            twin.timestamp())]
    assert differences == []


def _outbox_init(stack: StackEndpoints, table: str, *extra: str
                 ) -> subprocess.CompletedProcess[str]:
    """`cdc-router outbox init` of public.`table` (its publication named alike), no terminal."""
    return subprocess.run(
        [sys.executable, "-m", "cdc_router", "outbox", "init", "--dsn", stack.postgres_dsn,
         "--table", f"public.{table}", "--publication", table, *extra],
        capture_output=True, text=True, cwd=REPO, check=False, stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def _dropped_after(stack: StackEndpoints, prefix: str) -> Iterator[str]:
    """A new outbox table name; the table and its publication are dropped after."""
    table = unique(prefix)
    try:
        yield table
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP PUBLICATION IF EXISTS {table}")
            conn.execute(f"DROP TABLE IF EXISTS public.{table}")


def test_outbox_init_relay_adds_the_columns_once(stack: StackEndpoints) -> None:
    with _dropped_after(stack, "relay_init") as table:

        def init(*relay: str) -> str:
            result = _outbox_init(stack, table, *relay)
            assert result.returncode == 0, result.stderr
            return result.stdout

        init()  # an outbox of an earlier version, without the relay's columns
        added = init("--relay")
        assert "ensured  relay columns txid, seq" in added
        # QA 46-b F5: "outbox ready (nothing changed)" after adding two columns, two indexes.
        assert added.rstrip().endswith("outbox ready"), added
        assert init("--relay").rstrip().endswith("outbox ready (nothing changed)")  # idempotent
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            types = dict(conn.execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                "attrelid = %s::regclass AND attname IN ('txid', 'seq')",
                (f"public.{table}",)).fetchall())
            conn.execute(f"INSERT INTO public.{table} (id, aggregatetype, aggregateid, type, "
                         "payload) VALUES (gen_random_uuid(), 'A', '1', 'T', '{}')")
            row = conn.execute(f"SELECT seq, txid::text FROM public.{table}").fetchone()
    assert types == {"txid": "xid8", "seq": "bigint"}
    assert row is not None and row[0] > 0 and int(row[1]) > 0


def test_outbox_init_relay_on_a_table_with_rows_asks_before_it_rewrites_it(
        stack: StackEndpoints) -> None:
    # L4: adding txid and seq to a table holding rows rewrote it under an ACCESS EXCLUSIVE lock
    # (200000 rows: 8 s of INSERTs waiting) and gave every row to the relay, without a word.
    with _dropped_after(stack, "relay_rewrite") as table:

        def filenode() -> tuple[int, int]:
            with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
                found = conn.execute(
                    "SELECT pg_relation_filenode(%s::regclass), (SELECT count(*) FROM "
                    "pg_attribute WHERE attrelid = %s::regclass AND attname IN ('txid', "
                    "'seq'))", (f"public.{table}",) * 2).fetchone()
            assert found is not None
            return found[0], found[1]

        assert _outbox_init(stack, table).returncode == 0
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"INSERT INTO public.{table} (id, aggregatetype, aggregateid, type, "
                         "payload) SELECT gen_random_uuid(), 'A', g::text, 'T', '{}' FROM "
                         "generate_series(1, 100) g")
        before = filenode()
        refused = _outbox_init(stack, table, "--relay")  # no terminal: nobody to ask
        assert refused.returncode == 1 and filenode() == before, refused.stderr
        assert f"warning: public.{table} holds " in refused.stderr
        assert "has no seq or txid: adding them rewrites the whole table under an ACCESS " \
            "EXCLUSIVE lock" in refused.stderr and "--yes" in refused.stderr
        done = _outbox_init(stack, table, "--relay", "--yes")
        assert done.returncode == 0, done.stderr
        assert filenode()[0] != before[0] and filenode()[1] == 2  # rewritten, as it said
        again = _outbox_init(stack, table, "--relay")  # nothing to add: nothing to ask
        assert again.returncode == 0 and "warning" not in again.stderr, again.stderr


def test_a_sigterm_in_the_relays_first_seconds_stops_it_cleanly(stack: StackEndpoints,
                                                                 tmp_path: Path) -> None:
    # Fixer 63, item 7: the handlers came after the imports and the start's checks, so a
    # SIGTERM there (a deploy's quick rollback) killed it: exit -15, no line.
    # Each signal goes once the process catches SIGTERM (its hold installed: the interpreter's
    # start before it, 0.1 s idle and seconds on a loaded CI machine, is no start of ours to
    # stop cleanly), at once and later into the start's imports and checks.
    with relay_setup(stack, tmp_path) as setup:
        for instance, after_s in (("a", 0.0), ("b", 0.7), ("c", 2.0)):
            pid = setup.start(instance)
            _wait_until_it_catches(pid, signal.SIGTERM)
            time.sleep(after_s)
            code = setup.kill(instance, signal.SIGTERM)
            log = setup.log(instance)
            assert code == 0, (after_s, code, log[-2000:])
            assert "event=stopped" in log, (after_s, log[-2000:])


def _wait_until_it_catches(pid: int, signum: int, timeout_s: float = 60) -> None:
    """Until process `pid` has a handler for `signum` (SigCgt of /proc/<pid>/status)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        [caught] = [line.split()[1] for line in status.splitlines()
                    if line.startswith("SigCgt:")]
        if int(caught, 16) >> (signum - 1) & 1:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} caught no signal {signum} in {timeout_s} s")


def test_outbox_init_relay_creates_a_new_outbox_with_its_columns(stack: StackEndpoints) -> None:
    # Review 63 of the L4 fix: the rewrite check read the table before init made it, and
    # `outbox init --relay` on a database without the outbox failed (relation does not exist).
    with _dropped_after(stack, "relay_new") as table:
        made = _outbox_init(stack, table, "--relay")
        assert made.returncode == 0, made.stderr
        assert f"created  table public.{table}" in made.stdout and "warning" not in made.stderr
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            found = conn.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = "
                                 "%s::regclass AND attname IN ('txid', 'seq')",
                                 (f"public.{table}",)).fetchone()
        assert found == (2,)


def test_dlq_replay_delivers_a_relay_letter_from_its_row(stack: StackEndpoints,
                                                         tmp_path: Path) -> None:
    # QA, session 28: every relay letter was decoded as a Debezium change event and
    # dead-lettered again ("no 'op' field"), its event id lost.
    late = unique("late").replace("_", "-")
    with relay_setup(stack, tmp_path) as setup:
        config = yaml.safe_load(setup.config_path.read_text())
        config["routes"].insert(0, {"match": {"type": "Late"}, "topic": late})
        setup.config_path.write_text(yaml.safe_dump(config))
        setup.start("a")
        ids = [str(uuid.uuid4()) for _ in range(3)]
        with psycopg.connect(stack.postgres_dsn) as conn:
            for event_id, kind in zip(ids, ("OrderPaid", "Late", "OrderPaid"), strict=True):
                conn.execute(f"INSERT INTO public.{setup.table} (id, aggregatetype, aggregateid,"
                             " type, payload) VALUES (%s, 'Order', 'o-1', %s, '{\"n\": 1}')",
                             (event_id, kind))
        letters = read_topic(stack.bootstrap_servers, setup.dlq_topic, 1, 60)
        orders = read_topic(stack.bootstrap_servers, setup.orders_topic, 2, 60)
        setup.kill("a", signal.SIGTERM)
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        admin.create_topics([NewTopic(late, 1, 1)])[late].result(timeout=30)
        try:
            replayed = subprocess.run(
                [sys.executable, "-m", "cdc_router", "dlq", "replay", "-c",
                 str(setup.config_path), "--yes", "-o", "json"],
                capture_output=True, text=True, cwd=REPO, check=False)
            delivered = read_topic(stack.bootstrap_servers, late, 1, 60)
        finally:
            admin.delete_topics([late])[late].result(timeout=30)
    assert len(letters) == 1 and len(orders) == 2
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert json.loads(replayed.stdout)["committed"] == {"deliver": 1}, replayed.stdout
    assert [record.key().decode() for record in delivered] == [ids[1]]
    assert json.loads(delivered[0].value()) == {"n": 1}


def test_batches_end_at_batch_bytes_and_every_row_still_goes_once_in_order(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA, session 28: 250 rows of 3.9 MB took 2 GB of memory (a batch was batch_rows rows
    # whatever their size). Rows of 3 KB against a 10 KB budget: batches of 4 rows at most.
    with relay_setup(stack, tmp_path, config={"relay": {"batch_bytes": 10_000}}) as setup:
        ids = [str(uuid.uuid4()) for _ in range(30)]
        with psycopg.connect(stack.postgres_dsn) as conn:
            for number, event_id in enumerate(ids):
                conn.execute(f"INSERT INTO public.{setup.table} (id, aggregatetype, aggregateid,"
                             " type, payload) VALUES (%s, 'Order', 'o-1', 'OrderPaid', %s)",
                             (event_id, json.dumps({"n": number, "pad": "x" * 3_000})))
        setup.start("a")
        records = read_topic(stack.bootstrap_servers, setup.orders_topic, len(ids), 120)
        time.sleep(1)
        settled = read_to_end(stack.bootstrap_servers, setup.orders_topic)
        positions = read_to_end(stack.bootstrap_servers, setup.position_topic)
    assert [record.key().decode() for record in records] == ids  # one aggregate: in order
    assert len(settled) == len(ids)
    assert len(positions) >= len(ids) // 4, "a batch holds at most 4 such rows"


def test_at_least_once_the_delivered_rows_a_killed_relay_left_go_at_the_next_start(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 55-b F-1: at least once (no cleanup sweep), the rows a relay killed between a commit
    # and its delete had delivered stayed for ever, behind its position. A BEFORE DELETE
    # trigger keeps them here as the kill did; the next start deletes those its changelog marks
    # delivered, not the row of a dead letter.
    config = {"delivery": {"guarantee": "at_least_once"}}
    with relay_setup(stack, tmp_path, config=config) as setup:
        ids = [str(uuid.uuid4()) for _ in range(20)]
        keep = f"{setup.table}_keep"
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE FUNCTION public.{keep}() RETURNS trigger LANGUAGE plpgsql AS "
                         "$$ BEGIN RETURN NULL; END $$")
            conn.execute(f"CREATE TRIGGER keep BEFORE DELETE ON public.{setup.table} FOR EACH "
                         f"ROW EXECUTE FUNCTION public.{keep}()")
            for number, event_id in enumerate([*ids, str(uuid.uuid4())]):
                conn.execute(f"INSERT INTO public.{setup.table} (id, aggregatetype, aggregateid,"
                             " type, payload) VALUES (%s, 'Order', 'o-1', %s, %s)",
                             (event_id, "OrderPaid" if number < len(ids) else "",
                              json.dumps({"n": number})))  # the last one: a decode letter
        setup.start("a")
        read_topic(stack.bootstrap_servers, setup.orders_topic, len(ids), 120)
        deadline = time.monotonic() + 60
        while "event=cleanup_rows_kept" not in setup.log("a") and time.monotonic() < deadline:
            time.sleep(0.2)
        setup.kill("a")
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TRIGGER keep ON public.{setup.table}")
            conn.execute(f"DROP FUNCTION public.{keep}()")
        left_by_a = setup.rows_left()
        setup.start("b")
        setup.wait_for("b", STARTED, 1)
        deadline = time.monotonic() + 60
        while setup.rows_left() > 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        rows_left = setup.rows_left()
        time.sleep(1)
        settled = read_to_end(stack.bootstrap_servers, setup.orders_topic)
        log_b = setup.log("b")
    assert left_by_a == len(ids) + 1, setup.log("a")[-3000:]
    assert rows_left == 1, log_b[-3000:]  # the dead letter's row stays
    assert f"event=cleanup_left_behind table=public.{setup.table} rows={len(ids)}" in log_b
    assert sorted(record.key().decode() for record in settled) == sorted(ids)


def test_a_created_at_of_the_epoch_is_delivered_with_the_producers_clock(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 53-a F1: the relay dead-lettered a row dated 1970-01-01 00:00:00 with advice about
    # Kafka Connect's JsonConverter, which it does not use: the time is the row's own.
    with relay_setup(stack, tmp_path) as setup:
        ids = [str(uuid.uuid4()) for _ in range(2)]
        # Within any retention.ms, to be delivered: the relay checks a record's time against it.
        recent = (datetime.now(UTC) - timedelta(minutes=5)).replace(microsecond=0)
        with psycopg.connect(stack.postgres_dsn) as conn:
            for event_id, created_at in zip(ids, ("1970-01-01 00:00:00",
                                                  recent.strftime("%Y-%m-%d %H:%M:%S")),
                                            strict=True):
                conn.execute(f"INSERT INTO public.{setup.table} (id, aggregatetype, aggregateid,"
                             " type, payload, created_at) VALUES (%s, 'Order', 'o-1', "
                             "'OrderPaid', '{}', %s)", (event_id, created_at))
        started = time.time()
        setup.start("a")
        records = read_topic(stack.bootstrap_servers, setup.orders_topic, len(ids), 120)
        letters = read_to_end(stack.bootstrap_servers, setup.dlq_topic)
    assert [record.key().decode() for record in records] == ids and letters == []
    epoch, dated = (record.timestamp()[1] for record in records)
    assert started * 1000 - 60_000 <= epoch <= time.time() * 1000  # the producer's clock
    assert dated == int(recent.timestamp() * 1000)


def _insert(stack: StackEndpoints, table: str, types: list[str]) -> list[str]:
    """One row for each type, in one transaction; their event ids."""
    ids = [str(uuid.uuid4()) for _ in types]
    with psycopg.connect(stack.postgres_dsn) as conn:
        for number, (event_id, kind) in enumerate(zip(ids, types, strict=True)):
            conn.execute(f"INSERT INTO public.{table} (id, aggregatetype, aggregateid, type, "
                         "payload) VALUES (%s, 'Order', %s, %s, %s)",
                         (event_id, f"o-{number % 3}", kind, json.dumps({"n": number})))
    return ids


def test_a_destination_topic_deleted_under_the_relay_dead_letters_its_rows_until_recreated(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # The relay's side of the router's test: records to a deleted topic time out in the open
    # transaction and Kafka 4.x refuses its abort for good (INVALID_TXN_STATE); the relay
    # replaces its producer while it holds the table's lock, and reads from its position.
    moved = unique("moved").replace("_", "-")
    with relay_setup(stack, tmp_path) as setup:
        config = yaml.safe_load(setup.config_path.read_text())
        config["routes"].insert(0, {"match": {"type": "Moved"}, "topic": moved})
        config["topics"].append({"name": moved, "partitions": 1})
        setup.config_path.write_text(yaml.safe_dump(config))
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        admin.create_topics([NewTopic(moved, 1, 1)])[moved].result(timeout=30)
        try:
            setup.start("a")
            before = _insert(stack, setup.table, ["OrderPaid"] * 10)
            delivered_before = read_topic(stack.bootstrap_servers, setup.orders_topic, 10, 60)
            admin.delete_topics([setup.orders_topic])[setup.orders_topic].result(timeout=30)
            _wait_topic_gone(admin, setup.orders_topic)
            orphans_and_moved = _insert(stack, setup.table, ["OrderPaid", "Moved"] * 10)
            letters = read_topic(stack.bootstrap_servers, setup.dlq_topic, 10, 180)
            moved_records = read_topic(stack.bootstrap_servers, moved, 10, 60)
            applied = subprocess.run([sys.executable, "-m", "cdc_router", "topics", "apply",
                                      "-c", str(setup.config_path), "--yes"],
                                     capture_output=True, text=True, cwd=REPO, check=False)
            time.sleep(MISSING_RECHECK_S + 1)  # the relay asks for a missing topic again so
            after = _insert(stack, setup.table, ["OrderPaid"] * 10)
            delivered_after = read_topic(stack.bootstrap_servers, setup.orders_topic, 10, 180)
            settled_letters = read_to_end(stack.bootstrap_servers, setup.dlq_topic)
            still_running = setup.relays["a"].poll() is None
            log = setup.log("a")
        finally:
            admin.delete_topics([moved])[moved].result(timeout=30)
    assert Counter(r.key().decode() for r in delivered_before) == Counter(before)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert sorted(r.key().decode() for r in moved_records) == sorted(orphans_and_moved[1::2])
    assert len(settled_letters) == 10, log[-3000:]
    by_id = {dict(letter.headers())["dlq.event.id"].decode(): dict(letter.headers())
             for letter in letters}
    assert set(by_id) == set(orphans_and_moved[0::2]), log[-3000:]
    for headers in by_id.values():
        assert headers["dlq.stage"] in (b"route", b"produce"), headers
        assert setup.orders_topic.encode() in headers["dlq.error.message"], headers
    assert Counter(r.key().decode() for r in delivered_after) == Counter(after), log[-3000:]
    assert still_running and "Traceback" not in log, log[-3000:]


def _wait_topic_gone(admin: AdminClient, topic: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"{topic} is still listed"
        time.sleep(0.5)


def test_a_relay_whose_lock_connection_drops_exits_75_and_its_restart_goes_on_once(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 31-e: a Postgres restart cut the lock's connection and the relay exited 1, which a
    # supervisor restarting on 75 (as for `run`) took as final. Cutting that one connection is
    # the same event for the relay, without restarting the suite's Postgres.
    with relay_setup(stack, tmp_path) as setup:
        setup.start("a")
        setup.wait_for("a", STARTED, 1)
        before = _insert(stack, setup.table, ["OrderPaid"] * 5)
        delivered_before = read_topic(stack.bootstrap_servers, setup.orders_topic, 5, 60)
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            cut = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                "AND objid = %s::regclass::oid", (f"public.{setup.table}",)).fetchall()
        exit_code = setup.relays["a"].wait(timeout=60)
        first_log = setup.log("a")
        del setup.relays["a"]
        setup.start("a")
        setup.wait_for("a", STARTED, 2)
        after = _insert(stack, setup.table, ["OrderPaid"] * 5)
        read_topic(stack.bootstrap_servers, setup.orders_topic, 10, 60)
        time.sleep(3)  # a duplicate, if any, would land after the expected records
        settled = read_to_end(stack.bootstrap_servers, setup.orders_topic)
    assert cut == [(True,)], "the relay holds one advisory lock on its table"
    assert Counter(r.key().decode() for r in delivered_before) == Counter(before)
    assert exit_code == 75, first_log[-3000:]
    assert f"lost its lock on public.{setup.table}" in first_log
    assert "Traceback" not in first_log, first_log[-3000:]
    assert Counter(r.key().decode() for r in settled) == Counter(before + after)


def test_columns_changed_while_the_relay_runs_are_read_again(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 33-c: the select list was built once. After a DROP COLUMN every read failed for
    # ever ("column does not exist"); after the payload was made bytea, rows were read as
    # text and dead-lettered for good.
    with relay_setup(stack, tmp_path) as setup:
        table = f"public.{setup.table}"
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN note text")
        setup.start("a")
        first = _insert(stack, setup.table, ["OrderPaid"])
        read_topic(stack.bootstrap_servers, setup.orders_topic, 1, 60)
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {table} DROP COLUMN note")
        second = _insert(stack, setup.table, ["OrderPaid"])
        read_topic(stack.bootstrap_servers, setup.orders_topic, 2, 60)  # one change at a time
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {table} ALTER COLUMN payload TYPE bytea "
                         "USING convert_to(payload::text, 'UTF8')")
            conn.execute(f"INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload) "
                         "VALUES (%s, 'Order', 'o-1', 'OrderPaid', '\\x0102ff'::bytea)",
                         (third := str(uuid.uuid4()),))
        records = read_topic(stack.bootstrap_servers, setup.orders_topic, 3, 60)
        letters = read_to_end(stack.bootstrap_servers, setup.dlq_topic)
        log = setup.log("a")
    assert [record.key().decode() for record in records] == [*first, *second, third]
    assert records[2].value() == b"\x01\x02\xff"  # the bytes, not their text
    assert letters == [], [dict(letter.headers()) for letter in letters]
    assert log.count("event=relay_columns_changed") == 2, log[-3000:]


def test_a_role_granted_the_tables_columns_one_by_one_reads_its_rows(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # Review 33-3: the read's table lock was LOCK TABLE, which needs SELECT on the whole table:
    # a role granted the columns one by one was refused every read, for ever.
    from cdc_router.config.load import load_config
    from cdc_router.relay.guard import RelayPosition
    from cdc_router.relay.reader import OutboxReader

    role = unique("columns")
    with relay_setup(stack, tmp_path) as setup:
        table = f"public.{setup.table}"
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            columns = [row[0] for row in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                "AND NOT attisdropped", (table,))]
            conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
            conn.execute(f"GRANT SELECT ({', '.join(columns)}) ON {table} TO {role}")
        try:
            ids = _insert(stack, setup.table, ["OrderPaid", "OrderPaid"])
            params = psycopg.conninfo.conninfo_to_dict(stack.postgres_dsn)
            dsn = psycopg.conninfo.make_conninfo(**{**params, "user": role, "password": "pw"})
            config = load_config(setup.config_path).config
            assert config.relay is not None
            reader = OutboxReader(dsn, config.relay, config.source)
            position = RelayPosition().start_read(reader.snapshot())
            rows = reader.fetch(position, 10)
            reader.reset()
        finally:
            with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
                conn.execute(f"DROP OWNED BY {role}")
                conn.execute(f"DROP ROLE {role}")
    assert [row.values["id"] for row in rows] == ids


@pytest.mark.parametrize(("cleanup", "expected"), [
    ("delete", "field 'cleanup.table': the connection's role may not DELETE from the outbox "
               "table (or SELECT its columns)"),
    ("none", "field 'relay.table': the connection's role may not SELECT from the outbox table"),
])
def test_a_role_that_may_not_read_or_clean_the_table_stops_the_relay_at_start(
        stack: StackEndpoints, tmp_path: Path, cleanup: str, expected: str) -> None:
    # Review 51-d F9: the relay started, then logged batch_failed "permission denied" for
    # ever, relaying nothing, where `run` refuses the same cleanup role at start.
    role = unique("noperm")
    with relay_setup(stack, tmp_path) as setup, psycopg.connect(stack.postgres_dsn,
                                                                autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
        try:
            _insert(stack, setup.table, ["OrderPaid"])
            if cleanup == "delete":  # else the relay's own check names relay.table first
                conn.execute(f"GRANT SELECT ON public.{setup.table} TO {role}")
            dsn = psycopg.conninfo.make_conninfo(stack.postgres_dsn, user=role, password="pw")
            config = yaml.safe_load(setup.config_path.read_text())
            config["relay"]["dsn"] = config["cleanup"]["dsn"] = dsn
            config["cleanup"]["mode"] = cleanup
            setup.config_path.write_text(yaml.safe_dump(config))
            result = subprocess.run(
                [sys.executable, "-m", "cdc_router", "relay", "-c", str(setup.config_path),
                 "--metrics-port", "0"], capture_output=True, text=True, cwd=REPO,
                timeout=120, check=False)
        finally:
            conn.execute(f"REVOKE ALL ON public.{setup.table} FROM {role}")
            conn.execute(f"DROP ROLE {role}")
        assert setup.rows_left() == 1
    assert result.returncode == 1, result.stderr[-3000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ") and expected in error, result.stderr[-3000:]
    assert "GRANT SELECT" in error and "Traceback" not in result.stderr


def _outbox_init_relay(stack: StackEndpoints, table: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdc_router", "outbox", "init", "--dsn", stack.postgres_dsn,
         "--table", f"public.{table}", "--publication", table, "--relay"],
        capture_output=True, text=True, cwd=REPO, check=False)


def test_an_outbox_partitioned_by_seq_is_relayed_and_one_by_created_at_is_one_line(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 34-c: on any partitioned table `outbox init --relay` met Postgres's raw errors (an
    # index built CONCURRENTLY), and the relay's hint could not work either.
    by_seq, by_time = unique("relay_part_seq"), unique("relay_part_time")
    columns = ("id uuid NOT NULL, aggregatetype text NOT NULL, aggregateid text NOT NULL, "
               "type text NOT NULL, payload jsonb NOT NULL, headers jsonb, created_at "
               "timestamp(6) NOT NULL DEFAULT (now() AT TIME ZONE 'utc')")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE public.{by_seq} ({columns}, seq bigint GENERATED BY "
                     "DEFAULT AS IDENTITY, PRIMARY KEY (seq)) PARTITION BY RANGE (seq)")
        conn.execute(f"CREATE TABLE public.{by_seq}_a PARTITION OF public.{by_seq} FOR VALUES "
                     "FROM (1) TO (50)")
        conn.execute(f"CREATE TABLE public.{by_seq}_b PARTITION OF public.{by_seq} FOR VALUES "
                     "FROM (50) TO (1000000)")
        conn.execute(f"CREATE TABLE public.{by_time} ({columns}, PRIMARY KEY (id, created_at)) "
                     "PARTITION BY RANGE (created_at)")
    try:
        first, again = _outbox_init_relay(stack, by_seq), _outbox_init_relay(stack, by_seq)
        refused = _outbox_init_relay(stack, by_time)
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            made = conn.execute("SELECT pubname FROM pg_publication WHERE pubname = %s",
                                (by_time,)).fetchall()
        ids = [str(uuid.uuid4()) for _ in range(120)]
        with relay_setup(stack, tmp_path, table=by_seq) as setup:
            with psycopg.connect(stack.postgres_dsn) as conn, conn.transaction():
                for event_id in ids:
                    conn.execute(f"INSERT INTO public.{by_seq} (id, aggregatetype, aggregateid, "
                                 "type, payload) VALUES (%s, 'Order', '1', 'OrderPaid', '{}')",
                                 (event_id,))
            setup.start("a")
            records = read_topic(stack.bootstrap_servers, setup.orders_topic, len(ids), 120)
            deadline = time.monotonic() + 60
            while setup.rows_left() and time.monotonic() < deadline:  # the cleanup's delete
                time.sleep(0.2)
            left = setup.rows_left()
        with relay_setup(stack, tmp_path, table=by_time) as other:
            stopped = subprocess.run(
                [sys.executable, "-m", "cdc_router", "relay", "-c", str(other.config_path),
                 "--metrics-port", "0"], capture_output=True, text=True, cwd=REPO,
                timeout=120, check=False)
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            for table in (by_seq, by_time):
                conn.execute(f"DROP PUBLICATION IF EXISTS {table}")
                conn.execute(f"DROP TABLE IF EXISTS public.{table}")
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert [r.key().decode() for r in records] == ids, "each row once, in seq order"
    assert left == 0
    assert made == [], "a refused init --relay makes nothing (review 34-2)"
    for result, field_name in ((refused, "--table"), (stopped, "relay.table")):
        assert result.returncode == 1, result.stderr
        [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert f"field '{field_name}'" in line and "is partitioned by RANGE (created_at)" in line
        assert "Traceback" not in result.stderr


def test_status_of_a_relay_only_config_checks_the_relays_table_not_a_connector(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 34-c: a healthy relay was "critical: no source topic exists ()", with the connector's
    # table, slot and publication in its report. Review 34-2: an outbox without created_at
    # stopped `status` ("rows have no age").
    with relay_setup(stack, tmp_path, config={"source": {"outbox": {"created_at": None}}}) \
            as setup:
        with psycopg.connect(stack.postgres_dsn) as conn, conn.transaction():
            conn.execute(f"INSERT INTO public.{setup.table} (id, aggregatetype, aggregateid, "
                         "type, payload) VALUES (gen_random_uuid(), 'Order', '1', 'OrderPaid', "
                         "'{}')")
        result = subprocess.run(
            [sys.executable, "-m", "cdc_router", "status", "-c", str(setup.config_path)],
            capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 1: another test's slot
    assert f"outbox public.{setup.table}: 1 rows, oldest -," in result.stdout, result.stdout
    assert "connector: none (a relay-only config" in result.stdout
    assert f"router group {setup.name}: no raw topic" in result.stdout
    assert "critical" not in result.stdout and "NOT CHECKED" not in result.stdout
    assert "publication" not in result.stdout
