"""Faithful in-memory fakes of confluent-kafka's Consumer and Producer, and a harness that runs
an IdempotentConsumer over them.

The fakes keep a log per partition and honour pause/resume/seek/store_offsets/commit like
librdkafka, and a fake clock advances when consume() waits, so backoffs cost no real time.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from cdc_router.consumer import ConsumedEvent, ConsumerSettings, IdempotentConsumer, RetryPolicy
from cdc_router.consumer.dedup import MemoryDedupStore

TOPIC = "payments.confirmed"
DLQ = "fulfillment.dlq"
Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


class FakeMessage:
    def __init__(self, topic: str, partition: int, offset: int, record: Record,
                 error: KafkaError | None = None) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._headers = record
        self._error = error

    def topic(self) -> str: return self._topic
    def partition(self) -> int: return self._partition
    def offset(self) -> int: return self._offset
    def key(self) -> bytes | None: return self._key
    def value(self) -> bytes | None: return self._value
    def headers(self) -> list[tuple[str, bytes | None]] | None: return self._headers or None
    def timestamp(self) -> tuple[int, int]: return (1, 1_700_000_000_000)
    def error(self) -> KafkaError | None: return self._error


def closed_within(consumer: Any, timeout_s: float = 5.0) -> bool:
    """Whether `consumer` is closed now or within timeout_s: a replaced consumer is closed on
    a thread of its own (kafka/closing.py close_aside)."""
    deadline = time.monotonic() + timeout_s
    while not consumer.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(consumer.closed)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeConsumer:
    """One consumer owning every partition of `logs`; `journal` records calls in order."""

    def __init__(self, logs: dict[int, list[Record]], clock: FakeClock,
                 on_idle: Callable[[], None]) -> None:
        self.logs = logs
        self.clock = clock
        self.on_idle = on_idle
        self.positions = dict.fromkeys(logs, 0)
        # Offsets past each log's last record that a read_committed reader skips (commit
        # markers): the position moves over them once the log is read to its end.
        self.markers = dict.fromkeys(logs, 0)
        self.unpositioned: set[int] = set()  # sought or assigned, no record since
        self.paused: set[int] = set()
        self.assigned: set[int] = set()
        self.stored: dict[int, int] = {}
        self.committed: dict[int, int] = {}
        self.journal: list[tuple[str, Any]] = []
        self.pending_errors: list[KafkaError] = []
        self.before_consume: list[Callable[[FakeConsumer], None]] = []
        self.callbacks: dict[str, Any] = {}
        self.config: dict[str, str] = {}
        self.closed = False
        self.polls = 0
        self.missing: set[str] = set()  # topics list_topics answers unknown

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        assert topics == [TOPIC]
        self.callbacks = callbacks

    def list_topics(self, topic: str, timeout: float) -> Any:
        """The cluster's metadata: every topic but the ones in `missing` exists."""
        error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART) if topic in self.missing else None
        return SimpleNamespace(topics={topic: SimpleNamespace(error=error, partitions={0: None})})

    def poll(self, timeout: float) -> FakeMessage | None:
        """Before the subscription (error_cb's service): no record yet; after it, as
        librdkafka's, the first record consume() would give, or None after `timeout`."""
        if not self.callbacks:
            self.journal.append(("poll", timeout))
            return None
        batch = self.consume(1, timeout)
        return batch[0] if batch else None

    def rebalance(self) -> None:
        revoked = [TopicPartition(TOPIC, p) for p in sorted(self.assigned)]
        if revoked:
            self.callbacks["on_revoke"](self, revoked)
        self.assigned = set(self.logs)
        self.positions = {p: self.committed.get(p, 0) for p in self.logs}
        self.unpositioned = set(self.logs)
        self.journal.append(("rebalance", dict(self.committed)))
        self.callbacks["on_assign"](self, [TopicPartition(TOPIC, p) for p in self.logs])

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        self.polls += 1
        # A loop that retries without end would hang the test run instead of failing it.
        assert self.polls < 10_000, "the loop never finished: a partition is stuck"
        if not self.assigned:
            self.rebalance()
        while self.before_consume:
            self.before_consume.pop(0)(self)
        if self.pending_errors:
            return [FakeMessage(TOPIC, -1, -1, (None, None, []), self.pending_errors.pop(0))]
        batch: list[FakeMessage] = []
        for partition in sorted(self.assigned - self.paused):
            while self.positions[partition] < len(self.logs[partition]) and \
                    len(batch) < num_messages:
                offset = self.positions[partition]
                batch.append(FakeMessage(TOPIC, partition, offset, self.logs[partition][offset]))
                self.unpositioned.discard(partition)
                self.positions[partition] += 1
        if len(batch) < num_messages:  # librdkafka's consume() waits for a full batch
            self.clock.now += timeout
        # Not a drain without wait (timeout 0): the records before it are still to handle.
        if not batch and timeout > 0 and not self.paused and \
                all(self.positions[p] == len(self.logs[p]) for p in self.logs):
            self.on_idle()
        return batch

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, p) for p in sorted(self.assigned)]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Past the markers once a partition's records are all consumed, as librdkafka's;
        none (-1001) after a seek or an assignment until a record comes (review 35)."""
        return [TopicPartition(TOPIC, tp.partition, OFFSET_INVALID if tp.partition in
                               self.unpositioned else self.positions[tp.partition] + (
            self.markers[tp.partition] if self.positions[tp.partition] ==
            len(self.logs[tp.partition]) else 0)) for tp in partitions]

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused.update(p.partition for p in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused.difference_update(p.partition for p in partitions)

    def seek(self, partition: TopicPartition) -> None:
        self.positions[partition.partition] = partition.offset
        self.unpositioned.add(partition.partition)

    def store_offsets(self, offsets: list[TopicPartition]) -> None:
        for tp in offsets:
            if tp.partition not in self.assigned:
                raise KafkaException(KafkaError(KafkaError._STATE))
            self.stored[tp.partition] = tp.offset
            self.journal.append(("store", (tp.partition, tp.offset)))

    def commit(self, asynchronous: bool = True) -> None:
        assert asynchronous is False
        fresh = {p: o for p, o in self.stored.items() if self.committed.get(p) != o}
        if not fresh:
            raise KafkaException(KafkaError(KafkaError._NO_OFFSET))
        self.committed.update(fresh)
        self.journal.append(("commit", dict(self.committed)))

    def close(self) -> None:
        if self.callbacks:  # subscribed
            self.callbacks["on_revoke"](self, [TopicPartition(TOPIC, p) for p in self.assigned])
        self.assigned.clear()
        self.closed = True


def record_size(key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes | None]]) -> int:
    return len(key or b"") + len(value or b"") + sum(len(n) + len(v or b"") for n, v in headers)


class FakeProducer:
    """Refuses a record over message.max.bytes in produce(), as librdkafka does; `failures_left`
    delivery reports time out, and `refusals` are delivery errors the broker answers, in turn."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.failures_left = 0
        self.refusals: list[KafkaError] = []
        self.attempts = 0
        self.config: dict[str, str] = {}
        self._pending: list[tuple[Callable[..., None], dict[str, Any]]] = []

    def produce(self, topic: str, *, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes | None]],
                on_delivery: Callable[..., None]) -> None:
        self.attempts += 1
        limit = int(self.config.get("message.max.bytes", 1_000_000))
        if record_size(key, value, headers) > limit:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE,
                                            "Broker: Message size too large"))
        self._pending.append((on_delivery, {"topic": topic, "key": key, "value": value,
                                            "headers": headers}))

    def flush(self, timeout: float) -> int:
        for on_delivery, record in self._pending:
            if self.refusals:
                on_delivery(self.refusals.pop(0), None)
            elif self.failures_left:
                self.failures_left -= 1
                on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), None)
            else:
                self.sent.append(record)
                on_delivery(None, None)
        self._pending.clear()
        return 0


class Harness:
    """Builds a consumer over fakes; run() returns when every record is handled or stopped."""

    def __init__(self, logs: dict[int, list[Record]], *, store: Any = None,
                 retry: RetryPolicy | None = None, decoder: Any = None,
                 event_id_source: str | None = None,
                 handler: Callable[[ConsumedEvent, Any], None] | None = None,
                 producer_config: dict[str, str] | None = None,
                 consumer_config: dict[str, str] | None = None,
                 decode_mismatch_limit: int | None = None) -> None:
        self.clock = FakeClock()
        self.effects: list[ConsumedEvent] = []
        self.store = store or MemoryDedupStore()
        self.producer = FakeProducer()
        chosen: dict[str, Any] = {} if event_id_source is None else {
            "event_id_source": event_id_source}
        if decode_mismatch_limit is not None:
            chosen["decode_mismatch_limit"] = decode_mismatch_limit
        self.settings = ConsumerSettings(
            bootstrap_servers="fake:9092", group_id="fulfillment", topics=(TOPIC,),
            dead_letter_topic=DLQ, **chosen,  # type: ignore[arg-type]
            retry=retry or RetryPolicy(max_attempts=3, initial_backoff_s=1.0,
                                       max_backoff_s=4.0),
            commit_interval_s=5.0, producer_config=producer_config or {},
            consumer_config=consumer_config or {})
        self.producers_built = 0
        self.loop: IdempotentConsumer[Any] = IdempotentConsumer(
            self.settings, self.store, handler or self.record_effect, decoder=decoder,
            consumer_factory=self._make_consumer, producer_factory=self._make_producer,
            rng=random.Random(1), clock=self.clock)
        self.kafka = FakeConsumer(logs, self.clock, self.loop.stop)

    def _make_consumer(self, config: dict[str, str]) -> FakeConsumer:
        self.kafka.config = config
        return self.kafka

    def _make_producer(self, config: dict[str, str]) -> FakeProducer:
        self.producers_built += 1
        self.producer.config = config
        return self.producer

    def record_effect(self, event: ConsumedEvent, _context: Any) -> None:
        self.effects.append(event)

    def run(self) -> None:
        self.loop.run()

    def stored_offset_of(self, partition: int) -> int:
        return self.kafka.stored.get(partition, 0)


def rec(key: str | None, value: object = None, headers: list[tuple[str, bytes | None]] | None
        = None) -> Record:
    raw = None if value is None else json.dumps(value).encode()
    return (None if key is None else key.encode(), raw, headers or [])


def dlq_headers(record: dict[str, Any]) -> dict[str, str]:
    return {k: v.decode() for k, v in record["headers"] if k.startswith("dlq.")}


def run_poisoned(raised: BaseException, *, in_decoder: bool = False
                 ) -> tuple[Harness, dict[str, str]]:
    """Run records "poison" and "b" where the handler (or the decoder) raises `raised` on the
    first; the harness and the dlq.* headers of the one dead letter, after "b" took effect."""
    def handler(event: ConsumedEvent, _: Any) -> None:
        if event.event_id == "poison":
            raise raised
        h.effects.append(event)

    def decoder(raw: bytes | None) -> Any:
        if raw == b'"poison"':
            raise raised
        return raw

    h = Harness({0: [rec("poison", "poison"), rec("b", "b")]}, handler=handler,
                decoder=decoder if in_decoder else None)
    h.run()
    assert [event.event_id for event in h.effects] == ["b"]
    [dead] = h.producer.sent
    return h, dlq_headers(dead)
