"""The pure half of the JetStream consumer: a JetStream message seen as the Kafka loop's record,
the attempt number, what to do after a handler failure, and the dead-letter message.

A message becomes a `JetStreamRecord` with the shape of the Kafka loop's record (subject as
topic, partition 0, stream sequence as offset, Nats-Msg-Id as key), so the event id, the
decoding and the dlq.* headers come from the same code as on Kafka.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from cdc_router.config.nats import MSG_ID_HEADER, msg_id_problem
from cdc_router.consumer.dead_letter import dead_letter_headers
from cdc_router.consumer.event import ConsumedEvent, read_event
from cdc_router.consumer.jetstream_settings import JetStreamEventIdSource
from cdc_router.consumer.retry import RetryPolicy
from cdc_router.consumer.settings import EventIdSource
from cdc_router.dead_letter import ERROR_MESSAGE, SOURCE_STREAM, fitted
from cdc_router.errors import (
    DedupStoreRefused,
    JetStreamError,
    MalformedRecord,
    show,
)
from cdc_router.nats.publisher import MESSAGE_REFUSED, stream_full

# The Kafka loop's timestamp type for a time the broker set (LogAppendTime).
_BROKER_TIME = 2
# Nats-* headers steer the server (Nats-Expected-Stream, Nats-Msg-Id, ...): a copy of the
# original's would make the dead-letter publish fail or be dropped as a duplicate.
_RESERVED_PREFIX = "nats-"
# What NATS adds to a message beyond the sizes `fitted` counts: the NATS/1.0 status line
# and ": " plus CRLF per header.
_FRAMING_BYTES = 4096


@dataclass(frozen=True)
class JetStreamRecord:
    """One delivered JetStream message, shaped like the Kafka loop's record."""

    subject: str
    data: bytes
    header_map: tuple[tuple[str, str], ...]
    stream: str
    sequence: int  # the stream sequence: the message's place in the stream, for ever
    timestamp_ms: int | None
    num_delivered: int

    def topic(self) -> str: return self.subject
    def partition(self) -> int: return 0
    def offset(self) -> int: return self.sequence
    def value(self) -> bytes | None: return self.data
    def error(self) -> Any: return None

    def key(self) -> bytes | None:
        for name, value in self.header_map:
            if name == MSG_ID_HEADER:
                return value.encode()
        return None

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return [(name, value.encode()) for name, value in self.header_map] or None

    def timestamp(self) -> tuple[int, int]:
        return (0, 0) if self.timestamp_ms is None else (_BROKER_TIME, self.timestamp_ms)


def record_of(subject: str, data: bytes, headers: Mapping[str, str] | None,
              metadata: Any) -> JetStreamRecord:
    """The record of a nats-py message's parts (`metadata`: its Msg.Metadata)."""
    stamp: datetime.datetime | None = getattr(metadata, "timestamp", None)
    return JetStreamRecord(
        subject=subject, data=data, header_map=tuple((headers or {}).items()),
        stream=metadata.stream, sequence=metadata.sequence.stream,
        timestamp_ms=None if stamp is None else int(stamp.timestamp() * 1000),
        num_delivered=metadata.num_delivered)


def read_jetstream_event(record: JetStreamRecord, **options: Any) -> ConsumedEvent:
    """consumer.event.read_event of `record`, refusing an event id that holds U+FFFD.

    nats-py decodes header values with errors="replace": ids whose bytes that are not UTF-8
    differ reach us as one text, and dedup would skip the second event as a duplicate of
    the first (QA 54-c F-2). The Kafka consumer sees the bytes and refuses such an id."""
    event = read_event(record, **options)
    problem = msg_id_problem(event.event_id)
    if problem:
        raise MalformedRecord(f"event id {show(event.event_id, 60)} is not UTF-8 ({problem}): "
                              "publish event ids in UTF-8, without U+FFFD")
    return event


def kafka_source(source: JetStreamEventIdSource) -> EventIdSource:
    """The Kafka loop's name for `source`: Nats-Msg-Id plays the record key."""
    return "key" if source == "msg_id" else source


@dataclass(frozen=True)
class Retry:
    """Nak the message: JetStream redelivers it after `delay_s`."""

    delay_s: float


@dataclass(frozen=True)
class GiveUp:
    """The handler failed on the last allowed attempt: dead-letter the message."""

    attempts: int


def after_handler_failure(attempt: int, policy: RetryPolicy, rng: random.Random,
                          error: Exception) -> Retry | GiveUp:
    """What follows a handler failure on attempt `attempt`: a delayed nak, or the dead letter.
    A store that refuses us for good is no handler's failure: raised, it stops the consumer
    (review 47-e F7)."""
    if isinstance(error, DedupStoreRefused):
        raise error
    if policy.exhausted(attempt):
        return GiveUp(attempts=attempt)
    return Retry(delay_s=policy.backoff(attempt, rng))


@dataclass(frozen=True)
class DeadLetterMessage:
    """What goes to the dead-letter subject: the data (unless too big) and the headers."""

    data: bytes
    headers: dict[str, str]
    msg_id: str


def dead_letter_message(record: JetStreamRecord, *, durable: str, stage: str,
                        error: BaseException, attempts: int, event_id: str | None,
                        max_payload: int, drop_data: bool = False) -> DeadLetterMessage:
    """The dead letter of `record`: its data and headers (less Nats-*) plus the dlq.* headers.

    Its own Nats-Msg-Id names the durable, the stream sequence and the time the stream stored
    the message, so a crash between the dead-letter publish and the ack repeats the publish,
    which the dead-letter stream's duplicate window drops, while two services' dead letters of
    one message both stay. Without the time, a stream deleted and re-created within that
    window numbered its messages from 1 again, and a new poison message's letter was dropped
    as the old one's duplicate, then the message TERMed: in neither stream (review 46 F10).
    A message over the server's `max_payload` with the dlq.* headers goes without its data
    (dlq.value.dropped.bytes says its size), if need be without its own headers too; the
    stream still holds them. `drop_data`: without its data whatever its size (the dead-letter
    stream refused it before: its max_msg_size may be below the server's max_payload).
    """
    kept = [(name, value.encode()) for name, value in record.header_map
            if not name.lower().startswith(_RESERVED_PREFIX)]
    # The reason's text in ASCII: nats-py reads a header of other bytes as an email Header
    # object, not a str (QA 47-c F3: a cut reason's '…' broke a reader's slicing).
    dlq = [(name, raw.decode("utf-8", "replace").encode("ascii", "backslashreplace")
            if name == ERROR_MESSAGE else raw)
           for name, raw in dead_letter_headers(record, stage=stage, error=error,
                                                attempts=attempts, event_id=event_id)]
    dlq.append((SOURCE_STREAM, record.stream.encode()))
    _, value, headers = fitted(None, record.data, kept + dlq, max_payload - _FRAMING_BYTES,
                               drop_value=drop_data)
    return DeadLetterMessage(
        data=value or b"",
        headers={name: _header_text(raw) for name, raw in headers},
        msg_id=f"dlq:{record.stream}:{durable}:{record.sequence}"
               + ("" if record.timestamp_ms is None else f":{record.timestamp_ms}"))


def _header_text(raw: bytes) -> str:
    """A NATS header value: one line (an error message may hold line breaks)."""
    text = raw.decode("utf-8", "replace")
    return " ".join(text.splitlines()) if "\n" in text or "\r" in text else text


def letter_failure(failure: BaseException, subject: str, stream: str) -> BaseException:
    """Why a dead letter was not stored in `stream`, as a line names it (QA 47-c F6: "nats: no
    response from stream" named neither the dead-letter subject nor the fix; QA 49-a F2: nor
    did a full dead-letter stream's "maximum messages exceeded")."""
    from nats.js.errors import NoStreamResponseError

    if isinstance(failure, NoStreamResponseError):
        return JetStreamError(f"no stream captures the dead-letter subject {subject!r} now "
                              "(its stream deleted, or its subjects changed): add it to a "
                              "stream's subjects; the poison message waits meanwhile")
    if stream_full(failure):
        return JetStreamError(f"dead-letter stream {stream!r} (subject {subject!r}) is full "
                              "and set to discard new messages "
                              f"({getattr(failure, 'description', '')}): raise its max_msgs/"
                              "max_bytes, or set it to discard old ones (`cdc-router streams "
                              "apply` does when router.yaml declares it); the poison message "
                              "waits meanwhile")
    return failure


def refused_for_good(failure: BaseException) -> bool:
    """A publish JetStream refused for what the message is (nats/publisher.py's
    MESSAGE_REFUSED: over the stream's max_msg_size, headers over its limit); the same letter
    sent again is refused again. Other answers (a full stream or account) may clear."""
    return getattr(failure, "err_code", None) in MESSAGE_REFUSED


# Handler failures, outage naks and unacked letters remembered per stream sequence; beyond this
# many the oldest are forgotten (a forgotten message starts again from attempt 1: more tries,
# never fewer).
MAX_REMEMBERED = 10_000
T = TypeVar("T")


def count_for(counts: dict[int, int], sequence: int) -> int:
    """One more for `sequence` (re-inserted: the newest stays longest); the new count."""
    return keep_for(counts, sequence, counts.get(sequence, 0) + 1)


def keep_for(kept: dict[int, T], sequence: int, value: T) -> T:
    """`value` for `sequence`, the newest; the oldest beyond MAX_REMEMBERED are forgotten."""
    kept.pop(sequence, None)
    kept[sequence] = value
    while len(kept) > MAX_REMEMBERED:
        del kept[next(iter(kept))]
    return value
