"""Consumer helpers: rewinding to committed offsets, reading a changelog topic to its end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, Consumer, TopicPartition

from cdc_router.errors import DeliveryError


def rewind_to_committed(consumer: Consumer, timeout_s: float) -> None:
    """Seek every assigned partition back to its committed offset (the start if none)."""
    assignment = consumer.assignment()
    if not assignment:
        return
    for committed in consumer.committed(assignment, timeout=timeout_s):
        offset = committed.offset if committed.offset != OFFSET_INVALID else OFFSET_BEGINNING
        consumer.seek(TopicPartition(committed.topic, committed.partition, offset))


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
        }
        self._topic = topic
        self._consumer: Consumer | None = None

    def catch_up(self, idle_s: float = 1.0, timeout_s: float = 300.0) -> Iterator[tuple[
            bytes | None, bytes | None]]:
        """Yield (key, value) of every committed record not yet read, up to the end."""
        consumer = self._assigned()
        ends = self._high_watermarks(consumer)
        deadline = time.monotonic() + timeout_s
        last_record = time.monotonic()
        while not self._reached(consumer, ends):
            # Transaction markers hold offsets no record has; when nothing arrives for
            # `idle_s`, everything visible to read_committed has been read.
            if time.monotonic() - last_record > idle_s:
                return
            if time.monotonic() > deadline:
                raise DeliveryError(f"reading the changelog {self._topic} took over "
                                    f"{timeout_s:.0f}s; is the broker overloaded?")
            for message in consumer.consume(num_messages=10_000, timeout=0.2):
                if message.error():
                    continue
                last_record = time.monotonic()
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
        ends = {}
        for tp in consumer.assignment():
            _, high = consumer.get_watermark_offsets(tp, timeout=30, cached=False)
            ends[tp.partition] = high
        return ends

    def _reached(self, consumer: Consumer, ends: dict[int, int]) -> bool:
        positions = consumer.position([TopicPartition(self._topic, p) for p in ends])
        return all((tp.offset >= 0 and tp.offset >= ends[tp.partition]) or ends[tp.partition] == 0
                   for tp in positions)
