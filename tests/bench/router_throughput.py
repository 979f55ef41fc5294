"""Benchmark: events/s the router sustains draining a pre-filled raw topic, per delivery mode,
beside a plain consume-and-produce loop with no transformation (the ceiling of this hop).

    python -m tests.bench.router_throughput [--events 100000] [--bootstrap 127.0.0.1:19092]
    python -m tests.bench.router_throughput --profile [--events 50000]

The raw topic is filled with Debezium change events in the exact shape the connector emits
(JsonConverter, schemas disabled; see tests/unit/fixtures/debezium/create_jsonb.noschema.json),
the same ones on every run (seeded ids). Each router rate is also shown as a ratio to the plain
loop's, measured in the same run: on a shared machine only the ratio compares across runs; and
with the CPU time of the router's own thread per event.
`--profile` runs the router (exactly once) under cProfile instead and prints its top functions;
`--step` times the pure per-record step alone (decode, replay check, route, serialize) on the
same events, without a broker: the CPU cost per event, steadier than the rates on a busy machine.
`--step-once N` runs that step once, untimed, over the first N events, for an instruction count
that does not move with the machine's load (the difference of two runs is N2 - N1 events'):

    PY=$(python3 -c 'import sys; print(sys.executable)')  # valgrind a shim, and it counts bash
    export PYTHONHASHSEED=0
    valgrind --tool=callgrind $PY -m tests.bench.router_throughput --events 2500 --step-once 500
    valgrind --tool=callgrind $PY -m tests.bench.router_throughput --events 2500 --step-once 2500

`--loop-once N` is the same through the router's whole loop over clients that do nothing
(tests/bench/null_clients.py): the step plus the router's own bookkeeping, without librdkafka.
Measured after 0000004c6ac2 (issue #14): 164.6k instructions an event for the step, 220.5k for
the loop; before it, at 4148dcb: 181.5k and 238.1k (b387c33, before the header NUL check and
the event id of decode errors: 163.2k for the step).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_router.config.load import load_config
from cdc_router.router.destinations import DestinationMetadata
from cdc_router.router.loop import OutboxRouter
from cdc_router.router.metrics import RouterMetrics
from cdc_router.router.replay import ReplayFilter
from cdc_router.router.step import RecordStep, Routed
from cdc_router.router.timestamps import TopicLimitsCache
from cdc_router.router.topics import TopicAdmin
from tests.bench.bench_stack import delete_groups, delete_topics
from tests.bench.null_clients import run_loop

FIXTURE = Path(__file__).resolve().parents[1] / "unit/fixtures/debezium/create_jsonb.noschema.json"


SEED = 14


def raw_records(events: int) -> list[tuple[bytes, bytes]]:
    """(key, value) of `events` change events; the same ones on every call (seeded ids)."""
    template = json.loads(FIXTURE.read_text())["value"]
    rng = random.Random(SEED)
    records = []
    for i in range(events):
        event_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        after = {**template["after"], "id": event_id, "aggregateid": f"order-{i % 500}",
                 "payload": json.dumps({"order": i % 500, "seq": i, "total": "12.50"})}
        records.append((json.dumps({"id": event_id}).encode(),
                        json.dumps({**template, "after": after}).encode()))
    return records


def fill_raw_topic(bootstrap: str, topic: str, events: int, partitions: int = 1,
                   key_of: Callable[[bytes, bytes], bytes] | None = None) -> None:
    """Create `topic` and fill it with raw_records(events); `key_of(key, value)` picks each
    record's key (default: Debezium's, the row id)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "compression.type": "lz4"})
    for key, value in raw_records(events):
        key = key if key_of is None else key_of(key, value)
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(120)


class CommittedOffsets:
    """The group's committed offset on the raw topic, asked through one reused client."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        self._partition = TopicPartition(topic, 0)

    def total(self) -> int:
        offsets = self._consumer.committed([self._partition], timeout=10)
        return max(0, offsets[0].offset)

    def close(self) -> None:
        self._consumer.close()


def build_router(bootstrap: str, raw: str, guarantee: str, workdir: Path,
                 prefix: str = "bench") -> tuple[str, OutboxRouter]:
    name = f"{prefix}-{guarantee.replace('_', '-')}-{uuid.uuid4().hex[:6]}"
    config_path = workdir / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": bootstrap},
        "source": {"topics": [raw], "group_id": name},
        "routes": [{"topic": f"{name}-orders"}],
        "delivery": {"guarantee": guarantee},
        "dead_letter": {"topic": f"{name}-dlq"},
        "dedup": {"changelog_topic": f"{name}-dedup"},
        "topics": [{"name": f"{name}-orders", "partitions": 4}],
    }))
    compiled = load_config(config_path)
    config = compiled.config
    admin = TopicAdmin(config.kafka.librdkafka())
    admin.apply(admin.plan(config.topic_specs()))
    return name, OutboxRouter(compiled, instance_id=name, metrics=RouterMetrics())


def stop_when_done(router: OutboxRouter, offsets: CommittedOffsets, events: int,
                   running: threading.Thread) -> None:
    """Stop the router once the group committed `events`; give up if its thread died (its
    exception is printed by the thread) instead of waiting forever."""
    while offsets.total() < events:
        if not running.is_alive():
            raise SystemExit(f"the router stopped before committing {events} events")
        time.sleep(0.2)
    router.stop()


def run_router(bootstrap: str, raw: str, events: int, guarantee: str,
               workdir: Path, prefix: str = "bench") -> tuple[float, float]:
    """(events/s, CPU seconds of the router's own thread per event)."""
    name, router = build_router(bootstrap, raw, guarantee, workdir, prefix)
    offsets = CommittedOffsets(bootstrap, name, raw)
    cpu: list[float] = []

    def run() -> None:
        started_cpu = time.thread_time()
        router.run()
        cpu.append(time.thread_time() - started_cpu)

    thread = threading.Thread(target=run)
    started = time.monotonic()
    thread.start()
    stop_when_done(router, offsets, events, thread)
    elapsed = time.monotonic() - started
    thread.join()
    offsets.close()
    return events / elapsed, cpu[0] / events


def profile_router(bootstrap: str, raw: str, events: int, workdir: Path,
                   prefix: str = "bench") -> None:
    """Run the router (exactly once) in this thread under cProfile; print its top functions."""
    name, router = build_router(bootstrap, raw, "exactly_once", workdir, prefix)
    offsets = CommittedOffsets(bootstrap, name, raw)
    watcher = threading.Thread(target=stop_when_done,
                               args=(router, offsets, events, threading.current_thread()),
                               daemon=True)  # a failed run must not leave it waiting
    watcher.start()
    profiler = cProfile.Profile()
    started = time.monotonic()
    profiler.runcall(router.run)
    elapsed = time.monotonic() - started
    watcher.join()
    offsets.close()
    print(f"profiled: {events / elapsed:,.0f} events/s under cProfile")
    stats = pstats.Stats(profiler)
    for order in ("cumulative", "tottime"):
        stats.sort_stats(order).print_stats(25)


def run_plain_loop(bootstrap: str, raw: str, events: int, name: str | None = None) -> float:
    """The ceiling: consume, produce the value unchanged, commit offsets after delivery.

    `name` (group, and `<name>-out` topic) defaults to a new one. The clock starts with the
    first record, so that joining the group does not count.
    """
    name = name or f"bench-plain-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(f"{name}-out", 4, 1)]).values():
        future.result(timeout=30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": name,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    consumer.subscribe([raw])
    done = 0
    started: float | None = None
    while done < events:
        batch = consumer.consume(num_messages=500, timeout=0.5)
        started = started or (time.monotonic() if batch else None)
        for message in batch:
            if message.error():
                continue
            while True:
                try:
                    producer.produce(f"{name}-out", key=message.key(), value=message.value())
                    break
                except BufferError:
                    producer.poll(0.1)
            done += 1
        if batch:
            producer.flush(60)
            consumer.commit(asynchronous=False)
    elapsed = time.monotonic() - (started or 0.0)
    consumer.close()
    return events / elapsed


def step_harness(workdir: Path) -> Callable[[list[tuple[bytes, bytes]]], None]:
    """run(records): the step over `records` as the router builds it, each call afresh: cached
    destination metadata, a replay filter that learns each id, and the destination's timestamp
    limits (Kafka 4's default: one hour ahead)."""
    config_path = workdir / "step.yaml"
    config_path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": "127.0.0.1:1"}, "source": {"topics": ["raw"]},
        "routes": [{"topic": "orders"}], "dead_letter": {"topic": "dlq"}}))
    compiled = load_config(config_path)

    def run(records: list[tuple[bytes, bytes]]) -> None:
        replay = ReplayFilter(window_ms=compiled.config.dedup.window_ms,
                              max_ids=compiled.config.dedup.max_ids)
        limits = TopicLimitsCache(
            lambda topic, timeout_s: {"message.timestamp.after.max.ms": "3600000"})
        step = RecordStep(compiled, DestinationMetadata(lambda topic, timeout_s: 4).partitions,
                          seen=replay.seen, timestamp_limits=limits)
        for key, value in records:
            result = step("raw", key, value)
            if isinstance(result, Routed):
                replay.add_pending(result.record.event_id, 0)

    return run


def time_step(events: int, workdir: Path, repeat: int = 7) -> float:
    """Events/s of RecordStep alone over the bench's events, the best of `repeat` runs."""
    run, records = step_harness(workdir), raw_records(events)
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run(records)
        best = min(best, time.perf_counter() - started)
    return events / best


def remove_run(bootstrap: str, run: str) -> None:
    """Delete the run's topics and consumer groups from the shared cluster."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    delete_topics(admin, [run])
    groups = [group.group_id for group in admin.list_consumer_groups().result().valid
              if group.group_id.startswith(run)]
    delete_groups(admin, groups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--profile", action="store_true",
                        help="profile the router (exactly once) instead of the benchmark")
    parser.add_argument("--step-once", type=int, metavar="N",
                        help="run the step once over the first N of --events events, untimed: "
                             "for `valgrind --tool=callgrind` (see the module doc)")
    parser.add_argument("--loop-once", type=int, metavar="N",
                        help="the same through the router's loop over clients that do nothing "
                             "(tests/bench/null_clients.py): the step plus our bookkeeping")
    parser.add_argument("--step", action="store_true",
                        help="time the per-record step alone, no broker needed")
    args = parser.parse_args()
    if args.step_once is not None:
        records = raw_records(args.events)[:args.step_once]
        with tempfile.TemporaryDirectory() as workdir:
            step_harness(Path(workdir))(records)
        return
    if args.loop_once is not None:
        run_loop(raw_records(args.events)[:args.loop_once])
        return
    if args.step:
        with tempfile.TemporaryDirectory() as workdir:
            rate = time_step(args.events, Path(workdir))
        print(f"step alone: {rate:,.0f} events/s, {1e6 / rate:.1f} us/event")
        return
    run = f"bench-{uuid.uuid4().hex[:6]}"  # every topic and group of this run starts so
    raw = f"{run}-raw"
    try:
        print(f"filling {raw} with {args.events} Debezium change events ...", flush=True)
        fill_raw_topic(args.bootstrap, raw, args.events)
        with tempfile.TemporaryDirectory() as workdir:
            if args.profile:
                profile_router(args.bootstrap, raw, args.events, Path(workdir), run)
                return
            plain = run_plain_loop(args.bootstrap, raw, args.events, f"{run}-plain")
            results: dict[str, tuple[float, float]] = {}
            for guarantee in ("exactly_once", "at_least_once"):
                results[f"cdc-router {guarantee}"] = run_router(
                    args.bootstrap, raw, args.events, guarantee, Path(workdir), run)
    finally:
        remove_run(args.bootstrap, run)
    print(f"\n{'hop':<40} {'events/s':>10} {'/ plain':>8} {'CPU us/event':>13}")
    print(f"{'plain consume-produce loop (ceiling)':<40} {plain:>10,.0f} {1:>8.3f}")
    for name, (rate, cpu) in results.items():
        # CPU: the router's own thread (librdkafka's threads not counted), steadier than rates.
        print(f"{name:<40} {rate:>10,.0f} {rate / plain:>8.3f} {cpu * 1e6:>13.1f}")


if __name__ == "__main__":
    main()
