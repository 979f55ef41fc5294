"""The campaign's report: one table on stdout, the same facts (and more) as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.chaos.faults import FaultRecord
from tests.chaos.verifier import Verdict, as_dict


def throughput(timeline: list[tuple[float, int]], start: float,
               bucket_s: float = 5) -> list[tuple[float, float]]:
    """Events committed per second by the writers, per `bucket_s` window since `start`."""
    buckets: dict[int, int] = {}
    previous = 0
    for when, total in timeline:
        index = int((when - start) // bucket_s)
        buckets[index] = buckets.get(index, 0) + total - previous
        previous = total
    return [(index * bucket_s, count / bucket_s) for index, count in sorted(buckets.items())]


def build(*, header: dict[str, Any], faults: list[FaultRecord], verdict: Verdict,
          duplicates_dropped: int, write_errors: int,
          timeline: list[tuple[float, float]],
          router_progress: list[tuple[float, int | None, int | None]]) -> dict[str, Any]:
    return {**header, "passed": verdict.passed and not any(f.findings for f in faults),
            "faults": [asdict(f) for f in faults], "replays_on_raw_topic": verdict.raw_replays,
            "duplicates_dropped_by_router": duplicates_dropped,
            "writer_errors": write_errors, "verdict": as_dict(verdict),
            "throughput_events_per_s": timeline,
            # (s since start, raw topic end offset, router group's committed offset); None
            # while the broker did not answer.
            "router_progress": router_progress}


def render(report: dict[str, Any]) -> str:
    """The table README shows."""
    verdict = report["verdict"]
    rows = [
        ("run", f"{report['run']} (profile {report['profile']}, seed {report['seed']})"),
        ("events committed (ledger)", verdict["ledger_events"]),
        ("  to deliver / poison", f"{verdict['expected_deliveries']} / "
                                  f"{verdict['expected_dead_letters']}"),
        ("delivered (distinct ids)", verdict["delivered"]),
        ("lost", verdict["lost"]),
        ("duplicate ids", verdict["duplicates"]),
        ("wrong key / partition / topic", f"{verdict['wrong_key']} / "
         f"{verdict['wrong_partition']} / {verdict['wrong_topic']}"),
        ("per-aggregate order violations", verdict["order_violations"]),
        ("ids whose marks a hanging abort took",
         f"{verdict.get('marks_aborted', 0)}: delivered twice "
         f"{verdict.get('duplicates_after_abort', 0)}, out of order "
         f"{verdict.get('order_violations_after_abort', 0)} (attributed to the abort, "
         "README; not failures)"),
        ("dead letters (poison rows missing)", f"{verdict['dead_letters']} "
                                               f"({verdict['poison_not_dead_lettered']})"),
        ("dead letters: no reason / wrong stage / good rows",
         f"{verdict['dead_letters_without_reason']} / {verdict['dead_letters_wrong_stage']} / "
         f"{verdict['good_rows_dead_lettered']}"),
        ("replays on the raw topic", report["replays_on_raw_topic"]),
        ("duplicates dropped (router metrics)", report["duplicates_dropped_by_router"]),
        ("leaked outbox rows after drain", verdict["leaked_rows"]),
        ("new topics", ", ".join(verdict["new_topics"]) or "none"),
        ("wall time", f"{report['elapsed_s']:.0f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines += ["", f"{'#':>2}  {'fault':<16} {'at s':>6} {'recovery s':>10}  notes"]
    for number, fault in enumerate(report["faults"], 1):
        recovery = "-" if fault["recovery_s"] is None else f"{fault['recovery_s']:.1f}"
        notes = "; ".join(fault["notes"][:2])
        lines.append(f"{number:>2}  {fault['kind']:<16} {fault['started_s']:>6.0f} "
                     f"{recovery:>10}  {notes[:110]}")
    findings = [f for fault in report["faults"] for f in fault["findings"]]
    failures = {k: v for k, v in verdict["samples"].items() if v}
    lines.append("")
    # In full, as the table cuts the notes: what the campaign did as an operator (README).
    lines += [f"NOTE: after {fault['kind']}, aborted a hanging transaction on {a['topic']}-"
              f"{a['partition']} from offset {a['start_offset']} (producer {a['producer_id']}, "
              f"epoch {a['producer_epoch']}; end offset after the abort {a['end_offset']})"
              for fault in report["faults"] for a in fault.get("hanging_aborts", [])]
    lines += [f"FINDING: {finding}" for finding in findings]
    lines += [f"FAILED {check}: {', '.join(samples)}" for check, samples in failures.items()]
    lines.append("PASSED" if report["passed"] else "FAILED")
    return "\n".join(lines)


def save(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
