"""`outbox init` says which database it changes (QA 55-b F-5)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.cli import outbox as outbox_cli

_REPORT = SimpleNamespace(steps=[("created", "table public.outbox", None)], password=None,
                          warnings=[], notes=[], changed=True, not_ready=())


@pytest.fixture
def connected(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """No Postgres: `database` yields a connection that says where it is; the DSNs it got."""
    dsns: list[str] = []

    @contextmanager
    def database(dsn: str) -> Iterator[Any]:
        dsns.append(dsn)
        yield SimpleNamespace(info=SimpleNamespace(host="db.example", port=6432,
                                                   dbname="shop"), commit=lambda: None)

    monkeypatch.setattr(outbox_cli, "database", database)
    monkeypatch.setattr(outbox_cli, "init_outbox", lambda *args, **kwargs: _REPORT)
    return dsns


@pytest.mark.parametrize(("args", "env", "said"), [
    # QA 55-b F-5: init left at its default DSN changed the local stack's database (another
    # user's, there) and its output named no host, port or database.
    ([], {"CDC_ROUTER_PG_DSN": None}, "Postgres db.example:6432/shop (the default --dsn: the "
                                      "local stack; pass --dsn or set CDC_ROUTER_PG_DSN for "
                                      "another)"),
    (["--dsn", "postgresql://u:s3cret@db.example:6432/shop"], {"CDC_ROUTER_PG_DSN": None},
     "Postgres db.example:6432/shop"),
    ([], {"CDC_ROUTER_PG_DSN": "postgresql://u:s3cret@db.example:6432/shop"},
     "Postgres db.example:6432/shop"),
])
def test_init_says_first_which_database_it_changes(
        connected: list[str], args: list[str], env: dict[str, str | None], said: str) -> None:
    result = CliRunner().invoke(main, ["outbox", "init", *args], env=env)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == said and lines[1:] == ["created  table public.outbox", "outbox ready"]
    assert "s3cret" not in result.output and len(connected) == 1
