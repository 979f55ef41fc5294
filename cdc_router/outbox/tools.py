"""Operators' tools for the outbox: how big and old it is, and purging old rows by age.

The router's own cleanup (cdc_router.router.cleanup) deletes rows once their events are delivered;
these are for a person at a terminal (`cdc-router outbox stats`, `outbox purge`), e.g. for rows
that a crashed router without a dedup changelog left behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from cdc_router.errors import ConfigError
from cdc_router.outbox.age import created_ms, require_time
from cdc_router.outbox.table import OutboxSchema
from cdc_router.postgres import column_types, delete_in_chunks, regclass_text, utc_now_for

# The table's bytes with indexes and TOAST, its two %s the table's regclass text. A
# partitioned table has no storage of its own (pg_total_relation_size of its root is 0: QA
# 53-h F1): its size is the sum over its partition tree (Postgres 12+), which lists nothing
# for a plain table.
_ON_DISK = sql.SQL("(SELECT coalesce(sum(pg_total_relation_size(relid)), "
                   "pg_total_relation_size(%s::regclass)) FROM pg_partition_tree(%s::regclass))")


@dataclass(frozen=True)
class OutboxStats:
    """How big the outbox is and how old its oldest row."""

    table: str
    rows: int
    oldest_age_s: float | None
    table_bytes: int


def outbox_stats(conn: psycopg.Connection[Any], schema: OutboxSchema) -> OutboxStats:
    """Rows pending (not yet deleted), age of the oldest, size on disk with indexes and TOAST.

    A partitioned outbox's size is its partitions' (QA 53-h F1: 0 B). An outbox without a
    created_at column (source.outbox.created_at: null) has no age (review 34-2: `status` of
    such a config stopped with "rows have no age")."""
    if schema.columns.created_at is None:
        row = conn.execute(sql.SQL("SELECT count(*), {} FROM {}").format(
            _ON_DISK, schema.identifier), (regclass_text(schema.table),) * 2).fetchone()
        assert row is not None
        return OutboxStats(schema.table, int(row[0]), None, int(row[1]))
    column_type = column_types(conn, schema.table).get(schema.created_at_column, "")
    query = sql.SQL(
        # A row dated 'infinity' or '-infinity' has no age: the oldest is the oldest of the
        # others. Epochs, not a difference of timestamps: right for timestamp (UTC) and
        # timestamptz columns alike, whatever the session's TimeZone, and for an integer
        # created_at (epoch ms, us or ns as the router reads them by default: QA 49-h F2,
        # `status` failed on isfinite(bigint) for ever).
        "SELECT count(*), extract(epoch FROM now()) - min({created}) / 1000.0, {size} "
        "FROM {table}").format(
        created=created_ms(sql.Identifier(schema.created_at_column), column_type, "auto"),
        size=_ON_DISK, table=schema.identifier)
    row = conn.execute(query, (regclass_text(schema.table),) * 2).fetchone()
    assert row is not None
    rows, age, size = row
    return OutboxStats(schema.table, int(rows), float(age) if age is not None else None,
                       int(size))


def purge(conn: psycopg.Connection[Any], schema: OutboxSchema, older_than_ms: int,
          batch_size: int, *, dry_run: bool = False, before: object = None) -> int:
    """Delete rows created more than `older_than_ms` ago, oldest first, in bounded chunks; or
    those created before `before` (purge_cutoff's), to delete the rows a dry run counted.

    With an autocommit connection each chunk commits by itself; otherwise the caller commits.
    """
    if batch_size < 1:  # before any query; a dry run too
        raise ConfigError("must be at least 1", field="batch_size", value=batch_size)
    created = sql.Identifier(schema.created_at_column)
    if before is None:
        before = purge_cutoff(conn, schema, older_than_ms)
    older = sql.SQL("{} < %s").format(created)
    if dry_run:
        query = sql.SQL("SELECT count(*) FROM {} WHERE {}").format(schema.identifier, older)
        row = conn.execute(query, (before,)).fetchone()
        return int(row[0]) if row else 0
    return sum(delete_in_chunks(conn, schema.identifier, older, (before,),
                                batch_size=batch_size, order_by=created))


def purge_cutoff(conn: psycopg.Connection[Any], schema: OutboxSchema, older_than_ms: int) -> object:
    """The created_at value, in the column's own type, that rows older than `older_than_ms`
    are below now: taken once, a count and the delete after it agree on the rows."""
    column_type = column_types(conn, schema.table).get(schema.created_at_column, "")
    require_time(column_type, schema)
    query = sql.SQL("SELECT {} - make_interval(secs => %s / 1000.0)").format(
        utc_now_for(column_type))
    row = conn.execute(query, (older_than_ms,)).fetchone()
    assert row is not None  # a SELECT without FROM returns its row
    return row[0]


def relay_outbox_column(conn: psycopg.Connection[Any], schema: OutboxSchema) -> str | None:
    """The xid8 column `cdc-router relay` reads the table by (outbox/relay_columns.py), or None
    when the table has none: Debezium's path. The relay deletes each row it delivered, so in
    its outbox a row still there is an event not delivered yet (review 44: purge lost them)."""
    return next((name for name, kind in column_types(conn, schema.table).items()
                 if kind == "xid8"), None)
