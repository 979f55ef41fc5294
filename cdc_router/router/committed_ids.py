"""Ids whose events are committed on their destinations, read back from the dedup changelog.

The router writes each id it delivers to the changelog in the same Kafka transaction as the
delivery, so a committed mark is proof of delivery that outlives the process that wrote it.
The cleanup reads the marks back (its sweep) so that the rows a killed router had delivered but
not yet deleted are deleted all the same. Two kinds of marks are not proof:
- marks of open or aborted transactions: the changelog is read with read_committed;
- marks of dead-lettered events (the router remembers their ids too, so that a replay is not
  dead-lettered twice; not at stage decode: dead_letter.marks_delivery), whose rows stay. They
  are keyed `dead:` (replay.DEAD_LETTERED_KEY_PREFIX) and skipped. Earlier versions marked them
  like deliveries; for those, the ids in the dead-letter topic's `dlq.event.id` header, written
  in the same transaction as the mark, are left out (their letters name no dlq.source.group,
  which came later; a later letter keeps no `batch:` mark of its id out: that is a delivery).
  A chunk of marks is released only once the dead-letter topic has been read past its log end
  as of after the chunk was read: every dead letter of those transactions lies below that end,
  so it has been seen. A letter gone from that topic (its retention) leaves such an old mark
  unguarded; a `dead:` mark needs none.
  Only letters of this pipeline's sources count: another pipeline sharing the dead-letter topic
  may dead-letter the same id from its own raw topic while this one delivers it.
  A mark written by `cdc-router dlq replay` (key `replayed:`) is proof all the same: the
  replay delivered that dead letter, so its row goes too.

Only for `delivery.guarantee: exactly_once`: in at_least_once the marks are not written in a
transaction with their records, so a mark does not prove a delivery.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from cdc_router.dead_letter import EVENT_ID, SOURCE_GROUP, SOURCE_TOPIC, STAGE, marks_delivery
from cdc_router.kafka.consumer import record_headers
from cdc_router.kafka.errors import REFUSED_CREDENTIALS
from cdc_router.kafka.lookups import AdminConnection, log_end_offsets
from cdc_router.kafka.read_positions import assign_added, assign_from_beginning, reached
from cdc_router.kafka.reader import LEAN_QUEUE, reassigned
from cdc_router.router.replay import (
    DEAD_LETTERED_KEY_PREFIX,
    REPLAYED_KEY_PREFIX,
    parse_changelog,
)

# Dead-lettered ids are kept a little longer than their marks can live (the changelog's
# retention.ms: the window, or RouterConfig.changelog_keep_ms): a mark and its dead letter carry
# about the same time.
_DEAD_LETTER_MARGIN_MS = 3_600_000
# Short polls: the sweep runs on the cleaner's thread between deletes, and must not hold them up.
_POLL_S = 0.1
# Records a consume() call returns: a dead letter may hold a big row, a mark up to 64 KB of ids.
_RECORDS = 20
# The changelog's partitions are listed again this often: partitions added since are read too.
_RELIST_S = 60.0
# After a failed step the consumers are renewed, at most this often.
_RENEW_EVERY_S = 60.0


class CommittedIds:
    """Reads the changelog from its start, then follows it; never commits offsets."""

    def __init__(self, kafka_config: Mapping[str, Any], *, changelog_topic: str, group: str,
                 dead_letter_topic: str, window_ms: int,
                 ours: Callable[[str, str | None], bool]) -> None:
        """`group`: this pipeline's source.group_id; only its marks prove a delivery.
        `ours(dlq.source.topic, dlq.source.group)`: whether a dead letter is this pipeline's
        (router/dlq_replay.py, sources_of)."""
        self._config = {
            **kafka_config,
            # QA 33-a: with librdkafka's 64 MB read-ahead of each topic (a dead letter may hold
            # a big row), a restarted router held ~100 MB more after its sweep.
            **LEAN_QUEUE,
            "group.id": f"{kafka_config.get('client.id', 'cdc-router')}-cleanup-sweep",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
        self._client_config = dict(kafka_config)
        self._changelog_topic = changelog_topic
        self._group = group
        self._dead_letter_topic = dead_letter_topic
        self._ours = ours
        self._keep_dead_ms = window_ms + _DEAD_LETTER_MARGIN_MS
        self._changelog: Consumer | None = None
        self._changelog_partitions: list[int] = []
        self._listed = 0.0  # monotonic time the changelog's partitions were last listed
        self._dead_letters: Consumer | None = None
        # topic → its consumer's partitions assigned at an offset (kafka/reader.py reassigned)
        self._assigned_at: dict[str, dict[int, int]] = {}
        self._renewed = float("-inf")  # monotonic time of the last renewal
        self._admin = AdminConnection(self._client_config)
        self._dead: OrderedDict[str, int] = OrderedDict()  # dead-lettered id → when seen (ms)
        # Marks read from the changelog but not handed out yet: a record holds a batch's ids.
        # The flag: written by a dlq replay, so a delivery even though the id was dead.
        self._unread: list[tuple[str, int, bool]] = []
        # Marks read but not released yet, and the dead-letter log ends to read past first.
        self._held: tuple[list[tuple[str, int, bool]], dict[int, int]] | None = None
        # A topic refused to these consumers, raised at each step until they are renewed:
        # librdkafka reports it once per consumer (review 51-d F8: the sweep failed twice,
        # then stalled without a line, the rows delivered before a restart left in the table).
        self._refusal: KafkaException | None = None

    def next(self, max_ids: int) -> list[tuple[str, int]]:
        """Up to `max_ids` more (event id, delivered ms) in changelog order; [] if none is ready.

        Raises KafkaException or DeliveryError (a topic missing) when Kafka cannot answer; the
        caller retries later, and nothing read so far is lost. After a KafkaException the next
        call reads on with new consumers, from the same positions (QA 39-b: after the broker's
        outage the changelog consumer failed every metadata request for 8 minutes, until the
        process ended, while new clients answered at once).
        """
        try:
            return self._next(max_ids)
        except KafkaException as failure:
            # At most every _RENEW_EVERY_S: a step fails every 30 s in an outage (review 39-2).
            if time.monotonic() - self._renewed >= _RENEW_EVERY_S:
                self._renewed = time.monotonic()
                # A consumer that cannot be made now leaves the stale one, asked again later.
                with contextlib.suppress(KafkaException):
                    # Both readers are renewed: the line of one names the other's failure
                    # too (QA 51-i L2: the changelog's, the dead-letter topic's refusal).
                    self._renew(f"{str(failure)!r} (a read of the sweep failed: each of its "
                                "readers is renewed)")
            raise

    def _next(self, max_ids: int) -> list[tuple[str, int]]:
        if self._refusal is not None:
            raise self._refusal
        if self._held is None:
            marks = self._read_marks(max_ids)
            if not marks:
                return []
            try:
                ends = self._dead_letter_ends()
            except BaseException:  # the marks are out of the changelog consumer: keep them
                self._unread[:0] = marks  # (review 47-b F3: they were never swept)
                raise
            self._held = (marks, ends)
        self._read_dead_letters()
        marks, ends = self._held
        if not self._dead_letters_reached(ends):
            return []
        self._held = None
        return [(event_id, ms) for event_id, ms, replayed in marks
                if replayed or event_id not in self._dead]

    def _renew(self, why: str) -> None:
        self._admin.reset()
        if self._changelog is not None:
            self._changelog = self._reassigned(self._changelog, self._changelog_topic,
                                               self._changelog_partitions, why)
        if self._dead_letters is not None:
            self._dead_letters = self._reassigned(
                self._dead_letters, self._dead_letter_topic,
                [tp.partition for tp in self._dead_letters.assignment()], why)
        self._refusal = None  # the new consumers ask the broker again

    def _reassigned(self, stale: Consumer, topic: str, partitions: list[int],
                    why: str) -> Consumer:
        """A new consumer of `topic` at `stale`'s positions (kafka/reader.py reassigned)."""
        renewed, self._assigned_at[topic] = reassigned(
            stale, self._config, topic, partitions, self._assigned_at.get(topic, {}), why)
        return renewed

    def close(self) -> None:
        for consumer in (self._changelog, self._dead_letters):
            if consumer is not None:
                consumer.close()
        self._changelog = self._dead_letters = None

    def _read_marks(self, max_ids: int) -> list[tuple[str, int, bool]]:
        if self._changelog is None:
            self._changelog = self._consumer(self._changelog_topic, "dedup changelog")
            self._changelog_partitions = sorted(
                tp.partition for tp in self._changelog.assignment())
            self._listed = time.monotonic()
        elif time.monotonic() - self._listed >= _RELIST_S:
            self._changelog_partitions = assign_added(
                self._changelog, self._changelog_topic, self._changelog_partitions,
                "dedup changelog")
            self._listed = time.monotonic()
        replayed = REPLAYED_KEY_PREFIX.encode()
        dead = DEAD_LETTERED_KEY_PREFIX.encode()
        records = 0  # at most max_ids records a step, ours or not (review 33-3: another
        # pipeline's marks were read to the changelog's end in one step, the deletes waiting)
        while len(self._unread) < max_ids and records < max_ids:
            # A few records a call: those a call returns are out of librdkafka's queue, which
            # fills again meanwhile (QA 33-a: 10,000 a call held ~100 MB after a restart).
            messages = self._changelog.consume(num_messages=_RECORDS, timeout=_POLL_S)
            if not messages:
                break
            records += len(messages)
            for message in messages:
                error = message.error()
                if error is not None and error.code() in REFUSED_CREDENTIALS:
                    raise self._refused(self._changelog_topic, error)  # QA 31-c: unsaid
                key = message.key()
                if not error and not (key is not None and key.startswith(dead)):
                    by_replay = key is not None and key.startswith(replayed)
                    self._unread += [(event_id, ms, by_replay) for event_id, ms
                                     in parse_changelog(key, message.value(),
                                                        group=self._group)]
        marks, self._unread = self._unread[:max_ids], self._unread[max_ids:]
        return marks

    def _refused(self, topic: str, error: KafkaError) -> KafkaException:
        """The refusal of `topic`, kept until the consumers are renewed, naming the grant."""
        if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            error = KafkaError(error.code(), f"{error.str()}: this process's Kafka principal may "
                               f"not read topic {topic}; grant it Read on the topic (the "
                               "cleanup's sweep reads it; until then the rows delivered "
                               "before a restart stay in the table)")
        self._refusal = KafkaException(error)
        return self._refusal

    def _dead_letter_consumer(self) -> Consumer:
        if self._dead_letters is None:
            self._dead_letters = self._consumer(self._dead_letter_topic, "dead-letter")
        return self._dead_letters

    def _read_dead_letters(self) -> None:
        consumer = self._dead_letter_consumer()
        now_ms = int(time.time() * 1000)
        while messages := consumer.consume(num_messages=_RECORDS, timeout=_POLL_S):
            for message in messages:
                error = message.error()
                if error is not None and error.code() in REFUSED_CREDENTIALS:
                    raise self._refused(self._dead_letter_topic, error)
                if error:
                    continue
                headers = {name: value.decode(errors="replace")
                           for name, value in record_headers(message)}
                event_id = headers.get(EVENT_ID)
                # Only the letters of versions that marked them `batch:`: those name no group
                # (a later header). A later letter's mark is `dead:`, skipped; a `batch:` mark
                # of its id is a delivery since (review 43), whose row goes.
                if (event_id is not None and SOURCE_GROUP not in headers
                        and marks_delivery(headers.get(STAGE, ""))
                        and self._ours(headers.get(SOURCE_TOPIC, ""), None)):
                    self._dead[event_id] = now_ms
                    self._dead.move_to_end(event_id)
        while self._dead and next(iter(self._dead.values())) < now_ms - self._keep_dead_ms:
            self._dead.popitem(last=False)

    def _dead_letter_ends(self) -> dict[int, int]:
        return log_end_offsets(self._admin, self._dead_letter_topic,
                               [tp.partition for tp in self._dead_letter_consumer().assignment()])

    def _dead_letters_reached(self, ends: dict[int, int]) -> bool:
        return reached(self._dead_letter_consumer(), self._dead_letter_topic, ends,
                       self._assigned_at.get(self._dead_letter_topic))

    def _consumer(self, topic: str, what: str) -> Consumer:
        consumer = Consumer(self._config)
        try:
            assign_from_beginning(consumer, topic, what)
        except BaseException:
            consumer.close()
            raise
        return consumer
