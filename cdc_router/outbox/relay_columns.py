"""The two columns `cdc-router relay` needs on the outbox table, and the indexes it reads by.

`txid xid8 DEFAULT pg_current_xact_id()` is the inserting transaction's full id, which the
relay's visibility guard compares with Postgres snapshots (cdc_router/relay/guard.py); `seq`, an
identity column (GENERATED ALWAYS) with a unique index, is the insert order the relay delivers
a read's rows in. Both are filled by the database: the application never writes them.
Debezium ignores `xid8` columns (an unknown type to it), so the same table serves both.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import Any

import psycopg
from psycopg import sql

from cdc_router.errors import ConfigError, DatabaseError
from cdc_router.outbox.setup import INIT_LOCK
from cdc_router.postgres import (
    MAX_IDENTIFIER_BYTES,
    check_identifier,
    column_types,
    regclass_text,
    split_table,
    table_identifier,
)

# How long `outbox init --relay` waits for a lock on the table before it gives up (its SET
# lock_timeout, and what its line says: review 57, they were two '10 s').
LOCK_TIMEOUT_S = 10


def relay_columns_ddl(table: str, txid_column: str, seq_column: str, *,
                      existing: Collection[str] = (),
                      partitioned: bool = False) -> list[sql.Composed]:
    """Idempotent statements that add the relay's columns, indexes and txid trigger (Postgres
    14 or later), each to run on its own, as psql runs a script (no transaction block: the indexes
    are built CONCURRENTLY, so that an outbox in use keeps taking INSERTs meanwhile, except on a
    `partitioned` table, where Postgres builds them only under a lock).

    An ALTER TABLE takes an ACCESS EXCLUSIVE lock even when its column is there: it is left
    out for the columns `existing` names. Adding a column with a volatile default rewrites
    the table under that lock: run it when the table is small (or empty), not under full load.
    """
    target = table_identifier(table, "relay.table")
    statements = []
    if seq_column not in existing:
        statements.append(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} bigint GENERATED "
                                  "ALWAYS AS IDENTITY").format(target, sql.Identifier(seq_column)))
        # A seq column that was there already (the app's own) may allow NULL.
        statements.append(seq_not_null_ddl(table, seq_column))
    if txid_column not in existing:
        statements.append(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} xid8 NOT NULL "
                                  "DEFAULT pg_current_xact_id()").format(
            target, sql.Identifier(txid_column)))
    # txid: a new read finds the rows of transactions completed since the last one. seq: a
    # read bigger than a batch is paged in seq order; without this index each page sorts the
    # whole read again (measured: 200k rows in pages of 1000 took 32 s, with it 1.8 s).
    statements.append(sql.SQL("CREATE INDEX {}IF NOT EXISTS {} ON {} ({})").format(
        _concurrently(partitioned), sql.Identifier(txid_index(table, txid_column)), target,
        sql.Identifier(txid_column)))
    statements.append(unique_seq_ddl(table, seq_column, partitioned=partitioned))
    statements += trigger_ddl(table, txid_column)
    return statements


def rewrite_warning(conn: psycopg.Connection[Any], table: str, txid_column: str,
                    seq_column: str) -> str | None:
    """What adding the relay's columns does to `table` when it holds rows and lacks one of
    them (L4: `outbox init --relay` rewrote a live table without a word); None when it is
    missing, empty or has both. Both columns take a volatile default (an identity, the
    transaction's id): Postgres rewrites every row under an ACCESS EXCLUSIVE lock."""
    columns = column_types(conn, table)
    missing = [c for c in (seq_column, txid_column) if c not in columns]
    # No columns: no table yet (init creates it with both), nothing to rewrite (review 63: a
    # SELECT of the missing table failed `outbox init --relay` on a new database).
    if not columns or not missing or conn.execute(sql.SQL("SELECT FROM {} LIMIT 1").format(
            table_identifier(table, "--table"))).fetchone() is None:
        return None
    # The planner's estimate: a count(*) of a big outbox would scan it (-1: never analyzed).
    found = conn.execute("SELECT reltuples::bigint, pg_size_pretty(pg_total_relation_size(oid)) "
                         "FROM pg_class WHERE oid = to_regclass(%s)",
                         (regclass_text(table),)).fetchone()
    rows, size = found if found else (-1, "size unknown")
    held = f"about {rows} rows" if rows > 0 else "rows"
    return (f"{table} holds {held} ({size}) and has no {' or '.join(missing)}: "
            "adding them rewrites the whole table under an ACCESS EXCLUSIVE lock, so the "
            "application's INSERTs (and Debezium's reads) wait until it is done (200000 rows, "
            "15 MiB: 8 s), and every row there is one the relay's first start delivers; run "
            "it off-peak, after `outbox purge` of the rows already delivered")


def seq_not_null_ddl(table: str, seq_column: str) -> sql.Composed:
    """seq made NOT NULL (a no-op on an identity column). The relay pages a read by `seq >
    the last one delivered` in seq order: a row whose seq is NULL would never be read (review
    46 F1). Postgres scans the table for NULLs under an ACCESS EXCLUSIVE lock, and refuses
    when it finds one."""
    return sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET NOT NULL").format(
        table_identifier(table, "relay.table"), sql.Identifier(seq_column))


def seq_allows_null(conn: psycopg.Connection[Any], table: str, seq_column: str) -> bool:
    """Whether `table` has a column `seq_column` that allows NULL (seq_not_null_ddl)."""
    found = conn.execute("SELECT NOT attnotnull FROM pg_attribute WHERE attrelid = "
                         "to_regclass(%s) AND attname = %s AND NOT attisdropped",
                         (regclass_text(table, "relay.table"), seq_column)).fetchone()
    return bool(found and found[0])


def seq_not_null_fix(conn: psycopg.Connection[Any], table: str,
                     seq_column: str) -> sql.Composed | None:
    """The statement that makes an existing seq NOT NULL, or None when it is; a ConfigError,
    before anything is changed, when rows hold a NULL seq: they need one first."""
    if not seq_allows_null(conn, table, seq_column):
        return None
    target, column = table_identifier(table, "relay.table"), sql.Identifier(seq_column)
    if conn.execute(sql.SQL("SELECT FROM {} WHERE {} IS NULL LIMIT 1").format(
            target, column)).fetchone() is not None:
        raise ConfigError(
            f"rows of {table} have no {seq_column} (NULL): the relay reads rows in seq order, "
            "and would never read them", field="--table", value=table,
            hint=f"give them one (UPDATE ... SET {seq_column} = ...), then run `outbox init "
                 "--relay` again")
    return seq_not_null_ddl(table, seq_column)


def unique_seq_ddl(table: str, seq_column: str, *, partitioned: bool = False) -> sql.Composed:
    """The unique index on seq. The relay pages a read by `seq > the last one delivered`: rows
    sharing a seq across a page's end would be skipped for good."""
    return sql.SQL("CREATE UNIQUE INDEX {}IF NOT EXISTS {} ON {} ({})").format(
        _concurrently(partitioned), sql.Identifier(unique_seq_index(table, seq_column)),
        table_identifier(table, "relay.table"), sql.Identifier(seq_column))


def _concurrently(partitioned: bool) -> sql.SQL:
    return sql.SQL("" if partitioned else "CONCURRENTLY ")


def partitioned_by(conn: psycopg.Connection[Any], table: str, seq_column: str,
                   field: str = "relay.table") -> bool:
    """Whether `table` is partitioned; a ConfigError unless by `seq_column` alone (QA 34-c: an
    outbox partitioned by created_at or by hash of id met Postgres's raw errors): a unique
    index, which the relay pages its reads by, must hold every partitioning column."""
    found = conn.execute("SELECT pg_get_partkeydef(to_regclass(%s))",
                         (regclass_text(table, "relay.table"),)).fetchone()
    key = found[0] if found else None
    if key is None:
        return False
    if key.replace('"', "").lower().partition(" ")[2] != f"({seq_column.lower()})":
        raise ConfigError(
            f"{table} is partitioned by {key}: the relay pages its reads by a unique "
            f"{seq_column!r}, and a partitioned table has a unique index only on columns that "
            "hold its partitioning ones", field=field,
            hint=f"partition the outbox by RANGE ({seq_column}) (README, the relay on a "
                 "partitioned outbox), or capture it with Debezium (`cdc-router run`)")
    return True


def _named(table: str, suffix: str, what: str) -> str:
    """The name of one of the relay's objects on `table`: the table's name and `suffix`, cut to
    Postgres's 63 bytes (not 63 characters: 30 x 'é' made no name, review 46-3)."""
    return check_identifier(_cut(f"{split_table(table, 'relay.table')[1]}_{suffix}",
                                 MAX_IDENTIFIER_BYTES), what)


def _index_name(table: str, suffix: str) -> str:
    """The name of one of the relay's indexes on `table`: the table's name and `suffix` when
    they fit in 63 bytes (as before: existing installs keep their indexes); else the table's
    name cut, a hash of the whole name and `suffix`. A plain cut named a 62-byte table's two
    indexes alike, and a 63-byte one's as the table: the unique one was never made (review 46
    F5). Indexes share their schema's namespace with tables; the trigger's name is the
    table's own (_named)."""
    table_name = split_table(table, "relay.table")[1]
    name = f"{table_name}_{suffix}"
    if len(name.encode()) <= MAX_IDENTIFIER_BYTES:
        return name
    digest = "_" + hashlib.sha256(name.encode()).hexdigest()[:8]
    room = MAX_IDENTIFIER_BYTES - len(f"{digest}_{suffix}".encode())
    if room < 1:  # a column name of 50 bytes or more: the suffix is cut too
        return _cut(name, MAX_IDENTIFIER_BYTES - len(digest)) + digest
    return f"{_cut(table_name, room)}{digest}_{suffix}"


def _cut(text: str, size: int) -> str:
    """`text`'s first `size` bytes of UTF-8, never half a character."""
    return text.encode()[:size].decode(errors="ignore")


def txid_index(table: str, txid_column: str) -> str:
    return _index_name(table, f"{txid_column}_idx")


def unique_seq_index(table: str, seq_column: str) -> str:
    return _index_name(table, f"{seq_column}_key")


def relay_trigger(table: str, txid_column: str) -> str:
    """The name of the trigger that gives txid its value (trigger_ddl)."""
    return _named(table, txid_column, "relay trigger")


def trigger_ddl(table: str, txid_column: str) -> list[sql.Composed]:
    """The BEFORE INSERT trigger that sets txid to the inserting transaction's id, whatever the
    INSERT says: a txid written by the application (an INSERT ... SELECT from an old outbox
    copies it) is a transaction the relay's position may count as done already, or one in the
    future, and the row would never be read. It names no table and uses no sequence (no
    privilege beyond the INSERT's), so a rename leaves it working."""
    function = sql.Identifier(split_table(table, "relay.table")[0],
                              _named(table, f"{txid_column}_fn", "relay trigger function"))
    return [
        sql.SQL("CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
                "$cdc_router$BEGIN NEW.{} := pg_current_xact_id(); RETURN NEW; END"
                "$cdc_router$").format(function, sql.Identifier(txid_column)),
        sql.SQL("CREATE OR REPLACE TRIGGER {} BEFORE INSERT ON {} FOR EACH ROW EXECUTE "
                "FUNCTION {}()").format(sql.Identifier(relay_trigger(table, txid_column)),
                                        table_identifier(table, "relay.table"), function),
    ]


def seq_always_ddl(table: str, seq_column: str) -> sql.Composed:
    """An identity seq made GENERATED ALWAYS (a catalog change, no rewrite): an INSERT that
    gives its own seq is refused at once, rather than run ahead of the sequence until a later
    ordinary INSERT collides with it on the unique index."""
    return sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET GENERATED ALWAYS").format(
        table_identifier(table, "relay.table"), sql.Identifier(seq_column))


def render_ddl(statements: list[sql.Composed]) -> str:
    """The statements as one psql script (for error messages and `--print`)."""
    return "".join(f"{statement.as_string(None)};\n" for statement in statements)


def relay_catalog(conn: psycopg.Connection[Any], table: str) -> tuple[Any, ...]:
    """What `outbox init --relay` may change on `table`, to tell whether it did: its columns
    (type, NOT NULL, identity), its indexes (valid or not) and its triggers."""
    target = regclass_text(table, "--table")
    found = conn.execute(
        "SELECT (SELECT array_agg(attname || ' ' || format_type(atttypid, atttypmod) || ' ' "
        "|| attnotnull::text || attidentity::text ORDER BY attnum) FROM pg_attribute WHERE "
        "attrelid = to_regclass(%(t)s) AND attnum > 0 AND NOT attisdropped), (SELECT "
        "array_agg(c.relname || ' ' || i.indisvalid::text ORDER BY c.relname) FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = to_regclass(%(t)s)), "
        "(SELECT array_agg(tgname ORDER BY tgname) FROM pg_trigger WHERE tgrelid = "
        "to_regclass(%(t)s))", {"t": target})
    return tuple(found.fetchone() or ())


def add_relay_columns(conn: psycopg.Connection[Any], table: str, txid_column: str,
                      seq_column: str) -> bool:
    """The relay's columns, indexes and trigger, each statement on its own (the indexes are
    built CONCURRENTLY: the outbox keeps taking INSERTs). An invalid index left by a build
    that failed (repeated values, a lock timeout) is dropped first, or IF NOT EXISTS would
    keep it; an identity seq of an earlier version becomes GENERATED ALWAYS, the app's own
    seq NOT NULL. True when the table changed."""
    conn.autocommit = True
    before = relay_catalog(conn, table)
    # Behind a long transaction, an ALTER would wait, and every INSERT queue behind it.
    conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(f"{LOCK_TIMEOUT_S}s")))
    schema_name, _ = split_table(table)
    partitioned = partitioned_by(conn, table, seq_column, "--table")
    not_null = seq_not_null_fix(conn, table, seq_column)  # an app's own seq (46 F1)
    try:
        for index in (txid_index(table, txid_column),
                      unique_seq_index(table, seq_column)):
            invalid = conn.execute(
                "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE "
                "i.indrelid = to_regclass(%s) AND c.relname = %s AND NOT i.indisvalid",
                (regclass_text(table), index)).fetchone()
            if invalid is not None and not partitioned:  # a partitioned one: a partition lacks it
                conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(
                    sql.Identifier(schema_name, index)))
        for statement in relay_columns_ddl(table, txid_column, seq_column,
                                           existing=column_types(conn, table),
                                           partitioned=partitioned):
            if "CONCURRENTLY" in statement.as_string(None):  # no transaction can hold it
                conn.execute(statement)
            else:
                _under_init_lock(conn, statement)
        if not_null is not None:
            _under_init_lock(conn, not_null)
        identity = conn.execute("SELECT attidentity FROM pg_attribute WHERE attrelid = "
                                "to_regclass(%s) AND attname = %s",
                                (regclass_text(table), seq_column)).fetchone()
        if identity is not None and identity[0] == "d":
            _under_init_lock(conn, seq_always_ddl(table, seq_column))
    except psycopg.errors.LockNotAvailable as error:
        raise _lock_waited(table) from error
    return relay_catalog(conn, table) != before


def _lock_waited(table: str) -> DatabaseError:
    """QA 56-f F-2: a transaction open on the table (or, for a CONCURRENTLY build, anywhere in
    the database since the build began) held init past lock_timeout; Postgres said only
    'canceling statement due to lock timeout'."""
    return DatabaseError(
        f"`outbox init --relay` waited {LOCK_TIMEOUT_S} s for a lock on {table} behind a "
        "transaction open since before it (list them: SELECT pid, xact_start, state, query "
        f"FROM pg_stat_activity WHERE xact_start < now() - interval '{LOCK_TIMEOUT_S} s'); it "
        "gave up rather than queue the table's INSERTs behind it. Nothing is lost: run it "
        "again once that transaction ends (an index the cancelled build left INVALID is built "
        "again)")


def _under_init_lock(conn: psycopg.Connection[Any], statement: sql.Composed) -> None:
    """`statement` in a transaction of its own, on init's advisory lock (reread 50-i F10: two
    `outbox init --relay` at once replaced the trigger function together, after init's own
    lock was released: Postgres's 'tuple concurrently updated')."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (INIT_LOCK,))
        conn.execute(statement)
