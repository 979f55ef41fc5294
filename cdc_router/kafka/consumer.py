"""Consumer helpers: the router's handling of consumer errors, a record's headers, rewinding
to committed offsets, the next batch of records, the lag of each partition.

Reading a topic to its end is kafka/reader.py.
"""

from __future__ import annotations

import gc
import logging
import operator
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from cdc_router.dead_letter import HEADERS_DROPPED
from cdc_router.errors import EXIT_RESTART, OffsetsUnfetched, fatal_kafka_error
from cdc_router.kafka.errors import describe, kafka_error_of, stops_consumer

# In place of the headers of a record whose header names confluent-kafka cannot read.
UNREADABLE_HEADERS = ((HEADERS_DROPPED, b"a header name is not UTF-8"),)


class _WithHeaders(Protocol):
    def headers(self) -> Any: ...


# Message.headers() called so that CPython always checks its result (a call through
# PyObject_Call): see readable_headers.
_HEADERS = operator.methodcaller("headers")


def readable_headers(message: _WithHeaders) -> Any:
    """Message.headers() ([] for none), or None when confluent-kafka could not decode a
    header name.

    It decodes names as UTF-8; for a name that is not (librdkafka's C API, kcat or Go clients
    can write one) it leaves a NULL in the pair and returns the list with the decode error
    still set. CPython turns that into a SystemError only where it checks a call's result:
    once a `message.headers()` call site is specialized (after a few calls) it does not, and
    the list came back as if nothing happened; reading its NULL then crashed the interpreter
    (the full integration suite, the idempotent consumer). So the call goes through
    operator.methodcaller (always checked: 30 of 30 raised, against 7 of 30 for a plain call
    site, measured on a real record), and a pair is also checked without reading its items
    (the collector's view, gc.get_referents, skips a NULL): a list already cached by an
    earlier call holds it. Measured with confluent-kafka 2.16 on CPython 3.11.
    """
    try:
        raw = _HEADERS(message)
        if isinstance(raw, list) and any(len(gc.get_referents(pair)) < 2 for pair in raw):
            return None
    except (SystemError, UnicodeDecodeError):
        return None
    return [] if raw is None else raw


def record_headers(message: _WithHeaders) -> list[tuple[str, bytes]]:
    """A consumed record's headers as (name, bytes) pairs; a null header value is b''; for a
    record whose header names cannot be read (readable_headers), UNREADABLE_HEADERS."""
    raw = readable_headers(message)
    if raw is None:
        return list(UNREADABLE_HEADERS)
    pairs = raw.items() if isinstance(raw, dict) else raw
    return [(name, value if isinstance(value, bytes) else (value or "").encode())
            for name, value in pairs]


# A source topic still missing after this long is named again at WARNING (a typo in
# source.topics looks like a raw topic Debezium has not created yet), then as often.
SOURCE_MISSING_WARN_S = 300.0
# librdkafka repeats the error at every metadata refresh while the topic is missing (5 s for
# the router's consumer): a longer silence means it was found in between.
SOURCE_MISSING_EPISODE_S = 60.0


class SourceErrors:
    """What the router does with an error its consumer hands out in place of a record."""

    def __init__(self, log: logging.Logger,
                 clock: Callable[[], float] = time.monotonic, *, group: str = "") -> None:
        self._log = log
        self._group = group  # source.group_id, named by a refused join
        self._clock = clock
        self._missing_since: float | None = None
        self._missing_logged = self._missing_seen = 0.0

    def handle(self, error: KafkaError) -> None:
        """Nothing for the end of a partition; a wait for a raw topic not created yet;
        FatalKafkaError when the consumer cannot go on (a join its group refuses too); else a
        warning."""
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            # Debezium creates the raw topic with its first event: not an error, a wait.
            now = self._clock()
            if self._missing_since is not None and \
                    now - self._missing_seen > SOURCE_MISSING_EPISODE_S:
                self._missing_since = None  # found in between: a new episode
            self._missing_seen = now
            if self._missing_since is None:
                self._log.info("event=source_topic_missing detail=%r", error.str())
                self._missing_since = self._missing_logged = now
            elif now - self._missing_logged >= SOURCE_MISSING_WARN_S:
                self._log.warning(
                    "event=source_topic_missing detail=%r missing_for_s=%.0f hint=%r",
                    error.str(), now - self._missing_since,
                    "check source.topics; Debezium creates the raw topic with its first event")
                self._missing_logged = now
            return
        if stops_consumer(error):
            grant = "; grant this principal Read on the raw topics (source.topics)" \
                if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED else ""  # QA 35-e
            raise fatal_kafka_error(f"the consumer failed for good: {describe(error)}{grant}",
                                    error, consumer=True)
        if refused := group_protocol_refusal(
                error, "this router", "a member of the group source.group_id names uses an "
                "assignor that the router's (pinned: roundrobin,range, eager) shares nothing "
                "with, as a cooperative-sticky one: another application is using the router's "
                "group; give it a group of its own", group=self._group):
            raise fatal_kafka_error(refused, error, consumer=True)
        stranded = unfetched_offsets(error)
        if stranded is not None:
            raise stranded
        self._log.warning("event=consumer_error error=%s", describe(error))


def group_protocol_refusal(error: KafkaError, member: str, fix: str, *,
                           group: str = "") -> str | None:
    """The one line for a join the group refused because `member`'s assignors share none with
    its other members' (INCONSISTENT_GROUP_PROTOCOL: eager against cooperative), with `fix`;
    None for another error. Configuration, not an outage: librdkafka asks again every 2 s for
    ever and reads nothing (fixer 57-y N-3), so the router (SourceErrors) and the idempotent
    consumer (consumer/client.py) both stop on it. `group`: its group id, named when given
    (fixer 58-a: neither line said which group)."""
    if error.code() != KafkaError.INCONSISTENT_GROUP_PROTOCOL:
        return None
    named = f" {group!r}" if group else ""
    return f"the consumer group{named} refused {member}: {describe(error)}; {fix}"


def unfetched_offsets(error: KafkaError) -> OffsetsUnfetched | None:
    """The consumer error of librdkafka issue #5586 (errors.OffsetsUnfetched), else None."""
    # The case: a request-level error, which names no partition (`for 0 partition(s)`).
    if "Failed to fetch committed offsets for 0 partition" not in error.str():
        return None
    return OffsetsUnfetched(f"the consumer's partitions will never be read: {describe(error)} "
                            "(librdkafka does not ask again, its issue #5586); only a new "
                            f"consumer reads them (the router exits {EXIT_RESTART} for its "
                            "supervisor)", code=error.code())


def report_deleted_offsets(consumer: Consumer, partitions: list[TopicPartition],
                           timeout_s: float, log: logging.Logger, *,
                           committed: list[TopicPartition] | None = None,
                           ) -> list[TopicPartition] | None:
    """Say when a partition's committed offset is below its log start: the records between were
    deleted (retention) before the group read them, and librdkafka's auto.offset.reset goes on
    from the log start with a line of its own only (QA 31-b: 55 events skipped, nothing said).
    `committed`: the partitions' committed offsets when the caller has them, else asked for.
    Best effort: a partition whose offsets do not come is not checked. Returns the committed
    offsets (None when they did not come)."""
    if committed is None:
        try:
            committed = consumer.committed(partitions, timeout=timeout_s)
        except KafkaException:
            return None
    for partition in committed:
        if partition.error is not None or partition.offset < 0:
            continue  # no committed offset: a new group starts where auto.offset.reset says
        try:
            low, _ = consumer.get_watermark_offsets(partition, timeout=timeout_s)
        except KafkaException:
            continue
        if low > partition.offset:
            gap = low - partition.offset
            log.log(logging.WARNING if gap == 1 else logging.ERROR,
                    "event=raw_records_deleted topic=%s partition=%d offsets=%d-%d count=%d "
                    "hint=%r", partition.topic, partition.partition, partition.offset, low - 1,
                    gap, "the raw topic's retention deleted them before this group read them; "
                    "transaction markers and aborted records count too, but events among them "
                    "were never delivered: their outbox rows are still there (the cleanup "
                    "deletes delivered rows only); republish them with `cdc-router outbox "
                    "republish -c CONFIG --since TIME --dry-run`, then without --dry-run "
                    "(CONFIG: this router's config file; TIME: before it stopped; README, "
                    "runbook)")
    return committed


def rewind_to_committed(consumer: Consumer, timeout_s: float) -> list[TopicPartition]:
    """Seek every assigned partition back to its committed offset (the start if none); the
    committed offsets."""
    with _fatal_for_the_consumer():
        assignment = consumer.assignment()
        if not assignment:
            return []
        offsets: list[TopicPartition] = consumer.committed(assignment, timeout=timeout_s)
        for committed in offsets:
            if committed.error is not None:
                # Without the committed offset we would re-read from the start: refuse instead.
                raise KafkaException(committed.error)
            offset = committed.offset if committed.offset != OFFSET_INVALID else OFFSET_BEGINNING
            consumer.seek(TopicPartition(committed.topic, committed.partition, offset))
        return offsets


def partition_marks(consumer: Consumer) -> dict[tuple[str, int], tuple[int, int]]:
    """(position, high watermark) per assigned partition, from the last fetch's watermarks
    (no network call); partitions with no position yet are left out."""
    marks = {}
    for position in consumer.position(consumer.assignment()):
        _, high = consumer.get_watermark_offsets(position, cached=True)
        if position.offset >= 0 and high >= 0:
            marks[(position.topic, position.partition)] = (position.offset, high)
    return marks


def next_records(consumer: Consumer, batch: int, wait_s: float,
                 revoked: set[tuple[str, int]]) -> list[Message]:
    """Up to `batch` records: block for the first (at most wait_s), then take what has already
    arrived. One consume() of `batch` would wait its whole timeout for the batch to fill, and
    every record of a quiet stream would wait with it.

    `revoked` is where the caller's rebalance callbacks add the partitions they give up. The
    second consume() may serve a rebalance that takes the first record's partition: its offset
    was committed on revoke without it, and whoever owns the partition now reads it again, so
    it is dropped here (librdkafka drops such records only within one consume() call).
    """
    first = _consume(consumer, 1, wait_s)
    if not first:
        return first
    revoked.clear()
    arrived = _consume(consumer, batch - 1, 0)
    if revoked:
        first = [message for message in first
                 if (message.topic(), message.partition()) not in revoked]
    return first + arrived


def _consume(consumer: Consumer, count: int, wait_s: float) -> list[Message]:
    """consume(); a fatal error it raises is the consumer's (fatal_kafka_error with
    consumer=True: a fenced static member, for which the router builds a new consumer),
    never taken for the producer's fence (router/renewal.py)."""
    with _fatal_for_the_consumer():
        records: list[Message] = consumer.consume(num_messages=count, timeout=wait_s)
    return records


@contextmanager
def _fatal_for_the_consumer() -> Iterator[None]:
    """A KafkaException that stops the consumer as the consumer's fatal error; others pass.
    Review, session 30: one out of the rewind's committed()/seek() was backed off for ever."""
    try:
        yield
    except KafkaException as failure:
        error = kafka_error_of(failure)
        if error is not None and stops_consumer(error):
            raise fatal_kafka_error(f"the consumer failed for good: {describe(error)}", error,
                                    consumer=True) from failure
        raise
