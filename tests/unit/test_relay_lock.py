"""The relay's table lock: which failures it waits out, and which it reports at once."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from cdc_router.errors import ConfigError, DatabaseError
from cdc_router.relay.lock import TableLock


class _Failing:
    """A connection whose every query raises `error`."""

    closed = False

    def __init__(self, error: psycopg.Error) -> None:
        self.error = error

    def execute(self, query: str, params: Any = ()) -> Any:
        raise self.error

    def close(self) -> None:
        self.closed = True


def _acquire(connect: Any, tries: int = 3) -> tuple[bool, list[float]]:
    waits: list[float] = []
    lock = TableLock("postgresql://unused", "public.outbox", connect=connect)
    return lock.acquire(lambda s: waits.append(s) or len(waits) >= tries), waits


def test_a_table_that_does_not_exist_is_a_config_error_at_once() -> None:
    missing = psycopg.errors.UndefinedTable('relation "public.outbox" does not exist')
    with pytest.raises(ConfigError, match=r"relay\.table.*does not exist"):
        _acquire(lambda *a, **k: _Failing(missing))


def test_credentials_the_server_refuses_are_an_error_at_once() -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError('connection failed: connection to server at "h", port '
                                       '5432 failed: FATAL:  password authentication failed '
                                       'for user "app"')

    with pytest.raises(DatabaseError, match="password authentication failed"):
        _acquire(refused)


def test_a_server_not_answering_yet_is_waited_for() -> None:
    def down(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError("connection failed: Connection refused")

    acquired, waits = _acquire(down)
    assert not acquired and waits == [1.0, 2.0, 4.0]


def test_a_pg_variable_libpq_refuses_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Reread 59 F-2: libpq's refusal of PGSSLMODE read as a login to check.
    monkeypatch.setenv("PGSSLMODE", "bogus")
    with pytest.raises(DatabaseError) as refused:
        TableLock("host=127.0.0.1 port=1", "public.outbox").acquire(lambda s: True)
    assert str(refused.value) == (
        "the relay cannot lock public.outbox: its sslmode 'bogus' is not one libpq takes: "
        "disable, allow, prefer, require, verify-ca, verify-full (from the environment "
        "variable PGSSLMODE: fix or unset it); check relay.dsn, else cleanup.dsn")
