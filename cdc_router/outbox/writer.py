"""`write_event()` (and `write_event_async()`): the application's side of the outbox, one row in
the caller's transaction.

    from cdc_router.outbox import write_event

    with conn.transaction():
        ...  # the business change
        write_event(conn, aggregate_type="Order", aggregate_id="42", type="OrderPaid",
                    payload={"total": "19.90"})

    async with conn.transaction():  # a psycopg AsyncConnection
        ...
        await write_event_async(conn, aggregate_type="Order", ...)
"""

from __future__ import annotations

import inspect
import json
import os
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from cdc_router.config.headers import header_name_problem, is_reserved_header
from cdc_router.errors import InvalidEventError, show
from cdc_router.outbox.event_json import check_size, headers_json, jsonb_size, payload_json
from cdc_router.outbox.table import OutboxSchema

DEFAULT_SCHEMA = OutboxSchema()  # public.outbox with the EventRouter SMT's column names


_RANDOM_BITS = 74  # rand_a (12 bits) and rand_b (62 bits) of a UUIDv7, read as one number
_last_id = (0, 0)  # (unix milliseconds, random part) of this process's last id
_id_lock = threading.Lock()


def _forget_last_id() -> None:
    """In a forked child: start from fresh random bits. Two children counting on from the
    parent's last id made the same ids, and the second event was dropped as a replay (review
    44-3)."""
    global _last_id, _id_lock
    _last_id, _id_lock = (0, 0), threading.Lock()


os.register_at_fork(after_in_child=_forget_last_id)


def new_event_id() -> str:
    """A UUIDv7 (RFC 9562), time-ordered and monotonic in this process: an id made later sorts
    later, also within one millisecond (section 6.2, method 2: the random part counts on from
    the last id's). So primary-key inserts stay at the index's end, and an incremental
    snapshot, which reads by primary key, keeps one writer's order (review 44: two ids of one
    millisecond were in random order)."""
    global _last_id
    millis, random_part = time.time_ns() // 1_000_000, int.from_bytes(os.urandom(10), "big")
    with _id_lock:
        last_millis, last_random = _last_id
        if millis <= last_millis:  # the same millisecond, or the clock stepped back
            millis, random_part = last_millis, last_random + 1
            if random_part >> _RANDOM_BITS:  # 2**74 ids in one millisecond: the next one
                millis, random_part = millis + 1, 0
        random_part &= (1 << _RANDOM_BITS) - 1
        _last_id = (millis, random_part)
    value = ((millis & (2**48 - 1)) << 80) | (0x7 << 76)  # version 7
    value |= (random_part >> 62) << 64 | (0x2 << 62) | (random_part & (2**62 - 1))  # variant
    return str(uuid.UUID(int=value))


def write_event(conn: psycopg.Connection[Any], *, aggregate_type: str, aggregate_id: str,
                type: str, payload: dict[str, Any] | list[Any] | bytes,
                headers: Mapping[str, str] | None = None,
                event_id: str | uuid.UUID | None = None,
                schema: OutboxSchema = DEFAULT_SCHEMA) -> str:
    """Insert one outbox row in the caller's transaction and return its event id.

    Never commits: the row becomes visible (and reaches Kafka) exactly when the caller's
    business change does (an autocommit connection outside `conn.transaction()` is refused).
    payload: a dict or list (stored as JSON) or, for a bytea payload column, bytes. headers:
    string values only. event_id: a UUID; by default a new UUIDv7. schema: the outbox table,
    its column names and payload type (OutboxSchema("shop.events").with_columns({...}));
    by default public.outbox with the EventRouter SMT's names. An AsyncConnection takes
    write_event_async.
    """
    query, params = _insert(conn, False, aggregate_type, aggregate_id, type, payload, headers,
                            event_id, schema)
    result = conn.execute(query, params)
    if inspect.isawaitable(result):  # an async connection of another kind: nothing ran
        getattr(result, "close", lambda: None)()  # no "never awaited" warning
        raise InvalidEventError(f"write_event got a connection whose execute() is async "
                                f"({conn.__class__.__name__}): use `await "
                                "write_event_async(conn, ...)`")
    return str(params[0])


async def write_event_async(conn: psycopg.AsyncConnection[Any], *, aggregate_type: str,
                            aggregate_id: str, type: str,
                            payload: dict[str, Any] | list[Any] | bytes,
                            headers: Mapping[str, str] | None = None,
                            event_id: str | uuid.UUID | None = None,
                            schema: OutboxSchema = DEFAULT_SCHEMA) -> str:
    """write_event for a psycopg AsyncConnection: the same row, the same checks, awaited."""
    query, params = _insert(conn, True, aggregate_type, aggregate_id, type, payload, headers,
                            event_id, schema)
    await conn.execute(query, params)
    return str(params[0])


def _header_text(value: object) -> str:
    """What to write instead of a header value that is no string: bytes decoded (their repr
    "b'...'" would be sent as written), a dict or list as JSON (not Python's repr); review
    rv62b."""
    if isinstance(value, bytes | bytearray):
        try:
            return f"decode it: {show(bytes(value).decode())}"
        except UnicodeDecodeError:
            return "these bytes are no UTF-8 text: encode them (base64) into a string"
    if isinstance(value, dict | list | tuple):
        try:
            return f"write it as JSON text: {show(json.dumps(value))}"
        except (TypeError, ValueError):
            pass
    return f"write {show(str(value))}"


def _insert(conn: object, asynchronous: bool, aggregate_type: str, aggregate_id: str,
            type: str, payload: dict[str, Any] | list[Any] | bytes,
            headers: Mapping[str, str] | None, event_id: str | uuid.UUID | None,
            schema: OutboxSchema) -> tuple[sql.Composed, tuple[Any, ...]]:
    """The INSERT of one event and its values (the event id first), every check done: what
    write_event and write_event_async share. InvalidEventError before any SQL."""
    _check_connection(conn, asynchronous)
    if isinstance(aggregate_id, int) and not isinstance(aggregate_id, bool):
        aggregate_id = str(aggregate_id)  # a numeric order id, stored as its text as before
    for name, text in (("aggregate_type", aggregate_type), ("aggregate_id", aggregate_id),
                       ("type", type)):
        _check_text(name, text)
    event = str(event_id) if event_id is not None else new_event_id()
    try:
        event = str(uuid.UUID(event))
    except ValueError:
        raise InvalidEventError(f"event_id is not a UUID: {event!r}") from None
    value: Any
    if isinstance(payload, bytes | bytearray | memoryview):
        if schema.payload_type != "bytea":
            raise InvalidEventError(f"bytes payload for a {schema.payload_type} column "
                                    f"{schema.columns.payload!r}; pass a dict or list")
        value = data = bytes(payload)
        stored = len(data)
    elif isinstance(payload, dict | list):
        data = payload_json(payload, jsonb=schema.payload_type == "jsonb")
        value = _jsonb(payload, data) if schema.payload_type == "jsonb" else data
        stored = jsonb_size(data) if schema.payload_type == "jsonb" else len(data)
    else:
        raise InvalidEventError(f"payload must be a dict, list or bytes, not "
                                f"{payload.__class__.__name__} (parse JSON text first)")
    for key, item in (headers or {}).items():
        if not isinstance(key, str):
            raise InvalidEventError(f"header name {show(key)} is {key.__class__.__name__}: "
                                    f"header names are strings; write {show(str(key))}")
        if item is None:
            raise InvalidEventError(f"header {show(key)} is None: header values are strings; "
                                    "leave the header out")
        if not isinstance(item, str):
            raise InvalidEventError(f"header {show(key)} is {item.__class__.__name__}"
                                    f"{_as_text(item)}")
    for name in headers or {}:
        # Such a row could only be dead-lettered (router/routing.py): refuse it at the source.
        problem = ("is reserved for the router (id, type, aggregatetype, aggregateid, ce_*)"
                   if is_reserved_header(name, cloudevents=False) else header_name_problem(name))
        if problem:
            raise InvalidEventError(f"header name {show(name)} {problem}; the router would "
                                    "dead-letter the event")
    names = schema.columns
    columns = list(names.required)
    values = [event, aggregate_type, aggregate_id, type, value]
    if names.headers is not None:
        headers_data = headers_json(dict(headers)) if headers is not None else b""
        check_size(stored, len(headers_data))
        columns.append(names.headers)
        values.append(_jsonb(dict(headers), headers_data) if headers is not None else None)
    elif headers is not None:
        raise InvalidEventError("headers given, but the outbox has no headers column")
    else:
        check_size(stored, 0)
    query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        schema.identifier, sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.SQL(", ").join(sql.Placeholder() * len(columns)))
    return query, tuple(values)


def _jsonb(value: Any, data: bytes) -> Jsonb:
    """`value` for a jsonb parameter, as the JSON text already written and checked."""
    return Jsonb(value, dumps=lambda _: data)


def _as_text(item: object) -> str:
    """' VALUE: header values are strings; WHAT TO WRITE' (_header_text), for a header value
    that is no string, and nothing of a value whose repr or str raises (a user's class: it
    raised instead of InvalidEventError, review 62)."""
    try:
        return f" {show(item)}: header values are strings; {_header_text(item)}"
    except Exception:
        return ": header values are strings; write its text"


def _check_connection(conn: object, asynchronous: bool) -> None:
    """The connection's kind, and a transaction for the row to join. Review 50-d F1:
    write_event's execute() on an AsyncConnection made a coroutine nobody awaited; the id was
    returned, the transaction committed without the row."""
    if asynchronous and isinstance(conn, psycopg.Connection | psycopg.Cursor):
        raise InvalidEventError(f"write_event_async got a psycopg {conn.__class__.__name__}: "
                                "use write_event(conn, ...)")
    if not asynchronous and isinstance(conn, psycopg.AsyncConnection | psycopg.AsyncCursor):
        raise InvalidEventError(f"write_event got a psycopg {conn.__class__.__name__}: use "
                                "`await write_event_async(conn, ...)`")
    # Review 50-d F5: on an autocommit connection outside a transaction block the row committed
    # by itself, before (and whatever became of) the business change.
    connection = conn.connection if isinstance(conn, psycopg.Cursor | psycopg.AsyncCursor) \
        else conn
    status = getattr(getattr(connection, "info", None), "transaction_status", None)
    if getattr(connection, "autocommit", False) is True and \
            status == psycopg.pq.TransactionStatus.IDLE:
        block = "async with conn.transaction():" if asynchronous else "with conn.transaction():"
        raise InvalidEventError(f"the connection is in autocommit mode and outside a transaction, "
                                f"so the event would commit on its own, apart from the business "
                                f"change: call it inside `{block}` (or on a connection without "
                                "autocommit)")


def _check_text(name: str, text: object) -> None:
    """What the router could only dead-letter (an empty or blank column) or Postgres refuses
    (NUL, text that is not UTF-8) is refused here, in the writer's own terms."""
    if not isinstance(text, str) or text == "":
        raise InvalidEventError(f"{name} must be non-empty text, not {show(text)}")
    if text.isspace():  # the router's rule too (router/debezium.py), QA 46-a
        raise InvalidEventError(f"{name} is blank: {show(text)}; the router would dead-letter "
                                "the event")
    try:
        text.encode("utf-8")  # a lone surrogate fails (serde.json would make an import cycle)
        storable = "\x00" not in text
    except UnicodeEncodeError:
        storable = False
    if not storable:
        raise InvalidEventError(f"{name} holds a NUL or a lone surrogate, which Postgres text "
                                f"cannot store: {show(text)}")
