"""Dead letters: the raw input record unchanged, with headers saying where it came from and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Stage = Literal["decode", "route", "serialize", "produce"]

# Header names shared with the idempotent consumer's dead letters (cdc_router.consumer).
SOURCE_TOPIC = "dlq.source.topic"
SOURCE_PARTITION = "dlq.source.partition"
SOURCE_OFFSET = "dlq.source.offset"
STAGE = "dlq.stage"
ERROR_CLASS = "dlq.error.class"
ERROR_MESSAGE = "dlq.error.message"
EVENT_ID = "dlq.event.id"
# Set, to the raw value's size, when the value was left out to keep the dead letter deliverable.
VALUE_DROPPED = "dlq.value.dropped.bytes"

# librdkafka's default message.max.bytes, the producer's limit for one record.
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
# Room a dead letter keeps below that limit for what its size check does not count: the
# record and batch framing, and header lengths.
HEADROOM_BYTES = 64 * 1024


def dead_letter_max_bytes(message_max_bytes: str | int | None) -> int:
    """The largest dead letter to send whole, for a producer's message.max.bytes setting."""
    return int(message_max_bytes or DEFAULT_MESSAGE_MAX_BYTES) - HEADROOM_BYTES


# A reason is for people; an unbounded one could push the record over the broker's size limit.
_MAX_REASON = 2000


@dataclass(frozen=True)
class DeadLetter:
    """A poison input record and its reason, ready to produce to the dead-letter topic."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    stage: Stage
    reason: str


def dead_letter(*, topic: str, partition: int, offset: int, key: bytes | None,
                value: bytes | None, original_headers: list[tuple[str, bytes]] | None,
                stage: Stage, error: BaseException, event_id: str | None = None,
                max_bytes: int | None = None) -> DeadLetter:
    """The dead letter for an input record that failed at `stage` with `error`.

    With `max_bytes`, a raw record bigger than that keeps its coordinates and reason but not
    its value (VALUE_DROPPED says its size): a dead letter the broker refused would block the
    stream, and the raw topic still holds the value.
    """
    reason = (str(error) or type(error).__name__)[:_MAX_REASON]
    original_headers = list(original_headers or ())
    size = len(key or b"") + len(value or b"") + sum(
        len(name) + len(header) for name, header in original_headers)
    if max_bytes is not None and size > max_bytes:
        original_headers.append((VALUE_DROPPED, str(len(value or b"")).encode()))
        value = None
    ours = [
        (SOURCE_TOPIC, topic.encode()),
        (SOURCE_PARTITION, str(partition).encode()),
        (SOURCE_OFFSET, str(offset).encode()),
        (STAGE, stage.encode()),
        (ERROR_CLASS, type(error).__name__.encode()),
        (ERROR_MESSAGE, reason.encode()),
    ]
    if event_id:
        ours.append((EVENT_ID, event_id.encode()))
    headers = tuple(original_headers) + tuple(ours)
    return DeadLetter(key, value, headers, stage, reason)
