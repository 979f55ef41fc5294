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
UTC, numeric as text (decimal.handling.mode string), uuid as text.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.string import TextLoader

from cdc_router.outbox.table import OutboxSchema
from cdc_router.postgres import split_table

# Rows fetched per round trip of the server-side cursor.
_FETCH_ROWS = 1000
_EPOCH = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)
CONNECTOR_NAME = "cdc-router-republish"  # source.connector of every republished event


@dataclass(frozen=True)
class ChangeEvent:
    """One outbox row as a raw change record: Debezium's key and value bytes."""

    event_id: str
    key: bytes
    value: bytes


@dataclass(frozen=True)
class RowSelection:
    """The rows created at or after `since_ms` (epoch ms), or those with one of `ids`."""

    since_ms: int | None = None
    ids: tuple[str, ...] | None = None

    def where(self, schema: OutboxSchema) -> tuple[sql.Composable, tuple[Any, ...]]:
        if self.ids is not None:
            return (sql.SQL("{}::text = ANY(%s)").format(sql.Identifier(schema.columns.id)),
                    (list(self.ids),))
        since = datetime.fromtimestamp((self.since_ms or 0) / 1000, UTC).replace(tzinfo=None)
        return sql.SQL("{} >= %s").format(sql.Identifier(schema.created_at_column)), (since,)


def count_rows(conn: psycopg.Connection[Any], schema: OutboxSchema,
               selection: RowSelection) -> tuple[int, datetime | None]:
    """How many rows `selection` takes, and the oldest one's created_at (naive UTC)."""
    conn.execute("SET TIME ZONE 'UTC'")  # a timestamp column holds UTC, as write_event writes
    where, params = selection.where(schema)
    oldest = sql.SQL("NULL") if schema.columns.created_at is None else sql.SQL("min({})").format(
        sql.Identifier(schema.columns.created_at))
    query = sql.SQL("SELECT count(*), {} FROM {} WHERE {}").format(
        oldest, schema.identifier, where)
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(row[0]), row[1]


def outbox_rows(conn: psycopg.Connection[Any], schema: OutboxSchema,
                selection: RowSelection) -> Iterator[dict[str, Any]]:
    """The rows `selection` takes, oldest first; json and jsonb columns as their Postgres
    text, as Debezium sends them. Runs in a transaction of its own (a server-side cursor)."""
    for name in ("json", "jsonb"):
        conn.adapters.register_loader(name, TextLoader)
    conn.execute("SET TIME ZONE 'UTC'")
    where, params = selection.where(schema)
    order = [sql.Identifier(column) for column in (schema.columns.created_at, schema.columns.id)
             if column is not None]
    query = sql.SQL("SELECT * FROM {} WHERE {} ORDER BY {}").format(
        schema.identifier, where, sql.SQL(", ").join(order))
    with conn.cursor(name="cdc_router_republish", row_factory=dict_row) as cursor:
        cursor.itersize = _FETCH_ROWS
        cursor.execute(query, params)
        yield from cursor


def change_event(row: dict[str, Any], schema: OutboxSchema, *, binary_handling: str,
                 ts_ms: int) -> ChangeEvent:
    """The change event Debezium writes for an insert of `row` (see the module doc)."""
    id_column = schema.columns.id
    after = {name: _column(value, binary_handling) for name, value in row.items()}
    db_schema, table = split_table(schema.table)
    envelope = {
        "before": None,
        "after": after,
        "source": {"connector": CONNECTOR_NAME, "name": CONNECTOR_NAME, "snapshot": "false",
                   "schema": db_schema, "table": table, "ts_ms": ts_ms},
        "op": "c",
        "ts_ms": ts_ms,
    }
    key = json.dumps({id_column: after[id_column]}, separators=(",", ":"))
    return ChangeEvent(str(after[id_column]), key.encode(),
                       json.dumps(envelope, separators=(",", ":")).encode())


def _column(value: Any, binary_handling: str) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | memoryview):
        raw = bytes(value)
        return raw.hex() if binary_handling == "hex" else base64.b64encode(raw).decode()
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return (value - _EPOCH) // _MICROSECOND
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, date | time):
        return value.isoformat()
    return str(value)  # uuid, numeric, and any other type as its text

