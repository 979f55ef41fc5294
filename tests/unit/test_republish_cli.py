"""`outbox republish`'s selection and its window warning, without a database (QA 33-c)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.cli import outbox as outbox_cli

EXAMPLE = Path(__file__).parents[2] / "cdc_router" / "examples" / "router.yaml"
E1 = "0193a0c4-0000-7000-8000-000000000001"


def _dry_run(monkeypatch: pytest.MonkeyPatch, oldest_us: int | None,
             *args: str, id_type: str = "", missing: int = 0) -> tuple[Any, list[Any]]:
    asked: list[Any] = []

    @contextlib.contextmanager
    def database(dsn: str) -> Iterator[Any]:
        yield type("Conn", (), {"commit": lambda self: None})()

    def count_rows(conn: Any, schema: Any,
                   selection: Any) -> tuple[int, int | None, list[str]]:
        asked.append(selection)
        return 3, oldest_us, list((selection.ids or ())[:missing])

    monkeypatch.setattr(outbox_cli, "database", database)
    monkeypatch.setattr(outbox_cli, "count_rows", count_rows)
    monkeypatch.setattr(outbox_cli, "table_columns", lambda *args: {
        "id": id_type, "created_at": "timestamp(6) without time zone"})  # the columns it names
    result = CliRunner().invoke(main, ["outbox", "republish", "-c", str(EXAMPLE), "--dry-run",
                                       *args])
    return result, asked


def test_an_id_with_a_comma_or_outer_spaces_is_selected_exactly_with_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 33-c: --ids splits on commas and strips, so such an id matched 0 rows, unsaid.
    result, [selection] = _dry_run(monkeypatch, None, "--id", " a,b ", "--ids", "c, d")
    assert result.exit_code == 0, result.output
    assert selection.ids == (" a,b ", "c", "d")


def test_ids_of_a_uuid_column_are_compared_as_uuids_and_a_non_uuid_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 53-c F13: an upper-case (or braced) UUID was "not in public.outbox", exit 0.
    upper, braced = "C4928356-96E9-4E63-A985-5E0012AB4796", "{c4928356-96e9-4e63-a985-5e0012ab4797}"
    result, [selection] = _dry_run(monkeypatch, None, "--ids", upper, "--id", braced,
                                   id_type="uuid")
    assert result.exit_code == 0, result.output
    assert selection.ids == ("c4928356-96e9-4e63-a985-5e0012ab4797",
                             "c4928356-96e9-4e63-a985-5e0012ab4796") and selection.as_uuid
    result, _ = _dry_run(monkeypatch, None, "--ids", "a,B", id_type="text")
    assert result.exit_code == 0 and _[0].ids == ("a", "B") and not _[0].as_uuid
    result, asked = _dry_run(monkeypatch, None, "--id", "notauuid", id_type="uuid")
    assert result.exit_code == 1 and not asked
    assert "field '--id': not a UUID, and the id column 'id' is uuid (got 'notauuid')" in \
        result.output


def test_ids_not_in_the_table_fail_the_republish_and_no_ids_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 53-c F13: ids not found exited 0 (a runbook script went on); --ids '' said "0 rows".
    result, _ = _dry_run(monkeypatch, None, "--ids", "gone,B", "--id", "here", missing=2,
                         id_type="text")
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (
        "error: field '--id/--ids': not in public.outbox: 'here', 'gone'; nothing was "
        "republished; a delivered row may have been deleted by the cleanup: leave those ids "
        "out")
    result, asked = _dry_run(monkeypatch, None, "--ids", " , ")
    assert result.exit_code == 1 and not asked
    assert "error: field '--ids': no ids given (got ' , ')" in result.output


def test_the_window_warning_names_the_windows_edge(monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 33-c: it named the oldest selected row's time as the edge.
    year_2000_us = 946_684_800_000_000
    result, _ = _dry_run(monkeypatch, year_2000_us, "--since", "2000-01-01")
    edge = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 7 * 86_400))
    assert f"warning: rows created before {edge}T" in result.output, result.output
    assert "(now less dedup.window_ms; the oldest selected: 2000-01-01T00:00:00Z)" in \
        result.output


def test_the_key_columns_are_encoded_by_the_tables_types(monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 46: a timestamp(3) key column went as microseconds, Debezium's as milliseconds.
    produced: list[Any] = []

    @contextlib.contextmanager
    def database(dsn: str) -> Iterator[Any]:
        yield type("Conn", (), {"commit": lambda self: None})()

    def republish_events(config: Any, topic: str, events: Any) -> int:
        produced.extend(events)
        return len(produced)

    created = datetime(2016, 11, 4, 13, 51, 30, 123000)
    monkeypatch.setattr(outbox_cli, "database", database)
    monkeypatch.setattr(outbox_cli, "count_rows", lambda *args: (1, None, []))
    monkeypatch.setattr(outbox_cli, "table_columns", lambda *args: {
        "id": "uuid", "created_at": "timestamp(3) without time zone"})
    monkeypatch.setattr(outbox_cli, "outbox_rows", lambda *args: iter([
        {"id": E1, "created_at": (created - datetime(1970, 1, 1)) // timedelta(microseconds=1)}]))
    monkeypatch.setattr(outbox_cli, "republish_events", republish_events)
    result = CliRunner().invoke(main, ["outbox", "republish", "-c", str(EXAMPLE), "--ids", E1,
                                       "--yes", "--key-columns", "public.outbox:created_at"])
    assert result.exit_code == 0, result.output
    [event] = produced
    assert event.key == b'{"created_at":1478267490123}'


@pytest.mark.parametrize(("read", "said"), [
    (3, " (1 more than counted: rows written since the count);"),
    (1, " (1 fewer than counted: rows deleted since the count);"),
    (2, ";"),
])
def test_the_final_line_says_how_many_rows_differ_from_the_count(
        monkeypatch: pytest.MonkeyPatch, read: int, said: str) -> None:
    # QA 67-b F-5: "50950 rows ... to republish", then "republished 50960" without a word:
    # rows written between the count and the stream's query were in it.
    @contextlib.contextmanager
    def database(dsn: str) -> Iterator[Any]:
        yield type("Conn", (), {"commit": lambda self: None})()

    monkeypatch.setattr(outbox_cli, "database", database)
    monkeypatch.setattr(outbox_cli, "count_rows", lambda *args: (2, None, []))
    monkeypatch.setattr(outbox_cli, "table_columns", lambda *args: {
        "id": "uuid", "created_at": "timestamp(6) without time zone"})
    monkeypatch.setattr(outbox_cli, "outbox_rows", lambda *args: iter([{"id": E1}] * read))
    monkeypatch.setattr(outbox_cli, "republish_events",
                        lambda config, topic, events: sum(1 for _ in events))
    result = CliRunner().invoke(main, ["outbox", "republish", "-c", str(EXAMPLE), "--since",
                                       "1h", "--yes"])
    assert result.exit_code == 0, result.output
    last = result.output.rstrip().splitlines()[-1]
    assert re.fullmatch(rf"republished {read} change events onto \S+{re.escape(said)} the router "
                        "drops those it already delivered", last), result.output
