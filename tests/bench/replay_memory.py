"""Benchmark: the router's memory with a full dedup window, in a real `cdc-router run`.

    python -m tests.bench.replay_memory [--ids 1000000] [--json bench-memory.json]

Runs against the stack named by CDC_ROUTER_BOOTSTRAP_SERVERS (and the other variables of
tests/bench/bench_stack.py); every topic and group it creates is named for the run and removed
at the end, also when the run fails.

Two routers are started one after the other on an empty raw topic, each with a changelog of its
own: the first on an empty changelog (the baseline), the second on one filled with `--ids`
delivered ids, which it restores before it logs `event=assigned`. For each, once assigned, the
process's VmRSS (resident now) and VmHWM (the peak, restore included) from /proc/<pid>/status.
The ids are what the router remembers in production: the outbox's uuid ids as Postgres prints
them, plus a few other strings (NON_UUID_SHARE), written as the router writes its marks, one
changelog record per batch of 500 to 1,000 ids with one timestamp.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import Producer

from cdc_router.router.replay import changelog_records
from tests.bench.bench_stack import BenchStack, endpoints_from_env
from tests.bench.report import Memory, memory_json, render_memory

SEED = 14
NON_UUID_SHARE = 0.02  # ids that are not canonical uuids: other key types, other spellings
SETTLE_S = 2.0  # after event=assigned: the restore's garbage is freed, threads are up


def delivered_batches(ids: int, now_ms: int) -> Iterator[tuple[list[str], int]]:
    """`ids` ids in batches of 500 to 1,000, one timestamp each, the newest now; seeded."""
    rng = random.Random(SEED)
    batches = []
    made = 0
    while made < ids:
        size = min(ids - made, rng.randint(500, 1000))
        batch = [_event_id(rng, made + i) for i in range(size)]
        batches.append(batch)
        made += size
    for age, batch in enumerate(reversed(batches)):
        yield batch, now_ms - 100 * (len(batches) - 1 - age)  # one batch per 100 ms


def _event_id(rng: random.Random, seq: int) -> str:
    event_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if rng.random() >= NON_UUID_SHARE:
        return event_id
    return rng.choice([event_id.upper(), f"{{{event_id}}}", f"order-{seq}-paid"])


def fill_changelog(bootstrap: str, topic: str, ids: int) -> None:
    """Write `ids` delivered ids to `topic` the way the router marks them."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "compression.type": "lz4"})
    for batch, delivered_ms in delivered_batches(ids, int(time.time() * 1000)):
        for record in changelog_records(batch, delivered_ms):
            while True:
                try:
                    producer.produce(topic, key=record.key, value=record.value)
                    break
                except BufferError:
                    producer.poll(0.1)
    if producer.flush(120):
        raise RuntimeError(f"the changelog {topic} was not filled: records left unsent")


def process_memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines() if ":" in line)
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def router_memory(bench: BenchStack, raw: str, suffix: str, ids: int) -> tuple[float, float,
                                                                                   int, float]:
    """Start a router whose changelog holds `ids` ids; (rss, hwm, restored, restore s)."""
    config, destination = bench.router_config(suffix, raw, "exactly_once")
    if ids:
        fill_changelog(bench.stack.bootstrap_servers, f"{destination}-dedup", ids)
    pid = bench.start_router(config, suffix)
    time.sleep(SETTLE_S)
    rss, hwm = process_memory(pid)
    line = re.search(r"event=assigned .*restored=(\d+) seconds=([\d.]+)",
                     (bench.workdir / f"{suffix}.log").read_text())
    bench.stop(pid)
    assert line is not None, "the router logged event=assigned without its restore counts"
    return rss, hwm, int(line[1]), float(line[2])


def measure(bench: BenchStack, ids: int) -> Memory:
    """Baseline, then `ids` ids, each in a router process of its own."""
    raw = bench.topic(f"{bench.dashed}-mem-raw")
    base_rss, base_hwm, _, _ = router_memory(bench, raw, "mem-empty", 0)
    rss, hwm, restored, seconds = router_memory(bench, raw, "mem-full", ids)
    return Memory(ids, base_rss, base_hwm, rss, hwm, restored, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=1_000_000, help="ids in the changelog")
    parser.add_argument("--json", type=Path, help="also write the numbers there")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cdc-router-bench-") as workdir:
        bench = BenchStack(endpoints_from_env(), Path(workdir))
        try:
            memory = measure(bench, args.ids)
        finally:
            for problem in bench.close():
                print(f"cleanup: {problem}", file=sys.stderr)
    print(render_memory(memory))
    if args.json:
        args.json.write_text(json.dumps(memory_json(memory), indent=2) + "\n")


if __name__ == "__main__":
    main()
