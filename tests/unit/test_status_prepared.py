"""A prepared transaction (two-phase commit) left pending (QA 57-b F-2): `status` said ok while
one held 5 outbox rows back and pinned the slot's restart_lsn, and the lock hints sent the
operator to pg_stat_activity, where a prepared transaction has no row."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psycopg
import pytest

from cdc_router.config.model import RouterConfig
from cdc_router.config.status import StatusSettings
from cdc_router.ops import database
from cdc_router.ops.database import _guarded
from cdc_router.ops.report import OutboxState, PreparedXact
from cdc_router.ops.verdict import judge
from cdc_router.router.cleanup_failures import failure_reason
from tests.unit.test_status_verdict import healthy

HELD = PreparedXact(gid="qa57b-held", age_s=960.0, database="postgres", owner="postgres")


def _with(*prepared: PreparedXact) -> Any:
    report = healthy()
    return replace(report, wal=replace(report.wal, prepared=prepared))


def test_a_prepared_transaction_over_the_threshold_is_a_warning_naming_gid_age_and_the_fix():
    found = [problem for problem in judge(_with(HELD), StatusSettings()) if
             "prepared transaction" in str(problem)]
    assert [problem.level for problem in found] == ["warning"]
    line = str(found[0])
    assert "prepared transaction 'qa57b-held' (database postgres, owner postgres) pending for " \
           "960s (warning at 60s)" in line
    assert "any outbox rows it wrote are not streamed until it ends" in line
    assert "COMMIT PREPARED 'qa57b-held' (or ROLLBACK PREPARED to discard it)" in line


def test_a_young_prepared_transaction_or_the_check_off_is_no_problem():
    young = replace(HELD, gid="it's-young", age_s=5.0)
    assert judge(_with(young), StatusSettings()) == []
    assert judge(_with(HELD), StatusSettings(prepared_xact_warning_s=None)) == []
    quoted = judge(_with(replace(young, age_s=61.0)), StatusSettings())
    assert "COMMIT PREPARED 'it''s-young'" in str(quoted[0])


def test_the_threshold_is_a_status_threshold() -> None:
    from cdc_router.cli.status import with_thresholds

    config = RouterConfig.model_validate({"source": {"topics": ["raw"]},
                                          "routes": [{"topic": "out"}]})
    changed = with_thresholds(config, ("prepared_xact_warning_s=1200",))
    assert changed.status.prepared_xact_warning_s == 1200
    assert judge(_with(HELD), changed.status) == []


def test_the_wal_check_reads_pg_prepared_xacts_oldest_first() -> None:
    asked: list[str] = []

    class Conn:
        def execute(self, query: str, params: object = None) -> Any:
            asked.append(query)

            class Rows(list[tuple[Any, ...]]):
                def fetchone(self) -> tuple[Any, ...]:
                    return self[0]
            if "max_slot_wal_keep_size" in query:
                return Rows([(2 * 1024**3,)])
            if "pg_prepared_xacts" in query:
                return Rows([("g1", 960.5, "postgres", "postgres"), ("g2", 3.0, "app", "app")])
            return Rows()

    state = database.wal_state(Conn(), None)  # type: ignore[arg-type]
    assert state.prepared == (HELD.__class__("g1", 960.5, "postgres", "postgres"),
                              HELD.__class__("g2", 3.0, "app", "app"))
    assert any("ORDER BY prepared" in query for query in asked)


def test_the_lock_hints_of_status_and_the_cleanup_name_pg_prepared_xacts() -> None:
    def locked() -> OutboxState:
        raise psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")

    error = _guarded(locked, OutboxState).error or ""
    assert "see pg_locks and pg_stat_activity, and pg_prepared_xacts for a prepared " \
           "transaction (two-phase commit), whose lock has no pid: COMMIT PREPARED or " \
           "ROLLBACK PREPARED its gid" in error
    reason = failure_reason(psycopg.errors.LockNotAvailable("x"), connected=True,
                            table="public.outbox")
    assert "pg_prepared_xacts" in reason and reason.endswith("routing goes on")


@pytest.mark.parametrize("name", ["prepared_xact_warning_s"])
def test_the_readme_runbook_says_what_a_pending_prepared_transaction_does(name: str) -> None:
    from pathlib import Path

    readme = Path(__file__).resolve().parents[2].joinpath("README.md").read_text()
    assert name in readme and "pg_prepared_xacts" in readme
    assert "COMMIT PREPARED" in readme and "ROLLBACK PREPARED" in readme
