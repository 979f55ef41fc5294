"""Lookups of a topic's metadata and offsets that survive a broker's restart or a leader's
move: an admin client made anew after a failure, -1001 answers asked again, a topic deleted
told from a leader not yet known."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from cdc_router.errors import DeliveryError
from cdc_router.kafka.errors import kafka_error_of
from cdc_router.kafka.logs import refused_since, serve_logs

log = logging.getLogger("cdc_router.kafka")

# Metadata and offset lookups: the broker answers in milliseconds; 30 s covers a controller
# election, after which the caller's own retry (or the user) takes over.
LOOKUP_TIMEOUT_S = 30
# The first attempt of an offsets lookup that is retried (its timeout), and how much longer each
# next one is, up to LOOKUP_TIMEOUT_S: after a leader's kill the first one answered only at its
# timeout, while the next one answered at once (QA 38-a O1: restores of 28-62 s with 30 s a
# lookup; QA 39-a: 30 s in a watermark query), and a loaded host may need the longer ones.
_ATTEMPT_S = 10


def _next_attempt_s(previous_s: float, deadline: float) -> float:
    """The next attempt's timeout: _ATTEMPT_S longer than the previous one's, at most
    LOOKUP_TIMEOUT_S, and ending by `deadline` (one second at least)."""
    return max(1.0, min(LOOKUP_TIMEOUT_S, previous_s + _ATTEMPT_S,
                        deadline - time.monotonic()))
# A topic just created answers NOT_LEADER_FOR_PARTITION until its leader is known; librdkafka
# does not retry that for a watermark query, so we do, this often.
LEADER_WAIT_S = 0.5
# A topic is taken for deleted after this many such answers in a row, LEADER_WAIT_S apart: a
# broker just restarted may say so once of a topic that exists.
_DELETED_ANSWERS = 3

# The first slice of a metadata lookup that stops at a refusal; each next one twice as long.
_REFUSAL_SLICE_S = 1.0


def metadata(admin: Any, timeout_s: float) -> Any:
    """admin.list_topics() within `timeout_s`, asked in slices (1 s, 2 s, the rest) so that a
    refusal librdkafka logs meanwhile (credentials, SASL mechanism, a certificate) raises the
    lookup's error at once (QA 56-d F-4: `topics apply` waited its 30 s lookup out after a
    refusal logged in 200 ms); its log lines are served after each failed slice."""
    started = time.monotonic()
    deadline, slice_s = started + timeout_s, _REFUSAL_SLICE_S
    while True:
        left = deadline - time.monotonic()
        try:
            return admin.list_topics(timeout=max(0.1, min(slice_s, left)))
        except KafkaException:
            serve_logs(admin)
            if left <= slice_s or refused_since(started):
                raise
        # 1 s, 2 s, then the rest in one ask: a slow broker's answer may take most of it
        # (reread 56-s F-3: slices of 1, 2, 4 s gave up on an answer slower than 4 s).
        slice_s = timeout_s if slice_s >= 2 * _REFUSAL_SLICE_S else 2 * slice_s


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


def log_end_offsets(admin: AdminConnection, topic: str, partitions: list[int],
                    deadline: float | None = None) -> dict[int, int]:
    """partition → the log end offset as read_uncommitted sees it (open transactions included).

    A read_committed consumer's watermarks stop at the last stable offset, which an open
    transaction holds back; this is where a record written before now certainly lies below.
    Failures (a leader not yet known, a broker just restarted) are retried with a new client
    until `deadline` (default: one lookup's timeout from now), then raised.
    """
    deadline = time.monotonic() + LOOKUP_TIMEOUT_S if deadline is None else deadline
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    said_deleted = 0  # answers in a row that the topic does not exist
    attempt_s = 0.0
    while True:
        attempt_s = _next_attempt_s(attempt_s, deadline)
        try:
            futures = admin.client().list_offsets(
                {TopicPartition(topic, p): latest for p in partitions},
                isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=attempt_s)
            ends = {tp.partition: future.result().offset for tp, future in futures.items()}
            unknown = [p for p, offset in ends.items() if offset < 0]
            if not unknown:
                return ends
            # QA 37-a: for ~52 s after a partition's leader was killed, list_offsets answered
            # -1001 (OFFSET_INVALID) with no error, and a restore took the changelog for empty.
            raise KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE, "no log end "
                                            f"offset for partitions {unknown} (a leader moved?)"))
        except KafkaException as failure:
            admin.reset()  # the next question, this one included, goes to a new client
            said_deleted = said_deleted + 1 if _deleted(admin, topic, attempt_s) else 0
            if said_deleted >= _DELETED_ANSWERS:
                # No wait brings it back: retrying would log twice a second until the deadline.
                raise DeliveryError(f"topic {topic} does not exist any more (deleted while in "
                                    "use?): recreate it with `cdc-router topics apply -c "
                                    "<config>`; what it held is gone") from failure
            if time.monotonic() > deadline:
                raise
            log.warning("event=offsets_lookup_failed topic=%s error=%r; retrying with a new "
                        "admin client", topic, str(failure))
        time.sleep(LEADER_WAIT_S)


def _deleted(admin: AdminConnection, topic: str, timeout_s: float) -> bool:
    """Whether the cluster answers that `topic` does not exist (False when it cannot answer).
    DescribeTopics, not a metadata request, which a broker may answer by creating the topic."""
    futures = admin.client().describe_topics(TopicCollection([topic]), request_timeout=timeout_s)
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
        attempt_s = 0.0
        while True:
            attempt_s = _next_attempt_s(attempt_s, deadline)
            try:
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=attempt_s, cached=False)
                if high >= 0:  # -1001, no end known (a leader just moved), is asked again
                    break
                failure = KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE,
                                                    f"no end offset for {topic}[{partition}]"))
            except KafkaException as error:
                failure = error
                # A lookup that took its timeout or was refused; a -1001 answer is asked again
                # twice a second, unsaid.
                log.warning("event=offsets_lookup_failed topic=%s partition=%d error=%r; "
                            "asking again", topic, partition, str(error))
            if time.monotonic() > deadline:
                raise failure
            time.sleep(LEADER_WAIT_S)
        ends[partition] = int(high)
    return ends
