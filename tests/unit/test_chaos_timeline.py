"""The chaos report's timeline: the data the PNG draws (not the pixels)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos import campaign, faults, report, timeline, verifier


def test_writer_rates_fill_silent_windows_with_zero() -> None:
    # report.throughput keeps only the windows in which a transaction committed.
    buckets = [[0, 193.6], [5, 56.4], [20, 100.0]]
    assert timeline.writer_rates(buckets) == [(0.0, 193.6), (5.0, 56.4), (10.0, 0.0),
                                              (15.0, 0.0), (20.0, 100.0)]
    assert timeline.writer_rates([]) == []


def test_router_rates_span_unknown_readings_and_lag_has_a_gap_there() -> None:
    samples = [(5.0, 100, -1001),  # before the group's first commit
               (10.0, 200, 150),
               (15.0, None, None),  # broker down
               (20.0, None, 250),  # committed known, end not
               (25.0, 400, 400)]
    rates, lag = timeline.router_rates(samples)
    assert rates == [(20.0, 10.0), (25.0, 30.0)]
    assert lag == [(10.0, 50), (15.0, None), (25.0, 0)]  # one gap while unknown


def test_fault_marks_run_from_injection_to_recovery_or_to_the_end() -> None:
    faults = [{"kind": "kafka_kill", "started_s": 32.8, "recovery_s": 176.7},
              {"kind": "zombie", "started_s": 241.6, "recovery_s": None}]
    marks = timeline.fault_marks(faults, end_s=300.0)
    assert marks == [timeline.FaultMark("kafka_kill", 32.8, 32.8 + 176.7, "1 kafka_kill 177s"),
                     timeline.FaultMark("zombie", 241.6, 300.0, "2 zombie not recovered")]


def test_prepare_reads_a_report_without_router_progress() -> None:
    report = {"throughput_events_per_s": [[0, 10.0]], "elapsed_s": 12.0,
              "faults": [{"kind": "router_kill", "started_s": 3.0, "recovery_s": 2.0}]}
    data = timeline.prepare(report)
    assert (data.writers, data.router, data.lag, data.end_s) == ([(0.0, 10.0)], [], [], 12.0)
    assert [mark.end_s for mark in data.faults] == [5.0]


def test_from_report_draws_the_png_next_to_the_report(tmp_path: Path) -> None:
    verdict = verifier.Verdict(ledger_events=10, expected_deliveries=10, delivered=10)
    built = report.build(header={"run": "r", "profile": "short", "seed": 1, "elapsed_s": 30.0},
                         faults=[faults.FaultRecord("router_kill", 3.0, 2.0)], verdict=verdict,
                         duplicates_dropped=0, write_errors=0, timeline=[(0.0, 2.0)],
                         router_progress=[(5.0, 10, 4), (10.0, 10, 10)])
    report.save(built, tmp_path / "run.json")
    with pytest.raises(SystemExit) as exited:
        campaign.main(["--from-report", str(tmp_path / "run.json")])
    assert exited.value.code == 0
    assert (tmp_path / "run.png").read_bytes().startswith(b"\x89PNG")

