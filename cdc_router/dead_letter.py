"""Dead letters: the raw input record unchanged, with headers saying where it came from and why."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations
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
# Only the JetStream consumer's: the stream a message came from (its subject is
# SOURCE_TOPIC, its stream sequence SOURCE_OFFSET, and SOURCE_PARTITION is 0).
SOURCE_STREAM = "dlq.source.stream"
# Only the idempotent consumer's: how many handler attempts failed (0 for a malformed record).
ATTEMPTS = "dlq.attempts"
# Set, to the raw value's size, when the value was left out to keep the dead letter deliverable;
# then, if it was still too large, the key's (KEY_DROPPED) and the record's own headers'
# (HEADERS_DROPPED, how many) as well: the dlq.* headers always stay.
VALUE_DROPPED = "dlq.value.dropped.bytes"
KEY_DROPPED = "dlq.key.dropped.bytes"
HEADERS_DROPPED = "dlq.headers.dropped"
# Set by `cdc-router dlq replay` on a letter it dead-lettered again: the earlier letter,
# dead-letter-topic[partition]@offset.
REPLAY_OF = "dlq.replay.of"
# The source.group_id of the pipeline that wrote a router's (or relay's) dead letter: several
# pipelines may share one dead-letter topic (its default name), and read one raw topic too.
SOURCE_GROUP = "dlq.source.group"
# The group_id of the idempotent consumer that wrote a dead letter: services may share one
# dead-letter topic, and each letter is one group's failure (QA 67-b F-3). Not
# dlq.source.group, which tells a router's letters of other pipelines apart.
CONSUMER_GROUP = "dlq.consumer.group"
HEADER_PREFIX = "dlq."

# The longest event id, in UTF-8 bytes, the router routes and the idempotent consumer takes. A
# UUID is 36 bytes; far longer ids are no id this project writes, a dedup store must index them
# (Postgres refuses a btree entry over about 2,700 bytes, for ever), and an id rides in a
# record's key and headers and in the dedup changelog, where one of 500 KB made even its dead
# letter too large for Kafka.
MAX_EVENT_ID_BYTES = 1024


def marks_delivery(stage: str) -> bool:
    """Whether a router's dead letter at `stage` counts as its event's one delivery: its id
    goes to the dedup changelog, so that a replay of the event drops, and the cleanup keeps its
    row. Not at stage decode: the row itself failed, and may come back fixed (`outbox
    republish`), to be routed then."""
    return stage != "decode"

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

Headers = list[tuple[str, bytes]]


@dataclass(frozen=True)
class DeadLetter:
    """A poison input record and its reason, ready to produce to the dead-letter topic."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    stage: Stage
    reason: str


def shown_error(error: BaseException) -> str:
    """str(error), or `<unprintable ClassName>` when its __str__ raises: a user's exception
    class may have a bug there (review 52-c F-HIGH-13: `self.order['id']` on a payload with
    'order_id' raised KeyError, and the consumer crashed at the record's dead letter, and again
    after every restart). Every text of a user's exception goes through it or shown_repr."""
    try:
        return str(error)
    except Exception:
        return f"<unprintable {type(error).__name__}>"


def shown_repr(value: object) -> str:
    """repr(value), or `<unprintable ClassName>` when its __repr__ raises (the consumer's
    retry log line crashed on one)."""
    try:
        return repr(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def without_frames(error: BaseException) -> BaseException:
    """`error` with the tracebacks of it and of the exceptions it chains dropped, to keep it
    for a letter written later: their frames hold the handler's locals (reread 56-r F-2,
    56-s F-5: a handler raising inside `except` chains one that holds them too)."""
    seen: set[int] = set()
    chained: list[BaseException | None] = [error]
    while chained:
        link = chained.pop()
        if link is not None and id(link) not in seen:
            seen.add(id(link))
            link.__traceback__ = None
            chained += [link.__cause__, link.__context__]
    return error


def reason_of(error: BaseException) -> str:
    """The dlq.error.message of `error`: its text (its class when it has none), bounded."""
    return (shown_error(error) or type(error).__name__)[:_MAX_REASON]


def dead_letter_headers(*, topic: str, partition: int, offset: int, stage: str,
                        error: BaseException, attempts: int | None = None,
                        event_id: str | None = None, error_class: str | None = None) -> Headers:
    """The dlq.* headers of the record at topic[partition]@offset that failed at `stage`.

    The one builder for the router's and the consumer's dead letters. `attempts` (the
    consumer's handler tries) is written when given; `error_class` names another class than
    the error's own (the consumer names a malformed record's underlying cause).
    """
    values = [
        (SOURCE_TOPIC, topic),
        (SOURCE_PARTITION, str(partition)),
        (SOURCE_OFFSET, str(offset)),
        (STAGE, stage),
        (ERROR_CLASS, error_class or type(error).__name__),
        (ERROR_MESSAGE, reason_of(error)),
    ]
    if attempts is not None:
        values.append((ATTEMPTS, str(attempts)))
    if event_id:
        values.append((EVENT_ID, event_id))
    # An error's message may quote the record, lone surrogates included (json.loads lets
    # them through): strict UTF-8 would fail the dead letter itself.
    return [(name, value.encode("utf-8", "backslashreplace")) for name, value in values]


def record_size(key: bytes | None, value: bytes | None,
                headers: Sequence[tuple[str, bytes | None]]) -> int:
    """What librdkafka's size check counts: key, value, and the headers as Kafka's record
    format writes them, each name and value in UTF-8 after its varint length (fuzz 32-c: the
    lengths left out, a letter with thousands of headers passed the check and was refused,
    its batch aborted for ever)."""
    size = len(key or b"") + len(value or b"")
    for name, header in headers:
        name_bytes = len(name.encode("utf-8", "surrogatepass"))
        value_bytes = -1 if header is None else len(header)
        size += name_bytes + max(value_bytes, 0) + _varint_size(name_bytes) + \
            _varint_size(value_bytes)
    return size


# A record batch's header in Kafka's v2 record format (magic 2): base offset 8, length 4, leader
# epoch 4, magic 1, crc 4, attributes 2, last offset delta 4, first and max timestamps 8 each,
# producer id 8, epoch 2, base sequence 4, record count 4.
RECORD_BATCH_OVERHEAD = 61


def batch_size_bound(key: bytes | None, value: bytes | None,
                     headers: Sequence[tuple[str, bytes | None]]) -> int:
    """At least batch_size(), for the router's every record: a name's character is at most 4
    bytes of UTF-8 and a length's varint 5 (under 2^31); a record within a limit so counted fits
    without batch_size's count, which made the step half as slow again (the benchmark's step:
    21 to 31 us an event)."""
    return RECORD_BATCH_OVERHEAD + 5 + 18 + len(key or b"") + len(value or b"") + sum(
        [4 * len(name) + len(header or b"") + 10 for name, header in headers])


def batch_size(key: bytes | None, value: bytes | None,
               headers: Sequence[tuple[str, bytes | None]]) -> int:
    """The size of a batch holding only this record, uncompressed, as the broker compares it
    with a topic's max.message.bytes: record_size() plus the record's own framing (its length,
    attributes, timestamp and offset deltas, key and value lengths, header count) and the
    batch's header. A record over a limit so counted is refused alone, whatever it shares."""
    key_length = -1 if key is None else len(key)
    value_length = -1 if value is None else len(value)
    body = record_size(key, value, headers) + 1 + 1 + 1 + _varint_size(key_length) + \
        _varint_size(value_length) + _varint_size(len(headers))  # attributes, deltas 0
    return RECORD_BATCH_OVERHEAD + _varint_size(body) + body


def _varint_size(number: int) -> int:
    """Bytes of a zigzag varint (Kafka's record format)."""
    zigzag = (number << 1) ^ (number >> 63)
    return max(1, (zigzag.bit_length() + 6) // 7)


def fitted(key: bytes | None, value: bytes | None, headers: Headers, max_bytes: int | None,
           *, drop_value: bool = False) -> tuple[bytes | None, bytes | None, Headers]:
    """The key, value and headers to send: when the record is over `max_bytes`, without the
    fewest of its parts (the value, the key, its own headers) that bring it within, and of
    those choices the one that keeps the most bytes; without all three when none does. A part
    left out is named by a header (VALUE_DROPPED and KEY_DROPPED say its size, HEADERS_DROPPED
    how many); the dlq.* headers always stay. `drop_value`: without the value whatever its size.

    A dead letter the broker refused would block the stream; the raw topic still holds
    what was left out. QA 54-c F-8: the parts went in a fixed order (value, key, headers), so
    a letter over the limit by its headers alone lost its small value and key too.
    """
    parts = [part for part, present in (("value", value is not None), ("key", bool(key)),
                                        ("headers", True)) if present]
    forced = {"value"} if drop_value and value is not None else set()
    if max_bytes is None:
        return _without(key, value, headers, forced)
    for count in range(len(parts) + 1):  # fewest parts left out first
        fitting = [letter for dropped in combinations(parts, count) if forced <= set(dropped)
                   for letter in [_without(key, value, headers, set(dropped))]
                   if record_size(*letter) <= max_bytes]
        if fitting:
            return max(fitting, key=lambda letter: record_size(*letter))  # the most kept
    return _without(key, value, headers, set(parts))


def _without(key: bytes | None, value: bytes | None, headers: Headers,
             dropped: set[str]) -> tuple[bytes | None, bytes | None, Headers]:
    """The letter without the `dropped` parts, each named by its header."""
    headers = list(headers)
    if "value" in dropped and value is not None:
        headers.append((VALUE_DROPPED, str(len(value)).encode()))
        value = None
    if "key" in dropped and key:
        headers.append((KEY_DROPPED, str(len(key)).encode()))
        key = None
    if "headers" in dropped:
        own = [header for header in headers if not header[0].startswith(HEADER_PREFIX)]
        headers = [header for header in headers if header[0].startswith(HEADER_PREFIX)]
        headers.append((HEADERS_DROPPED, str(len(own)).encode()))
    return key, value, headers


def dead_letter(*, topic: str, partition: int, offset: int, key: bytes | None,
                value: bytes | None, original_headers: list[tuple[str, bytes]] | None,
                stage: Stage, error: BaseException, event_id: str | None = None,
                max_bytes: int | None = None, group: str | None = None) -> DeadLetter:
    """The router's dead letter for an input record that failed at `stage` with `error`;
    `group`: the pipeline's source.group_id (SOURCE_GROUP).

    With `max_bytes`, a record bigger than that keeps its coordinates and reason but not its
    value, nor if need be its key and own headers (see fitted).
    """
    headers = list(original_headers or ()) + dead_letter_headers(
        topic=topic, partition=partition, offset=offset, stage=stage, error=error,
        event_id=event_id)
    if group is not None:
        headers.append((SOURCE_GROUP, group.encode("utf-8", "backslashreplace")))
    key, value, headers = fitted(key, value, headers, max_bytes)
    return DeadLetter(key, value, tuple(headers), stage, reason_of(error))


def without_dead_letter_headers(headers: list[tuple[str, bytes]]) -> Headers:
    """A dead letter's headers less the dlq.* ones: the raw input record's own headers."""
    return [(name, value) for name, value in headers if not name.startswith(HEADER_PREFIX)]


def dead_letter_origin(headers: list[tuple[str, bytes]]) -> dict[str, str | None]:
    """What the dlq.* headers of a consumed dead letter say, as text: stage, source
    (topic[partition]@offset), event_id, error (the class) and reason."""
    values = {name: value.decode(errors="replace") for name, value in headers}
    return {
        "stage": values.get(STAGE),
        "source": f"{values.get(SOURCE_TOPIC)}[{values.get(SOURCE_PARTITION)}]"
                  f"@{values.get(SOURCE_OFFSET)}",
        "event_id": values.get(EVENT_ID),
        "error": values.get(ERROR_CLASS),
        "reason": values.get(ERROR_MESSAGE),
    }


def of_pipeline(headers: list[tuple[str, bytes]], ours: Callable[[str, str | None], bool]) -> bool:
    """Whether a consumed dead letter is the pipeline's that `ours(source topic, source group)`
    accepts; one that names no source topic (not the router's or the relay's) cannot be told
    apart, and counts as this pipeline's."""
    values = {name: value for name, value in headers if name in (SOURCE_TOPIC, SOURCE_GROUP)}
    topic, group = values.get(SOURCE_TOPIC), values.get(SOURCE_GROUP)
    if topic is None:
        return True
    return ours(topic.decode(errors="replace"),
                None if group is None else group.decode(errors="replace"))
