"""What `status` says to do under the faults of QA 58-b: the advice must lead to a repair."""

from __future__ import annotations

from dataclasses import replace

from cdc_router.ops.report import PublicationState
from cdc_router.ops.verdict import judge
from tests.unit.test_status_verdict import SETTINGS, healthy, lines

RUNBOOK = "README runbook 'the slot was dropped or its WAL removed'"


def test_a_missing_publication_sends_to_outbox_init_then_the_slot_runbook() -> None:
    # QA 58-b F-2: `outbox init` alone re-created the publication, the task was RUNNING and
    # the slot never streamed again (pgoutput decodes the WAL after the slot's position with
    # the catalog of that time, where the publication did not exist): only the slot runbook
    # from its step 2 restored capture.
    report = replace(healthy(), publication=PublicationState(name="outbox_pub", exists=False))
    assert lines(report) == [
        "critical: publication: publication outbox_pub does not exist: the connector cannot "
        "stream; run `cdc-router outbox init --publication outbox_pub` (with this database's "
        "--dsn), then follow "
        f"{RUNBOOK} from its step 2: created again, it does not serve the slot past a change "
        "written while it was missing (Postgres decodes the slot's WAL with the catalog as of "
        "each change)"]


def test_a_missing_publication_of_another_outbox_table_names_it_for_outbox_init() -> None:
    # QA 58-d F-1: followed literally, `outbox init --publication ob3_pub` made the publication
    # FOR public.outbox, not the connector's public.ob3.
    healthy_report = healthy()
    report = replace(healthy_report, publication=PublicationState(name="ob3_pub", exists=False),
                     outbox=replace(healthy_report.outbox, table="public.ob3"))
    [line] = lines(report)
    assert "run `cdc-router outbox init --publication ob3_pub --table public.ob3` (with this " \
        "database's --dsn), then follow" in line, line


def test_a_capture_stopped_line_names_a_recreated_publication_among_its_causes() -> None:
    slot = replace(healthy().wal.slots[0], active=False)
    report = replace(healthy(), wal=replace(healthy().wal, slots=(slot,)))
    (problem,) = judge(report, SETTINGS)
    assert "a publication re-created after the slot" in problem.message
    assert f"`publication ... does not exist` while it does: {RUNBOOK} from its step 2" in \
        problem.message
