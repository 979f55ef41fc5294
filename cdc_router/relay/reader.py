"""The relay's reads of the outbox table: the current snapshot, and the rows a position wants.

Each row comes back as the values Debezium's JsonConverter would send for it (text for text,
uuid and jsonb columns, base64 or hex for a bytea payload per source.binary_handling, ISO text
for created_at in UTC), so that debezium.event_from_row applies the router's very checks and
builds the same OutboxEvent. The row's other columns are extra columns as Postgres's text; the
relay's own two columns are left out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from cdc_router.config.relay import RelaySettings
from cdc_router.config.source import SourceSettings
from cdc_router.errors import ConfigError, DecodeError
from cdc_router.outbox.relay_columns import (
    partitioned_by,
    relay_columns_ddl,
    relay_trigger,
    render_ddl,
    seq_allows_null,
    seq_not_null_ddl,
    trigger_ddl,
    unique_seq_ddl,
)
from cdc_router.postgres import (
    column_types,
    missing_table,
    one_line,
    regclass_text,
    require_outbox_grants,
    session_options,
    table_identifier,
)
from cdc_router.relay.guard import DatabaseIdentity, RelayPosition, Snapshot
from cdc_router.relay.lock_wait import LockWait, blocking_pids
from cdc_router.relay.same_database import primary_database

log = logging.getLogger("cdc_router.relay")

_INTEGER_TYPES = frozenset({"bigint", "integer", "smallint"})


# Rows taken from the server-side cursor at a time: the memory beyond relay.batch_bytes.
_FETCH_ROWS = 20


@dataclass(frozen=True)
class RelayRow:
    """One outbox row as read: its insert order, its transaction, its values by column."""

    seq: int
    txid: int
    values: dict[str, Any]
    # Why the row cannot be read as text (a SQL_ASCII database's bytes that are not UTF-8):
    # it is the row's dead letter, not a failure of every read (_text_of).
    undecodable: DecodeError | None = None

    @property
    def size(self) -> int:
        """The bytes of its text and binary values, what relay.batch_bytes counts."""
        return sum(len(value) for value in self.values.values()
                   if isinstance(value, str | bytes))


class FetchedRows(list[RelayRow]):
    """A batch of rows; `truncated`: it ended at relay.batch_bytes, not for want of rows, so
    the read goes on after it (RelayPosition.after_batch)."""

    truncated = False


def read_failure(error: psycopg.Error, table: str) -> str:
    """The batch_failed reason of a read that failed: Postgres's line, and for a grant
    revoked while the relay runs the GRANT to give (review 51-d F9: it named none)."""
    reason = f"Postgres: {one_line(error)}"
    if isinstance(error, psycopg.errors.InsufficientPrivilege):
        reason += (f"; field 'relay.table': GRANT SELECT ON {table} TO the role of relay.dsn "
                   "(else cleanup.dsn); tried again meanwhile, nothing is relayed")
    return reason


class OutboxReader:
    """Reads one outbox table on its own connection (made on first use, again after a failure).

    Raises psycopg.Error when Postgres fails (the caller backs off and calls again) and
    ConfigError when the table lacks what the relay needs.
    """

    def __init__(self, dsn: str, relay: RelaySettings, source: SourceSettings, *,
                 connect: Callable[..., psycopg.Connection[Any]] = psycopg.connect) -> None:
        self._dsn = dsn
        self._relay = relay
        self._source = source
        self._outbox = source.outbox.first  # the table's own names once read (_prepare)
        self._connect = connect
        self._conn: psycopg.Connection[Any] | None = None
        self._select: sql.Composable | None = None
        self._names: list[str] = []
        self._types: dict[str, str] = {}  # the columns the select list was built for
        # A SQL_ASCII database: text is read as its bytes and decoded row by row (_text_of).
        self._raw_text = False
        self.database: DatabaseIdentity | None = None  # of the connection, once made
        # Column name -> its Connect field schema, as debezium.event_from_row reads it.
        self.columns: dict[str, dict[str, Any]] = {}

    def snapshot(self) -> Snapshot:
        """The current snapshot: which transactions have completed by now."""
        row = self._connection().execute("SELECT pg_current_snapshot()::text").fetchone()
        assert row is not None
        return Snapshot.parse(str(row[0]))

    def fetch(self, position: RelayPosition, limit: int) -> FetchedRows:
        """Up to `limit` rows that `position` wants (RelayPosition.wanted), in seq order, and
        no more than relay.batch_bytes of values past the first row (FetchedRows.truncated)."""
        conn = self._connection()
        reading = position.reading
        if reading is None:
            raise ValueError("fetch needs a read in progress (RelayPosition.start_read)")
        txid, seq = (sql.Identifier(self._relay.txid_column),
                     sql.Identifier(self._relay.seq_column))
        # The bounds on txid alone let the index on it narrow the scan; the
        # pg_visible_in_snapshot calls then decide row by row.
        where = [sql.SQL("{} < %(xmax)s::xid8 AND pg_visible_in_snapshot({}, "
                         "%(reading)s::pg_snapshot)").format(txid, txid)]
        params: dict[str, Any] = {"xmax": str(reading.xmax), "reading": str(reading),
                                  "limit": limit}
        if position.done is not None:
            # Not completed in `done`: at or past its xmax, or one of its in-progress ids. Not
            # `>= done.xmin` (QA 48-c F3: with one transaction open for long, every idle read
            # walked each row written since it began, 135 ms on 300,000 rows; this, 0.3 ms).
            where.append(sql.SQL("({} >= %(done_xmax)s::xid8 OR {} = ANY(%(xip)s::xid8[])) AND "
                                 "NOT pg_visible_in_snapshot({}, %(done)s::pg_snapshot)"
                                 ).format(txid, txid, txid))
            params.update(done_xmax=str(position.done.xmax), done=str(position.done),
                          xip=[str(xid) for xid in position.done.xip])
        if position.after_seq is not None:
            where.append(sql.SQL("{} > %(after)s").format(seq))
            params["after"] = position.after_seq
        rows, size = FetchedRows(), 0
        # A server-side cursor (in a transaction), read a few rows at a time, so that the
        # batch stops at its byte budget without the rest in memory.
        with conn.transaction(), conn.cursor(name="cdc_router_relay_batch") as cursor:
            self._columns_now(conn)
            assert self._select is not None
            cursor.execute(sql.SQL("{} WHERE {} ORDER BY {} LIMIT %(limit)s").format(
                self._select, sql.SQL(" AND ").join(where), seq), params)
            while len(rows) < limit and size < self._relay.batch_bytes:
                found_rows = cursor.fetchmany(_FETCH_ROWS)
                if not found_rows:
                    return rows
                for found in found_rows:
                    if rows and size >= self._relay.batch_bytes:
                        break
                    if found[0] is None:  # a NOT NULL dropped under the lock? never int(None)
                        raise self._nullable_seq()
                    values = dict(zip(self._names, found[2:], strict=True))
                    row = RelayRow(int(found[0]), int(found[1]), values,
                                   self._text_of(values) if self._raw_text else None)
                    if not position.wanted(row.txid, row.seq):  # SQL and model must agree
                        raise AssertionError(f"row seq {row.seq} txid {row.txid} is not "
                                             f"wanted by the position {position}")
                    rows.append(row)
                    size += row.size
            rows.truncated = len(rows) < limit
        return rows

    def passed_ids(self, position: RelayPosition, keep: Callable[[str], bool]) -> list[str]:
        """The ids `keep` takes of the rows still in the table that `position` has passed
        (RelayPosition.passed), read through a server-side cursor: only the kept ids stay in
        memory (reread 55-r F-2: millions of skipped rows behind it came back as one list)."""
        txid, seq = (sql.Identifier(self._relay.txid_column),
                     sql.Identifier(self._relay.seq_column))
        completed = "({} < %({})s::xid8 AND pg_visible_in_snapshot({}, %({})s::pg_snapshot)"
        behind: list[sql.Composable] = []
        if position.done is not None:
            behind.append(sql.SQL(completed + ")").format(txid, sql.SQL("done_xmax"), txid,
                                                          sql.SQL("done")))
        if position.reading is not None and position.after_seq is not None:
            behind.append(sql.SQL(completed + " AND {} <= %(after)s)").format(
                txid, sql.SQL("xmax"), txid, sql.SQL("reading"), seq))
        if not behind:
            return []
        query = sql.SQL("SELECT {}::text FROM {} WHERE {}").format(
            sql.Identifier(self._outbox.id),
            table_identifier(self._relay.table, "relay.table"), sql.SQL(" OR ").join(behind))
        reading, done = position.reading, position.done
        params = {"done_xmax": done and str(done.xmax), "done": done and str(done),
                  "xmax": reading and str(reading.xmax), "reading": reading and str(reading),
                  "after": position.after_seq}
        conn = self._connection()
        # Iterating a named cursor fetches its itersize rows (100) at a time.
        with conn.transaction(), conn.cursor(name="cdc_router_relay_passed") as cursor:
            cursor.execute(query, params)
            return [str(row[0]) for row in cursor if row[0] is not None and keep(str(row[0]))]

    def reset(self) -> None:
        """Drop the connection (after a failure); the next call makes a new one."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(psycopg.Error):  # gone either way (and a lock with it)
                conn.close()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            conn = self._connect(self._dsn, autocommit=True,
                                 **session_options(self._dsn, "cdc-router-relay"))
            # created_at as ISO text in UTC, whatever the server's or role's defaults.
            conn.execute("SET TimeZone = 'UTC'")
            conn.execute("SET DateStyle = 'ISO'")
            # Text as UTF-8 whatever the database's encoding: in a SQL_ASCII one psycopg gave
            # bytes for every text and name, and the checks found no column (review 46 F6).
            conn.execute("SET client_encoding = 'UTF8'")
            # There Postgres checks each value it sends as UTF-8: one row's other bytes failed
            # every read. The rows' text goes as bytes instead, decoded here row by row.
            encoding = conn.execute("SHOW server_encoding").fetchone()
            self._raw_text = encoding is not None and encoding[0] == "SQL_ASCII"
            self.database = primary_database(conn)
            self._conn = conn
            if self._select is None:
                self._prepare(conn)
        return self._conn

    def _columns_now(self, conn: psycopg.Connection[Any]) -> None:
        """In the batch's transaction: the table locked as its SELECT locks it (ACCESS SHARE,
        by an empty SELECT, which waits for an ALTER TABLE to end), its columns read again
        and, when they changed, the select list built anew (QA 33-c: after a DROP COLUMN
        every read failed for ever; a payload made bytea was read as text, dead-lettered)."""
        table = self._relay.table
        try:
            # Not LOCK TABLE, which needs SELECT on the whole table (review 33-3: a role granted
            # its columns one by one was refused every read).
            pid = conn.info.backend_pid  # a lock held for long is said (QA 67-a F-2)
            with LockWait(table, lambda: blocking_pids(self._dsn, pid, self._connect)):
                conn.execute(sql.SQL("SELECT FROM {} LIMIT 0").format(
                    table_identifier(table, "relay.table")))
        except psycopg.errors.UndefinedTable:
            raise ConfigError("the outbox table was dropped while the relay ran",
                              field="relay.table", value=table,
                              hint="create it with `cdc-router outbox init`") from None
        types = column_types(conn, table, "relay.table")
        if types != self._types:
            log.info("event=relay_columns_changed table=%s columns=%s", table, ",".join(types))
            self._prepare(conn, types)
        else:  # ALTER ... DROP NOT NULL changes no type: checked under this batch's lock
            self._check_seq_not_null(conn)

    def _prepare(self, conn: psycopg.Connection[Any],
                 types: dict[str, str] | None = None) -> None:
        """Read the table's columns (unless given), check them, and build the select list."""
        table = self._relay.table
        types = column_types(conn, table, "relay.table") if types is None else types
        if not types:
            raise missing_table(table, "relay.table")
        require_outbox_grants(conn, table, "relay.table", delete=False)  # review 51-d F9: at start
        partitioned = partitioned_by(conn, table, self._relay.seq_column)
        self._check_relay_columns(types, partitioned)
        self._check_seq_not_null(conn)
        self._check_indexes(conn, partitioned)
        # A column listed with several names (a rename): the first the table has, again at
        # each change of its columns.
        self._outbox = self._source.outbox.for_table(types)
        for column in self._outbox.required:
            if column not in types:
                raise ConfigError(f"the outbox table {table} has no column {column!r}",
                                  field="source.outbox", value=sorted(types),
                                  hint="name the table's columns under source.outbox")
        self._types, self.columns = types, {}
        own = {self._relay.txid_column, self._relay.seq_column}
        selected: list[sql.Composable] = [sql.SQL("{}, {}::text").format(
            sql.Identifier(self._relay.seq_column), sql.Identifier(self._relay.txid_column))]
        self._names = []
        for column, kind in types.items():
            if column in own:
                continue
            selected.append(self._select_one(column, kind))
            self._names.append(column)
        self._select = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(selected), table_identifier(table, "relay.table"))

    def _text_of(self, values: dict[str, Any]) -> DecodeError | None:
        """Decode, in place, the bytes a SQL_ASCII database gave for each text value; the
        row's decode error when one is not UTF-8 (that value kept with its bytes escaped)."""
        undecodable = None
        for column, value in values.items():
            if isinstance(value, bytes):
                try:
                    values[column] = value.decode()
                except UnicodeDecodeError as error:
                    values[column] = value.decode(errors="backslashreplace")
                    undecodable = undecodable or DecodeError(
                        f"column {column!r} is not UTF-8 text (byte 0x{value[error.start]:02x} "
                        f"at {error.start}) in a SQL_ASCII database: fix the row, or write "
                        "UTF-8 to it")
        if undecodable is not None:
            event_id = values.get(self._outbox.id)
            undecodable.event_id = event_id if isinstance(event_id, str) else None
        return undecodable

    def _select_one(self, column: str, kind: str) -> sql.Composable:
        name = sql.Identifier(column)
        if column == self._outbox.payload and kind == "bytea":
            self.columns[column] = {"type": "bytes"}
            if self._source.binary_handling == "hex":
                return sql.SQL("encode({}, 'hex')").format(name)
            # encode(..., 'base64') breaks lines every 76 characters; Debezium does not.
            return sql.SQL("translate(encode({}, 'base64'), E'\\n', '')").format(name)
        if self._raw_text:
            return sql.SQL("convert_to({}::text, 'SQL_ASCII')").format(name)
        return sql.SQL("{}::text").format(name)

    def _check_indexes(self, conn: psycopg.Connection[Any], partitioned: bool) -> None:
        """Refuse a table without a valid unique index on seq or without the trigger that
        sets txid (relay_columns.py: rows would be skipped for good); warn when txid leads no
        valid index: the relay works, but scans."""
        relay = self._relay
        table = regclass_text(relay.table, "relay.table")
        rows = conn.execute(
            "SELECT a.attname, i.indisvalid, i.indisunique AND i.indnkeyatts = 1 "
            "AND i.indpred IS NULL FROM pg_index i JOIN pg_attribute a ON a.attrelid = "
            "i.indrelid AND a.attnum = i.indkey[0] WHERE i.indrelid = to_regclass(%s)",
            (table,)).fetchall()
        missing, statements = [], []
        if not any(name == relay.seq_column and valid and unique for name, valid, unique in rows):
            missing.append(f"a valid unique index on {relay.seq_column!r} (reads are paged by "
                           "it: rows sharing a value would be skipped)")
            statements.append(unique_seq_ddl(relay.table, relay.seq_column,
                                             partitioned=partitioned))
        if conn.execute("SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(%s) AND tgname = "
                        "%s AND tgenabled <> 'D'",
                        (table, relay_trigger(relay.table, relay.txid_column))).fetchone() is None:
            missing.append(f"the trigger that sets {relay.txid_column!r} (a row inserted with "
                           "its own would never be read)")
            statements += trigger_ddl(relay.table, relay.txid_column)
        if missing:
            raise ConfigError(
                f"the outbox table {relay.table} lacks {' and '.join(missing)}",
                field="relay.table", value=relay.table,
                hint="`cdc-router outbox init --relay` adds them for the default column names;"
                     " or run (renumber repeated values first if the index fails): "
                     + render_ddl(statements).replace("\n", " ").strip())
        if not any(name == relay.txid_column and valid for name, valid, _ in rows):
            log.warning("event=relay_index_missing table=%s column=%s hint='CREATE INDEX ON "
                        "the table (%s): without a valid one every read scans the table'",
                        relay.table, relay.txid_column, relay.txid_column)

    def _check_seq_not_null(self, conn: psycopg.Connection[Any]) -> None:
        """Refuse a seq column that allows NULL (review 46 F1): ORDER BY seq puts such a row
        last, where int(None) stopped the relay, and a read paged by `seq > the last one`
        never reaches it: once the read ended, its transaction counted as done, the row was
        skipped for good."""
        if seq_allows_null(conn, self._relay.table, self._relay.seq_column):
            raise self._nullable_seq()

    def _nullable_seq(self) -> ConfigError:
        relay = self._relay
        return ConfigError(
            f"column {relay.seq_column!r} of {relay.table} may be NULL: the relay reads rows "
            "in seq order, a row without one would never be read", field="relay.seq_column",
            hint=f"give such rows a {relay.seq_column}, then run: "
                 + render_ddl([seq_not_null_ddl(relay.table, relay.seq_column)]).strip()
                 + " (`cdc-router outbox init --relay` does it for the default column names)")

    def _check_relay_columns(self, types: dict[str, str], partitioned: bool) -> None:
        relay = self._relay
        problems = []
        if types.get(relay.txid_column) != "xid8":
            problems.append(f"column {relay.txid_column!r} of type xid8 "
                            f"(found {types.get(relay.txid_column) or 'none'})")
        if types.get(relay.seq_column) not in _INTEGER_TYPES:
            problems.append(f"integer column {relay.seq_column!r} "
                            f"(found {types.get(relay.seq_column) or 'none'})")
        if problems:
            ddl = render_ddl(relay_columns_ddl(relay.table, relay.txid_column, relay.seq_column,
                                               partitioned=partitioned)).replace("\n", " ")
            raise ConfigError(f"the relay needs {' and '.join(problems)} on {relay.table}",
                              field="relay.txid_column/seq_column",
                              hint=f"add them (Postgres 14 or later): {ddl.strip()}")

