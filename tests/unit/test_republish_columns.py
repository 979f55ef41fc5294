"""`outbox republish`'s column errors name the config's source.outbox keys (review 53-c F11):
they named `--column`, which republish does not have."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.cli import outbox as outbox_cli

_TYPES = {"id": "uuid", "aggregatetype": "text", "aggregateid": "text", "type": "text",
          "payload": "jsonb", "headers": "jsonb"}


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    @contextmanager
    def database(dsn: str) -> Iterator[object]:
        yield object()

    def table_columns(conn: Any, table: str, field: str, required: Any) -> dict[str, str]:
        return dict(_TYPES)  # public.outbox2, without created_at (nor ts)

    monkeypatch.setattr(outbox_cli, "database", database)
    monkeypatch.setattr(outbox_cli, "table_columns", table_columns)
    path = tmp_path / "ob3.yaml"
    path.write_text("source: {topics: [outbox2.public.outbox2], outbox: {created_at: ts}}\n"
                    "routes: [{topic: x}]\ncleanup: {mode: delete, table: public.outbox2, "
                    "dsn: 'postgresql://u@127.0.0.1:1/db'}\n", "utf-8")
    return path


def _refusal(config: Path) -> str:
    """What `outbox republish --since 1h --dry-run` says on stderr, exiting 1."""
    result = CliRunner().invoke(main, ["outbox", "republish", "-c", str(config), "--since", "1h",
                                       "--dry-run"])
    assert result.exit_code == 1, result.output
    return result.stderr


def test_a_column_the_table_lacks_names_the_configs_key(config: Path) -> None:
    assert _refusal(config) == (
        f"error: {config}: field 'source.outbox.created_at': the outbox table public.outbox2 "
        "has no column 'ts' (got 'ts'); name the table's created_at column there (it has id, "
        "aggregatetype, aggregateid, type, payload, headers), or null for a table without "
        "one\n")


def test_no_created_at_column_suggests_the_ids(config: Path) -> None:
    config.write_text(config.read_text().replace("created_at: ts", "created_at: null"))
    refusal = _refusal(config)
    assert refusal == (
        f"error: {config}: field 'source.outbox.created_at': the outbox has no created_at "
        "column, so --since cannot tell which rows are recent; select the rows with --ids/--id, "
        "or name the column that holds their time there\n")
    assert "--column" not in refusal
