"""The demo's last act: run the router, write sample events, show the records it routed."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import Consumer, Message, Producer

from cdc_router.config.compiled import CompiledConfig
from cdc_router.config.model import RouterConfig
from cdc_router.errors import CdcRouterError, DatabaseError
from cdc_router.kafka.consumer import record_headers
from cdc_router.outbox import new_event_id, write_event
from cdc_router.router import clients
from cdc_router.router.debezium import OutboxEvent
from cdc_router.router.dlq_letters import Letter, read_letter
from cdc_router.router.loop import OutboxRouter
from cdc_router.router.routing import Router

Say = Callable[[str], None]
# Debezium needs a moment to see the commit, the router one batch to commit it: seconds.
_ROUTED_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SampleEvent:
    aggregate_type: str
    aggregate_id: str
    type: str
    payload: dict[str, Any]
    headers: dict[str, str]


def sample_events(order_id: str) -> list[SampleEvent]:
    """An order paid, and its payment confirmed (tenant header: the payments route needs it)."""
    return [
        SampleEvent("Order", order_id, "OrderPaid",
                    {"order_id": order_id, "amount": "19.90", "currency": "EUR"},
                    {"traceparent": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"}),
        SampleEvent("Payment", f"pay-{order_id}", "PaymentConfirmed",
                    {"order_id": order_id, "amount": "19.90", "method": "card"},
                    {"tenant": "acme-eu"}),
    ]


def require_outbox(conn: psycopg.Connection[Any]) -> None:
    """DatabaseError naming the database when it has no outbox for the samples (review 50-d
    F9: write_event's UndefinedTable was a traceback)."""
    row = conn.execute("SELECT to_regclass('public.outbox') IS NOT NULL").fetchone()
    if not (row and row[0]):
        info = conn.info
        raise DatabaseError(f"Postgres at {info.host}:{info.port}/{info.dbname} has no outbox "
                            "table public.outbox: run `cdc-router outbox init --dsn ...` "
                            "(`make demo` does it), or pass the --dsn of the database that has it")


def run_demo(compiled: CompiledConfig, dsn: str, say: Say) -> list[Message]:
    """Route two sample events end to end and return their destination records, the order
    paid's then the payment confirmed's (as sample_events lists them). The samples
    are written once the router polls (review 50-d F9: with Kafka down they were committed to
    the outbox, captured whenever a connector was set up, and the router then failed)."""
    samples = {new_event_id(): event for event in sample_events(str(int(time.time()) % 100_000))}
    destinations = sample_destinations(compiled, samples)
    router = OutboxRouter(compiled, instance_id=f"demo-{uuid.uuid4().hex[:6]}")
    thread = _RouterThread(router)
    started = router.last_poll
    thread.start()
    try:
        _wait_for_poll(router, started, thread, compiled.config.kafka.bootstrap_servers)
        with psycopg.connect(dsn) as conn, conn.transaction():
            for event_id, event in samples.items():
                write_event(conn, aggregate_type=event.aggregate_type,
                            aggregate_id=event.aggregate_id, type=event.type,
                            payload=event.payload, headers=event.headers, event_id=event_id)
                say(f"wrote  {event.type:<17} id={event_id} aggregate={event.aggregate_type}"
                    f"/{event.aggregate_id}")
        records = _read_routed(compiled.config, destinations, thread)
    finally:
        router.stop()
        thread.join(timeout=30)
    for record in records:
        headers = ", ".join(f"{name}={_printable(value)}" for name, value in record_headers(record))
        say(f"routed {record.topic()}[{record.partition()}]@{record.offset()}")
        say(f"       key     {_printable(record.key())}")
        say(f"       headers {headers}")
        say(f"       value   {_printable(record.value())}")
    return records


def sample_destinations(compiled: CompiledConfig,
                        samples: dict[str, SampleEvent]) -> dict[str, str]:
    """Each sample's Kafka topic by the config's routes (review 50-d F10: the demo read the
    topics declared under `topics:`, none in a config without them); CdcRouterError, before
    anything is written, for a sample no Kafka route takes."""
    routes, destinations = Router(compiled), {}
    for event_id, sample in samples.items():
        event = OutboxEvent(event_id, sample.aggregate_type, sample.aggregate_id, sample.type,
                            json.dumps(sample.payload).encode(), True,
                            tuple(sample.headers.items()), None, "c", None, None)
        found = routes.explain(event)
        if found is None or found[1].nats is not None:
            raise CdcRouterError(
                f"the demo's sample {sample.type} (aggregate {sample.aggregate_type}, headers "
                f"{sample.headers}) {'matches no route' if found is None else 'goes to NATS'}"
                " in this config: the demo needs routes that take it to a Kafka topic, as "
                "cdc_router/examples/router.yaml's do")
        destinations[event_id] = routes.topic_for(event, found[0])
    return destinations


def run_fulfillment(config: RouterConfig, dsn: str, payment: Message, say: Say,
                    redeliveries: int = 2) -> int:
    """Deliver the payment event again (as at-least-once delivery may), run the fulfillment
    service on it, and return how many shipments its event id got: one."""
    from cdc_router.examples import fulfillment

    topic = payment.topic() or ""
    producer = Producer(clients.logged_config(config))
    for _ in range(redeliveries):
        producer.produce(topic, key=payment.key(), value=payment.value(),
                         headers=payment.headers() or [])
    producer.flush(30)
    say(f"redelivered the {topic} record {redeliveries} more times")
    args = fulfillment.parse_args([
        "--bootstrap", config.kafka.bootstrap_servers, "--dsn", dsn, "--topic", topic,
        "--group", "demo-fulfillment",  # offsets persist: each run sees only its own copies
        "--dead-letter-topic", config.dead_letter.topic])
    consumer = fulfillment.build(args)
    thread = threading.Thread(target=consumer.run, name="fulfillment", daemon=True)
    thread.start()
    event_id = event_id_of(payment)  # the consumer dedups on it (review 50-i F3: the key)
    deadline = time.monotonic() + _ROUTED_TIMEOUT_S
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while True:
                row = conn.execute("SELECT count(*) FROM public.cdc_router_dedup WHERE "
                                   "event_id = %s", (event_id,)).fetchone()
                if (row and row[0] and consumer.stats.duplicates >= redeliveries) or \
                        time.monotonic() > deadline or not thread.is_alive():
                    break
                time.sleep(0.2)
            shipped = conn.execute("SELECT count(*) FROM public.shipments WHERE event_id = %s",
                                   (event_id,)).fetchone()
    finally:
        consumer.stop()
        thread.join(timeout=30)
    count = int(shipped[0]) if shipped else 0
    say(f"fulfillment: {count} shipment for event {event_id} "
        f"({consumer.stats.duplicates} duplicate deliveries acknowledged, not shipped)")
    return count


def event_id_of(record: Message) -> str:
    """A destination record's event id: its `id` header (the router sets it), else its key;
    whatever the routes key by."""
    found = dict(record_headers(record)).get("id")
    return _printable(record.key() if found is None else found)


def _printable(value: str | bytes | None) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


class _RouterThread(threading.Thread):
    """The demo's router; what stopped it is kept for the demo to say (QA, session 29: a
    missing dead-letter topic was a thread's traceback, then a timeout blaming the connector)."""

    def __init__(self, router: OutboxRouter) -> None:
        super().__init__(name="router", daemon=True)
        self._router = router
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self._router.run()
        except BaseException as failure:  # kept, and raised by the demo
            self.failure = failure

    def raise_failure(self) -> None:
        if isinstance(self.failure, CdcRouterError):
            raise self.failure
        if self.failure is not None:
            raise CdcRouterError(f"the demo's router stopped: {self.failure!r}") from self.failure


def _wait_for_poll(router: OutboxRouter, started: float, thread: _RouterThread,
                   bootstrap: str) -> None:
    deadline = time.monotonic() + _ROUTED_TIMEOUT_S
    while router.last_poll == started:
        if not thread.is_alive():
            thread.raise_failure()
            raise CdcRouterError("the demo's router stopped before it started")
        if time.monotonic() > deadline:
            raise CdcRouterError(f"the demo's router did not start within "
                                 f"{_ROUTED_TIMEOUT_S:.0f}s: is Kafka at {bootstrap} up?")
        time.sleep(0.1)


def _read_routed(config: RouterConfig, destinations: dict[str, str],
                 router: _RouterThread) -> list[Message]:
    ids, topics = set(destinations), sorted(set(destinations.values()))
    consumer = Consumer({**clients.logged_config(config), "group.id": f"demo-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    # The dead-letter topic too: a sample dead-lettered is said at once, with its reason
    # (review 50-d F12: the demo waited 60 s and blamed the connector).
    consumer.subscribe(sorted({*topics, config.dead_letter.topic}))
    found: dict[str, Message] = {}
    deadline = time.monotonic() + _ROUTED_TIMEOUT_S
    try:
        while set(found) != ids:
            if not router.is_alive():
                router.raise_failure()
            if time.monotonic() > deadline or not router.is_alive():
                raise CdcRouterError(
                    f"only {len(found)} of {len(ids)} sample events reached {', '.join(topics)} "
                    f"within {_ROUTED_TIMEOUT_S:.0f}s: check `cdc-router connectors status "
                    "outbox-connector` and the router's log")
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            if message.topic() == config.dead_letter.topic:
                raise_if_dead_lettered(read_letter(
                    message.partition() or 0, message.offset() or 0, message.timestamp()[1],
                    message.key(), message.value(), record_headers(message)), ids)
                continue
            event_id = event_id_of(message)
            if event_id in ids:
                found[event_id] = message
    finally:
        consumer.close()
    return [found[event_id] for event_id in destinations]  # in the samples' order


def raise_if_dead_lettered(letter: Letter, ids: set[str]) -> None:
    """CdcRouterError naming the sample, stage and reason when `letter` is the dead letter of
    one of the samples `ids` (read as `dlq list` reads it: reread 50-i F7)."""
    if letter.event_id in ids:
        raise CdcRouterError(f"the sample event {letter.event_id} was dead-lettered (stage "
                             f"{letter.stage}): {letter.reason}; "
                             "`cdc-router dlq list -c ... --newest` shows it")
