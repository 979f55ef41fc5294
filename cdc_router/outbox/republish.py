"""Outbox rows as the change events Debezium would have written for them, for `outbox republish`.

After a replication slot was dropped or invalidated, or a connector reset, the events of rows
committed in the gap never reach the raw topic. The rows are still in the outbox (cleanup
`none` or `retention`, or `delete` for rows not delivered yet). `outbox republish` reads them
and writes a change event per row onto the raw topic, in the shape of Debezium's PostgreSQL
connector with Kafka Connect's JsonConverter (schemas.enable=false, the shipped connector's
setting): key `{"<id column>":"<id>"}`, value `{"before":null,"after":{...},"source":{...},
"op":"c","ts_ms":...}`. The running router routes them like any other; its replay filter drops
those whose ids it already delivered.

Column values follow the shipped connector's settings: jsonb and json as their Postgres text,
bytea as base64 or hex (source.binary_handling), a timestamp without time zone as epoch
microseconds (time.precision.mode adaptive_time_microseconds), with a time zone as ISO-8601
UTC, numeric as text (decimal.handling.mode string), uuid as text. A timestamp without time
zone that Python cannot hold (after year 9999, BC, 'infinity') is read from its text, never as
a datetime, into the number Debezium sends (measured on the local stack: 'infinity' as
9223372036825200000, pgjdbc's DATE_POSITIVE_INFINITY taken for microseconds), and the router
dead-letters such a row with its reason rather than one row stopping the whole republish. A
timestamptz Python cannot hold goes as Postgres's text, which the router dead-letters at
decode (Debezium writes `+20000-01-01T00:00:00Z`; the router dead-letters that too).

The key's columns (--key-columns) are written as Debezium writes them, type and precision
counted (its JdbcValueConverters and PostgresValueConverter under adaptive_time_microseconds):
a timestamp(0) to timestamp(3) as epoch milliseconds (io.debezium.time.Timestamp), a date as
epoch days, a time as microseconds past midnight, a timestamptz with as many fraction digits as
its precision (6 unless given); else a key's bytes, so its raw partition, would not be
Debezium's (review 46). The value takes the milliseconds of a timestamp(0) to timestamp(3) too
(a created_at read with source.created_at_unit millis was a thousand times too late) and keeps
the other encodings above: the router reads a date's text as that date.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.adapt import Loader
from psycopg.rows import dict_row
from psycopg.types.datetime import TimestamptzLoader
from psycopg.types.string import TextLoader

from cdc_router.errors import ConfigError
from cdc_router.outbox.age import created_ms, require_time
from cdc_router.outbox.table import OutboxSchema
from cdc_router.postgres import INSERT_ORDER, column_types, split_table

# Rows fetched per round trip of the server-side cursor.
_FETCH_ROWS = 1000
_EPOCH = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)
CONNECTOR_NAME = "cdc-router-republish"  # source.connector of every republished event
# What Debezium writes for a timestamp without time zone of 'infinity' and '-infinity'.
_INFINITY_MICROS = {b"infinity": 9223372036825200000, b"-infinity": -9223372036832400000}
# Postgres's ISO output of a timestamp without time zone (DateStyle ISO), any year.
_TIMESTAMP = re.compile(rb"(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?( BC)?")
# A time type's precision in format_type's text: "timestamp(3) without time zone".
_PRECISION = re.compile(r"\((\d)\)")
_EPOCH_DAY = date(1970, 1, 1)


@dataclass(frozen=True)
class ChangeEvent:
    """One outbox row as a raw change record: Debezium's key and value bytes."""

    event_id: str
    key: bytes
    value: bytes


@dataclass(frozen=True)
class RowSelection:
    """The rows created at or after `since_ms` (epoch ms), or those with one of `ids`: as
    UUIDs for a uuid id column (`as_uuid`: ids_for_column's), else as the column's text."""

    since_ms: int | None = None
    ids: tuple[str, ...] | None = None
    as_uuid: bool = False

    def where(self, schema: OutboxSchema) -> tuple[sql.Composable, tuple[Any, ...]]:
        if self.ids is not None:
            compared = "{} = ANY(%s::uuid[])" if self.as_uuid else "{}::text = ANY(%s)"
            return (sql.SQL(compared).format(sql.Identifier(schema.columns.id)),
                    (list(self.ids),))
        since = datetime.fromtimestamp((self.since_ms or 0) / 1000, UTC).replace(tzinfo=None)
        return sql.SQL("{} >= %s").format(sql.Identifier(schema.created_at_column)), (since,)


def ids_for_column(given: list[tuple[str, str]], column_type: str, column: str
                   ) -> RowSelection:
    """The selection of the ids `given` (option, id) for an id column of `column_type`
    (format_type): for a uuid column each id as its canonical UUID text, so that an upper-case
    or braced form finds its row (review 53-c F13: it was "not in" the table, exit 0), and a
    ConfigError naming the option and the id for one that is no UUID; else as given."""
    if column_type != "uuid":
        return RowSelection(ids=tuple(event_id for _, event_id in given))
    ids = []
    for option, event_id in given:
        try:
            ids.append(str(uuid.UUID(event_id)))
        except ValueError:
            raise ConfigError(f"not a UUID, and the id column {column!r} is uuid", field=option,
                              value=event_id) from None
    return RowSelection(ids=tuple(ids), as_uuid=True)


class _MicrosLoader(Loader):
    """A timestamp without time zone as Debezium's MicroTimestamp: epoch microseconds, for any
    year Postgres holds (proleptic Gregorian, as both Postgres and Java count)."""

    def load(self, data: Any) -> int:
        text = bytes(data)
        if text in _INFINITY_MICROS:
            return _INFINITY_MICROS[text]
        found = _TIMESTAMP.fullmatch(text)
        if found is None:
            raise psycopg.DataError(f"unexpected timestamp text {text!r} (DateStyle ISO?)")
        year, month, day, hour, minute, second = map(int, found.groups()[:6])
        if found.group(8):
            year = 1 - year  # 1 BC is year 0
        fraction = int((found.group(7) or b"0").ljust(6, b"0"))
        seconds = _days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second
        return seconds * 1_000_000 + fraction


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date, any year (H. Hinnant's method)."""
    year -= month <= 2
    era = year // 400
    of_era = year - era * 400
    of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    return era * 146097 + of_era * 365 + of_era // 4 - of_era // 100 + of_year - 719468


class _ZonedLoader(Loader):
    """A timestamp with time zone as a datetime, or its text when Python cannot hold it."""

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        self._datetime = TimestamptzLoader(oid, context)

    def load(self, data: Any) -> datetime | str:
        try:
            return self._datetime.load(data)
        except psycopg.DataError:
            return bytes(data).decode()


def _read_as_debezium(conn: psycopg.Connection[Any]) -> None:
    """json and jsonb as their Postgres text, timestamps as _MicrosLoader and _ZonedLoader
    say, in UTC (a timestamp column holds UTC, as write_event writes)."""
    for name in ("json", "jsonb"):
        conn.adapters.register_loader(name, TextLoader)
    conn.adapters.register_loader("timestamp", _MicrosLoader)
    conn.adapters.register_loader("timestamptz", _ZonedLoader)
    conn.execute("SET TIME ZONE 'UTC'")
    conn.execute("SET DateStyle = 'ISO'")
    # Text as text in a SQL_ASCII database too, where psycopg gave bytes, written as base64
    # into the change events, each then a dead letter (QA 47-g F2); a row whose text is not
    # UTF-8 fails the command there, with Postgres's line naming the bytes.
    conn.execute("SET client_encoding = 'UTF8'")


def count_rows(conn: psycopg.Connection[Any], schema: OutboxSchema,
               selection: RowSelection) -> tuple[int, int | None, list[str]]:
    """How many rows `selection` takes, the oldest finite created_at (epoch micros, UTC),
    whatever the column's type (timestamp, timestamptz, date), and the ids it names that no
    row has (QA 47-d F3: an operator's list could not tell purged or mistyped ids)."""
    _read_as_debezium(conn)
    where, params = selection.where(schema)
    oldest: sql.Composable = sql.SQL("NULL")
    if schema.columns.created_at is not None:
        column_type = column_types(conn, schema.table).get(schema.columns.created_at, "")
        if selection.ids is None:  # --since compares the column with a time
            require_time(column_type, schema)
        oldest = sql.SQL("(min({}) * 1000)::bigint").format(  # QA 49-h F2: isfinite(bigint)
            created_ms(sql.Identifier(schema.columns.created_at), column_type, "auto"))
    query = sql.SQL("SELECT count(*), {} FROM {} WHERE {}").format(
        oldest, schema.identifier, where)
    row = conn.execute(query, params).fetchone()
    assert row is not None
    if selection.ids is None:
        return int(row[0]), row[1], []
    found = {str(found[0]) for found in conn.execute(sql.SQL("SELECT {}::text FROM {} WHERE {}")
             .format(sql.Identifier(schema.columns.id), schema.identifier, where), params)}
    return int(row[0]), row[1], [event_id for event_id in dict.fromkeys(selection.ids)
                                 if event_id not in found]


def outbox_rows(conn: psycopg.Connection[Any], schema: OutboxSchema,
                selection: RowSelection) -> Iterator[dict[str, Any]]:
    """The rows `selection` takes, in insert order (one aggregate's events in the order its
    writer made them; review 44 M2: by created_at, then id, a transaction's rows tied and a
    random id reordered them); json and jsonb columns as their Postgres text, as Debezium
    sends them. Runs in a transaction of its own (a server-side cursor)."""
    _read_as_debezium(conn)
    where, params = selection.where(schema)
    query = sql.SQL("SELECT * FROM {} WHERE {} ORDER BY {}").format(
        schema.identifier, where, sql.SQL(INSERT_ORDER))
    with conn.cursor(name="cdc_router_republish", row_factory=dict_row) as cursor:
        cursor.itersize = _FETCH_ROWS
        cursor.execute(query, params)
        yield from cursor


def key_columns(value: str | None, schema: OutboxSchema) -> tuple[str, ...]:
    """The columns of Debezium's record key for the outbox: the id (its primary key) without
    message.key.columns; else that setting's columns for this table, given as the connector's
    whole value (`<schema>.<table regex>:col,col;...`) or as the columns alone."""
    if value is None:
        return (schema.columns.id,)
    if ":" not in value:
        return _named_columns(value, value)
    # Debezium matches each entry's table pattern against schema.table, case-blind, and keys
    # by the columns of every entry that matches (review 45-3).
    qualified = ".".join(split_table(schema.table))
    found: list[str] = []
    for entry in value.split(";"):
        table, _, columns = entry.strip().partition(":")
        try:
            if re.fullmatch(table.strip(), qualified, re.IGNORECASE):
                found += _named_columns(columns, value)
        except re.error:
            pass  # not a pattern Python reads: this entry names no table of ours
    if found:
        return tuple(dict.fromkeys(found))
    raise ConfigError(f"no entry names the outbox table {qualified}: give the connector's "
                      "message.key.columns, or the key's columns alone", field="--key-columns",
                      value=value)


def _named_columns(columns: str, value: str) -> tuple[str, ...]:
    """The comma-separated column names of one message.key.columns entry (of `value`)."""
    named = tuple(column.strip() for column in columns.split(",") if column.strip())
    if not named:
        raise ConfigError("names no column", field="--key-columns", value=value)
    return named


def change_event(row: dict[str, Any], schema: OutboxSchema, *, binary_handling: str,
                 ts_ms: int, key: tuple[str, ...] = (),
                 types: Mapping[str, str] | None = None) -> ChangeEvent:
    """The change event Debezium writes for an insert of `row` (see the module doc), keyed by
    the `key` columns (default: the id) in the table's order, as Debezium orders them and
    encodes them by their SQL `types` (column -> format_type)."""
    id_column = schema.columns.id
    after = {name: _column(value, binary_handling) for name, value in row.items()}
    types = types or {}
    for name, sql_type in types.items():
        if isinstance(after.get(name), int) and _in_millis(sql_type):
            after[name] //= 1000  # floored, as Java's toEpochMilli
    db_schema, table = split_table(schema.table)
    envelope = {
        "before": None,
        "after": after,
        "source": {"connector": CONNECTOR_NAME, "name": CONNECTOR_NAME, "snapshot": "false",
                   "schema": db_schema, "table": table, "ts_ms": ts_ms},
        "op": "c",
        "ts_ms": ts_ms,
    }
    keyed = {name: _key_column(row[name], types.get(name, ""), value)
             for name, value in after.items() if name in (key or (id_column,))}
    # As Jackson writes it: non-ASCII text as UTF-8, not \u escapes, or the key's bytes, so
    # its partition, would not be Debezium's (review 45-3).
    return ChangeEvent(str(after[id_column]),
                       json.dumps(keyed, separators=(",", ":"), ensure_ascii=False).encode(),
                       json.dumps(envelope, separators=(",", ":")).encode())


def _key_column(value: Any, sql_type: str, encoded: Any) -> Any:
    """A key column as Debezium encodes one of `sql_type` (the module doc); `encoded`, its
    value's encoding, for the types whose encoding is the same."""
    precision = _precision(sql_type, 6)
    zoned = sql_type.endswith("with time zone")
    if sql_type.startswith("timestamp") and zoned and isinstance(value, datetime):
        utc = value.astimezone(UTC)
        fraction = f".{utc.microsecond:06d}"[:precision + 1] if precision else ""
        return f"{utc.replace(tzinfo=None).isoformat(timespec='seconds')}{fraction}Z"
    if sql_type == "date" and isinstance(value, date):
        return (value - _EPOCH_DAY).days
    if sql_type.startswith("time") and not zoned and isinstance(value, time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + \
            value.microsecond
    return encoded


def _in_millis(sql_type: str) -> bool:
    """A timestamp(0) to timestamp(3) without time zone, which Debezium writes as epoch
    milliseconds (io.debezium.time.Timestamp), in the key and in the value."""
    return (sql_type.startswith("timestamp") and not sql_type.endswith("with time zone")
            and _precision(sql_type, 6) <= 3)


def _precision(sql_type: str, default: int) -> int:
    """The precision format_type gives a time type, `timestamp(3) ...`, or `default`."""
    found = _PRECISION.search(sql_type)
    return int(found.group(1)) if found else default


def _column(value: Any, binary_handling: str) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | memoryview):
        raw = bytes(value)
        return raw.hex() if binary_handling == "hex" else base64.b64encode(raw).decode()
    if isinstance(value, datetime):  # outbox_rows reads a timestamptz as one
        if value.tzinfo is None:
            return (value - _EPOCH) // _MICROSECOND
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, date | time):
        return value.isoformat()
    return str(value)  # uuid, numeric, and any other type as its text
