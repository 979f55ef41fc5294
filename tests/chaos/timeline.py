"""The report's PNG timeline: the writers' and the router's throughput, the router's lag, and
each fault as a band from its injection to its recovery.

The data preparation is pure (and unit-tested); `draw` only hands it to matplotlib.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The Figure API draws without pyplot's global state or a display backend.
from matplotlib.figure import Figure

BUCKET_S = 5.0  # report.throughput's default window


@dataclass(frozen=True)
class FaultMark:
    kind: str
    start_s: float
    end_s: float  # the recovery; the end of the run when it never recovered
    label: str


@dataclass(frozen=True)
class Timeline:
    writers: list[tuple[float, float]]  # (s, events/s committed in Postgres)
    router: list[tuple[float, float]]  # (s, raw offsets/s the router committed)
    lag: list[tuple[float, int | None]]  # (s, raw end - committed); None: no reading there
    faults: list[FaultMark]
    end_s: float


def writer_rates(buckets: list[list[float]] | list[tuple[float, float]],
                 bucket_s: float = BUCKET_S) -> list[tuple[float, float]]:
    """The writers' buckets with the silent ones as 0: report.throughput only keeps windows
    in which a transaction committed, and a gap is exactly what a fault looks like."""
    known = {round(start / bucket_s): rate for start, rate in buckets}
    if not known:
        return []
    return [(index * bucket_s, known.get(index, 0.0))
            for index in range(min(known), max(known) + 1)]


def router_rates(samples: list[list[Any]] | list[tuple[float, int | None, int | None]]
                 ) -> tuple[list[tuple[float, float]], list[tuple[float, int | None]]]:
    """Offsets/s the router committed between readings, and its lag at each reading.

    A reading is missing while the broker is down (None) or before the group's first commit
    (a negative offset, librdkafka's OFFSET_INVALID). A rate spans two known readings, so the
    offsets committed during an outage show up after it rather than vanish; the lag has a gap
    (None) there instead of a line drawn through readings nobody took.
    """
    rates: list[tuple[float, float]] = []
    lag: list[tuple[float, int | None]] = []
    previous: tuple[float, int] | None = None
    for when, end, committed in samples:
        if committed is None or committed < 0 or end is None:
            if lag and lag[-1][1] is not None:
                lag.append((when, None))
        else:
            lag.append((when, max(0, end - committed)))
        if committed is None or committed < 0:
            continue
        if previous is not None and when > previous[0]:
            rates.append((when, (committed - previous[1]) / (when - previous[0])))
        previous = (when, committed)
    return rates, lag


def fault_marks(faults: list[dict[str, Any]], end_s: float) -> list[FaultMark]:
    marks = []
    for number, fault in enumerate(faults, 1):
        recovery = fault["recovery_s"]
        label = (f"{number} {fault['kind']} " +
                 ("not recovered" if recovery is None else f"{recovery:.0f}s"))
        end = end_s if recovery is None else fault["started_s"] + recovery
        marks.append(FaultMark(fault["kind"], fault["started_s"], end, label))
    return marks


def prepare(report: dict[str, Any]) -> Timeline:
    router, lag = router_rates(report.get("router_progress", []))
    return Timeline(writer_rates(report["throughput_events_per_s"]), router, lag,
                    fault_marks(report["faults"], report["elapsed_s"]), report["elapsed_s"])


def draw(report: dict[str, Any], path: Path) -> None:
    data = prepare(report)
    figure = Figure(figsize=(13, 6.5))
    rates, lags = figure.subplots(2, 1, sharex=True, height_ratios=(3, 1.3))
    rates.step(*_xy(data.writers), where="post", label="writers: events/s committed",
               color="tab:blue")
    if data.router:  # each rate holds for the interval that ends at its reading
        rates.step(*_xy(data.router), where="pre", label="router: raw offsets/s committed",
                   color="tab:orange", alpha=0.8)
    if data.lag:
        lags.plot(*_xy(data.lag), color="tab:red", label="router lag: raw end - committed")
    else:
        lags.text(0.5, 0.5, "no router progress in this report", transform=lags.transAxes,
                  ha="center", va="center", fontsize=8)
    lags.set_ylabel("router lag\n(raw offsets)")
    rates.set_ylabel("per second (5 s windows)")
    lags.set_xlabel("seconds since the campaign's start")
    top = max([rate for _, rate in data.writers + data.router] or [1.0])
    rates.set_ylim(0, top * 1.45)  # room above the curves for the fault labels
    for mark in data.faults:
        for axes in (rates, lags):
            axes.axvspan(mark.start_s, max(mark.end_s, mark.start_s + 1), alpha=0.15,
                         color=_COLOURS.get(mark.kind, "grey"))
            axes.axvline(mark.start_s, color=_COLOURS.get(mark.kind, "grey"), lw=0.8)
        rates.text(mark.start_s + data.end_s / 400, top * 1.42, mark.label, rotation=90,
                   va="top", ha="left", fontsize=7)
    # Below the plots: inside, the legend would hide the fault labels.
    figure.legend(loc="lower center", ncols=3, fontsize=8, frameon=False)
    passed = "PASSED" if report["passed"] else "FAILED"
    rates.set_title(f"chaos {report['run']}: profile {report['profile']}, seed "
                    f"{report['seed']}, {report['verdict']['ledger_events']} events, {passed}"
                    " (bands: fault until recovery)", fontsize=10)
    rates.set_xlim(0, data.end_s)
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)


_COLOURS = {"router_kill": "tab:red", "connect_kill": "tab:purple", "kafka_kill": "tab:brown",
            "postgres_stop": "tab:green", "zombie": "tab:olive", "rebalance_storm": "tab:cyan",
            "replay_phase": "tab:pink"}


def _xy(points: list[tuple[float, float]] | list[tuple[float, int | None]]
        ) -> tuple[list[float], list[float]]:
    """x and y for matplotlib; a None becomes NaN, which it draws as a gap."""
    return ([float(x) for x, _ in points],
            [float("nan") if y is None else float(y) for _, y in points])
