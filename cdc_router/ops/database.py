"""Postgres's side of `status`: the connector's slots and their WAL, the publication, the outbox.

One short connection, read only. The WAL a slot holds back is measured as Postgres itself
does for `max_slot_wal_keep_size`: from its restart_lsn to the current WAL position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar, cast

import psycopg
from psycopg import sql

from cdc_router.config.dsn import refused_dsn
from cdc_router.errors import ConfigError
from cdc_router.ops.report import OutboxState, PreparedXact, PublicationState, Slot, WalState
from cdc_router.outbox.existing import column_list_problem, publication_filter, row_filter_problem
from cdc_router.outbox.table import OutboxColumns, OutboxSchema
from cdc_router.outbox.tools import outbox_stats
from cdc_router.postgres import (
    PREPARED_HINT,
    column_types,
    one_line,
    read_publication,
    refused_for_good,
    regclass_text,
    server_unreachable,
    session_options,
)

T = TypeVar("T")

# A status check answers in seconds or says why: a Postgres that does not accept the TCP
# connection in 5 s (session_options, unless the DSN says otherwise) is reported as
# unreachable rather than waited for; a lock on the outbox
# (an ALTER TABLE, a VACUUM FULL) is waited for 5 s, a query (a count of a huge outbox) 20 s,
# then its section says so (review 49-b F1: status hung for as long as the lock was held).
LOCK_TIMEOUT_MS = 5_000
STATEMENT_TIMEOUT_MS = 20_000

_SLOTS = """
SELECT slot_name, active, wal_status, safe_wal_size,
       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint,
       pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
FROM pg_replication_slots WHERE slot_name = ANY(%(names)s)
   OR (%(names)s IS NULL AND slot_type = 'logical' AND database = current_database())
"""


_OTHER_INACTIVE = """
SELECT slot_name, wal_status, safe_wal_size,
       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint
FROM pg_replication_slots WHERE slot_type = 'logical'
  AND database = coalesce(%(database)s, current_database()) AND NOT active
  AND slot_name <> ALL(%(names)s) ORDER BY slot_name
"""


def probe_database(dsn: str, slots: list[str] | None, publication: str | None,
                   outbox: OutboxSchema, *, reader: str | None = None,
                   signal_table: str | None = None, source: str = "the DSN",
                   named_by: str = "cleanup.table", others: Sequence[OutboxSchema] = (),
                   database: str | None = None,
                   ) -> tuple[WalState, PublicationState, OutboxState]:
    """The three Postgres sections; each holds the error when its query failed. `slots` None:
    every logical slot of this database; `publication` None: not checked (an empty state).
    `source` names where the DSN came from, for a connection refused for good; `named_by` the
    setting that named the outbox, for a table the database lacks; `others`: the connector's
    other captured tables, checked alike (the outbox's `others`); `database`: the one the
    connector captures, whose publication and outbox only are this pipeline's."""
    try:
        # application_name: its queries are named in pg_stat_activity (review 49-b F6).
        conn = psycopg.connect(dsn, autocommit=True, **session_options(dsn, "cdc-router-status"))
        conn.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
        conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
    except psycopg.Error as error:
        message = f"Postgres: {one_line(error)}"
        if (problem := refused_dsn(dsn, error)) is not None:  # no server asked: reread 59 F-2
            message = f"libpq refuses the DSN, before asking any server: {problem}"
        if refused_for_good(error):  # QA 44-a: a wrong password did not say which setting
            message += f" (the DSN comes from {source}: fix it there)"
        return WalState(error=message), PublicationState(error=message, name=publication), \
            OutboxState(error=message, table=outbox.table)
    with conn:
        outbox, listed = _for_table(conn, outbox)
        others = [_for_table(conn, other)[0] for other in others]
        elsewhere = _other_database(conn, database, source)
        if elsewhere is not None:  # slots are the server's: still this pipeline's
            # The other inactive slots of the connector's database, not of the DSN's.
            return (_guarded(lambda: wal_state(conn, slots, database), WalState),
                    PublicationState(error=elsewhere, name=publication),
                    OutboxState(error=elsewhere, table=outbox.table))
        return (_guarded(lambda: wal_state(conn, slots), WalState),
                _guarded(lambda: publication_state(conn, publication, signal_table, outbox),
                         PublicationState)
                if publication is not None else PublicationState(),
                replace(_checked(conn, outbox, reader, named_by), listed_columns=listed,
                        others=tuple(
                    _named(_checked(conn, other, reader, OTHER_TABLE), other.table)
                    for other in others)))


def _for_table(conn: psycopg.Connection[Any],
               outbox: OutboxSchema) -> tuple[OutboxSchema, tuple[str, ...]]:
    """`outbox` with each column listed over a rename the first of its names the table has,
    and which those are; as it is when nothing is listed, or the table cannot be read (its
    check says why)."""
    if not outbox.listed:
        return outbox, ()
    try:
        present = column_types(conn, outbox.table)
    except psycopg.Error:
        return outbox, ()
    return outbox.for_table(present), outbox.choices(present)


def _other_database(conn: psycopg.Connection[Any], database: str | None,
                    source: str) -> str | None:
    """Why the DSN's database is not the connector's `database`, or None when it is (or that
    cannot be told). QA 63-b F-2: pipelines of two databases on one server, the shell's
    CDC_ROUTER_PG_DSN naming the first: status of the second's config said its publication
    was missing, critical, and advised creating it in the first."""
    if not database or "${" in database:  # a placeholder Connect's worker resolves
        return None
    try:
        row = conn.execute("SELECT current_database()").fetchone()
    except psycopg.Error:
        return None
    current = row[0] if row else None
    if current is None or current == database:
        return None
    return (f"the connector captures database {database!r}, and the DSN from {source} "
            f"connects to database {current!r}, where this pipeline's publication and outbox "
            f"are not: give status the DSN of database {database!r} (--dsn)")


# What names a captured table besides the one status checks first (its `others`).
OTHER_TABLE = "the connector's table.include.list, another table it captures"


def _checked(conn: psycopg.Connection[Any], schema: OutboxSchema, reader: str | None,
             named_by: str) -> OutboxState:
    return _guarded(lambda: outbox_state(conn, schema, reader), OutboxState,
                    lambda error: _outbox_hint(error, schema, named_by))


def _named(state: OutboxState, table: str) -> OutboxState:
    """`state` naming its table when its check failed (one of several tables)."""
    return state if state.table is not None else replace(state, table=table)


def _outbox_hint(error: psycopg.Error, outbox: OutboxSchema, named_by: str) -> str:
    """What to set when the outbox or one of its columns is not there: Postgres answered, the
    config names what the table does not have (QA 54-a F-1: status said UNREACHABLE)."""
    if isinstance(error, psycopg.errors.UndefinedTable):
        if named_by == "status.outbox_table":
            return f" (renamed?): fix status.outbox_table, which names {outbox.table}"
        if named_by == OTHER_TABLE:
            return (" (renamed?): fix the connector's table.include.list, which names "
                    f"{outbox.table}")
        return (f" (renamed?): fix {named_by}, which names {outbox.table}, or name the outbox "
                "with status.outbox_table")
    if not isinstance(error, psycopg.errors.UndefinedColumn):
        return ""
    # Its primary message only (as one_line): the rest quotes the query, every column of it.
    text = error.diag.message_primary or (str(error).splitlines() or [""])[0]
    fields = [name for name, column in outbox.columns.model_dump().items()
              if column is not None and f'"{column}"' in text]
    where = f"source.outbox.{fields[0]}" if fields else "the source.outbox column names"
    return (f" in {outbox.table} (renamed?): set {where} to the column's name (headers and "
            "created_at may be null for a table without them)")


def _guarded(read: Callable[[], T], kind: Callable[..., T],
             hint: Callable[[psycopg.Error], str] = lambda _: "") -> T:
    try:  # answered: True when Postgres answered, its query's rows or its refusal alike
        return cast(T, replace(cast(Any, read()), answered=True))
    except psycopg.errors.LockNotAvailable as error:
        return kind(answered=True,
                    error=f"Postgres: {one_line(error)} (another session holds a lock on a "
                          f"table this check reads, over {LOCK_TIMEOUT_MS // 1000} s: see "
                          f"pg_locks and pg_stat_activity, and {PREPARED_HINT})")
    except psycopg.errors.QueryCanceled as error:
        return kind(answered=True,
                    error=f"Postgres: {one_line(error)} (a query of this check took over "
                          f"{STATEMENT_TIMEOUT_MS // 1000} s)")
    except psycopg.Error as error:
        # A connection lost mid-check did not answer; any other error is a failed query.
        return kind(answered=not server_unreachable(error),
                    error=f"Postgres: {one_line(error)}{hint(error)}")


_PREPARED = """
SELECT gid, EXTRACT(EPOCH FROM now() - prepared)::float8, database, owner
FROM pg_prepared_xacts ORDER BY prepared
"""


def wal_state(conn: psycopg.Connection[Any], names: list[str] | None,
              database: str | None = None) -> WalState:
    """The slots `names` (each, found or not) and the other inactive logical slots of
    `database` (by default this one's), or every logical slot of this database for None."""
    row = conn.execute("SELECT pg_size_bytes(current_setting('max_slot_wal_keep_size'))"
                       ).fetchone()
    limit = int(row[0]) if row is not None else None
    found = {slot: Slot(slot, True, bool(active), status, retained_wal_bytes=_int(retained),
                        safe_wal_size_bytes=_int(safe), flush_lag_bytes=_int(lag))
             for slot, active, status, safe, retained, lag in conn.execute(
                 _SLOTS, {"names": names})}
    prepared = tuple(PreparedXact(str(gid), float(age), str(database), str(owner))
                     for gid, age, database, owner in conn.execute(_PREPARED))
    others = () if names is None else tuple(
        Slot(slot, True, False, status, retained_wal_bytes=_int(retained),
             safe_wal_size_bytes=_int(safe))
        for slot, status, safe, retained in conn.execute(_OTHER_INACTIVE, {
            "names": names, "database": database}))
    return WalState(max_slot_wal_keep_size_bytes=limit, prepared=prepared,
                    slots=tuple(found.values()) if names is None else
                    tuple(found.get(name, Slot(name, exists=False)) for name in names),
                    other_inactive_slots=others)


def publication_state(conn: psycopg.Connection[Any], name: str,
                      signal_table: str | None = None,
                      outbox: OutboxSchema | None = None) -> PublicationState:
    """The publication, whether the connector's signal table (Debezium's `schema.table`,
    quoted or not) exists, and what its row filter or column list on `outbox` loses."""
    signals = None
    if signal_table is not None:
        found = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                             (quoted_table(signal_table),)).fetchone()
        signals = bool(found and found[0])
    found = read_publication(conn, name)
    if found is None:
        return PublicationState(name=name, exists=False, signal_table=signal_table,
                                signal_table_exists=signals)
    filtered = columns = None
    if outbox is not None:
        row_filter, column_list = publication_filter(conn, name, outbox.table)
        filtered = row_filter_problem(name, outbox.table, row_filter)
        columns = column_list_problem(name, outbox, column_list)
    return PublicationState(name=name, exists=True, tables=found.tables,
                            operations=found.operations, via_root=found.via_root,
                            signal_table=signal_table, signal_table_exists=signals,
                            row_filter_problem=filtered, column_list_problem=columns)


def quoted_table(table: str) -> str:
    """Debezium's `schema.table` as SQL (regclass_text); as given when it is no table name."""
    try:
        return regclass_text(table, "signal.data.collection")
    except ConfigError:
        return table


def outbox_state(conn: psycopg.Connection[Any], schema: OutboxSchema,
                 reader: str | None = None) -> OutboxState:
    """`reader`: the connector's role, asked whether it may SELECT the table (the snapshot
    needs it; streaming does not, so a connector without it looks healthy until it
    snapshots)."""
    # QA 63-a: a column the config names that a migration renamed was `status: ok` while the
    # router dead-lettered the next events and stopped: Postgres names it (_outbox_hint).
    conn.execute(sql.SQL("SELECT {} FROM {} LIMIT 0").format(sql.SQL(", ").join(
        sql.Identifier(column) for column in schema.columns.model_dump().values()
        if column is not None), schema.identifier))
    stats = outbox_stats(conn, schema)
    row = conn.execute(
        "SELECT c.relkind, CASE WHEN r.oid IS NOT NULL THEN has_table_privilege(r.oid, c.oid, "
        "'SELECT') END FROM pg_class c LEFT JOIN pg_roles r ON r.rolname = %s "
        "WHERE c.oid = to_regclass(%s)", (reader, regclass_text(schema.table))).fetchone()
    return OutboxState(table=stats.table, rows=stats.rows, oldest_age_s=stats.oldest_age_s,
                       size_bytes=stats.table_bytes,
                       partitioned=None if row is None else row[0] == "p",
                       reader=reader, reader_may_select=None if row is None else row[1],
                       column_flags=column_flags(schema.columns))


def column_flags(columns: OutboxColumns) -> tuple[str, ...]:
    """`outbox init --column` values for `columns`: each name other than the default, and
    `name=` for an optional column the table lacks."""
    default = OutboxColumns().model_dump()
    return tuple(f"{field}={name or ''}" for field, name in columns.model_dump().items()
                 if name != default[field])


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
