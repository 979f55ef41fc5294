"""write_event() / write_event_async() against Postgres: the row is there exactly when the
caller's transaction commits, and what would fail there is refused first (review 50-d)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cdc_router.outbox import InvalidEventError, OutboxSchema, write_event, write_event_async
from tests.integration.support import (
    StackEndpoints,
    create_outbox_table,
    drop_outbox_table,
    unique,
)

pytestmark = pytest.mark.integration

EVENT: dict[str, Any] = {"aggregate_type": "Order", "aggregate_id": "42", "type": "OrderPaid",
                         "payload": {"total": 10}}
ALONE = "01a247a0-f6dd-7000-8000-00000000a10e"


@pytest.fixture
def outbox(stack: StackEndpoints) -> Iterator[OutboxSchema]:
    name = unique("writer")
    create_outbox_table(stack.postgres_dsn, name)
    yield OutboxSchema(table=f"public.{name}")
    drop_outbox_table(stack.postgres_dsn, name)


def _count(dsn: str, schema: OutboxSchema, event_id: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM {schema.table} WHERE id = %s",
                           (event_id,)).fetchone()
    assert row is not None
    return int(row[0])


def test_an_async_connection_writes_with_write_event_async_and_is_refused_by_write_event(
        stack: StackEndpoints, outbox: OutboxSchema) -> None:
    # Review 50-d F1: write_event on an AsyncConnection returned an id for a row never written.
    async def run() -> str:
        async with await psycopg.AsyncConnection.connect(stack.postgres_dsn) as conn, \
                conn.transaction():
            with pytest.raises(InvalidEventError, match="write_event_async"):
                write_event(conn, schema=outbox, **EVENT)  # type: ignore[arg-type]
            return await write_event_async(conn, schema=outbox, **EVENT)

    event_id = asyncio.run(run())

    assert _count(stack.postgres_dsn, outbox, event_id) == 1


def test_an_autocommit_connection_must_open_a_transaction_for_the_event(
        stack: StackEndpoints, outbox: OutboxSchema) -> None:
    # Review 50-d F5: outside a transaction block the event committed on its own, at once.
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        with pytest.raises(InvalidEventError, match=r"inside `with conn.transaction\(\):`"):
            write_event(conn, schema=outbox, event_id=ALONE, **EVENT)
        with conn.transaction():
            inside = write_event(conn, schema=outbox, **EVENT)

    assert _count(stack.postgres_dsn, outbox, ALONE) == 0
    assert _count(stack.postgres_dsn, outbox, inside) == 1
