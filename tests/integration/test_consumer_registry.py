"""The idempotent consumer decoding the router's Avro wire format while the schema registry goes
down and comes back: nothing is acknowledged or dead-lettered during the outage, every event
takes effect once it is back, and an id the registry does not know is dead-lettered. The
registry is a real one of the test's own (Apicurio, as the local stack runs it), stopped and
restarted by its pid; its H2 file keeps the schema across the restart."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from cdc_router.consumer import ConsumedEvent, ConsumerSettings, IdempotentConsumer, RetryPolicy
from cdc_router.consumer.dedup import MemoryDedupStore
from cdc_router.serde.avro import CONFLUENT_MAGIC, load_schema
from cdc_router.serde.decode import PayloadDecoder
from tests.integration.registry_server import registry_server
from tests.integration.support import StackEndpoints, read_topic, unique
from tests.integration.test_idempotent_consumer import (
    offsets,
    produce,
    topic_and_dead_letter_topic,
    wait_until,
)

pytestmark = pytest.mark.integration

PAYMENT = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "avro" / \
    "payment_confirmed.avsc"
NOT_COMMITTED = -1001


def wire_format(schema_id: int, payment_id: str) -> bytes:
    schema = load_schema(PAYMENT)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, schema.parsed, {
        "payment_id": payment_id, "order_id": 42, "amount_cents": 1999,
        "lines": [{"sku": "brulee", "quantity": 2}]})
    return CONFLUENT_MAGIC + schema_id.to_bytes(4, "big") + body.getvalue()


@pytest.fixture
def topics(stack: StackEndpoints) -> Iterator[tuple[str, str]]:
    with topic_and_dead_letter_topic(stack.bootstrap_servers, "payments_avro", 1) as pair:
        yield pair


def test_a_registry_outage_is_waited_out_and_an_unknown_id_is_dead_lettered(
        stack: StackEndpoints, topics: tuple[str, str], tmp_path: Path,
        jar_cache: Path) -> None:
    topic, dead_letter = topics
    with registry_server(tmp_path / "registry", jar_cache) as registry:
        client = SchemaRegistryClient({"url": registry.url})
        schema_id = client.register_schema(f"{topic}-value",
                                           Schema(load_schema(PAYMENT).text, "AVRO"))
    # The registry is down from here on, before the consumer has looked up any schema.
    # Its ids are content ids, counted from its start: none this far above ours is taken.
    unknown_id = schema_id + 998
    produce(stack.bootstrap_servers, topic, [
        (b"evt-1", wire_format(schema_id, "pay-1"), 0),
        (b"evt-2", wire_format(schema_id, "pay-2"), 0),
        (b"evt-3", wire_format(unknown_id, "pay-3"), 0)])  # an id nobody registered
    effects: list[ConsumedEvent] = []
    decoder = PayloadDecoder(registry=SchemaRegistryClient({"url": registry.url}))
    settings = ConsumerSettings(
        bootstrap_servers=stack.bootstrap_servers, group_id=unique("fulfillment"),
        topics=(topic,), dead_letter_topic=dead_letter,
        retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.05, max_backoff_s=0.5))
    consumer: IdempotentConsumer[None] = IdempotentConsumer(
        settings, MemoryDedupStore(), lambda event, _: effects.append(event),
        decoder=lambda raw: decoder.decode(raw or b"").value)
    runner = threading.Thread(target=consumer.run)
    runner.start()
    try:
        # More failed lookups than max_attempts: a poison record would be dead by now.
        wait_until(lambda: consumer.stats.retries >= 4, 120, "retries during the outage")
        assert effects == []
        assert consumer.stats.dead_lettered == 0
        assert offsets(stack.bootstrap_servers, settings.group_id, topic, 1)[0] == \
            [NOT_COMMITTED]
        registry.start()  # the same port and H2 file
        wait_until(lambda: offsets(stack.bootstrap_servers, settings.group_id, topic,
                                   1)[0] == [3], 120, "all three records committed")
    finally:
        consumer.stop()
        runner.join(60)
        registry.stop()
    assert [(e.event_id, e.payload["payment_id"]) for e in effects] == [
        ("evt-1", "pay-1"), ("evt-2", "pay-2")]
    [dead] = read_topic(stack.bootstrap_servers, dead_letter, 1)
    headers = {name: value.decode() for name, value in dead.headers()}
    assert (headers["dlq.stage"], headers["dlq.source.offset"]) == ("decode", "2")
    assert f"schema id {unknown_id} is unknown" in headers["dlq.error.message"]
