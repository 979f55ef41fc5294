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


def test_the_trigger_function_and_trigger_are_replaced_under_inits_lock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("relay_catalog", "column_types"):
        monkeypatch.setattr(relay_columns, name, lambda *args: ())
    monkeypatch.setattr(relay_columns, "partitioned_by", lambda *args: False)
    monkeypatch.setattr(relay_columns, "seq_not_null_fix", lambda *args: None)
    conn = _Conn()

    relay_columns.add_relay_columns(conn, "public.outbox", "txid", "seq")  # type: ignore[arg-type]

    ddl = [(text, locked) for text, locked in conn.statements
           if text.startswith(("CREATE", "ALTER"))]
    assert any("CREATE OR REPLACE FUNCTION" in text for text, _ in ddl)
    assert any("CREATE OR REPLACE TRIGGER" in text for text, _ in ddl)
    for text, locked in ddl:  # a CONCURRENTLY build cannot run in a transaction
        assert locked is ("CONCURRENTLY" not in text), text
