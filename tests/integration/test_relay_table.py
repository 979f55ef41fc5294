"""The relay's reader against tables made by hand on the stack's Postgres: what it refuses
at start, and what it reads. Postgres only: no relay process, no broker."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdc_router.config.relay import RelaySettings
from cdc_router.config.source import SourceSettings
from cdc_router.errors import ConfigError
from cdc_router.outbox.relay_columns import relay_columns_ddl
from cdc_router.relay import lock_wait
from cdc_router.relay.guard import RelayPosition
from cdc_router.relay.reader import OutboxReader, RelayRow
from tests.integration.pipeline import REPO
from tests.integration.support import StackEndpoints, unique

pytestmark = pytest.mark.integration

_COLUMNS = ("id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, "
            "type text NOT NULL, payload jsonb NOT NULL, headers jsonb, "
            "created_at timestamp(6) NOT NULL DEFAULT (now() AT TIME ZONE 'utc')")
_INSERT = ('INSERT INTO public."{}" (id, aggregatetype, aggregateid, type, payload{}) VALUES '
           "(gen_random_uuid(), 'Order', %s, 'OrderPaid', '{{}}'{})")


@contextmanager
def _table(dsn: str, name: str, extra: str = "") -> Iterator[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE public."{name}" ({_COLUMNS}{extra})')
    try:
        yield f'public."{name}"'
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP TABLE IF EXISTS public."{name}"')


@contextmanager
def _one_row_relay_table(dsn: str, prefix: str) -> Iterator[
        tuple[str, psycopg.Connection[Any], OutboxReader]]:
    """A table with the relay's columns and one row ("first"), an autocommit connection and
    a reader of it (the caller resets it)."""
    with _table(dsn, unique(prefix)) as table, psycopg.connect(dsn, autocommit=True) as conn:
        name = table.split(".")[1].strip('"')
        for statement in relay_columns_ddl(table, "txid", "seq"):
            conn.execute(statement)
        conn.execute(_INSERT.format(name, "", ""), ("first",))
        yield table, conn, OutboxReader(dsn, RelaySettings(table=table),
                                        SourceSettings(group_id="shop"))


def _read_all(dsn: str, table: str, limit: int = 10) -> list[RelayRow]:
    reader = OutboxReader(dsn, RelaySettings(table=table), SourceSettings(group_id="shop"))
    try:
        position = RelayPosition().start_read(reader.snapshot())
        rows: list[RelayRow] = []
        while position.reading is not None:
            batch = reader.fetch(position, limit)
            rows += batch
            full = len(batch) if batch.truncated else limit
            position = position.after_batch(len(batch), full, batch[-1].seq if batch else None)
        return rows
    finally:
        reader.reset()


def _init_relay(dsn: str, table: str) -> tuple[subprocess.CompletedProcess[str], bool]:
    """`outbox init --relay` of `table`, and whether it made its publication."""
    publication = unique("relay_pub")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "cdc_router", "outbox", "init", "--dsn", dsn, "--table",
             table, "--publication", publication, "--relay"],
            capture_output=True, text=True, cwd=REPO, check=False, timeout=120)
        with psycopg.connect(dsn) as conn:
            return result, conn.execute("SELECT FROM pg_publication WHERE pubname = %s",
                                        (publication,)).fetchone() is not None
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP PUBLICATION IF EXISTS {publication}")


def test_a_nullable_seq_is_refused_and_outbox_init_relay_makes_it_not_null(
        stack: StackEndpoints) -> None:
    # Review 46 F1: a seq of the app's own that allowed NULL passed every check; its NULL row
    # stopped the relay on int(None), or in a read longer than a page was skipped for good.
    dsn = stack.postgres_dsn
    with _table(dsn, unique("relay_null_seq"), ", seq bigint UNIQUE") as table, \
            psycopg.connect(dsn, autocommit=True) as conn:
        name = table.split(".")[1].strip('"')
        for statement in relay_columns_ddl(table, "txid", "seq", existing={"seq"}):
            conn.execute(statement)
        for seq in (1, None, 2, 3):
            conn.execute(_INSERT.format(name, ", seq", ", %s"), (f"o{seq}", seq))
        with pytest.raises(ConfigError) as refused:
            _read_all(dsn, table, limit=2)
        failed, published = _init_relay(dsn, table)  # a NULL row is there: nothing is made
        nullable = conn.execute("SELECT NOT attnotnull FROM pg_attribute WHERE attrelid = "
                                "%s::regclass AND attname = 'seq'", (table,)).fetchone()
        conn.execute(f'UPDATE {table} SET seq = 4 WHERE seq IS NULL')
        fixed, _ = _init_relay(dsn, table)
        rows = _read_all(dsn, table, limit=2)
    assert "field 'relay.seq_column': column 'seq' of" in str(refused.value)
    assert f'ALTER TABLE "public"."{name}" ALTER COLUMN "seq" SET NOT NULL' in str(refused.value)
    assert failed.returncode == 1 and "have no seq (NULL)" in failed.stderr, failed.stderr
    assert not published  # QA 46-c: it made the publication, then refused
    assert nullable == (True,)
    assert fixed.returncode == 0, fixed.stderr
    assert [row.seq for row in rows] == [1, 2, 3, 4]


def test_a_seq_made_nullable_while_the_relay_reads_stops_it_with_the_fix(
        stack: StackEndpoints) -> None:
    # The check is made again in each batch's transaction: int(None) is never reached.
    dsn = stack.postgres_dsn
    with _one_row_relay_table(dsn, "relay_null_later") as (table, conn, reader):
        name = table.split(".")[1].strip('"')
        try:
            reader.snapshot()  # the table checked, as at the relay's start
            conn.execute(f'ALTER TABLE {table} ALTER COLUMN seq DROP IDENTITY')
            conn.execute(f'ALTER TABLE {table} ALTER COLUMN seq DROP NOT NULL')
            conn.execute(_INSERT.format(name, ", seq", ", NULL"), ("null",))
            position = RelayPosition().start_read(reader.snapshot())
            with pytest.raises(ConfigError) as refused:
                reader.fetch(position, 10)
        finally:
            reader.reset()
    assert "column 'seq' of" in str(refused.value) and "SET NOT NULL" in str(refused.value)


def test_a_read_waiting_on_a_migrations_lock_says_so_with_the_locking_pid(
        stack: StackEndpoints, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 67-a F-2: a read held 60 s by an ACCESS EXCLUSIVE lock said nothing.
    monkeypatch.setattr(lock_wait, "LOCK_WAIT_WARN_S", 1.0)
    dsn = stack.postgres_dsn
    with _one_row_relay_table(dsn, "relay_lock_wait") as (table, _, reader), \
            psycopg.connect(dsn) as migration:
        try:
            position = RelayPosition().start_read(reader.snapshot())
            migration.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            locker = migration.info.backend_pid
            with caplog.at_level("INFO", logger="cdc_router.relay"), \
                    ThreadPoolExecutor(1) as pool:
                reading = pool.submit(reader.fetch, position, 10)
                said = threading.Event()
                for _ in range(300):  # up to 30 s on a busy machine
                    if any("relay_read_waiting_on_lock" in r.getMessage()
                           for r in caplog.records) or said.wait(0.1):
                        break
                waiting = not reading.done()
                migration.commit()  # the migration ends: the read goes on
                rows = reading.result(timeout=30)
        finally:
            reader.reset()
    lines = [record.getMessage() for record in caplog.records if "lock" in record.getMessage()]
    assert waiting and [row.values["aggregateid"] for row in rows] == ["first"]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"event=relay_read_waiting_on_lock table={table} waited_s=")
    assert f"blocking_pids={{{locker}}}" in lines[0], lines
    assert lines[1].startswith(f"event=relay_read_lock_wait_over table={table} waited_s=")


@pytest.mark.parametrize("length", [62, 63])
def test_outbox_init_relay_makes_both_indexes_of_a_table_named_to_the_limit(
        stack: StackEndpoints, length: int) -> None:
    # Review 46 F5: both index names were cut to the same 63 bytes; the unique one was never
    # made, and the relay refused the table for good.
    dsn = stack.postgres_dsn
    name = (unique("relay_long") + "o" * 63)[:length]
    with _table(dsn, name) as table, psycopg.connect(dsn, autocommit=True) as conn:
        init, _ = _init_relay(dsn, table)
        indexes = conn.execute("SELECT indisunique, indisvalid FROM pg_index WHERE indrelid = "
                               "%s::regclass ORDER BY 1", (table,)).fetchall()
        conn.execute(_INSERT.format(name, "", ""), ("a",))
        rows = _read_all(dsn, table)
    assert init.returncode == 0, init.stderr
    assert indexes == [(False, True), (True, True), (True, True)]  # txid; seq and the key
    assert len(rows) == 1


@pytest.fixture
def sql_ascii_dsn(stack: StackEndpoints) -> Iterator[str]:
    """A database of encoding SQL_ASCII, as older installations have, dropped after."""
    name = unique("relay_sql_ascii")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'SQL_ASCII' "
                     "LC_COLLATE 'C' LC_CTYPE 'C'")
    try:
        yield make_conninfo(**{**conninfo_to_dict(stack.postgres_dsn), "dbname": name})
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_the_relay_reads_an_outbox_in_a_sql_ascii_database(sql_ascii_dsn: str) -> None:
    # Review 46 F6: psycopg gave bytes there, the checks found "column 'txid' (found none)"
    # and asked to add the columns the table had.
    with _table(sql_ascii_dsn, "outbox") as table, \
            psycopg.connect(sql_ascii_dsn, autocommit=True) as conn:
        init, _ = _init_relay(sql_ascii_dsn, table)
        conn.execute("SET client_encoding = 'UTF8'")
        conn.execute(_INSERT.format("outbox", "", ""), ("naïve ✓",))
        rows = _read_all(sql_ascii_dsn, table)
    assert init.returncode == 0, init.stderr
    assert [row.values["aggregateid"] for row in rows] == ["naïve ✓"]
    assert rows[0].values["type"] == "OrderPaid"


def test_a_row_of_text_that_is_not_utf8_in_a_sql_ascii_database_is_read_as_undecodable(
        sql_ascii_dsn: str) -> None:
    # Every read that reached such a row failed with Postgres's 'invalid byte sequence for
    # encoding "UTF8"', and the relay stalled on it (stop 46, documented).
    with _table(sql_ascii_dsn, "outbox") as table, \
            psycopg.connect(sql_ascii_dsn, autocommit=True) as conn:
        init, _ = _init_relay(sql_ascii_dsn, table)
        with conn.cursor() as cursor:  # the connection's SQL_ASCII: bytes go as they are
            cursor.execute(_INSERT.format("outbox", "", "").replace("%s", "'caf\xe9'")
                           .encode("latin-1"))
        conn.execute("SET client_encoding = 'UTF8'")
        conn.execute(_INSERT.format("outbox", "", ""), ("naïve ✓",))
        bad_id = conn.execute(f"SELECT id::text FROM {table} ORDER BY seq LIMIT 1").fetchone()
        rows = _read_all(sql_ascii_dsn, table)
    assert init.returncode == 0, init.stderr
    assert [row.values["aggregateid"] for row in rows] == ["caf\\xe9", "naïve ✓"]
    assert rows[0].undecodable is not None and "'aggregateid' is not UTF-8" in str(
        rows[0].undecodable)
    assert bad_id is not None and rows[0].undecodable.event_id == bad_id[0]
    assert rows[1].undecodable is None and rows[1].values["type"] == "OrderPaid"


def test_republish_reads_a_sql_ascii_databases_text_as_text(sql_ascii_dsn: str) -> None:
    # QA 47-g F1, F2: psycopg gave bytes there: every column went into the change event as
    # base64 (each event then a dead letter), and `--ids` named the ids it found as missing.
    from cdc_router.outbox.republish import RowSelection, count_rows, outbox_rows
    from cdc_router.outbox.table import OutboxColumns, OutboxSchema

    with _table(sql_ascii_dsn, "outbox") as table, \
            psycopg.connect(sql_ascii_dsn, autocommit=True) as conn:
        conn.execute("SET client_encoding = 'UTF8'")
        conn.execute(_INSERT.format("outbox", "", ""), ("naïve ✓",))
        [(found,)] = conn.execute(f"SELECT id::text FROM {table}").fetchall()
        schema = OutboxSchema(table, OutboxColumns())
        with psycopg.connect(sql_ascii_dsn) as reading:
            selection = RowSelection(ids=(found, "nosuch"))
            count, _, missing = count_rows(reading, schema, selection)
            rows = list(outbox_rows(reading, schema, selection))
    assert (count, missing) == (1, ["nosuch"])
    assert rows[0]["aggregateid"] == "naïve ✓" and rows[0]["type"] == "OrderPaid"
