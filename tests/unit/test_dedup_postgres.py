"""PostgresDedupStore's connection options (no database: psycopg.connect is replaced)."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_router.consumer.dedup import postgres
from cdc_router.consumer.dedup.postgres import PostgresDedupStore


def connect_options(monkeypatch: pytest.MonkeyPatch, dsn: str) -> dict[str, Any]:
    """The keywords the store's first connection of `dsn` is opened with."""
    seen: dict[str, Any] = {}

    class Connection:
        closed = False

    def connect(conninfo: str, **options: Any) -> Connection:
        seen.update(options, conninfo=conninfo)
        return Connection()

    monkeypatch.setattr(postgres.psycopg, "connect", connect)
    PostgresDedupStore(dsn, connect_timeout_s=7)._connection()
    return seen


def test_the_store_connects_with_the_liveness_options_of_the_routers_sessions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 46 F3: without keepalives and tcp_user_timeout a Postgres host gone without a
    # FIN held run_once, and the consumer's stop, for the kernel's TCP retries (~15 min).
    monkeypatch.delenv("PGAPPNAME", raising=False)
    options = connect_options(monkeypatch, "host=db dbname=app")
    assert options["keepalives"] == "1" and options["tcp_user_timeout"] == "30000"
    assert options["autocommit"] is True and options["connect_timeout"] == 7
    assert options["application_name"] == "cdc-router-consumer"


def test_the_dsns_own_liveness_settings_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    options = connect_options(monkeypatch, "host=db tcp_user_timeout=0 keepalives_idle=60")
    assert "tcp_user_timeout" not in options and "keepalives_idle" not in options
    assert options["keepalives_count"] == "3"
