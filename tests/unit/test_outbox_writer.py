"""write_event() and write_event_async(): the connection they take, and what they refuse before
any SQL (review 50-d)."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
from psycopg.pq import TransactionStatus

from cdc_router.outbox import InvalidEventError, write_event, write_event_async

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
