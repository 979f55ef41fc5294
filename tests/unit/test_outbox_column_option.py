"""`--column DEFAULT=` of the `outbox` commands: a table without headers or created_at
(review 50-d F6), as router.yaml's `source.outbox.headers: null`."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.cli import outbox as cli_outbox
from cdc_router.outbox import OutboxSchema, OutboxStats
from cdc_router.postgres import column_hint

WRITE = ["outbox", "write", "--aggregate-type", "A", "--aggregate-id", "1", "--type", "T",
         "--payload", "{}"]


@pytest.fixture
def schemas(monkeypatch: pytest.MonkeyPatch) -> list[OutboxSchema]:
    """The schema each command got; no database."""
    seen: list[OutboxSchema] = []
    monkeypatch.setattr(cli_outbox, "database", lambda dsn: contextlib.nullcontext(
        SimpleNamespace(transaction=contextlib.nullcontext)))

    def write_event(conn: object, *, schema: OutboxSchema, **event: Any) -> str:
        seen.append(schema)
        return "01a247a0-f6dd-7000-8000-000000000001"

    def outbox_stats(conn: object, schema: OutboxSchema) -> OutboxStats:
        seen.append(schema)
        return OutboxStats(schema.table, 3, None, 8192)

    monkeypatch.setattr(cli_outbox, "write_event", write_event)
    monkeypatch.setattr(cli_outbox, "outbox_stats", outbox_stats)
    return seen


@pytest.mark.parametrize("none", ["", "null", "NULL"])
def test_an_empty_name_says_the_table_has_no_such_column(schemas: list[OutboxSchema],
                                                        none: str) -> None:
    # null too, as in router.yaml (reread 50-i F11: --column headers=null was a column "null")
    result = CliRunner().invoke(main, [*WRITE, "--column", f"headers={none}", "--column",
                                       f"created_at={none}", "--column", "payload=body"])

    assert result.exit_code == 0, result.output
    [schema] = schemas
    assert (schema.columns.headers, schema.columns.created_at) == (None, None)
    assert schema.columns.payload == "body"


def test_null_is_a_name_for_a_column_every_outbox_has(schemas: list[OutboxSchema]) -> None:
    assert CliRunner().invoke(main, [*WRITE, "--column", "payload=null"]).exit_code == 0
    assert schemas[0].columns.payload == "null"


def test_stats_of_a_table_without_created_at_says_why_it_has_no_age(
        schemas: list[OutboxSchema]) -> None:
    result = CliRunner().invoke(main, ["outbox", "stats", "--column", "created_at="])

    assert result.exit_code == 0, result.output
    assert "oldest       - (the table has no created_at column)\n" in result.stdout
    assert "rows         3\n" in result.stdout


def test_a_column_every_outbox_has_cannot_be_absent(schemas: list[OutboxSchema]) -> None:
    result = CliRunner().invoke(main, [*WRITE, "--column", "id="])

    assert result.exit_code == 1
    assert result.stderr == ("error: field '--column': every outbox has its id column: only "
                             "headers and created_at may be absent (as headers=) (got 'id=')\n")
    assert schemas == []


def test_the_hint_for_a_missing_column_says_how_to_name_none() -> None:
    hint = column_hint(psycopg.errors.UndefinedColumn('column "headers" does not exist'))
    assert "--column headers= or --column created_at=" in hint
    assert "null" not in hint


def test_the_help_says_how_to_name_none() -> None:
    result = CliRunner().invoke(main, ["outbox", "stats", "--help"])
    assert "DEFAULT= (or DEFAULT=null) for a table without it (headers, created_at)" in " ".join(
        result.stdout.split())

