"""`status`'s Report and problems for people (text) and scripts (a dict of stable keys)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from cdc_router.cli._output import age_text as _age
from cdc_router.cli._output import table
from cdc_router.ops.problem import Problem
from cdc_router.ops.report import Report
from cdc_router.ops.verdict import EXIT_CODES, deployed_text, outbox_tables, size, verdict


def as_json(report: Report, problems: list[Problem]) -> dict[str, Any]:
    """The JSON document of `status -o json`: verdict first, then the report's sections."""
    status = verdict(problems)
    # A section the report lacks (no JetStream route, no registry) is left out, not null.
    sections = {name: value for name, value in dataclasses.asdict(report).items()
                if value is not None}
    return {"status": status, "exit_code": EXIT_CODES[status],
            "problems": [dataclasses.asdict(problem) for problem in problems], **sections}


def _table(headers: list[str], rows: list[list[object]]) -> list[str]:
    return ["  " + line for line in table(headers, rows).splitlines()]


def as_text(report: Report, problems: list[Problem]) -> str:
    """The report for a terminal: one block per part, then the problems and the verdict."""
    lines = [f"checked at {report.checked_at}"]
    sections: list[Callable[[Report], list[str]]] = [
        _wal, _publication, _outbox, _connector, _router, _dead_letters, _changelog,
        _jetstream, _registry]
    for section in sections:
        lines += section(report)
    lines.append("")
    lines += [f"{problem}" for problem in problems]
    lines.append(f"status: {verdict(problems)}")
    return "\n".join(lines)


def _failed(what: str, error: str | None) -> list[str] | None:
    # Not "UNREACHABLE": a part that answered may refuse a query (QA 54-a F-1), as its error says.
    return [f"{what}: NOT CHECKED: {error}"] if error is not None else None


def _wal(report: Report) -> list[str]:
    wal = report.wal
    if (failed := _failed("replication slots", wal.error)) is not None:
        return failed
    limit = wal.max_slot_wal_keep_size_bytes
    lines = [f"replication slots (max_slot_wal_keep_size "
             f"{'unlimited' if limit == -1 else size(limit)}):"]
    rows: list[list[object]] = [
        [s.name, "missing" if not s.exists else "yes" if s.active else "NO",
         s.wal_status or "-", size(s.retained_wal_bytes), size(s.safe_wal_size_bytes),
         size(s.flush_lag_bytes)] for s in wal.slots]
    rows += [[f"{s.name} (not the connector's)", "NO", s.wal_status or "-",
              size(s.retained_wal_bytes), size(s.safe_wal_size_bytes), "-"]
             for s in wal.other_inactive_slots]  # a slot.name change's leftover, say (fixer 63)
    return lines + _table(
        ["slot", "active", "wal_status", "retained WAL", "safe_wal_size", "flush lag"], rows)


def _publication(report: Report) -> list[str]:
    pub = report.publication
    if (failed := _failed("publication", pub.error)) is not None:
        return failed
    if pub.name is None and report.connector.exists is False:
        return [f"publication: not checked (connector {report.connector.name} is not deployed, "
                "and its config names the publication)"]
    if pub.name is None and report.connector.error is not None:
        return ["publication: not checked (the connector's config names it, and Kafka Connect "
                "did not give it: see the connector line)"]
    if pub.name is None:
        return []  # a relay-only config: no publication is read
    if not pub.exists:
        return [f"publication {pub.name}: MISSING"]
    return [f"publication {pub.name} ({', '.join(pub.operations) or 'nothing'}): "
            f"{', '.join(pub.tables) or 'no tables'}"]


def _outbox(report: Report) -> list[str]:
    """A line per table: the outbox, each other table the connector captures (QA 55-a F-4),
    and each include-list entry status cannot check."""
    lines = []
    for outbox in outbox_tables(report):
        failed = _failed(f"outbox {outbox.table or ''}".rstrip(), outbox.error)
        lines += failed or [f"outbox {outbox.table}: {outbox.rows} rows, oldest "
                            f"{_age(outbox.oldest_age_s)}, {size(outbox.size_bytes)} on disk"]
        lines += [f"  {entry}" for entry in outbox.listed_columns]  # a rename's names
    return lines + [f"outbox {entry}: not checked (a regular expression in the connector's "
                    "table.include.list: status checks the tables it names one by one)"
                    for entry in report.outbox.not_checked]


def _connector(report: Report) -> list[str]:
    c = report.connector
    if (failed := _failed(f"connector {c.name}", c.error)) is not None:
        return failed
    if c.name is None:
        return ["connector: none (a relay-only config: `cdc-router relay` reads the table)"]
    if not c.exists:
        return [f"connector {c.name}: NOT DEPLOYED: Kafka Connect has no connector of that "
                f"name{deployed_text(c)}"]
    lines = [f"connector {c.name}: {c.state} on {c.worker_id}"
             + (f": {c.failure}" if c.failure else "")]
    lines += [f"  task {t.id}: {t.state} on {t.worker_id}" + (f": {t.failure}" if t.failure
                                                                else "") for t in c.tasks]
    return lines


def _router(report: Report) -> list[str]:
    r = report.router
    if (failed := _failed(f"router group {r.group}", r.error)) is not None:
        return failed
    if r.lag is None:
        return [f"router group {r.group}: no raw topic (a relay-only config: the relay's "
                "progress is the outbox's rows above, and its /metrics)"]
    lines = [f"router group {r.group} ({r.group_state}): lag {r.lag}, last commit "
             f"{_age(r.last_commit_age_s)}, oldest waiting record {_age(r.oldest_pending_age_s)}"]
    lines += _table(["topic", "partition", "committed", "end", "lag", "last commit"],
                    [[p.topic, p.partition, "-" if p.committed is None else p.committed, p.end,
                      p.lag if p.lag_exact else f"~{p.lag}", _age(p.last_commit_age_s)]
                     for p in r.partitions])
    lines.append(f"router instances: {len(r.members)}")
    lines += [f"  {m.instance_id or m.client_id} on {m.host}: {', '.join(m.partitions) or '-'}"
              for m in r.members]
    return lines


def _dead_letters(report: Report) -> list[str]:
    d = report.dead_letters
    if (failed := _failed(f"dead letters {d.topic}", d.error)) is not None:
        return failed
    count = f"{d.count}" if d.count_exact else f"at least {d.count}"
    line = f"dead letters on {d.topic}: {count}"
    if d.others:
        line += f" of this pipeline ({d.others} of other pipelines: `dlq list --all`)"
    replayed = d.undelivered is not None and d.count is not None and d.undelivered < d.count
    if replayed:  # QA 52-m F2: the count not delivered is said, not left to a subtraction
        line += (f", {d.undelivered} not delivered ({(d.count or 0) - (d.undelivered or 0)} "
                 "delivered by `dlq replay` since)")
    if d.newest is not None and not (replayed and d.undelivered == 0):
        n = d.newest
        line += (f"; newest {_age(n.age_s)} (offset {n.partition}:{n.offset}): stage {n.stage}, "
                 f"{n.error}: {(n.reason or '')[:160]}")
    return [line]


def _changelog(report: Report) -> list[str]:
    c = report.dedup_changelog
    if not c.enabled:
        return ["dedup changelog: disabled (dedup.enabled false)"]
    if (failed := _failed(f"dedup changelog {c.topic}", c.error)) is not None:
        return failed
    line = (f"dedup changelog {c.topic}: {c.retained_offsets} offsets retained in "
            f"{c.partitions} partition{'' if c.partitions == 1 else 's'}")
    if c.other_groups:  # QA 63-b L-2: the count is theirs too
        line += (f", every pipeline's: shared with group{'s' * (len(c.other_groups) > 1)} "
                 f"{', '.join(c.other_groups)} (among its newest marks; each pipeline reads "
                 "only its own group's)")
    return [line]


def _jetstream(report: Report) -> list[str]:
    j = report.jetstream
    if j is None:
        return []
    if (failed := _failed(f"jetstream {j.url}", j.error)) is not None:
        return failed
    lines = [f"jetstream {j.url}:"]
    return lines + _table(
        ["stream", "subjects", "messages", "bytes", "discard", "differs from the config"],
        [[s.name, ", ".join(s.subjects), _used(s.messages, s.max_msgs, str),
          _used(s.bytes, s.max_bytes, size), s.discard or "-", ", ".join(s.changes) or "-"]
         if s.exists else [s.name, ", ".join(s.subjects), "MISSING", "-", "-", "-"]
         for s in j.streams])


def _registry(report: Report) -> list[str]:
    r = report.registry
    if r is None:
        return []
    what = f"schema registry {r.url}"
    lacking = f", {len(r.lacking)} route subjects lack their schema" if r.lacking else ""
    return _failed(what, r.error) or [f"{what}: answers, {r.subjects} subjects{lacking}"]


def _used(count: int | None, most: int | None, shown: Callable[[int], str]) -> str:
    """'12', or '12 of 1000 (1%)' under a limit."""
    if count is None:
        return "-"
    if most is None or most <= 0:
        return shown(count)
    return f"{shown(count)} of {shown(most)} ({100.0 * count / most:.0f}%)"
