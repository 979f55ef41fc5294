"""write_event() and write_event_async(): the connection they take, and what they refuse before
any SQL (review 50-d)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import json
import re
import warnings
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from psycopg.pq import TransactionStatus

from cdc_router.cli import main
from cdc_router.outbox import InvalidEventError, OutboxSchema, write_event, write_event_async
from cdc_router.outbox.event_json import jsonb_size, payload_json
from cdc_router.outbox.setup import MAX_EVENT_BYTES
from cdc_router.serde.json import MAX_JSON_DEPTH

EVENT: dict[str, Any] = {"aggregate_type": "Order", "aggregate_id": "42", "type": "OrderPaid",
                         "payload": {"total": 10}, "headers": {"tenant": "t1"}}
EVENT_ID = "01a247a0-f6dd-7000-8000-000000000001"


class SyncConnection:
    """Stands in for a psycopg Connection: records what is executed."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []

    def execute(self, query: Any, params: tuple[Any, ...]) -> None:
        self.calls.append((query, params))


class AsyncConnection:
    """Stands in for a psycopg AsyncConnection: execute() is a coroutine."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []

    async def execute(self, query: Any, params: tuple[Any, ...]) -> None:
        self.calls.append((query, params))


def test_write_event_refuses_a_connection_whose_execute_is_async() -> None:
    # Review 50-d F1: the coroutine was never awaited, the id returned, the row never written.
    conn = AsyncConnection()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "coroutine ... was never awaited" either
        with pytest.raises(InvalidEventError, match=r"await write_event_async\(conn"):
            write_event(conn, **EVENT)  # type: ignore[arg-type]
    assert conn.calls == []


def test_write_event_async_inserts_the_row_write_event_would() -> None:
    sync, async_ = SyncConnection(), AsyncConnection()

    event_id = asyncio.run(write_event_async(async_, event_id=EVENT_ID,  # type: ignore[arg-type]
                                             **EVENT))
    write_event(sync, event_id=EVENT_ID, **EVENT)  # type: ignore[arg-type]

    assert event_id == EVENT_ID
    [(query, params)], [(sync_query, sync_params)] = async_.calls, sync.calls
    assert query.as_string(None) == sync_query.as_string(None)
    assert params[:4] == sync_params[:4] == (EVENT_ID, "Order", "42", "OrderPaid")
    assert [params[4].obj, params[5].obj] == [{"total": 10}, {"tenant": "t1"}]


def test_write_event_async_makes_the_same_checks() -> None:
    conn = AsyncConnection()
    with pytest.raises(InvalidEventError, match="header name 'id' is reserved"):
        asyncio.run(write_event_async(conn, **{**EVENT,  # type: ignore[arg-type]
                                              "headers": {"id": "forged"}}))
    assert conn.calls == []


class _Unprintable:
    def __str__(self) -> str:
        raise KeyError("order_id")

    __repr__ = __str__


@pytest.mark.parametrize(("headers", "message"), [
    ({"tenant": 1}, "header 'tenant' is int 1: header values are strings; write '1'"),
    ({"n": None}, "header 'n' is None: header values are strings; leave the header out"),
    ({7: "x"}, "header name 7 is int: header names are strings; write '7'"),
    # Review 62: a value whose str() raises was a KeyError out of write_event.
    ({"tenant": _Unprintable()}, "header 'tenant' is _Unprintable: header values are "
     "strings; write its text"),
    # Review rv62b: it said write "b'eu'", the repr, which would be sent as written.
    ({"t": b"eu"}, "header 't' is bytes b'eu': header values are strings; decode it: 'eu'"),
    ({"t": b"\xff"}, "header 't' is bytes b'\\xff': header values are strings; these bytes "
                     "are no UTF-8 text: encode them (base64) into a string"),
    ({"t": {"a": 1}}, "header 't' is dict {'a': 1}: header values are strings; write it as "
                      "JSON text: '{\"a\": 1}'"),
])
def test_a_header_that_is_no_string_is_named_with_its_value(headers: dict[Any, Any],
                                                           message: str) -> None:
    conn = SyncConnection()
    with pytest.raises(InvalidEventError) as refused:
        write_event(conn, **{**EVENT, "headers": headers})  # type: ignore[arg-type]
    assert str(refused.value) == message
    assert conn.calls == []


def test_a_real_async_connection_is_refused_by_write_event_by_its_class() -> None:
    import psycopg

    conn = psycopg.AsyncConnection.__new__(psycopg.AsyncConnection)  # no server needed
    with pytest.raises(InvalidEventError, match="AsyncConnection: use `await write_event_async"):
        write_event(conn, **EVENT)  # type: ignore[arg-type]
    sync = psycopg.Connection.__new__(psycopg.Connection)
    with pytest.raises(InvalidEventError, match=r"Connection: use write_event\(conn"):
        asyncio.run(write_event_async(sync, **EVENT))  # type: ignore[arg-type]



class _Info:
    def __init__(self, status: TransactionStatus) -> None:
        self.transaction_status = status


class AutocommitConnection(SyncConnection):
    """A connection in autocommit mode, inside a transaction block or not."""

    def __init__(self, status: TransactionStatus) -> None:
        super().__init__()
        self.autocommit = True
        self.info = _Info(status)


class AsyncAutocommitConnection(AsyncConnection):
    def __init__(self, status: TransactionStatus) -> None:
        super().__init__()
        self.autocommit = True
        self.info = _Info(status)


def test_an_autocommit_connection_outside_a_transaction_is_refused() -> None:
    # Review 50-d F5: the event committed on its own, apart from the business change.
    conn = AutocommitConnection(TransactionStatus.IDLE)
    with pytest.raises(InvalidEventError, match=r"inside `with conn.transaction\(\):`"):
        write_event(conn, **EVENT)  # type: ignore[arg-type]
    async_conn = AsyncAutocommitConnection(TransactionStatus.IDLE)
    with pytest.raises(InvalidEventError, match=r"inside `async with conn.transaction\(\):`"):
        asyncio.run(write_event_async(async_conn, **EVENT))  # type: ignore[arg-type]
    assert conn.calls == async_conn.calls == []


def test_an_autocommit_connection_inside_a_transaction_block_writes() -> None:
    conn = AutocommitConnection(TransactionStatus.INTRANS)
    write_event(conn, **EVENT)  # type: ignore[arg-type]
    assert len(conn.calls) == 1


# -- payload and headers: what Postgres or the router would refuse (review 50-d F3/F4) ---------

BYTEA = OutboxSchema(payload_type="bytea")


def _deep(levels: int) -> list[Any]:
    return functools.reduce(lambda inner, _: [inner], range(levels - 1), [])


def _circular() -> dict[str, Any]:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    return loop


@pytest.mark.parametrize("schema", [OutboxSchema(), BYTEA], ids=["jsonb", "bytea"])
@pytest.mark.parametrize(("fields", "message"), [
    ({"payload": {"a": float("nan")}}, "payload field 'a' is nan, which JSON cannot hold"),
    ({"payload": {"a": [1, float("-inf")]}}, "payload field 'a[1]' is -inf"),
    ({"payload": {"a": "\ud800"}}, "payload field 'a' holds a lone UTF-16 surrogate"),
    ({"payload": {"\udc80": 1}}, "payload key '\\udc80' holds a lone UTF-16 surrogate"),
    ({"payload": {"at": datetime.datetime(2026, 1, 1)}}, "payload field 'at' is a datetime"),
    ({"payload": {(1, 2): 1}}, "JSON keys are strings"),
    ({"payload": _circular()}, "payload contains itself"),
    ({"payload": _deep(MAX_JSON_DEPTH + 1)}, "payload is JSON nested deeper than 256 levels"),
    ({"payload": _deep(5000)}, "payload is nested too deeply"),
    ({"payload": {"n": 2**1100}}, "payload field 'n' holds a number beyond a double ('1"),
    ({"payload": {"n": [{"m": 1}, {"m": -(10**400)}]}},  # QA 50-h F1: its field named
     "payload field 'n[1].m' holds a number beyond a double ('-1000"),
    ({"payload": {10**400: 1, "b": 10**400}},  # reread 51-h M1: a key is written as a string
     "payload field 'b' holds a number beyond a double"),
    ({"payload": [(1, 10**400)]},  # a tuple is written as an array: it was not looked into
     "payload field '[0][1]' holds a number beyond a double"),
    ({"payload": {"n": [Decimal("1E-16384")]}},  # reread 50-i F1: failed at the INSERT
     "payload field 'n[0]' has 16,384 digits after the decimal point, over the 16,383"),
    ({"payload": {"n": Decimal("1E+131072")}}, "payload field 'n' holds a number beyond"),
    ({"payload": {"s": "x" * MAX_EVENT_BYTES}}, "over the pipeline's limit of 4,000,000 (the "
                                                "size check cdc_router_event_size that `outbox "
                                                "init` gives an outbox)"),
    ({"payload": {"s": "x" * 3_000_000}, "headers": {"h": "y" * 1_000_000}}, "over the pipel"),
    ({"headers": {"h": "a\x00b"}}, "headers field 'h' holds a NUL character"),
    ({"headers": {"h": "\udc80"}}, "headers field 'h' holds a lone UTF-16 surrogate"),
])
def test_what_postgres_or_the_router_would_refuse_is_refused_before_any_sql(
        schema: OutboxSchema, fields: dict[str, Any], message: str) -> None:
    conn = SyncConnection()
    with pytest.raises(InvalidEventError, match=re.escape(message)):
        write_event(conn, **{**EVENT, **fields}, schema=schema)  # type: ignore[arg-type]
    assert conn.calls == []


def test_a_nul_is_refused_in_a_jsonb_payload_and_kept_as_json_in_a_bytea_one() -> None:
    conn = SyncConnection()
    with pytest.raises(InvalidEventError, match="payload field 'a' holds a NUL character"):
        write_event(conn, **{**EVENT, "payload": {"a": "x\x00y"}})  # type: ignore[arg-type]
    write_event(conn, **{**EVENT, "payload": {"a": "x\x00y"}},  # type: ignore[arg-type]
                schema=BYTEA)
    # Its text "\u0000" (a backslash, then u0000) is no NUL.
    write_event(conn, **{**EVENT, "payload": {"a": "\\u0000"}})  # type: ignore[arg-type]
    assert [params[4] if isinstance(params[4], bytes) else params[4].obj
            for _, params in conn.calls] == [b'{"a":"x\\u0000y"}', {"a": "\\u0000"}]


# The lengths of `SELECT length(text::jsonb::text)` on Postgres 15.18, less the brackets.
@pytest.mark.parametrize(("number", "in_jsonb"), [
    (1e300, 301), (-1e-300, 303), (1.5e-07, 10), (1.2345678901234568e+16, 17), (5e-324, 326),
    (Decimal("1E+2"), 3), (Decimal("0E-10"), 12), (Decimal("-1.23E+5"), 7), (Decimal("-0E+5"), 1),
    (Decimal("1.23E-7"), 11), (1.5, 3), (-2, 2)])
def test_the_size_counts_a_number_as_jsonb_writes_it(number: float | Decimal,
                                                     in_jsonb: int) -> None:
    assert jsonb_size(payload_json([number], jsonb=True)) == in_jsonb + 2


def test_the_size_reads_no_number_in_a_string() -> None:
    text = payload_json({"s": '1e+300 " 2e-05', "n": [1, 2.5e-05]}, jsonb=True)
    assert jsonb_size(text) == 44 == len(text) + 1  # 2.5e-05 is 0.000025


def test_floats_postgres_writes_over_the_limit_are_refused_before_any_sql() -> None:
    # QA 50-h F2: 112 KB as Python writes them, 4.2 MB as jsonb does: the outbox's size check
    # refused the INSERT (CheckViolation), which aborted the caller's transaction.
    conn = SyncConnection()
    with pytest.raises(InvalidEventError, match="4,242,007 bytes of payload and headers"):
        write_event(conn, **{**EVENT, "headers": None,  # type: ignore[arg-type]
                             "payload": {"n": [1e300] * 14_000}})
    write_event(conn, **{**EVENT, "payload": {"n": [1e300] * 13_000}})  # type: ignore[arg-type]
    assert len(conn.calls) == 1


def test_a_bytes_payload_over_the_limit_is_refused() -> None:
    with pytest.raises(InvalidEventError, match="4,000,001 bytes of payload and headers"):
        write_event(SyncConnection(), **{**EVENT, "headers": None,  # type: ignore[arg-type]
                                         "payload": b"x" * (MAX_EVENT_BYTES + 1)}, schema=BYTEA)


def test_ordinary_payloads_are_stored_as_before() -> None:
    conn = SyncConnection()
    write_event(conn, **{**EVENT, "payload": {"a": "é", "b": [1, 2.5]}},  # type: ignore[arg-type]
                schema=BYTEA)
    write_event(conn, **{**EVENT, "payload": {"a": "é", "b": [1, 2.5]}})  # type: ignore[arg-type]

    [(_, as_bytea), (_, as_jsonb)] = conn.calls
    assert as_bytea[4] == b'{"a":"\\u00e9","b":[1,2.5]}'  # compact, ASCII: as it always was
    jsonb, headers = as_jsonb[4], as_jsonb[5]
    assert jsonb.obj == {"a": "é", "b": [1, 2.5]}
    assert json.loads(jsonb.dumps(jsonb.obj)) == jsonb.obj
    assert json.loads(headers.dumps(headers.obj)) == {"tenant": "t1"}


# -- exact numbers (review 50-d F2) -------------------------------------------------------------


@pytest.mark.parametrize(("schema", "stored"), [
    (OutboxSchema(), '{"amount": 12345678901234567.89, "price": 1.10, "n": [1E+2, 2.5]}'),
    (BYTEA, '{"amount":12345678901234567.89,"price":1.10,"n":[1E+2,2.5]}')],
    ids=["jsonb", "bytea"])
def test_decimals_are_written_exactly_as_their_text(schema: OutboxSchema, stored: str) -> None:
    conn = SyncConnection()
    payload = {"amount": Decimal("12345678901234567.89"), "price": Decimal("1.10"),
               "n": [Decimal("1E+2"), 2.5]}

    write_event(conn, **{**EVENT, "payload": payload}, schema=schema)  # type: ignore[arg-type]

    value = conn.calls[0][1][4]
    assert (value if isinstance(value, bytes) else value.dumps(value.obj)).decode() == stored


@pytest.mark.parametrize(("number", "message"), [
    (Decimal("NaN"), "payload field 'a' is Decimal('NaN'), which JSON cannot hold"),
    (Decimal("-Infinity"), "payload field 'a' is Decimal('-Infinity')"),
    (Decimal("1E+400"), "payload field 'a' holds a number beyond a double (1E+400)")])
def test_a_decimal_json_or_the_router_cannot_take_is_refused(number: Decimal,
                                                             message: str) -> None:
    with pytest.raises(InvalidEventError, match=re.escape(message)):
        write_event(SyncConnection(), **{**EVENT, "payload": {"a": number}})  # type: ignore[arg-type]


def test_outbox_write_hands_write_event_the_payloads_numbers_as_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_router.cli import outbox as cli_outbox

    written: list[Any] = []
    monkeypatch.setattr(cli_outbox, "database", lambda dsn: contextlib.nullcontext(
        SimpleNamespace(transaction=contextlib.nullcontext)))
    monkeypatch.setattr(cli_outbox, "write_event", lambda conn, **event: written.append(
        event["payload"]) or EVENT_ID)
    result = CliRunner().invoke(main, ["outbox", "write", "--aggregate-type", "A",
                                       "--aggregate-id", "1", "--type", "T", "--payload",
                                       '{"amount": 12345678901234567.89, "price": 1.10}'])

    assert result.exit_code == 0, result.output
    assert written == [{"amount": Decimal("12345678901234567.89"), "price": Decimal("1.10")}]
    assert str(written[0]["price"]) == "1.10"


@pytest.mark.parametrize(("option", "value", "said"), [
    ("--aggregate-type", "", "field '--aggregate-type': must be non-empty text, not ''"),
    ("--aggregate-id", " ", "field '--aggregate-id': blank: ' '; the router would "
     "dead-letter the event"),
    ("--event-id", "notauuid", "field '--event-id': not a UUID: 'notauuid'")])
def test_outbox_write_names_the_option_of_a_refused_value(
        monkeypatch: pytest.MonkeyPatch, option: str, value: str, said: str) -> None:
    # Review 53-c F12: the errors named write_event's parameters (aggregate_type, event_id).
    from cdc_router.cli import outbox as cli_outbox

    monkeypatch.setattr(cli_outbox, "database", lambda dsn: contextlib.nullcontext(
        SimpleNamespace(transaction=contextlib.nullcontext)))
    given = {"--aggregate-type": "A", "--aggregate-id": "1", "--type": "T", option: value}
    result = CliRunner().invoke(main, ["outbox", "write", "--payload", "{}",
                                       *(item for pair in given.items() for item in pair)])

    assert result.exit_code == 1, result.output
    assert result.stderr == f"error: {said}\n"


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_outbox_write_refuses_nan_in_the_payload_naming_the_option(constant: str) -> None:
    result = CliRunner().invoke(main, ["outbox", "write", "--dsn", "postgresql://x@127.0.0.1:9/db",
                                       "--aggregate-type", "A", "--aggregate-id", "1",
                                       "--type", "T", "--payload", f'{{"a": {constant}}}'])

    assert result.exit_code == 1, result.output
    assert result.stderr == (f"error: field '--payload': not valid JSON: {constant} is not JSON "
                             "(RFC 8259); send null or a string\n")


# -- surrogate pairs (review 50-i F9) -----------------------------------------------------------


def test_a_surrogate_pair_held_as_two_code_points_is_written_as_its_character() -> None:
    # A str from a UTF-16 source may hold 😀 as "\ud83d\ude00": jsonb joins such a pair, and it
    # was written before; only a lone surrogate is refused.
    pair = "\ud83d\ude00"
    conn = SyncConnection()
    write_event(conn, **{**EVENT, "payload": {"a": pair},  # type: ignore[arg-type]
                         "headers": {"h": pair}})
    write_event(conn, **{**EVENT, "payload": {"a": pair}}, schema=BYTEA)  # type: ignore[arg-type]

    [(_, as_jsonb), (_, as_bytea)] = conn.calls
    payload, headers = as_jsonb[4], as_jsonb[5]
    assert json.loads(payload.dumps(payload.obj)) == {"a": "😀"}
    assert json.loads(headers.dumps(headers.obj)) == {"h": "😀"}
    assert as_bytea[4] == b'{"a":"\\ud83d\\ude00"}'  # the bytes as before: the router reads 😀
    with pytest.raises(InvalidEventError, match="payload field 'b' holds a lone UTF-16"):
        write_event(conn, **{**EVENT,  # type: ignore[arg-type]
                             "payload": {"a": pair, "b": f"{pair}\ud83d"}})


def test_a_decimal_with_as_many_digits_after_the_point_as_numeric_holds_is_written() -> None:
    conn = SyncConnection()
    write_event(conn, **{**EVENT,  # type: ignore[arg-type]
                         "payload": {"n": Decimal("1E-16383")}})
    assert len(conn.calls) == 1


def test_readmes_own_outbox_snippet_writes_to_its_table_and_columns() -> None:
    # QA 55-a F-2: README showed only the default public.outbox; a team with its own table
    # wrote there without a word. The snippet, run as written, writes to its table.
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    [snippet] = [block for block in re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
                 if "OutboxSchema(" in block]
    conn = SyncConnection()
    conn.transaction = contextlib.nullcontext  # type: ignore[attr-defined]
    scope: dict[str, Any] = {"conn": conn}
    exec(compile(snippet, "README.md", "exec"), scope)
    [(query, params)] = conn.calls
    text = query.as_string(None)
    assert '"shop"."order_events"' in text and "public" not in text
    for column in ("event_id", "kind", "entity_id", "event_type", "body", "meta"):
        assert f'"{column}"' in text, column
    assert params[0] == scope["event_id"]
