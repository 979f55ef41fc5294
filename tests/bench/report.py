"""The side-by-side benchmark's results: percentiles, ratios to Debezium's raw ingest, the router's
memory, the issue's goals, the printed table and the JSON document. Pure functions over plain
values, no I/O.

Ratios, not rates, compare across runs: every rate is divided by Debezium's raw ingest rate
measured in the same run, on the same busy machine: the fastest of its raw passes (raw_rate).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

RAW = "debezium raw ingest"
RAW_BESIDE_EOS = "debezium raw, EOS router on"
RAW_BESIDE_ALO = "debezium raw, ALO router on"
_RAW_PASSES = (RAW, RAW_BESIDE_EOS, RAW_BESIDE_ALO)
ROUTER_EOS = "router path, exactly-once"
ROUTER_ALO = "router path, at-least-once"
ALONE_EOS = "router alone, exactly-once"
ALONE_ALO = "router alone, at-least-once"
PLAIN = "plain consume-produce hop"
SMT = "EventRouter SMT"
RELAY = "cdc-router relay"
NAIVE = "naive polling relay"
TUNED = "tuned poller"
MIB = 1024 * 1024


@dataclass(frozen=True)
class Throughput:
    """One path's bulk run: `rows` seen on its output between the first and the last one."""

    path: str
    rows: int
    seconds: float
    expected: int  # rows the path was given; fewer: lost, or not there by the time limit
    note: str = ""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def complete(self) -> bool:
        return self.rows >= self.expected


@dataclass(frozen=True)
class Latency:
    """One path's commit-to-visible latencies in ms; `missing` rows never became visible."""

    path: str
    samples_ms: Sequence[float]
    missing: int = 0

    def percentile(self, q: float) -> float | None:
        return percentile(self.samples_ms, q)


@dataclass(frozen=True)
class Memory:
    """A router's resident memory in MiB (tests/bench/replay_memory.py): with an empty dedup
    changelog, and with `ids` ids in it, restored when it got its partitions."""

    ids: int
    baseline_rss_mb: float
    baseline_hwm_mb: float  # VmHWM: the peak, start-up (and restore) included
    rss_mb: float
    hwm_mb: float
    restored: int  # ids the router says it restored (its event=assigned line)
    restore_s: float  # the router's own timing of the restore

    @property
    def bytes_per_id(self) -> float:
        return (self.rss_mb - self.baseline_rss_mb) * MIB / self.restored if self.restored else 0.0


MEMORY_GOAL_IDS = 1_000_000
MEMORY_GOAL = f"router RSS with {MEMORY_GOAL_IDS:,} dedup ids (MB)"


@dataclass(frozen=True)
class Goal:
    """One of issue 14's goals, checked on this run's numbers."""

    name: str
    value: float | None
    target: str
    met: bool | None  # None: the run lacks a number it needs


@dataclass(frozen=True)
class Results:
    """Everything one run measured, and the setup it ran on."""

    setup: Mapping[str, Any]
    throughput: Sequence[Throughput]  # with Debezium's raw passes: the paths in _RAW_PASSES
    latency: Sequence[Latency]
    memory: Memory | None = None

    @property
    def raw_rate(self) -> float | None:
        """Debezium's raw ingest rate, what other rates are over: the fastest of its complete
        raw passes. Each pass is a lower bound of what Debezium does: a JIT still warming up
        (the first pass once ran at 6.8k rows/s, the next ones at 9.5k and 12.0k) or a router
        sharing the two cores only slows it, so the fastest is the fair reference."""
        rates = [item.rate for item in self.throughput
                 if item.path in _RAW_PASSES and item.complete]
        return max(rates) if rates else None

    def ratio(self, item: Throughput) -> float | None:
        """The path's rate over Debezium's raw ingest rate (raw_rate)."""
        raw = self.raw_rate
        return item.rate / raw if raw else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks, as numpy's
    default; None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _find(items: Sequence[Any], path: str) -> Any:
    return next((item for item in items if item.path == path), None)


def goals(results: Results) -> list[Goal]:
    """Issue 14's goals, each on numbers from this one run."""
    checked = []
    path = _find(results.throughput, ROUTER_EOS)
    ratio = results.ratio(path) if path else None
    checked.append(Goal("router path / raw ingest", ratio, ">= 0.95",
                        None if ratio is None else ratio >= 0.95))
    alone = _find(results.throughput, ALONE_EOS)
    ratio = results.ratio(alone) if alone else None
    checked.append(Goal("router alone (exactly-once) / raw ingest", ratio, ">= 2.0",
                        None if ratio is None else ratio >= 2.0))
    router, smt = _find(results.latency, ROUTER_EOS), _find(results.latency, SMT)
    router_p99 = router.percentile(99) if router else None
    smt_p99 = smt.percentile(99) if smt else None
    gap = router_p99 - smt_p99 if router_p99 is not None and smt_p99 is not None else None
    checked.append(Goal("router p99 - SMT p99 (ms)", gap, "<= 50",
                        None if gap is None else gap <= 50))
    checked.append(Goal("router path p99 (ms)", router_p99, "< 300",
                        None if router_p99 is None else router_p99 < 300))
    memory = results.memory
    rss = memory.rss_mb if memory is not None and memory.restored >= MEMORY_GOAL_IDS else None
    checked.append(Goal(MEMORY_GOAL, rss, "<= 250", None if rss is None else rss <= 250))
    return checked


def _number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render_table(results: Results) -> str:
    """The results as the plain-text tables the benchmark prints and README shows."""
    lines = [f"{'throughput (bulk)':<30} {'rows':>8} {'s':>7} {'rows/s':>9} {'/ raw':>6}  note"]
    for item in results.throughput:
        note = item.note if item.complete else f"{item.expected:,} expected; {item.note}"
        lines.append(f"{item.path:<30} {item.rows:>8,} {item.seconds:>7.1f} "
                     f"{item.rate:>9,.0f} {_number(results.ratio(item), 2):>6}  {note}".rstrip())
    lines += ["", f"{'latency (commit to visible)':<30} {'rows':>6} {'miss':>5} {'p50 ms':>7} "
                  f"{'p95 ms':>7} {'p99 ms':>7} {'max ms':>7}"]
    for path in results.latency:
        cells = [_number(path.percentile(q)) for q in (50, 95, 99, 100)]
        lines.append(f"{path.path:<30} {len(path.samples_ms):>6,} {path.missing:>5,} "
                     + " ".join(f"{cell:>7}" for cell in cells))
    if results.memory is not None:
        lines += ["", render_memory(results.memory)]
    lines += ["", f"{'goal (issue 14)':<42} {'value':>8} {'target':>8}  met"]
    for goal in goals(results):
        met = {True: "yes", False: "NO", None: "n/a"}[goal.met]
        lines.append(f"{goal.name:<42} {_number(goal.value, 2):>8} {goal.target:>8}  {met}")
    return "\n".join(lines)


def render_memory(memory: Memory) -> str:
    """The memory numbers as a small table, with the cost of an id."""
    return "\n".join([
        f"{'router memory (dedup window)':<30} {'ids':>9} {'RSS MB':>7} {'peak MB':>8}",
        f"{'empty changelog':<30} {0:>9,} {memory.baseline_rss_mb:>7.1f} "
        f"{memory.baseline_hwm_mb:>8.1f}",
        f"{'restored':<30} {memory.restored:>9,} {memory.rss_mb:>7.1f} {memory.hwm_mb:>8.1f}",
        f"per id: {memory.bytes_per_id:,.0f} bytes of RSS; the restore took "
        f"{memory.restore_s:.1f}s",
    ])


def memory_json(memory: Memory) -> dict[str, Any]:
    return {**asdict(memory), "bytes_per_id": memory.bytes_per_id}


def to_json(results: Results) -> dict[str, Any]:
    """The results as one JSON-ready document (the samples themselves are left out)."""
    return {
        "setup": dict(results.setup),
        "raw_ingest_rows_per_s": results.raw_rate,
        "throughput": [{**asdict(item), "rows_per_s": item.rate, "complete": item.complete,
                        "ratio_to_raw_ingest": results.ratio(item)}
                       for item in results.throughput],
        "latency": [{"path": item.path, "rows": len(item.samples_ms), "missing": item.missing,
                     **{f"p{q}_ms": item.percentile(q) for q in (50, 95, 99)},
                     "max_ms": item.percentile(100)} for item in results.latency],
        "memory": memory_json(results.memory) if results.memory is not None else None,
        "goals": [asdict(goal) for goal in goals(results)],
    }
