"""`status`'s verdict on the Postgres WAL side: the connector's replication slots, and the
prepared transactions that hold WAL back (split from ops/verdict.py, unchanged)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from psycopg import sql

from cdc_router.config.status import Level, StatusSettings
from cdc_router.ops.connector_failure import LOST_SLOT_RUNBOOK
from cdc_router.ops.problem import Problem, reached, size
from cdc_router.ops.report import Report, Slot, WalState


def wal_problems(report: Report, settings: StatusSettings) -> Iterator[Problem]:
    """The slots' (and prepared transactions') problems of `report`."""
    connector = report.connector
    # The connector and every task say RUNNING: an inactive slot is then no restart to wait
    # for (QA 54-b F-4: Debezium retried a role that may not log in, both RUNNING for minutes).
    running = connector.name if connector.error is None and connector.exists and \
        connector.state == "RUNNING" and connector.tasks and \
        all(task.state == "RUNNING" for task in connector.tasks) else None
    for slot in report.wal.slots:
        yield from _slot(slot, report.wal.max_slot_wal_keep_size_bytes, settings, running,
                         report.checked_at)
    yield from _prepared(report.wal, settings)
    yield from _left_behind(report.wal, [slot.name for slot in report.wal.slots], settings)


def _left_behind(wal: WalState, ours: list[str], settings: StatusSettings
                 ) -> Iterator[Problem]:
    """This database's other inactive logical slots: one a slot.name change left behind keeps
    the WAL since its last read, for ever (max_slot_wal_keep_size -1), and `status
    --connector` named only the connector's own (fixer 63). They are listed in any case; one
    is a problem only once the WAL it keeps reaches the thresholds the connector's slot is
    held to: another team's slot on a shared server, down for a while, is theirs to mind
    until it fills the disk this pipeline's slot needs too (and a warning for every short
    stop of another connector turned this pipeline's status, and its exit code, to warning)."""
    named = " or ".join(ours) or "-"
    for slot in wal.other_inactive_slots:
        if slot.retained_wal_bytes is None or slot.wal_status == "lost":
            continue  # invalidated: it holds no WAL back any more
        over = _retained_over(slot.retained_wal_bytes, wal.max_slot_wal_keep_size_bytes,
                              settings)
        if over is None:
            continue
        level, how_much = over
        yield Problem(level, "wal", f"slot {slot.name} inactive, in this database and not "
                      f"the connector's ({named}): nobody streams from it and it retains "
                      f"{how_much}; a slot a slot.name change left behind, or another "
                      "consumer's that is down: if nothing reads it any more, drop it "
                      f"(SELECT pg_drop_replication_slot({_literal(slot.name)}))")


def _retained_over(retained: int, limit: int | None, settings: StatusSettings
                   ) -> tuple[Level, str] | None:
    """The level a slot's retained WAL has reached (status.wal_*), with the amount said
    against its threshold; None under the warning threshold."""
    if limit is not None and limit >= 0:
        percent = 100.0 * retained / limit if limit else 100.0
        over = reached(percent, settings.wal_critical_percent, settings.wal_warning_percent)
        return None if over is None else (over[0], (
            f"{size(retained)} of WAL, {percent:.0f}% of max_slot_wal_keep_size "
            f"({size(limit)}; {over[0]} at {over[1]:g}%): the slot is invalidated at 100%"))
    over = reached(retained, settings.wal_critical_bytes, settings.wal_warning_bytes)
    return None if over is None else (over[0], (
        f"{size(retained)} of WAL ({over[0]} at {size(over[1])}) and max_slot_wal_keep_size "
        "is -1, so it can fill the disk"))


def _prepared(wal: WalState, settings: StatusSettings) -> Iterator[Problem]:
    """A prepared transaction left pending (QA 57-b F-2): status said ok while one pinned the
    slot's restart_lsn and held its outbox rows back, invisible in the outbox's row count."""
    bound = settings.prepared_xact_warning_s
    for xact in wal.prepared:
        if bound is not None and xact.age_s >= bound:
            yield Problem("warning", "wal", f"prepared transaction {xact.gid!r} (database "
                          f"{xact.database}, owner {xact.owner}) pending for {xact.age_s:.0f}s "
                          f"(warning at {bound:g}s): any outbox rows it wrote are not "
                          "streamed until it ends, every slot keeps the WAL written since it "
                          "began, and its locks (pid NULL in pg_locks) stay held; have its "
                          f"coordinator finish it, or by hand in database {xact.database}: "
                          "COMMIT PREPARED "
                          f"{_literal(xact.gid)} (or ROLLBACK PREPARED to discard it)")


def _literal(text: str) -> str:
    return sql.Literal(text).as_string(None)


def _inactive_while_running(slot: Slot, connector: str, checked_at: str,
                            settings: StatusSettings) -> Problem:
    """An inactive slot while connector and tasks say RUNNING: Debezium retrying a retriable
    error; critical once a watch has seen it so for status.capture_stopped_critical_s."""
    since = slot.inactive_since or checked_at
    age = (datetime.fromisoformat(checked_at) - datetime.fromisoformat(since)).total_seconds()
    where = f"slot {slot.name} inactive"
    look = ("Debezium retries a retriable error (a role that may not log in, pg_hba.conf, the "
            "network, a publication re-created after the slot) and `cdc-router connectors "
            "status` says RUNNING: read Connect's log for the task's error and `Awaiting end "
            "of restart backoff period` (`cdc-router local logs connect` on the local stack); "
            f"`publication ... does not exist` while it does: {LOST_SLOT_RUNBOOK} from its "
            "step 2")
    wal = f"it retains {size(slot.retained_wal_bytes or 0)} of WAL"
    bound = settings.capture_stopped_critical_s
    if bound is not None and age >= bound:
        return Problem("critical", "wal", f"{where} for {age:.0f}s (critical at {bound:g}s) "
                       f"while connector {connector} and its tasks say RUNNING: capture "
                       f"stopped, the rows written meanwhile wait in the outbox and {wal}; "
                       f"{look}")
    return Problem(settings.slot_inactive, "wal", f"{where}: nobody streams from it while "
                   f"connector {connector} and its tasks say RUNNING, and {wal}; if it lasts, "
                   f"{look}")


def _slot(slot: Slot, limit: int | None, settings: StatusSettings, running: str | None,
          checked_at: str) -> Iterator[Problem]:
    where = f"slot {slot.name}"
    if not slot.exists:
        # Not "lost": the rows stay in the outbox (the cleanup deletes delivered rows only)
        # and the runbook brings their events back; "lost" scared operators (QA 36-c).
        yield Problem("critical", "wal", f"{where} does not exist: Debezium streams nothing, "
                      "and the rows written meanwhile stay in the outbox without reaching the "
                      f"raw topic until they are republished; {LOST_SLOT_RUNBOOK}")
        return
    if slot.wal_status == "lost":
        yield Problem("critical", "wal", f"{where} wal_status lost: Postgres removed WAL it "
                      "still needed, so the rows committed in it stay in the outbox without "
                      f"reaching the raw topic until they are republished; {LOST_SLOT_RUNBOOK}")
    elif slot.wal_status == "unreserved":
        yield Problem("critical", "wal", f"{where} wal_status unreserved: the next checkpoint "
                      "removes WAL it needs; resume or fix the connector now, or raise "
                      "max_slot_wal_keep_size")
    if slot.active is False and running is not None:
        yield _inactive_while_running(slot, running, checked_at, settings)
    elif slot.active is False:
        yield Problem(settings.slot_inactive, "wal", f"{where} inactive: nobody streams from "
                      f"it and it retains {size(slot.retained_wal_bytes or 0)} of WAL; check "
                      "the connector and its task (`cdc-router connectors status`)")
    retained = slot.retained_wal_bytes
    if retained is None or slot.wal_status == "lost":
        return
    over = _retained_over(retained, limit, settings)
    if over is not None:
        fix = "make the connector catch up" + (
            " (is it running? is the heartbeat on?)" if limit is not None and limit >= 0
            else ", and set max_slot_wal_keep_size")
        yield Problem(over[0], "wal", f"{where} retains {over[1]}; {fix}")
