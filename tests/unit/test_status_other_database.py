"""`status` of a pipeline whose connector captures another database than the one its DSN
connects to (QA 63-b F-2: two teams' databases on one server, the shell's CDC_ROUTER_PG_DSN
naming the first; the second's status said its publication was missing, critical, and
advised creating it in the first database)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from cdc_router.ops import database
from cdc_router.ops.connector import capture_of
from cdc_router.outbox.table import OutboxSchema


class _Cursor:
    def __init__(self, row: tuple[Any, ...] | None) -> None:
        self.row = row

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.row


class _Connection:
    """Answers SET and current_database(); any other query fails as Postgres would."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.queries: list[str] = []

    def execute(self, query: str, *args: object) -> _Cursor:
        text = str(query)
        self.queries.append(text)
        if text.startswith("SET "):
            return _Cursor(None)
        if "current_database()" in text and "pg_replication_slots" not in text:
            return _Cursor((self.name,))
        raise psycopg.errors.UndefinedTable("relation does not exist")

    def __enter__(self) -> _Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _connected(monkeypatch: pytest.MonkeyPatch, name: str) -> _Connection:
    conn = _Connection(name)
    monkeypatch.setattr(database.psycopg, "connect", lambda *a, **k: conn)
    return conn


def test_another_database_is_named_not_reported_as_a_missing_publication(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _connected(monkeypatch, "postgres")
    _, publication, outbox = database.probe_database(
        "postgresql://postgres@127.0.0.1:23432/postgres", ["billing_slot"], "billing_pub",
        OutboxSchema(), source="--dsn or CDC_ROUTER_PG_DSN", database="billing")
    for section in (publication, outbox):
        assert section.error == (
            "the connector captures database 'billing', and the DSN from --dsn or "
            "CDC_ROUTER_PG_DSN connects to database 'postgres', where this pipeline's "
            "publication and outbox are not: give status the DSN of database 'billing' (--dsn)")
    assert publication.name == "billing_pub"


def test_the_connectors_own_database_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    _connected(monkeypatch, "billing")
    _, publication, _ = database.probe_database(
        "postgresql://postgres@127.0.0.1:23432/billing", ["billing_slot"], "billing_pub",
        OutboxSchema(), database="billing")
    assert publication.error is None or "connects to database" not in publication.error


def test_a_database_connect_resolves_is_not_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    _connected(monkeypatch, "postgres")
    _, publication, _ = database.probe_database(
        "postgresql://127.0.0.1/postgres", None, "pub", OutboxSchema(),
        database="${env:DB_NAME}")
    assert publication.error is None or "connects to database" not in publication.error


def test_the_capture_names_the_connectors_database() -> None:
    capture = capture_of({"slot.name": "s", "publication.name": "p",
                          "table.include.list": "public.outbox", "database.dbname": "billing"})
    assert capture.database == "billing"
    assert capture_of({"table.include.list": "public.outbox"}).database is None
