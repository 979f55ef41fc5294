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
        "stream; run `cdc-router outbox init` with its name (--publication), then follow "
        f"{RUNBOOK} from its step 2: created again, it does not serve the slot past a change "
        "written while it was missing (Postgres decodes the slot's WAL with the catalog as of "
        "each change)"]


def test_a_capture_stopped_line_names_a_recreated_publication_among_its_causes() -> None:
    slot = replace(healthy().wal.slots[0], active=False)
    report = replace(healthy(), wal=replace(healthy().wal, slots=(slot,)))
    (problem,) = judge(report, SETTINGS)
    assert "a publication re-created after the slot" in problem.message
    assert f"`publication ... does not exist` while it does: {RUNBOOK} from its step 2" in \
        problem.message
