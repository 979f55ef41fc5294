"""Benchmark: events/s the router sustains draining a pre-filled raw topic, per delivery mode,
beside a plain consume-and-produce loop with no transformation (the ceiling of this hop).

    python -m tests.bench.router_throughput [--events 100000] [--bootstrap 127.0.0.1:19092]

The raw topic is filled with Debezium change events in the exact shape the connector emits
(JsonConverter, schemas disabled; see tests/unit/fixtures/debezium/create_jsonb.noschema.json).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_router.config.load import load_config
from cdc_router.router.loop import OutboxRouter
from cdc_router.router.metrics import RouterMetrics
from cdc_router.router.topics import TopicAdmin

FIXTURE = Path(__file__).resolve().parents[1] / "unit/fixtures/debezium/create_jsonb.noschema.json"


def fill_raw_topic(bootstrap: str, topic: str, events: int) -> None:
    template = json.loads(FIXTURE.read_text())["value"]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "compression.type": "lz4"})
    for i in range(events):
        event_id = str(uuid.uuid4())
        after = {**template["after"], "id": event_id, "aggregateid": f"order-{i % 500}",
                 "payload": json.dumps({"order": i % 500, "seq": i, "total": "12.50"})}
        value = json.dumps({**template, "after": after}).encode()
        while True:
            try:
                producer.produce(topic, key=json.dumps({"id": event_id}).encode(), value=value)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(120)


def committed_total(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        offsets = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        return max(0, offsets[0].offset)
    finally:
        consumer.close()


def run_router(bootstrap: str, raw: str, events: int, guarantee: str, workdir: Path) -> float:
    name = f"bench-{guarantee.replace('_', '-')}-{uuid.uuid4().hex[:6]}"
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
    metrics = RouterMetrics()
    router = OutboxRouter(compiled, instance_id=name, metrics=metrics)
    thread = threading.Thread(target=router.run)
    started = time.monotonic()
    thread.start()
    while committed_total(bootstrap, name, raw) < events:
        time.sleep(0.2)
    elapsed = time.monotonic() - started
    router.stop()
    thread.join()
    return events / elapsed


def run_plain_loop(bootstrap: str, raw: str, events: int) -> float:
    """The ceiling: consume, produce the value unchanged, commit offsets after delivery."""
    name = f"bench-plain-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(f"{name}-out", 4, 1)]).values():
        future.result(timeout=30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": name,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    consumer.subscribe([raw])
    done = 0
    started = time.monotonic()
    while done < events:
        batch = consumer.consume(num_messages=500, timeout=0.5)
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
    elapsed = time.monotonic() - started
    consumer.close()
    return events / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    args = parser.parse_args()
    raw = f"bench-raw-{uuid.uuid4().hex[:6]}"
    print(f"filling {raw} with {args.events} Debezium change events ...", flush=True)
    fill_raw_topic(args.bootstrap, raw, args.events)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as workdir:
        results["plain consume-produce loop (ceiling)"] = run_plain_loop(
            args.bootstrap, raw, args.events)
        for guarantee in ("exactly_once", "at_least_once"):
            results[f"cdc-router {guarantee}"] = run_router(
                args.bootstrap, raw, args.events, guarantee, Path(workdir))
    print(f"\n{'hop':<40} {'events/s':>10}")
    for name, rate in results.items():
        print(f"{name:<40} {rate:>10,.0f}")


if __name__ == "__main__":
    main()
