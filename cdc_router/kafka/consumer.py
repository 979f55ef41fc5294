"""Consumer helpers: rewinding to committed offsets, reading a changelog topic to its end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    IsolationLevel,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from cdc_router.errors import DeliveryError


def record_headers(message: Message) -> list[tuple[str, bytes]]:
    """A consumed record's headers as (name, bytes) pairs; a null header value is b''."""
    raw = message.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    return [(name, value if isinstance(value, bytes) else (value or "").encode())
            for name, value in pairs]


def rewind_to_committed(consumer: Consumer, timeout_s: float) -> None:
    """Seek every assigned partition back to its committed offset (the start if none)."""
    assignment = consumer.assignment()
    if not assignment:
        return
    for committed in consumer.committed(assignment, timeout=timeout_s):
        if committed.error is not None:
            # Without the committed offset we would re-read from the start: refuse instead.
            raise KafkaException(committed.error)
        offset = committed.offset if committed.offset != OFFSET_INVALID else OFFSET_BEGINNING
        consumer.seek(TopicPartition(committed.topic, committed.partition, offset))


def log_end_offsets(admin: AdminClient, topic: str, partitions: list[int]) -> dict[int, int]:
    """partition → the log end offset as read_uncommitted sees it (open transactions included).

    A read_committed consumer's watermarks stop at the last stable offset, which an open
    transaction holds back; this is where a record written before now certainly lies below.
    """
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    futures = admin.list_offsets({TopicPartition(topic, p): latest for p in partitions},
                                 isolation_level=IsolationLevel.READ_UNCOMMITTED,
                                 request_timeout=30)
    return {tp.partition: future.result().offset for tp, future in futures.items()}


class ChangelogReader:
    """Reads every partition of a compacted changelog topic, resuming where it stopped."""

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        self._config = {
            **config,
            # No group: offsets of the changelog are never committed, it is read from the start.
            "group.id": f"{config.get('client.id', 'cdc-router')}-changelog-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            # Never create the changelog by looking it up: `topics apply` creates it.
            "allow.auto.create.topics": False,
        }
        self._client_config = {key: value for key, value in config.items()
                               if key != "allow.auto.create.topics"}  # not an admin property
        self._topic = topic
        self._consumer: Consumer | None = None
        self._admin: AdminClient | None = None

    def catch_up(self, timeout_s: float = 300.0) -> Iterator[tuple[bytes | None, bytes | None]]:
        """Yield (key, value) of every committed record up to the log's end as of now.

        The end is the high watermark, not the last stable offset: a transaction still open
        is waited for (until it commits or aborts, at most transaction.timeout.ms), so that
        no mark written before this call is missed. Control markers are passed over.
        """
        consumer = self._assigned()
        ends = self._high_watermarks(consumer)
        deadline = time.monotonic() + timeout_s
        while not self._reached(consumer, ends):
            if time.monotonic() > deadline:
                raise DeliveryError(f"reading the dedup changelog {self._topic} to its end took "
                                    f"over {timeout_s:.0f}s; is a transaction stuck open?")
            for message in consumer.consume(num_messages=10_000, timeout=0.2):
                if message.error():
                    continue
                yield message.key(), message.value()

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _assigned(self) -> Consumer:
        if self._consumer is None:
            consumer = Consumer(self._config)
            metadata = consumer.list_topics(self._topic, timeout=30)
            found = metadata.topics.get(self._topic)
            if found is None or found.error is not None:
                consumer.close()
                raise DeliveryError(f"the dedup changelog topic {self._topic} does not exist: "
                                    "run `cdc-router topics apply -c <config>` first")
            consumer.assign([TopicPartition(self._topic, p, OFFSET_BEGINNING)
                             for p in found.partitions])
            self._consumer = consumer
        return self._consumer

    def _high_watermarks(self, consumer: Consumer) -> dict[int, int]:
        if self._admin is None:
            self._admin = AdminClient(self._client_config)
        return log_end_offsets(self._admin, self._topic,
                               [tp.partition for tp in consumer.assignment()])

    def _reached(self, consumer: Consumer, ends: dict[int, int]) -> bool:
        positions = consumer.position([TopicPartition(self._topic, p) for p in ends])
        return all(ends[tp.partition] <= 0 or tp.offset >= ends[tp.partition]
                   for tp in positions)
