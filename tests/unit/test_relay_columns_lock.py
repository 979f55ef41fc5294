"""add_relay_columns takes init's advisory lock for what it replaces in the catalog (reread
50-i F10: two `outbox init --relay` at once replaced the trigger function together, after
init's own lock was released)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from cdc_router.outbox import relay_columns
from cdc_router.outbox.setup import INIT_LOCK


class _Conn:
    """Records each statement with whether init's lock is held (in a transaction) for it."""

    def __init__(self) -> None:
        self.autocommit = False
        self.locked = False
        self.statements: list[tuple[str, bool]] = []

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        try:
            yield
        finally:
            self.locked = False  # an xact lock ends with its transaction

    def execute(self, query: Any, params: Any = None) -> Any:
        text = query if isinstance(query, str) else query.as_string(None)
        if text == "SELECT pg_advisory_xact_lock(%s)" and params == (INIT_LOCK,):
            self.locked = True
        self.statements.append((text, self.locked))
        return self

    def fetchone(self) -> None:
        return None


@pytest.fixture
def catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unpartitioned table whose catalog queries (columns, indexes, NULL seqs) answer nothing."""
    for name in ("relay_catalog", "column_types"):
        monkeypatch.setattr(relay_columns, name, lambda *args: ())
    monkeypatch.setattr(relay_columns, "partitioned_by", lambda *args: False)
    monkeypatch.setattr(relay_columns, "seq_not_null_fix", lambda *args: None)


def test_the_trigger_function_and_trigger_are_replaced_under_inits_lock(catalog: None) -> None:
    conn = _Conn()

    relay_columns.add_relay_columns(conn, "public.outbox", "txid", "seq")  # type: ignore[arg-type]

    ddl = [(text, locked) for text, locked in conn.statements
           if text.startswith(("CREATE", "ALTER"))]
    assert any("CREATE OR REPLACE FUNCTION" in text for text, _ in ddl)
    assert any("CREATE OR REPLACE TRIGGER" in text for text, _ in ddl)
    for text, locked in ddl:  # a CONCURRENTLY build cannot run in a transaction
        assert locked is ("CONCURRENTLY" not in text), text


class _HeldConn(_Conn):
    """The unique index's CONCURRENTLY build meets lock_timeout (a transaction held open)."""

    def execute(self, query: Any, params: Any = None) -> Any:
        text = query if isinstance(query, str) else query.as_string(None)
        if text.startswith("CREATE UNIQUE INDEX CONCURRENTLY"):
            import psycopg

            raise psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
        return super().execute(query, params)


def test_a_lock_timeout_says_what_held_it_and_to_run_init_again(catalog: None) -> None:
    # QA 56-f F-2 (measured on a 2M-row table left by 0.1.0's init, a transaction held open
    # 15 s): the build was cancelled after 10 s with Postgres's bare 'canceling statement due
    # to lock timeout', an INVALID index left behind, and no word of what to do.
    from cdc_router.errors import DatabaseError

    with pytest.raises(DatabaseError) as caught:
        relay_columns.add_relay_columns(_HeldConn(), "public.outbox", "txid",  # type: ignore[arg-type]
                                        "seq")
    text = str(caught.value)
    assert text.startswith("`outbox init --relay` waited 10 s for a lock on public.outbox "
                           "behind a transaction open since before it")
    assert "pg_stat_activity" in text
    assert text.endswith("run it again once that transaction ends (an index the cancelled "
                         "build left INVALID is built again)")


def test_the_lock_timeout_set_is_the_one_the_line_names(catalog: None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 57: '10s' in the SET and '10 s' twice in the line were written apart; the
    # constant LOCK_TIMEOUT_S gives all three.
    from cdc_router.errors import DatabaseError

    monkeypatch.setattr(relay_columns, "LOCK_TIMEOUT_S", 3)
    conn = _HeldConn()
    with pytest.raises(DatabaseError) as caught:
        relay_columns.add_relay_columns(conn, "public.outbox", "txid",  # type: ignore[arg-type]
                                        "seq")
    assert ("SET lock_timeout = '3s'", False) in conn.statements
    text = str(caught.value)
    assert "waited 3 s for a lock on public.outbox" in text
    assert "WHERE xact_start < now() - interval '3 s')" in text
