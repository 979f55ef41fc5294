"""Benchmark: one router instance against two, on a raw topic of two partitions.

    python -m tests.bench.scale_out [--events 100000] [--partitions 2]

The raw topic is filled with the same Debezium change events as tests/bench/router_throughput.py,
keyed by aggregate id as Debezium writes them with `message.key.columns=<table>:aggregateid`
(README, "Scaling out"), so that each aggregate stays in one raw partition. Then, for 1 and for
2 instances (`cdc-router run` processes, exactly once, one new group each time), it times the
drain: events/s between the first and the last record a read_committed reader sees on the
destination. The ratio of the two is the number to read; on a 2-core machine the instances,
librdkafka's threads and the broker share the same two cores.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tests.bench.bench_stack import BenchStack, endpoints_from_env
from tests.bench.router_throughput import fill_raw_topic
from tests.bench.watcher import Watcher


def aggregate_key(_key: bytes, value: bytes) -> bytes:
    """The key Debezium writes with message.key.columns=<table>:aggregateid."""
    return json.dumps({"aggregateid": json.loads(value)["after"]["aggregateid"]}).encode()


def drain(bench: BenchStack, raw: str, events: int, instances: int) -> float:
    """Events/s of `instances` routers of one new group draining `raw`."""
    config, destination = bench.router_config(f"x{instances}", raw, "exactly_once")
    watcher = Watcher(bench.stack.bootstrap_servers, [destination])
    pids = []
    try:
        for index in range(instances):
            pids.append(bench.start_router(config, f"x{instances}-{index}"))
        if not watcher.wait_for(destination, events, timeout_s=600):
            raise RuntimeError(f"{instances} instance(s): only {watcher.count(destination)} "
                               f"of {events} events after 600 s")
    finally:
        watcher.stop()
        for pid in pids:
            bench.stop(pid)
    seen = watcher.seen[destination]
    return seen.count / seen.span()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cdc-router-scale-") as workdir:
        bench = BenchStack(endpoints_from_env(), Path(workdir))
        try:
            raw = f"{bench.dashed}-raw"
            fill_raw_topic(bench.stack.bootstrap_servers, raw, args.events, args.partitions,
                           key_of=aggregate_key)
            rates = {n: drain(bench, raw, args.events, n) for n in (1, 2)}
        finally:
            for problem in bench.close():
                print(f"cleanup: {problem}")
    print(f"\nraw topic: {args.partitions} partitions keyed by aggregate id, "
          f"{args.events:,} events, exactly once")
    for instances, rate in rates.items():
        print(f"{instances} instance(s): {rate:>10,.0f} events/s  {rate / rates[1]:.2f}x")


if __name__ == "__main__":
    main()
