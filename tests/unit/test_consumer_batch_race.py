"""A rebalance between the loop's reads never hands over a record of a revoked partition
(reread 52-l F3), on librdkafka's own in-process mock cluster."""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import Consumer, Producer

from cdc_router.consumer import ConsumerSettings, IdempotentConsumer
from cdc_router.consumer.dedup.memory import MemoryDedupStore

QUICK = {"heartbeat.interval.ms": "100", "session.timeout.ms": "6000"}


def _second_member(brokers: str, done: threading.Event) -> None:
    """Joins, holds its share for a few seconds (without reading it), then leaves: the
    first member gets every partition back."""
    other = Consumer({"bootstrap.servers": brokers, "group.id": "g", **QUICK})
    other.subscribe(["orders"])
    until = time.monotonic() + 6
    while not done.is_set() and time.monotonic() < until:
        other.poll(0.2)
    other.close()


class _Widened:
    """A consumer whose first read without waiting starts a second member and gives the
    rebalance time to be queued: the window between two reads of one iteration, widened."""

    def __init__(self, real: Consumer, brokers: str, done: threading.Event) -> None:
        self._real, self._brokers, self._done, self._armed = real, brokers, done, True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        if self._armed and timeout == 0:
            self._armed = False
            threading.Thread(target=_second_member, args=(self._brokers, self._done),
                             daemon=True).start()
            time.sleep(2.0)
        return self._real.consume(num_messages=num_messages, timeout=timeout)


def test_a_revocation_between_reads_hands_over_no_record_of_the_revoked_partition() -> None:
    # Reread 52-l F3: the loop polled one record, then consume(timeout=0) served the
    # revocation; the polled record's handler failed, and the retry's seek on a partition no
    # longer ours stopped run() with FatalKafkaError ("cannot rewind ... Erroneous state").
    mock = Producer({"test.mock.num.brokers": 1})
    brokers = ",".join(f"{b.host}:{b.port}" for b in mock.list_topics(timeout=5).brokers.values())
    producer = Producer({"bootstrap.servers": brokers})
    producer.produce("orders.dlq", value=b"x")
    for i in range(3):
        producer.produce("orders", key=b"e%d" % i, value=b'"v"', headers=[("id", b"e%d" % i)])
    assert producer.flush(5) == 0
    done, attempts = threading.Event(), []
    settings = ConsumerSettings(bootstrap_servers=brokers, group_id="g", topics=("orders",),
                                dead_letter_topic="orders.dlq", consumer_config=QUICK)

    def handler(event: Any, context: Any) -> None:
        attempts.append(event.event_id)
        if len(attempts) == 1:
            raise RuntimeError("the first attempt fails: a retry")
        if {"e0", "e1", "e2"} <= set(attempts):
            consumer.stop()

    consumer: IdempotentConsumer[None] = IdempotentConsumer(
        settings, MemoryDedupStore(), handler,
        consumer_factory=lambda conf: _Widened(Consumer(conf), brokers, done),
        members_factory=lambda *_: lambda name, timeout_s: True)
    stopper = threading.Timer(30, consumer.stop)  # a safety net only
    stopper.daemon = True
    stopper.start()
    try:
        consumer.run()  # raised FatalKafkaError before
    finally:
        done.set()
        stopper.cancel()
    assert sorted(set(attempts)) == ["e0", "e1", "e2"]
