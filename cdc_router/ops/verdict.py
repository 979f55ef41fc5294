"""The verdict on a Report: each problem one line (what, the value, what to do) and an exit code.

Pure: a Report and the thresholds in, problems out; `--watch` and `--serve` pass the previous
tick's Report so that growing dead letters are seen. Exit codes for cron jobs and probes:
0 all well, 1 a warning, 2 a critical problem.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from typing import Literal

from psycopg import sql

from cdc_router.config.status import StatusSettings
from cdc_router.connect.spec import QUOTED_TABLE, quoted_table_fix
from cdc_router.ops.connector_failure import LOST_SLOT_RUNBOOK, failed_fix, init_publication
from cdc_router.ops.database import quoted_table
from cdc_router.ops.problem import Problem, reached
from cdc_router.ops.problem import size as size  # its old home: re-exported
from cdc_router.ops.report import (
    ConnectorState,
    OutboxState,
    PublicationState,
    Report,
    sections,
)
from cdc_router.ops.verdict_jetstream import jetstream_problems
from cdc_router.ops.verdict_router import router_problems
from cdc_router.ops.verdict_wal import wal_problems
from cdc_router.outbox.existing import publication_fix
from cdc_router.postgres import unquoted

EXIT_CODES = {"ok": 0, "warning": 1, "critical": 2}
# `status` could not check at all (its config or arguments are wrong): as Nagios's UNKNOWN, apart
# from the verdicts, so that a probe never reads a broken check as a mere warning.
EXIT_UNKNOWN = 3
_NAMES_SHOWN = 10  # of the connectors Connect has, when the one asked for is not among them


def verdict(problems: list[Problem]) -> Literal["ok", "warning", "critical"]:
    if any(problem.level == "critical" for problem in problems):
        return "critical"
    return "warning" if problems else "ok"


def judge(report: Report, settings: StatusSettings,
          previous: Report | None = None) -> list[Problem]:
    """Every problem of `report`, critical ones first."""
    found = [*_unreachable(report), *wal_problems(report, settings), *_publication(report),
             *_reader(report),
             *_outbox(report, settings), *_connector(report),
             *router_problems(report.router, settings), *_dead_letters(report, settings, previous),
             *jetstream_problems(report.jetstream, settings),
             *(Problem("critical", "registry", line)
               for line in (report.registry.lacking if report.registry else ()))]
    return sorted(found, key=lambda problem: problem.level != "critical")


def _unreachable(report: Report) -> Iterator[Problem]:
    """One line per unreachable part, naming every section it left unchecked."""
    found: dict[str, list[str]] = {}
    for name, section in sections(report):
        if section.error is not None:
            found.setdefault(section.error, []).append(name)
    for error, names in found.items():
        yield Problem("critical", ", ".join(names), f"cannot check it: {error}")


def _publication(report: Report) -> Iterator[Problem]:
    publication = report.publication
    if publication.error is not None or publication.name is None:
        return
    if not publication.exists:
        # QA 58-b F-2: re-created alone, it did not serve the slot: pgoutput decodes the WAL
        # with the catalog of each change's time, and fails on any change (of any table)
        # written while the publication was missing (Postgres 15, checked by hand).
        # QA 58-d F-1: without --table, init made it FOR public.outbox, not this outbox.
        yield Problem("critical", "publication", f"publication {publication.name} does not "
                      "exist: the connector cannot stream; run "
                      f"{init_publication(publication.name, report.outbox.table)}, then follow "
                      f"{LOST_SLOT_RUNBOOK} from its step 2: created again, it does not "
                      "serve the slot past a change written while it was missing (Postgres "
                      "decodes the slot's WAL with the catalog as of each change)")
        return
    published = {unquoted(table) for table in publication.tables}
    for outbox in outbox_tables(report):
        if outbox.table is None or outbox.error is not None or \
                unquoted(outbox.table) in published:
            continue
        fix = publication_fix(publication.name, outbox.table, partitioned=bool(
            outbox.partitioned) and not publication.via_root)
        yield Problem("critical", "publication", f"{fix} (it publishes: "
                      f"{', '.join(publication.tables) or 'nothing'})")
    if "update" in publication.operations:
        # QA 31-a: Debezium sends a changed primary key as an insert of the new key (op c,
        # marked only by a header the router does not read per record: 3 us an event).
        yield Problem("warning", "publication", f"publication {publication.name} publishes "
                      "updates: an UPDATE of an outbox row's id reaches the router as an "
                      "insert of the new id and is delivered again; publish inserts only: "
                      f"ALTER PUBLICATION {sql.Identifier(publication.name).as_string(None)} "
                      "SET (publish = 'insert')")
    if publication.row_filter_problem is not None:  # review 50-d F13: rows lost for good
        yield Problem("critical", "publication", publication.row_filter_problem)
    if publication.column_list_problem is not None:
        yield Problem("warning", "publication", publication.column_list_problem)
    yield from _signal_table(publication)


def _signal_table(publication: PublicationState) -> Iterator[Problem]:
    """Left out at stop 32 (QA 32-e): an execute-snapshot row in a signal table the
    publication leaves out is ignored without a line, and a Kafka-channel signal waits for
    ever on the markers it writes there."""
    signals = publication.signal_table
    if not signals or unquoted(signals) in {unquoted(t) for t in publication.tables}:
        return
    pub, table = sql.Identifier(publication.name or "").as_string(None), quoted_table(signals)
    add = f"`ALTER PUBLICATION {pub} ADD TABLE {table}`"
    if publication.signal_table_exists is False:
        where, fix = "does not exist", (f"create it (`CREATE TABLE {table} (id varchar(42) "
                                        "PRIMARY KEY, type varchar(32) NOT NULL, data "
                                        f"varchar(2048))`), then {add} (unless it publishes "
                                        "all tables)")
    else:
        where, fix = f"is not in publication {publication.name}", f"run {add}"
    yield Problem("warning", "publication", f"the connector's signal table {signals} "
                  f"(signal.data.collection) {where}: Debezium never sees a signal written "
                  f"there; {fix}, grant the connector's role INSERT on it, and restart the "
                  "connector's task (connectors/README.md, signals)")


def outbox_tables(report: Report) -> list[OutboxState]:
    """The outbox, then the other tables the connector captures (QA 55-a F-4)."""
    return [report.outbox, *report.outbox.others]


def _reader(report: Report) -> Iterator[Problem]:
    for outbox in outbox_tables(report):
        if outbox.error is not None or outbox.reader_may_select is not False:
            continue
        # QA, session 29: the snapshot failed on `permission denied` and Connect retried it
        # for ever, both states RUNNING; the cause was only in Connect's log.
        role = outbox.reader or ""
        # lw66: `outbox init --replication-role R` alone inits the default public.outbox and
        # publication, and grants nothing on a table of another name.
        publication = report.publication.name
        init = f"cdc-router outbox init --table {shlex.quote(outbox.table or '')}" + (
            f" --publication {shlex.quote(publication)}" if publication else "") + "".join(
            f" --column {shlex.quote(flag)}" for flag in outbox.column_flags)
        yield Problem("critical", "outbox", f"the connector's role {role} may not SELECT "
                      f"{outbox.table}: Debezium's snapshot fails (its task restarts and shows "
                      f"RUNNING); run `{init} --replication-role {shlex.quote(role)}`, or "
                      f"`GRANT SELECT ON {outbox.table} TO "
                      f"{sql.Identifier(role).as_string(None)}`")


# Why another captured table's rows stay (QA 55-a F-4), for its backlog's warnings.
_NOT_CLEANED = ("the router's cleanup deletes from cleanup.table alone, not from this other "
                "table the connector captures: delete its delivered rows yourself, or give it "
                "a pipeline of its own")
_BEHIND = "check the router's lag and `cdc-router dlq list`"


def _outbox(report: Report, settings: StatusSettings) -> Iterator[Problem]:
    for outbox in outbox_tables(report):
        if outbox.error is not None:
            if outbox is not report.outbox:  # the outbox's own error is _unreachable's line
                yield Problem("warning", "outbox", f"{outbox.table}, another table the "
                              f"connector captures, cannot be checked: {outbox.error}")
            continue
        uncleaned = outbox.is_cleanup_table is False
        age, limit = outbox.oldest_age_s, settings.outbox_age_warning_s
        if age is not None and limit is not None and age >= limit:
            yield Problem("warning", "outbox", f"{outbox.table}'s oldest row is {age:.0f}s "
                          f"old (warning at {limit:g}s): " + (
                              f"{_NOT_CLEANED} (a row not delivered yet: {_BEHIND})"
                              if uncleaned else "with cleanup on, the router is behind or a "
                              f"row is dead-lettered; {_BEHIND}"))
        rows, most = outbox.rows, settings.outbox_rows_warning
        if rows is not None and most is not None and rows >= most:
            yield Problem("warning", "outbox", f"{outbox.table} holds {rows} rows (warning at "
                          f"{most}): " + (_NOT_CLEANED if uncleaned else "check the cleanup "
                                          "(cleanup.mode) and the router's lag"))


def _connector(report: Report) -> Iterator[Problem]:
    connector, wal = report.connector, report.wal
    if connector.error is not None or connector.name is None:
        return
    name = f"connector {connector.name}"
    if not connector.exists:
        # QA 58-b F-3: a worker still reading connect-offsets behind a hanging transaction
        # lists no connector; the connector came back by itself once it was aborted.
        starting = "" if connector.deployed != () else (
            "a worker that has not finished starting lists none: if Connect's log stops at "
            "`Starting KafkaBasedLog with topic connect-offsets`, a hanging transaction holds "
            "it (README, Operations: the row 'nothing captured after a broker was killed'): "
            "abort it and the connector comes back by itself; else ")
        yield Problem("critical", "connector", f"{name} is not deployed: Kafka Connect has no "
                      f"connector of that name{deployed_text(connector)}, so nothing captures "
                      f"the outbox and its slot and publication are not checked; {starting}set "
                      "status.connector (or --connector) to the one capturing it, or "
                      "`cdc-router connectors apply -f <file>`")
        return
    if connector.state == "FAILED" or any(task.state == "FAILED" for task in connector.tasks):
        failure = connector.failure or next(
            (f"task {t.id}: {t.failure}" for t in connector.tasks if t.state == "FAILED"), "")
        # The capture's own slot, when status read the connector's config (slot.name).
        slots = [slot.exists for slot in wal.slots] if report.publication.name else []
        yield Problem("critical", "connector", f"{name} FAILED: {failure}; " + failed_fix(
            failure, connector.name, publication=report.publication.name,
            table=report.outbox.table, slot_exists=slots[0] if len(slots) == 1 else None))
    elif connector.state in ("PAUSED", "STOPPED"):
        gone = [slot.name for slot in wal.slots if not slot.exists]
        if gone:
            # Review 49-b F6: "its slot retains WAL" beside the wal line saying it is gone
            # (the runbook's step 2 drops it); a resume alone streams from offsets whose WAL
            # is gone.
            yield Problem("warning", "connector", f"{name} is {connector.state}: no event is "
                          f"captured, and its slot {gone[0]} does not exist (see the wal "
                          f"line); follow {LOST_SLOT_RUNBOOK} from its step 3: `cdc-router "
                          f"connectors reset-offsets {connector.name}` (while STOPPED), "
                          f"then `cdc-router connectors resume {connector.name}`")
        else:
            # Only `resume` starts either: a restart of a STOPPED connector leaves it STOPPED
            # (QA 36-c; the slot runbook's step 2 leaves it so).
            yield Problem("warning", "connector", f"{name} is {connector.state}: no event is "
                          "captured and its slot retains WAL; "
                          f"`cdc-router connectors resume {connector.name}`")
    elif connector.state == "RUNNING" and not connector.tasks:
        yield Problem("warning", "connector", f"{name} is RUNNING with no task: no event is "
                      "captured; a lost slot does this (see the wal line and "
                      f"{LOST_SLOT_RUNBOOK}), else check Connect's log and "
                      f"`cdc-router connectors restart {connector.name} --tasks all`")
    elif connector.state != "RUNNING" or any(task.state != "RUNNING" for task in connector.tasks):
        tasks = ", ".join(f"task {t.id} {t.state}" for t in connector.tasks) or "no tasks"
        yield Problem("warning", "connector", f"{name} is {connector.state} ({tasks}): "
                      "events are not captured; check Connect's log, then `cdc-router "
                      f"connectors restart {connector.name} --tasks all`")
    for entry in connector.quoted_tables:  # QA 53-h F3: RUNNING, its table never checked
        yield Problem("critical", "connector", f"{name}: the table.include.list entry {entry} "
                      f"{QUOTED_TABLE}; {quoted_table_fix(entry)}, then `cdc-router connectors "
                      "apply` it")
    if connector.raw_topic_read is False:
        topic = connector.raw_topic
        yield Problem("warning", "connector", f"{name} writes the outbox's change events to "
                      f"{topic}, which source.topics neither names nor matches: the router "
                      "reads none of them and events stop flowing (a changed topic.prefix "
                      f"moves the raw topic); add {topic} to source.topics and restart the "
                      "router, or set the connector's topic.prefix back")
    for topic in connector.unread_topics:
        yield Problem("warning", "connector", f"{name} writes the change events of one of its "
                      f"tables to {topic}, which source.topics neither names nor matches: "
                      "unless another pipeline's router reads it, that table's events are "
                      f"never delivered; add {topic} to source.topics and restart the router, "
                      "or take the table out of the connector's table.include.list (another "
                      "pipeline's on purpose: name it in status.read_elsewhere)")


def deployed_text(connector: ConnectorState) -> str:
    """' (it has: a, b)' or ' (it has none)' when Connect said which connectors it has."""
    names = connector.deployed
    if names is None:
        return ""
    if not names:
        return " (it has none)"
    more = f", and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
    return f" (it has: {', '.join(names[:_NAMES_SHOWN])}{more})"


def _dead_letters(report: Report, settings: StatusSettings,
                  previous: Report | None) -> Iterator[Problem]:
    letters = report.dead_letters
    if letters.error is not None or letters.count is None:
        return
    newest = letters.newest
    why = f"; newest: stage {newest.stage}, {newest.reason}" if newest is not None else ""
    todo = ("see `cdc-router dlq list`, fix the rules or the producer of those rows; "
            "`cdc-router dlq replay --dry-run` counts those not delivered since")
    ours = " of this pipeline" if letters.others else ""  # a topic shared (QA 35-c)
    # Those not delivered since (QA 52-b M1: a replayed letter counted until its retention);
    # not known (the replay group unreadable): every letter on the topic.
    pending = letters.count if letters.undelivered is None else letters.undelivered
    what = "dead letters" if letters.undelivered is None else "dead letters not delivered"
    held = "" if pending == letters.count else f" ({letters.count} on the topic, " \
        f"{letters.count - pending} delivered by `dlq replay` since)"
    over = reached(pending, settings.dead_letters_critical, settings.dead_letters_warning)
    if over is not None:
        yield Problem(over[0], "dead_letters", f"{pending} {what}{ours} on {letters.topic}"
                      f"{held} ({over[0]} at {over[1]:g}){why}; {todo}")
        return
    before = previous.dead_letters.count if previous is not None else None
    if before is not None and letters.count > before:
        new = letters.count - before
        yield Problem("warning", "dead_letters", f"{new} new dead letter{'s' if new > 1 else ''}"
                      f"{ours} on {letters.topic} since the last check{why}; {todo}")
