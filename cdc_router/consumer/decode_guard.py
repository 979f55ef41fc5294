"""A decoder that cannot decode a topic at all is a config error, not a run of dead letters.

QA 66-a F-6: a JSON decoder on an Avro topic dead-lettered every record (43,700 in 50 s), each
offset committed. As Kafka Streams' deserialization handler does by default (FAIL;
LogAndContinue is the opt-in), the consumer stops instead: while no record of a topic has
decoded since the start, its records that fail to decode are held (neither dead-lettered nor
acknowledged: the commit stays before them), and when `limit` of them fail alike (the
decoder's exception class), run() raises ConfigError naming the topic, the decoder and the
first reason, nothing of them acknowledged. A restart with the right decoder reads them again.

The hold ends, and the held records go the usual way (rewound, read again, dead-lettered one
by one), at the topic's first record that decodes, at a failure of another kind, and
`HOLD_S` after the first was held (a few poison records at the start of a quiet topic are
letters after that long). Tombstones and records without an event id are never held, and
end the hold only on a partition with held records (their letter would acknowledge them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cdc_router.consumer.event import KafkaMessage
from cdc_router.errors import ConfigError, MalformedRecord, printable

# How long held records wait for the limit before they are dead-lettered as usual: long
# enough for a backlog's first `limit` records to come (a consume() brings hundreds at once),
# short beside an operator's wait for letters.
HOLD_S = 60.0
# The decoder's failure (consumer/event.py's read_event): a record's undecodable value.
_DECODE_FAILURE = "value cannot be decoded: "


@dataclass
class _Held:
    cause: str  # the decoder's exception class, e.g. UnicodeDecodeError
    since: float
    first: dict[tuple[str, int], KafkaMessage] = field(default_factory=dict)  # by partition
    count: int = 0
    reason: str = ""


class DecodeMismatch:
    """hold(message, error) -> whether the loop holds the record; raises ConfigError at the
    limit. decoded(topic), interrupted(message, error), expired() -> the first held record of each
    partition to rewind to (the hold is over for their topic)."""

    def __init__(self, limit: int, decoder: object, clock: Callable[[], float]) -> None:
        """`limit`: ConsumerSettings.decode_mismatch_limit (0: never hold)."""
        self._limit = limit
        self._decoder = getattr(decoder, "__qualname__", None) or type(decoder).__name__
        self._clock = clock
        self._decoded: set[str] = set()  # topics past their hold: a record decoded, or released
        self._held: dict[str, _Held] = {}

    def holds(self, tp: tuple[str, int]) -> bool:
        """Whether records of partition `tp` are held: its position must not be stored."""
        held = self._held.get(tp[0])
        return held is not None and tp in held.first

    def hold(self, message: KafkaMessage, error: MalformedRecord) -> bool:
        """Hold `message` (True), or let it be dead-lettered now (False: first rewind to
        what interrupted() returns, the records held before it)."""
        topic = message.topic()
        if self._limit <= 0 or topic in self._decoded or not _undecodable(message, error):
            return False
        cause = type(error.__cause__).__name__
        held = self._held.setdefault(topic, _Held(cause, self._clock(), reason=str(error)))
        if held.cause != cause:
            return False
        held.first.setdefault((topic, message.partition()), message)
        held.count += 1
        if held.count >= self._limit:
            reason = printable(held.reason[len(_DECODE_FAILURE):])[:400]
            raise ConfigError(
                f"the first {held.count} records of topic {topic!r} all failed to decode with "
                f"the decoder {self._decoder} ({reason})"
                ": it does not fit the topic's format, so the consumer stops; none of them was "
                "dead-lettered or acknowledged",
                source="IdempotentConsumer", field="decoder",
                hint="pass the decoder for this topic (the reason says its format), or "
                     "ConsumerSettings(decode_mismatch_limit=0) to dead-letter each such record")
        return True

    def release(self, topic: str) -> list[KafkaMessage]:
        """End the hold of `topic` for good; the first held record of each partition."""
        self._decoded.add(topic)
        held = self._held.pop(topic, None)
        return [] if held is None else list(held.first.values())

    def decoded(self, topic: str) -> list[KafkaMessage]:
        """A record of `topic` decoded: release() it (nothing once past its hold)."""
        return [] if topic in self._decoded else self.release(topic)

    def interrupted(self, message: KafkaMessage, error: MalformedRecord) -> list[KafkaMessage]:
        """A failure hold() did not hold: release() its topic if records of it are held. Not
        for a tombstone or a record without an id on a partition nothing is held of: it says
        nothing of the decoder, and its letter commits past nothing held (review 67: one
        tombstone ended the hold of the whole topic, and the letters came back)."""
        topic, tp = message.topic(), (message.topic(), message.partition())
        held = self._held.get(topic)
        if held is None or (tp not in held.first and not _undecodable(message, error)):
            return []
        return self.release(topic)

    def expired(self) -> list[KafkaMessage]:
        """release() every topic held for HOLD_S."""
        now = self._clock()
        return [message for topic in [t for t, held in self._held.items()
                                      if now - held.since >= HOLD_S]
                for message in self.release(topic)]

    def forget(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Partitions revoked or lost: their held records come again to their next owner."""
        for tp in partitions:
            held = self._held.get(tp[0])
            if held is not None and held.first.pop(tp, None) is not None and not held.first:
                del self._held[tp[0]]


def _undecodable(message: KafkaMessage, error: MalformedRecord) -> bool:
    """Whether the decoder failed on `message`'s value (read_event's), not a tombstone or a
    record without an event id."""
    return message.value() is not None and error.__cause__ is not None \
        and str(error).startswith(_DECODE_FAILURE)
