"""Benchmark: events/s of Avro validation and encoding on their own (no Kafka, no network).

    python -m tests.bench.avro_encoding [--events 100000] [--repeat 3]

Each step runs over the same pre-built OutboxEvents (a PaymentConfirmed payload of about 300
bytes of JSON with a nested array of records, a union and a map; tests/unit/fixtures/avro/),
and the best of --repeat runs is shown:
- json.loads: the floor every JSON payload pays;
- validate: fastavro's validation plus our extra-fields walk, on parsed payloads;
- encode: fastavro's schemaless_writer, on parsed payloads;
- serialize: what the router calls per event (parse, validate, walk, encode, frame), for
  single-object encoding and for the registry's wire format (confluent-kafka's AvroSerializer,
  its subject known, as after the first event of a subject; its mock:// client);
- the JSON serializer, for comparison.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from cdc_router.config.connections import SchemaRegistrySettings
from cdc_router.config.routes import RouteRule
from cdc_router.router.debezium import OutboxEvent
from cdc_router.serde.avro import AvroSerializer, encode
from cdc_router.serde.avro_diagnostics import payload_problem
from cdc_router.serde.avro_schema import load_schema
from cdc_router.serde.json import JsonSerializer

SCHEMA = Path(__file__).resolve().parents[1] / "unit/fixtures/avro/payment_confirmed.avsc"
TOPIC = "payments"


def payload(i: int) -> dict[str, Any]:
    return {"payment_id": f"pay-{i}", "order_id": 100_000 + i, "amount_cents": 1999 + i % 500,
            "currency": "EUR", "note": None if i % 2 else f"crème brûlée #{i}",
            "lines": [{"sku": f"sku-{i % 97}-{n}", "quantity": n + 1} for n in range(i % 4 + 1)],
            "tags": {"channel": "web", "tenant": f"t{i % 9}"}}


def events(count: int) -> list[OutboxEvent]:
    return [OutboxEvent(event_id=f"00000000-0000-0000-0000-{i:012d}", aggregate_type="Payment",
                        aggregate_id=f"pay-{i}", type="PaymentConfirmed",
                        payload=json.dumps(payload(i)).encode(), payload_is_json=True,
                        headers=(), created_at_ms=1_700_000_000_000 + i, op="c", lsn=i, tx_id=i)
            for i in range(count)]


def best_rate(step: Callable[[Any], object], items: Sequence[Any], repeat: int) -> float:
    """Items per second of the fastest of `repeat` runs of `step` over every item."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for item in items:
            step(item)
        best = min(best, time.perf_counter() - started)
    return len(items) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    batch = events(args.events)
    datums = [json.loads(event.payload) for event in batch]
    schema = load_schema(SCHEMA)
    rule = RouteRule.model_validate({"topic": TOPIC, "format": "avro", "schema": str(SCHEMA)})
    single = AvroSerializer([rule])
    client = SchemaRegistryClient.new_client({"url": "mock://bench"})
    client.register_schema(f"{TOPIC}-value", Schema(schema.text, "AVRO"))
    wire = AvroSerializer([rule], SchemaRegistrySettings(url="mock://bench"),
                          registry_client=client)
    wire.serialize(batch[0], rule, TOPIC)  # the one registry lookup, then cached
    as_json = JsonSerializer()
    assert all(payload_problem(datum, schema) is None for datum in datums[:1000])

    steps: list[tuple[str, Callable[[Any], object], Sequence[Any]]] = [
        ("json.loads (floor)", lambda event: json.loads(event.payload), batch),
        ("validate + extra-fields walk", lambda datum: payload_problem(datum, schema), datums),
        ("encode (schemaless_writer)", lambda datum: encode(datum, schema), datums),
        ("serialize, single-object", lambda event: single.serialize(event, rule, TOPIC), batch),
        ("serialize, registry wire format", lambda event: wire.serialize(event, rule, TOPIC),
         batch),
        ("serialize, JSON (comparison)", lambda event: as_json.serialize(event, rule, TOPIC),
         batch),
    ]
    mean_bytes = sum(len(event.payload) for event in batch) / len(batch)
    avro_bytes = sum(len(single.serialize(e, rule, TOPIC)) for e in batch[:1000]) / 1000
    print(f"{args.events} events, JSON payload {mean_bytes:.0f} bytes on average, "
          f"single-object Avro {avro_bytes:.0f} bytes; best of {args.repeat} runs")
    for name, step, items in steps:
        rate = best_rate(step, items, args.repeat)
        print(f"  {name:<34} {rate:>10,.0f} events/s  {1e6 / rate:6.1f} µs/event")


if __name__ == "__main__":
    main()
