"""The side-by-side benchmark as a PNG: throughput per path beside latency percentiles."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI

import matplotlib.pyplot as plt
from matplotlib import ticker

from tests.bench.report import Results


def draw(results: Results, path: Path) -> None:
    """Bars of rows/s (with Debezium's raw ingest as a line) and of p50/p95/p99 per path."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, 6))
    names = [item.path for item in results.throughput]
    left.barh(names, [item.rate for item in results.throughput], color="#4c72b0")
    if results.raw_rate:
        left.axvline(results.raw_rate, color="#c44e52", linestyle="--",
                     label=f"Debezium raw ingest {results.raw_rate:,.0f} rows/s")
        left.legend(loc="lower right")
    left.invert_yaxis()
    left.set_xlabel("rows/s (bulk)")
    left.set_title(f"Throughput, {results.setup.get('rows', '?'):,} rows")
    for index, item in enumerate(results.throughput):
        left.annotate(f"{item.rate:,.0f}", (item.rate, index), xytext=(3, 0),
                      textcoords="offset points", va="center", fontsize=8)

    paths = [item.path for item in results.latency]
    height = 0.27
    for offset, (q, color) in enumerate(((50, "#55a868"), (95, "#dd8452"), (99, "#c44e52"))):
        values = [item.percentile(q) or 0.0 for item in results.latency]
        right.barh([index + (offset - 1) * height for index in range(len(paths))], values,
                   height=height, color=color, label=f"p{q}")
    right.set_yticks(range(len(paths)), paths)
    right.invert_yaxis()
    right.set_xscale("log")
    # Plain numbers at 10, 20, 50, 100, ... ms; matplotlib's own minor labels (2x10^1, ...)
    # overlap each other.
    right.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    right.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    right.xaxis.set_minor_formatter(ticker.NullFormatter())
    right.set_xlabel("commit to visible (ms, log scale)")
    right.set_title(f"Latency at {results.setup.get('rate', '?')} rows/s, "
                    f"{results.setup.get('latency_seconds', '?')} s")
    right.legend(loc="lower right")
    figure.suptitle(f"cdc-router side by side ({results.setup.get('machine', '')})", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
