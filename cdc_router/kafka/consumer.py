"""Consumer helpers: a record's headers, rewinding to committed offsets.

Reading a topic to its end is kafka/reader.py.
"""

from __future__ import annotations

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)


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
