"""`status --connector` and the database's other inactive logical slots (fixer 63): a slot a
slot.name change left behind keeps its WAL for ever, and status, asked about the connector's
slot alone, did not name it."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from cdc_router.cli._status_text import as_json, as_text
from cdc_router.config.status import StatusSettings
from cdc_router.ops import database
from cdc_router.ops.report import Slot
from cdc_router.ops.verdict import judge
from tests.unit.test_status_verdict import GIB, healthy

LEFT = Slot("outbox_slot_v1", True, False, "extended", retained_wal_bytes=3 * GIB)
MIB = 1024**2


class Rows(list[tuple[Any, ...]]):
    def fetchone(self) -> tuple[Any, ...] | None:
        return self[0] if self else None


def _report(*slots: Slot) -> Any:
    report = healthy()  # max_slot_wal_keep_size 2 GiB
    return replace(report, wal=replace(report.wal, other_inactive_slots=slots))


def test_another_inactive_slot_holding_wal_past_the_thresholds_is_a_problem_with_the_fix() -> None:
    found = [str(problem) for problem in judge(_report(LEFT), StatusSettings())]
    assert found == [
        "critical: wal: slot outbox_slot_v1 inactive, in this database and not the "
        "connector's (outbox_slot): nobody streams from it and it retains 3.0 GiB of WAL, "
        "150% of max_slot_wal_keep_size (2.0 GiB; critical at 80%): the slot is invalidated "
        "at 100%; a slot a slot.name change left behind, or another consumer's that is down: "
        "if nothing reads it any more, drop it (SELECT pg_drop_replication_slot("
        "'outbox_slot_v1'))"]
    half = replace(LEFT, retained_wal_bytes=1100 * MIB)
    assert [problem.level for problem in judge(_report(half), StatusSettings())] == ["warning"]
    assert judge(healthy(), StatusSettings()) == []  # without it: all well, as before


def test_one_under_the_thresholds_or_invalidated_is_listed_but_no_problem() -> None:
    # Another team's connector stopped for a while, or restarting: theirs to mind, and every
    # such stop turned this pipeline's status (and exit code) to warning (review of fixer 63).
    small = replace(LEFT, name="other_team", retained_wal_bytes=100 * MIB)
    lost = replace(LEFT, name="gone", wal_status="lost", retained_wal_bytes=None)
    report = _report(small, lost)
    assert judge(report, StatusSettings()) == []
    text = as_text(report, [])
    assert "other_team (not the connector's)" in text and "gone (not the connector's)" in text
    assert text.rstrip().endswith("status: ok"), text


def test_it_is_listed_in_the_text_and_in_json() -> None:
    report = _report(LEFT)
    problems = judge(report, StatusSettings())
    text = as_text(report, problems)
    [row] = [line for line in text.splitlines() if "outbox_slot_v1 (not the connector's)" in line]
    assert "NO" in row and "3.0 GiB" in row and "extended" in row, row
    document = json.loads(json.dumps(as_json(report, problems)))
    [other] = document["wal"]["other_inactive_slots"]
    assert (other["name"], other["active"], other["retained_wal_bytes"]) == (
        "outbox_slot_v1", False, 3 * GIB)
    assert document["status"] == "critical"


def test_the_wal_check_asks_for_them_only_when_it_names_the_connectors_slots() -> None:
    asked: list[tuple[str, Any]] = []

    class Conn:
        def execute(self, query: str, params: Any = None) -> Rows:
            asked.append((query, params))
            if "max_slot_wal_keep_size" in query:
                return Rows([(-1,)])
            if "NOT active" in query:
                return Rows([("outbox_slot_v1", "extended", None, 3 * GIB)])
            return Rows()

    state = database.wal_state(Conn(), ["outbox_slot"])  # type: ignore[arg-type]
    assert state.other_inactive_slots == (LEFT,)
    assert [params for query, params in asked if "NOT active" in query] == [
        {"names": ["outbox_slot"], "database": None}]  # None: the DSN's own database
    asked.clear()
    assert database.wal_state(Conn(), None).other_inactive_slots == ()  # type: ignore[arg-type]
    assert not any("NOT active" in query for query, _ in asked)  # all of them are listed then


def test_with_a_dsn_of_another_database_the_connectors_databases_slots_are_listed(
        monkeypatch: Any) -> None:
    # Review 63 (186e24a with d5aebf3): the DSN naming another database of the server, the
    # other inactive slots listed were that database's, said to be "in this database".
    asked: list[Any] = []

    class Conn:
        def __enter__(self) -> Conn:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def execute(self, query: str, params: Any = None) -> Any:
            asked.append(params)
            if "max_slot_wal_keep_size" in query:
                return Rows([(-1,)])
            return Rows([("shop",)] if query.strip() == "SELECT current_database()" else [])

    monkeypatch.setattr(database.psycopg, "connect", lambda *args, **kwargs: Conn())
    database.probe_database("postgresql://h/shop", ["billing_slot"], "billing_pub",
                            database.OutboxSchema(), database="billing")
    assert {"names": ["billing_slot"], "database": "billing"} in asked, asked
