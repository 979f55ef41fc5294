"""write_event() / write_event_async() against Postgres: the row is there exactly when the
caller's transaction commits, and what would fail there is refused first (review 50-d)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.outbox import InvalidEventError, OutboxSchema, write_event, write_event_async
from cdc_router.outbox.setup import add_size_check_statement
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


def test_a_refused_event_leaves_the_callers_transaction_usable(
        stack: StackEndpoints, outbox: OutboxSchema) -> None:
    # Review 50-d F4: these reached the INSERT, whose server error aborted the transaction
    # (InFailedSqlTransaction for the rest), or escaped as RecursionError.
    bad_events: list[dict[str, Any]] = [
        {"payload": {"a": "x\x00y"}}, {"payload": {"a": "\ud800"}},
        {"payload": {"a": float("nan")}}, {"headers": {"h": "a\x00b"}},
        {"payload": {"s": "x" * 4_000_000}}, {"payload": _deep(5000)}]
    with psycopg.connect(stack.postgres_dsn) as conn, conn.transaction():
        for fields in bad_events:
            with pytest.raises(InvalidEventError):
                write_event(conn, schema=outbox, **{**EVENT, **fields})
        kept = write_event(conn, schema=outbox, **EVENT)

    assert _count(stack.postgres_dsn, outbox, kept) == 1


def test_the_size_write_event_measures_is_the_one_the_outbox_check_measures(
        stack: StackEndpoints, outbox: OutboxSchema) -> None:
    from cdc_router.outbox.event_json import headers_json, jsonb_size, payload_json

    payload = {"text": "é \" \n 漢字 \\u0000 😀 1e+300", "n": [1, 2.5, -3, True, None],
               "nested": {"b": {}, "a": []},
               # Python writes these with an exponent, jsonb in full (QA 50-h F2).
               "e": [1e300, -1e-300, 1.5e-07, 1.2345678901234568e+16, 5e-324, -2.5e-5,
                     Decimal("1E+2"), Decimal("0E-10"), Decimal("-1.23E+5")]}
    headers = {"tenant": "ü", "trace": "x"}
    with psycopg.connect(stack.postgres_dsn) as conn, conn.transaction():
        event_id = write_event(conn, schema=outbox, **{**EVENT, "payload": payload,
                                                        "headers": headers})
        row = conn.execute(f"SELECT octet_length(concat(payload)), octet_length(concat(headers))"
                           f" FROM {outbox.table} WHERE id = %s", (event_id,)).fetchone()

    assert row == (jsonb_size(payload_json(payload, jsonb=True)), len(headers_json(headers)))


def test_floats_postgres_writes_over_the_limit_are_refused_before_the_insert(
        stack: StackEndpoints, outbox: OutboxSchema) -> None:
    # QA 50-h F2: 112 KB as Python writes them, 4.2 MB as jsonb does: the size check refused
    # the INSERT (CheckViolation), which aborted the caller's transaction.
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(add_size_check_statement(outbox))
    with psycopg.connect(stack.postgres_dsn) as conn, conn.transaction():
        with pytest.raises(InvalidEventError, match="4,242,007 bytes of payload and headers"):
            write_event(conn, schema=outbox, **{**EVENT, "payload": {"n": [1e300] * 14_000}})
        kept = write_event(conn, schema=outbox, **{**EVENT, "payload": {"n": [1e300] * 13_000}})

    assert _count(stack.postgres_dsn, outbox, kept) == 1


def test_a_bytea_payload_with_nan_is_refused_not_stored_as_non_json(
        stack: StackEndpoints) -> None:
    # Review 50-d F3: b'{"a":NaN}' was stored, and sent on as JSON no reader takes.
    name = unique("writer_bytea")
    schema = OutboxSchema(table=f"public.{name}", payload_type="bytea")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {schema.table} (id uuid PRIMARY KEY, aggregatetype text, "
                     "aggregateid text, type text, payload bytea, headers jsonb)")
        try:
            with conn.transaction():
                with pytest.raises(InvalidEventError, match="payload field 'a' is nan"):
                    write_event(conn, schema=schema, **{**EVENT, "payload": {"a": float("nan")}})
                write_event(conn, schema=schema, **EVENT)
            rows = conn.execute(f"SELECT convert_from(payload, 'utf8') FROM {schema.table}")
            assert rows.fetchall() == [('{"total":10}',)]
        finally:
            conn.execute(f"DROP TABLE {schema.table}")


def _deep(levels: int) -> list[Any]:
    return functools.reduce(lambda inner, _: [inner], range(levels - 1), [])


def test_outbox_write_stores_the_payloads_numbers_exactly_as_given(
        stack: StackEndpoints, outbox: OutboxSchema) -> None:
    # Review 50-d F2: a float round trip made 12345678901234567.89 12345678901234568, 1.10 1.1.
    payload = ('{"amount": 12345678901234567.89, "price": 1.10, '
               '"n": 100000000000000000000000000000001.5, "i": 12345678901234567890123}')
    result = CliRunner().invoke(main, ["outbox", "write", "--dsn", stack.postgres_dsn,
                                       "--table", outbox.table, "--aggregate-type", "O",
                                       "--aggregate-id", "1", "--type", "T",
                                       "--payload", payload])
    assert result.exit_code == 0, result.output

    with psycopg.connect(stack.postgres_dsn) as conn:
        row = conn.execute(f"SELECT payload = %s::jsonb, payload::text FROM {outbox.table} "
                           "WHERE id = %s", (payload, result.stdout.strip())).fetchone()
    assert row is not None
    assert row[0], row[1]
    assert "12345678901234567.89" in row[1] and "1.10" in row[1]


def test_write_event_stores_a_decimal_exactly(stack: StackEndpoints,
                                              outbox: OutboxSchema) -> None:
    with psycopg.connect(stack.postgres_dsn) as conn, conn.transaction():
        event_id = write_event(conn, schema=outbox, **{
            **EVENT, "payload": {"total": Decimal("19.90"), "big": Decimal("1E+30")}})
        row = conn.execute(f"SELECT payload->>'total', payload->>'big' FROM {outbox.table} "
                           "WHERE id = %s", (event_id,)).fetchone()

    assert row == ("19.90", "1000000000000000000000000000000")


def test_outbox_write_of_an_event_id_already_in_the_table_says_so(
        stack: StackEndpoints, outbox: OutboxSchema) -> None:
    # Review 53-c F12: Postgres's words (duplicate key value violates unique constraint).
    write = ["outbox", "write", "--dsn", stack.postgres_dsn, "--table", outbox.table,
             "--aggregate-type", "O", "--aggregate-id", "1", "--type", "T", "--payload", "{}"]
    first = CliRunner().invoke(main, write)
    assert first.exit_code == 0, first.output
    event_id = first.stdout.strip()
    again = CliRunner().invoke(main, [*write, "--event-id", event_id.upper()])
    assert again.exit_code == 1
    assert again.stderr == (f"error: field '--event-id': event id {event_id.upper()} is already "
                            f"in {outbox.table}: leave --event-id out for a new one\n")
