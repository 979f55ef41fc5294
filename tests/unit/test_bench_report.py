"""The side-by-side benchmark's pure logic: percentiles, ratios, goals, table, JSON, row ids;
and the router's loop over null clients, which --loop-once measures."""

from __future__ import annotations

import json

import pytest

from tests.bench import report
from tests.bench.null_clients import run_loop
from tests.bench.report import Goal, Latency, Memory, Results, Throughput, goals, percentile
from tests.bench.router_throughput import raw_records
from tests.bench.watcher import row_id

ID = "0192f1a4-6b1c-7d2e-8f30-4a5b6c7d8e9f"


def test_percentile_interpolates_between_closest_ranks_as_numpy_does() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([4.0, 1.0, 3.0, 2.0], 0) == 1.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0
    assert percentile([float(value) for value in range(1, 101)], 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0


def test_percentile_of_nothing_is_none_and_outside_0_100_is_refused() -> None:
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match=r"outside 0\.\.100"):
        percentile([1.0], 101)


def test_throughput_rate_and_a_cut_off_path() -> None:
    assert Throughput("p", 1000, 2.0, 1000).rate == 500
    assert Throughput("p", 1000, 2.0, 1000).complete
    assert not Throughput("p", 600, 3.0, 1000).complete
    assert Throughput("p", 0, 0.0, 1000).rate == 0.0


def results(router_p99: float = 400.0, smt_p99: float = 380.0) -> Results:
    throughput = [
        Throughput(report.RAW, 1000, 1.0, 1000),  # 1,000 rows/s
        Throughput(report.RAW_BESIDE_EOS, 1000, 2.0, 1000),  # slower: not the reference
        Throughput(report.ROUTER_EOS, 1000, 1.05, 1000),
        Throughput(report.ALONE_EOS, 1000, 0.25, 1000),  # 4,000 rows/s
        Throughput(report.NAIVE, 300, 2.0, 3000, "500 ms tick"),
    ]
    latency = [Latency(report.ROUTER_EOS, [router_p99] * 100),
               Latency(report.SMT, [smt_p99] * 98, missing=2)]
    return Results({"rows": 1000}, throughput, latency)


def test_ratios_are_over_debezium_fastest_raw_pass() -> None:
    run = results()
    assert run.raw_rate == 1000.0
    assert run.ratio(run.throughput[1]) == 0.5
    assert run.ratio(run.throughput[2]) == pytest.approx(1000 / 1.05 / 1000)
    assert run.ratio(run.throughput[3]) == 4.0


def test_a_faster_raw_pass_beside_a_router_is_the_reference_and_a_cut_off_one_is_not() -> None:
    cold = Throughput(report.RAW, 1000, 2.0, 1000)  # a first pass on a cold JIT: 500 rows/s
    beside = Throughput(report.RAW_BESIDE_ALO, 1000, 0.8, 1000)  # 1,250 rows/s
    cut_off = Throughput(report.RAW_BESIDE_EOS, 900, 0.1, 1000)  # 9,000 rows/s, rows missing
    path = Throughput(report.ROUTER_EOS, 1000, 1.0, 1000)
    run = Results({}, [cold, cut_off, beside, path], [])
    assert run.raw_rate == 1250.0
    assert run.ratio(path) == pytest.approx(0.8)
    assert Results({}, [cut_off, path], []).raw_rate is None


def test_goals_are_checked_on_the_run_numbers() -> None:
    checked = {goal.name: goal for goal in goals(results())}
    path = checked["router path / raw ingest"]
    assert path.met is True and path.value == pytest.approx(0.952, abs=1e-3)
    assert checked["router alone (exactly-once) / raw ingest"].met is True
    gap = checked["router p99 - SMT p99 (ms)"]
    assert gap.value == pytest.approx(20.0) and gap.met is True
    assert checked["router path p99 (ms)"].met is False  # 400 ms is not under 300


def test_a_latency_gap_over_50_ms_misses_its_goal() -> None:
    checked = {goal.name: goal for goal in goals(results(router_p99=500, smt_p99=300))}
    assert checked["router p99 - SMT p99 (ms)"] == Goal("router p99 - SMT p99 (ms)", 200.0,
                                                        "<= 50", False)


def test_goals_without_their_numbers_are_not_applicable() -> None:
    empty = Results({}, [], [])
    assert [goal.met for goal in goals(empty)] == [None, None, None, None, None]
    assert "n/a" in report.render_table(empty)


def test_table_shows_rates_ratios_cut_off_paths_and_unmet_goals() -> None:
    table = report.render_table(results())
    lines = table.splitlines()
    router = next(line for line in lines if line.startswith(report.ROUTER_EOS))
    assert "952" in router and "0.95" in router
    naive = next(line for line in lines if line.startswith(report.NAIVE))
    assert "3,000 expected; 500 ms tick" in naive
    smt = next(line for line in lines if line.startswith(report.SMT))
    assert smt.removeprefix(report.SMT).split()[:2] == ["98", "2"]  # rows seen, rows missing
    goal = next(line for line in lines if line.startswith("router path p99"))
    assert goal.endswith("NO")


def test_json_document_is_serializable_and_carries_ratios_and_goals() -> None:
    document = json.loads(json.dumps(report.to_json(results())))
    assert document["raw_ingest_rows_per_s"] == 1000.0
    router = next(item for item in document["throughput"] if item["path"] == report.ROUTER_EOS)
    assert router["ratio_to_raw_ingest"] == pytest.approx(0.952, abs=1e-3)
    smt = next(item for item in document["latency"] if item["path"] == report.SMT)
    assert smt["p99_ms"] == 380.0 and smt["missing"] == 2
    assert [goal["met"] for goal in document["goals"]] == [True, True, True, False, None]
    assert document["memory"] is None


MEMORY = Memory(ids=1_000_000, baseline_rss_mb=75.0, baseline_hwm_mb=76.0, rss_mb=187.5,
                hwm_mb=190.0, restored=1_000_000, restore_s=1.9)


def test_the_memory_goal_is_the_rss_with_a_million_ids_and_an_id_costs_the_difference() -> None:
    assert MEMORY.bytes_per_id == pytest.approx(112.5 * 1024 * 1024 / 1_000_000)
    run = Results({}, [], [], MEMORY)
    assert goals(run)[-1] == Goal(report.MEMORY_GOAL, 187.5, "<= 250", True)
    over = Results({}, [], [], Memory(1_000_000, 75.0, 76.0, 251.0, 251.0, 1_000_000, 2.0))
    assert goals(over)[-1].met is False
    # Fewer ids restored than the goal names (a shorter run, or a lost record): no verdict.
    short = Results({}, [], [], Memory(1_000_000, 75.0, 76.0, 120.0, 120.0, 999_000, 2.0))
    assert goals(short)[-1].met is None


def test_table_and_json_carry_the_memory_numbers() -> None:
    run = Results({}, [], [], MEMORY)
    table = report.render_table(run)
    restored = next(line for line in table.splitlines() if line.startswith("restored"))
    assert restored.split()[1:] == ["1,000,000", "187.5", "190.0"]
    assert "per id: 118 bytes of RSS" in table
    document = json.loads(json.dumps(report.to_json(run)))
    assert document["memory"]["rss_mb"] == 187.5
    assert document["memory"]["bytes_per_id"] == pytest.approx(117.96, abs=0.01)


@pytest.mark.parametrize("key", [ID.encode(), f'{{"id":"{ID}"}}'.encode(), f'"{ID}"'.encode()])
def test_row_id_is_found_in_every_path_key_shape(key: bytes) -> None:
    assert row_id(key) == ID


def test_a_key_without_a_row_id_has_none() -> None:
    assert row_id(b"order-42") is None
    assert row_id(None) is None


def test_the_loop_over_null_clients_routes_every_event_and_one_changelog_mark() -> None:
    # router_throughput.py's --loop-once counts the instructions of this run: it must go
    # through the whole loop (step, produce, marks, commit), not stop early.
    assert run_loop(raw_records(40)) == 40 + 1
