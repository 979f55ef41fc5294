"""Reading a topic to its end: every partition from its beginning, up to ends taken first.

Deterministic, unlike "stop once nothing came for N seconds": the end offsets are fetched
before reading, and the read stops when every partition's position has reached its end.
Read with read_committed and without a group: no offsets are ever committed.

Two ends, for two questions:
- "stable" (the last stable offset): what is committed now; an open transaction is not waited
  for (`dlq list`);
- "log_end" (the high watermark, open transactions included): nothing written before the call
  may be missed, so an open transaction is waited for until it commits or aborts (the router's
  dedup changelog restore).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from cdc_router.errors import DeliveryError, fatal_kafka_error
from cdc_router.kafka.errors import REFUSED_CREDENTIALS, describe, kafka_error_of
from cdc_router.kafka.logs import serve_logs

End = Literal["stable", "log_end"]

log = logging.getLogger("cdc_router.kafka")

# Metadata and offset lookups: the broker answers in milliseconds; 30 s covers a controller
# election, after which the caller's own retry (or the user) takes over.
_LOOKUP_TIMEOUT_S = 30
# One log-end lookup of log_end_offsets, retried with a new admin client until its deadline:
# after a leader's kill the first one answered only at its timeout while a new client's
# answered at once (QA 38-a O1: restores of 28-62 s with 30 s a lookup).
_LOG_END_ATTEMPT_S = 10
# A topic just created answers NOT_LEADER_FOR_PARTITION until its leader is known; librdkafka
# does not retry that for a watermark query, so we do, this often.
_LEADER_WAIT_S = 0.5
# A topic is taken for deleted after this many such answers in a row, _LEADER_WAIT_S apart: a
# broker just restarted may say so once of a topic that exists.
_DELETED_ANSWERS = 3
# Messages a consume() call returns, and librdkafka's prefetch queue (queued.max.messages.kbytes),
# of a lean reader: a dedup changelog holds records of up to 64 KB (router/replay.py), and with
# the defaults (10,000 messages, a 64 MB queue) a restore kept up to ~70 MB of fetched records
# alive at once, which the C heap kept after the restore (measured: 70 MB of a router's RSS
# restoring 1M ids, against 3 MB with these; tests/bench/replay_memory.py).
_DEFAULT_BATCH = 10_000
_LEAN_BATCH = 100
_LEAN_QUEUE_KBYTES = 4096
# A full queue postpones the next fetch by fetch.queue.backoff.ms (librdkafka's default 1 s):
# a small queue fills at once, so the wait must be short too (at 1 s a 1M-id restore took 8.6 s
# instead of 1.9).
_LEAN_QUEUE_BACKOFF_MS = 10


class AdminConnection:
    """An AdminClient made on first use, and made anew after a failed lookup.

    After a broker restart a long-lived AdminClient keeps answering FENCED_LEADER_EPOCH from
    its stale metadata (measured on Kafka 4.3 with librdkafka 2.x: still failing after 20 s)
    where a new one answers at once.
    """

    def __init__(self, config: Mapping[str, Any],
                 factory: Callable[[dict[str, Any]], AdminClient] = AdminClient) -> None:
        # Its lines are served now (serve_logs): not the broker's idle close of its connection
        # every connections.max.idle.ms (10 min), a line each time it is used (review 32-2).
        self._config = {**config, "log.connection.close": False}
        self._factory = factory
        self._client: AdminClient | None = None

    def client(self) -> AdminClient:
        """The client; the lines it logged since its last use are served first (an AdminClient
        queues them until poll(), which nothing else calls)."""
        if self._client is None:
            self._client = self._factory(self._config)
        else:
            serve_logs(self._client)
        return self._client

    def reset(self) -> None:
        if self._client is not None:
            serve_logs(self._client)  # what it logged before failing
        self._client = None

    def answer(self, request: Callable[[AdminClient], Any], timeout_s: float) -> Any:
        """The result of the future `request(client)` gives; raised as it failed, after which
        the next request gets a new client."""
        try:
            return request(self.client()).result(timeout=timeout_s)
        except (KafkaException, TimeoutError):
            self.reset()
            raise


class ReadTimedOut(DeliveryError):
    """A topic was not read to its end in time: the cluster is slow or a transaction is stuck,
    not a setting to change."""


def log_end_offsets(admin: AdminConnection, topic: str, partitions: list[int],
                    deadline: float | None = None) -> dict[int, int]:
    """partition → the log end offset as read_uncommitted sees it (open transactions included).

    A read_committed consumer's watermarks stop at the last stable offset, which an open
    transaction holds back; this is where a record written before now certainly lies below.
    Failures (a leader not yet known, a broker just restarted) are retried with a new client
    until `deadline` (default: one lookup's timeout from now), then raised.
    """
    deadline = time.monotonic() + _LOOKUP_TIMEOUT_S if deadline is None else deadline
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    said_deleted = 0  # answers in a row that the topic does not exist
    while True:
        try:
            futures = admin.client().list_offsets(
                {TopicPartition(topic, p): latest for p in partitions},
                isolation_level=IsolationLevel.READ_UNCOMMITTED,
                request_timeout=_LOG_END_ATTEMPT_S)
            ends = {tp.partition: future.result().offset for tp, future in futures.items()}
            unknown = [p for p, offset in ends.items() if offset < 0]
            if not unknown:
                return ends
            # QA 37-a: for ~52 s after a partition's leader was killed, list_offsets answered
            # -1001 (OFFSET_INVALID) with no error, and a restore took the changelog for empty.
            raise KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE, "no log end "
                                            f"offset for partitions {unknown} (a leader moved?)"))
        except KafkaException as failure:
            said_deleted = said_deleted + 1 if _deleted(admin, topic) else 0
            if said_deleted >= _DELETED_ANSWERS:
                # No wait brings it back: retrying would log twice a second until the deadline.
                raise DeliveryError(f"topic {topic} does not exist any more (deleted while in "
                                    "use?): recreate it with `cdc-router topics apply -c "
                                    "<config>`; what it held is gone") from failure
            if time.monotonic() > deadline:
                raise
            log.warning("event=offsets_lookup_failed topic=%s error=%r; retrying with a new "
                        "admin client", topic, str(failure))
            admin.reset()
        time.sleep(_LEADER_WAIT_S)


def _deleted(admin: AdminConnection, topic: str) -> bool:
    """Whether the cluster answers that `topic` does not exist (False when it cannot answer).
    DescribeTopics, not a metadata request, which a broker may answer by creating the topic."""
    futures = admin.client().describe_topics(TopicCollection([topic]),
                                             request_timeout=_LOOKUP_TIMEOUT_S)
    try:
        futures[topic].result()
    except KafkaException as failure:
        error = kafka_error_of(failure)
        return error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    return False


def stable_offsets(consumer: Consumer, topic: str, partitions: list[int],
                   deadline: float) -> dict[int, int]:
    """partition → the last stable offset (a read_committed consumer's high watermark)."""
    ends = {}
    for partition in partitions:
        while True:
            try:
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=_LOOKUP_TIMEOUT_S, cached=False)
                if high >= 0:  # -1001, no end known (a leader just moved), is asked again
                    break
                failure = KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE,
                                                    f"no end offset for {topic}[{partition}]"))
            except KafkaException as error:
                failure = error
            if time.monotonic() > deadline:
                raise failure
            time.sleep(_LEADER_WAIT_S)
        ends[partition] = int(high)
    return ends


def assign_from_beginning(consumer: Consumer, topic: str, what: str) -> list[int]:
    """Assign every partition of `topic` from its first offset; DeliveryError if it is missing.

    Never creates the topic by looking it up (the consumer's allow.auto.create.topics is off):
    `topics apply` creates it.
    """
    found = consumer.list_topics(topic, timeout=_LOOKUP_TIMEOUT_S).topics.get(topic)
    if found is None or found.error is not None:
        raise DeliveryError(f"the {what} topic {topic} does not exist: run "
                            "`cdc-router topics apply -c <config>` first")
    partitions = sorted(found.partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    return partitions


def assign_added(consumer: Consumer, topic: str, partitions: list[int], what: str) -> list[int]:
    """Assign, from their beginning, the partitions added to `topic` (kafka-topics --alter)
    since `partitions` were; every partition now assigned. QA, session 30: a router listed the
    changelog's partitions once, never read the marks other instances wrote to the added ones,
    and delivered their replays again."""
    found = consumer.list_topics(topic, timeout=_LOOKUP_TIMEOUT_S).topics.get(topic)
    added = sorted(set(found.partitions) - set(partitions)) \
        if found is not None and found.error is None else []
    if added:
        log.warning("event=partitions_added topic=%s partitions=%s what=%r", topic,
                    ",".join(map(str, added)), what)
        consumer.incremental_assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in added])
    return sorted([*partitions, *added])


def reached(consumer: Consumer, topic: str, ends: Mapping[int, int]) -> bool:
    """Whether every partition's position is at its end, or it holds nothing below it."""
    for position in consumer.position([TopicPartition(topic, p) for p in ends]):
        end = ends[position.partition]
        if end <= 0 or position.offset >= end:
            continue
        if position.offset < 0:
            # Nothing consumed yet: reached only if retention left nothing below the end.
            low, _ = consumer.get_watermark_offsets(position, timeout=_LOOKUP_TIMEOUT_S,
                                                    cached=False)
            if low >= end:
                continue
        return False
    return True


def _positions(consumer: Consumer, topic: str, ends: Mapping[int, int]) -> dict[int, int]:
    return {tp.partition: tp.offset for tp in consumer.position(
        [TopicPartition(topic, p) for p in ends])}


def _shown(offsets: Mapping[int, int]) -> str:
    return ",".join(f"{partition}:{offset}" for partition, offset in sorted(offsets.items()))


# The prefetch settings of a lean reader (see _LEAN_QUEUE_KBYTES).
LEAN_QUEUE = {"queued.max.messages.kbytes": _LEAN_QUEUE_KBYTES,
              "fetch.queue.backoff.ms": _LEAN_QUEUE_BACKOFF_MS}


class TopicReader:
    """Reads one topic to its end, and again later from where it stopped; built lazily."""

    def __init__(self, config: Mapping[str, Any], topic: str, *, group_id: str,
                 what: str, lean: bool = False, renewable: bool = False) -> None:
        """`lean`: little buffered at a time, for a topic of large records read once.
        `renewable`: a consumer whose lookups fail is replaced (see _ends); not for a reader
        whose consumer was handed out (its `consumer`, which `dlq replay` commits under)."""
        self._batch = _LEAN_BATCH if lean else _DEFAULT_BATCH
        self._renewable = renewable
        self._config = {
            **config,
            **(LEAN_QUEUE if lean else {}),
            # Needed by librdkafka, never joined: partitions are assigned, offsets not committed.
            "group.id": group_id,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "allow.auto.create.topics": False,
        }
        self._client_config = {key: value for key, value in config.items()
                               if key != "allow.auto.create.topics"}  # not an admin property
        self._topic = topic
        self._what = what
        self._consumer: Consumer | None = None
        self._partitions: list[int] = []
        self._admin = AdminConnection(self._client_config)

    def read_to_end(self, *, end: End = "stable",
                    timeout_s: float = 300.0) -> Iterator[Message]:
        """Yield every committed record up to the ends as of this call (see the module doc).

        Records consumed past an end in the last fetch are yielded too, not dropped: the
        next call goes on after them. Control markers and transient errors are passed over.
        """
        deadline = time.monotonic() + timeout_s
        consumer, ends = self._ends(end, deadline)
        started, read = _positions(consumer, self._topic, ends), 0
        while not reached(consumer, self._topic, ends):
            if time.monotonic() > deadline:
                raise ReadTimedOut(f"reading the {self._what} topic {self._topic} to its end "
                                   f"took over {timeout_s:.0f}s; is a transaction stuck open?")
            for message in consumer.consume(num_messages=self._batch, timeout=0.2):
                error = message.error()
                if error is None:
                    read += 1
                    yield message
                elif error.code() in REFUSED_CREDENTIALS:  # not the group's: never joined (QA 31-d)
                    # QA 31-c: a topic the principal may not read was passed over like a
                    # transient error for 300 s, then "is a transaction stuck open?".
                    raise fatal_kafka_error(
                        f"reading the {self._what} topic {self._topic} failed for good: "
                        f"{describe(error)}; " + (
                            "grant this principal Read on the topic"
                            if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED else
                            "check the kafka section's security settings"), error)

        log.info("event=topic_read topic=%s ends=%s from=%s records=%d", self._topic,
                 _shown(ends), _shown(started), read)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _ends(self, end: End, deadline: float) -> tuple[Consumer, dict[int, int]]:
        """The consumer, and the ends to read to. A renewable reader whose lookups fail for a
        lookup's timeout is given a new consumer at the same positions, which asks again until
        `deadline` (QA 38-a O2: after a broker's kill the changelog reader's consumer answered
        "Failed to get metadata" for minutes while new clients worked, and the router's next
        restore failed: exit 75, 118-193 s without delivery)."""
        if not self._renewable or self._consumer is None:
            return self._looked_up(end, deadline)
        try:
            return self._looked_up(end, min(deadline, time.monotonic() + _LOOKUP_TIMEOUT_S))
        except KafkaException as failure:
            if time.monotonic() > deadline:
                raise
            log.warning("event=reader_renewed topic=%s error=%r; a new consumer asks again, "
                        "from the same positions", self._topic, str(failure))
            self._renew(self._consumer)
        return self._looked_up(end, deadline)

    def _looked_up(self, end: End, deadline: float) -> tuple[Consumer, dict[int, int]]:
        consumer = self._assigned(refresh=True)
        ends = stable_offsets(consumer, self._topic, self._partitions, deadline)
        if end == "log_end":
            # The committed end, asked of the leader by the consumer, is the floor of the log
            # end the admin client gives: a second opinion (QA 37-a: after the changelog's
            # leader was killed, the admin's answer, -1001, made a restore read no mark).
            logged = log_end_offsets(self._admin, self._topic, self._partitions, deadline)
            ends = {p: max(offset, ends.get(p, 0)) for p, offset in logged.items()}
        return consumer, ends

    def _renew(self, stale: Consumer) -> None:
        """Replace the consumer by one assigned where it stood (its positions are its own, not
        the broker's): nothing read is read again, nothing not yet read is passed over."""
        positions = stale.position([TopicPartition(self._topic, p) for p in self._partitions])
        self._consumer = None
        with contextlib.suppress(KafkaException, RuntimeError):
            stale.close()
        consumer = Consumer(self._config)
        # Nothing consumed yet (a negative position): from the beginning, as first assigned.
        consumer.assign([TopicPartition(self._topic, tp.partition,
                                        tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                         for tp in positions])
        self._consumer = consumer

    @property
    def consumer(self) -> Consumer:
        """The consumer, built and assigned on first use: its group metadata names the reader's
        group (`dlq replay` commits offsets under it in a transaction)."""
        return self._assigned()

    def _assigned(self, *, refresh: bool = False) -> Consumer:
        """The consumer; `refresh`: assigned also the partitions added to the topic since."""
        if self._consumer is None:
            consumer = Consumer(self._config)
            try:
                self._partitions = assign_from_beginning(consumer, self._topic, self._what)
            except BaseException:
                consumer.close()
                raise
            self._consumer = consumer
        elif refresh:
            self._assign_added(self._consumer)
        return self._consumer

    def _assign_added(self, consumer: Consumer) -> None:
        self._partitions = assign_added(consumer, self._topic, self._partitions, self._what)


class ChangelogReader(TopicReader):
    """The router's dedup changelog, read to its log end on each partition assignment."""

    def __init__(self, config: Mapping[str, Any], topic: str) -> None:
        super().__init__(config, topic, what="dedup changelog", lean=True, renewable=True,
                         group_id=f"{config.get('client.id', 'cdc-router')}-changelog-reader")

    def catch_up(self, timeout_s: float = 300.0) -> Iterator[tuple[bytes | None, bytes | None]]:
        """(key, value) of every committed mark written before this call, waiting for a
        transaction still open (it may hold marks of a previous owner of our partitions)."""
        for message in self.read_to_end(end="log_end", timeout_s=timeout_s):
            yield message.key(), message.value()
