"""The idempotent consume loop: effect first (through a dedup store), offset commit after.

Per record, in partition order:
1. read the event id (the `id` header, else the key) and decode the value; a malformed record is
   dead-lettered at once (stage "decode");
2. `store.run_once(group, event id, handler)`: DONE and DUPLICATE both mean the effect is
   safe, so the offset is stored; BUSY (another worker's live claim) means wait and retry;
3. a handler exception is retried with exponential backoff and full jitter; after
   `retry.max_attempts` failures the record is dead-lettered (stage "handle") and acknowledged;
4. a store failure (DedupStoreError), a schema registry that cannot answer (RegistryError
   from the decoder) or a failed dead-letter write (that write alone, not the handler) is
   retried without limit: an outage is not the record's fault, and skipping it would lose it.
A retry pauses the record's partition and seeks back to the record, so other partitions go on
and polling continues (no race with max.poll.interval.ms, rebalances are served).
Stored offsets are committed every `commit_interval_s`, on revoke and on stop; once a batch is
handled, a partition's offset moves past the commit markers after its last record. A crash
between effect and commit redelivers the record; the dedup store turns it into a DUPLICATE.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from cdc_router.consumer.client import (
    commit_stored,
    consume_batch,
    consumer_error,
    noting_errors,
    positions_past,
    raise_reported,
)
from cdc_router.consumer.controls import ConsumerControls
from cdc_router.consumer.dead_letter import STAGE_DECODE, STAGE_HANDLE, DeadLetterWriter
from cdc_router.consumer.decode_guard import DecodeMismatch
from cdc_router.consumer.dedup.store import DedupKey, DedupStore, Outcome
from cdc_router.consumer.event import Decoder, KafkaMessage, read_event
from cdc_router.consumer.handler import Handler, check_wiring, guarded
from cdc_router.consumer.outage import StoreOutage
from cdc_router.consumer.retry import PartitionRetry, poll_timeout
from cdc_router.consumer.settings import ConsumerSettings, built
from cdc_router.consumer.store_checks import check_store
from cdc_router.dead_letter import shown_repr, without_frames
from cdc_router.errors import (
    DeadLetterRefused,
    DedupStoreError,
    DedupStoreRefused,
    DeliveryError,
    FatalKafkaError,
    MalformedRecord,
    MemberFenced,
    RegistryError,
    RetriableError,
)
from cdc_router.kafka.budget import RenewalBudget, unblocked_enough
from cdc_router.kafka.closing import Generations, close_all, close_aside
from cdc_router.kafka.membership import ListedFactory, MembershipWatch, admin_listed

log = logging.getLogger(__name__)

Context = TypeVar("Context")


class IdempotentConsumer(ConsumerControls, Generic[Context]):
    """Consumes `settings.topics` and runs `handler(event, context)` once per event id.

    `context` is what the store hands the effect (the Postgres connection inside the dedup
    transaction, the Redis client, None). run() blocks until stop() is called from another
    thread or a signal handler; constructing the object makes no network call.
    """

    def __init__(self, settings: ConsumerSettings, store: DedupStore[Context],
                 handler: Handler[Context], *, decoder: Decoder | None = None,
                 consumer_factory: Callable[[dict[str, str]], Any] = Consumer,
                 producer_factory: Callable[[dict[str, str]], Any] = Producer,
                 rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 members_factory: ListedFactory = admin_listed) -> None:
        check_wiring("IdempotentConsumer", settings, ConsumerSettings, store, handler, decoder)
        super().__init__()
        self.settings = settings
        self._store = store
        self._handler = guarded(handler)  # an awaitable or a CancelledError: a failure
        self._decoder = decoder
        self._mismatch = DecodeMismatch(settings.decode_mismatch_limit, decoder, clock)
        self._consumer_factory = consumer_factory
        self._dead_letters = DeadLetterWriter(settings.dead_letter_topic,
                                              settings.librdkafka_producer(), producer_factory,
                                              settings.dead_letter_timeout_s, settings.group_id)
        self._rng = rng or random.Random()
        self._clock = clock
        self._outage = StoreOutage(type(store).__name__, clock)  # its lines (QA 61-b F6)
        self._consumer: Any = None
        self._reported: list[KafkaError] = []  # what librdkafka gave its error_cb
        # A consumer its group no longer lists is replaced (kafka/membership.py, QA 39-c).
        self._membership = MembershipWatch.for_consumer(
            settings.librdkafka_consumer(), settings.librdkafka_admin(), settings.topics,
            members_factory, clock)
        self._renewals = RenewalBudget(clock)  # of the consumer, by the membership watch
        self._generations = Generations()
        self._retries: dict[tuple[str, int], PartitionRetry] = {}
        self._rewound: set[tuple[str, int]] = set()
        self._fresh: list[TopicPartition] = []
        self._assigned = False  # once: a TLS handshake worked (client.raise_reported)
        self._stored_since_commit = False
        self._stored: dict[tuple[str, int], int] = {}
        self._last_commit = 0.0

    def run(self) -> None:
        """Consume until stop(); commits what is done and closes the clients on the way out."""
        self._consumer = built(self._consumer_factory, noting_errors(
            self.settings.librdkafka_consumer(), self._reported), "consumer_config")
        self._last_commit = self._clock()
        log.info("event=consumer_started group=%s topics=%s store=%s", self.settings.group_id,
                 ",".join(self.settings.topics), type(self._store).__name__)
        try:
            self._dead_letters.open()
            self._dead_letters.require_topic(self._consumer, self._login_refused)
            check_store(self._store)  # a wrong DSN, no table: now, not at the first record
            self._subscribe()
            while not self._stop.is_set():
                self.poll_once()
        finally:
            self._shutdown()

    def _subscribe(self) -> None:
        self._generations.subscribe(self._consumer, self.settings.topics, self._on_assign,
                                    self._on_revoke, self._on_lost)

    def _rejoin(self, reason: str) -> None:
        """A new consumer for one its group no longer lists: it holds no partition, so nothing
        of it is stored, retried or paused any more."""
        log.warning("event=consumer_renewed group=%s reason=%r", self.settings.group_id, reason)
        stale = self._consumer
        self._consumer = built(self._consumer_factory, noting_errors(
            self.settings.librdkafka_consumer(), self._reported), "consumer_config")
        self._fresh, self._stored_since_commit, self._stored = [], False, {}
        self._retries, self._rewound = {}, set()
        self._generations.retire()  # the stale one's callbacks (its close runs them) do nothing
        close_aside(stale, "consumer")  # before the new one joins; bounded (kafka/closing.py)
        self._subscribe()

    def poll_once(self) -> None:
        """One iteration: resume due partitions, consume a batch, handle it, maybe commit."""
        consumer = self._consumer
        self._rewind_held(self._mismatch.expired())
        self._resume_due()
        messages = consume_batch(consumer, self.settings.batch_size, poll_timeout(
            self.settings.poll_timeout_s, self._retries, self._rewound, self._clock()))
        self._dead_letters.serve()  # its queued lines
        raise_reported(self._reported, at_start=not self._assigned,
                       group=self.settings.group_id)
        for message in messages:
            if self._stop.is_set():
                break  # its offset is not stored: the next owner gets it again
            error = message.error()
            if error is not None:
                consumer_error(error, self.settings.group_id)
                continue
            if (message.topic(), message.partition()) in self._rewound:
                continue  # the partition was sought back; this record comes again
            self._handle(message)
        else:  # every record handed over is handled (review 35: not only when idle)
            self._store_positions()
        if self._stored_since_commit and \
                self._clock() - self._last_commit >= self.settings.commit_interval_s:
            self._commit()
        try:
            self._membership.check(consumer)
        except MemberFenced as stranded:
            if not unblocked_enough() or not self._renewals.spend():
                raise  # a group that never takes it, or clients that never let go: exit 75
            self._rejoin(stranded.detail)

    def _handle(self, message: KafkaMessage) -> None:
        tp = (message.topic(), message.partition())
        retry = self._retries.get(tp)
        if retry is not None and retry.offset != message.offset():
            retry = None
        if retry is not None and retry.letter is not None:  # QA 56-e F-2: not the handler again
            self._dead_letter(message, retry=retry, **retry.letter)
            return
        attempt = (retry.failures if retry else 0) + 1
        try:
            event = read_event(message, source=self.settings.event_id_source,
                               header=self.settings.event_id_header, decoder=self._decoder,
                               attempt=attempt, keyed_topics=self._keyed_topics)
        except MalformedRecord as error:
            if self._mismatch.hold(message, error):  # the decoder may not fit the topic
                return
            if not self._rewind_held(self._mismatch.interrupted(message, error), tp):
                self._dead_letter(message, STAGE_DECODE, error, attempts=0, retry=retry)
            return
        except RegistryError as error:
            # An outage, like a store failure: the record is fine, so wait and retry it.
            self._retry_later(message, retry, "registry_unavailable", error)
            return
        if self._rewind_held(self._mismatch.decoded(tp[0]), tp):
            return  # the records held before it first, as letters
        key = DedupKey(self.settings.group_id, event.event_id)
        try:
            outcome = self._store.run_once(key, lambda context: self._handler(event, context))
        except DedupStoreRefused:
            raise  # its table missing, no grant: stop, as no retry mends it (review 47-e F7)
        except DedupStoreError as error:  # an outage's lines: outage.py; contention's: here
            self._retry_later(message, retry, self._outage.failed(error), error)
            return
        except RetriableError as error:
            self._outage.answered()  # the handler's failure: the store answered
            self._retry_later(message, retry, "handler_retriable", error)
            return
        except Exception as error:
            self._outage.answered()
            retry = retry or PartitionRetry(offset=message.offset())
            retry.failures += 1
            if self.settings.retry.exhausted(retry.failures):
                self._dead_letter(message, STAGE_HANDLE, error, attempts=retry.failures,
                                  retry=retry, event_id=event.event_id)
            else:
                self._retry_later(message, retry, "handler_failed", error)
            return
        self._outage.answered()
        if outcome is Outcome.BUSY:
            self._retry_later(message, retry, "claimed_elsewhere", None)
            return
        self._counts["processed" if outcome is Outcome.DONE else "duplicates"] += 1
        log.debug("event=handled id=%s outcome=%s topic=%s partition=%d offset=%d",
                  event.shown_id, outcome.value, *tp, message.offset())
        self._acknowledge(message)

    def _dead_letter(self, message: KafkaMessage, stage: str, error: Exception, *,
                     attempts: int, retry: PartitionRetry | None,
                     event_id: str | None = None) -> None:
        retry = retry or PartitionRetry(offset=message.offset())
        retry.letter = {"stage": stage, "error": without_frames(error),  # not its locals
                        "attempts": attempts, "event_id": event_id}
        try:
            self._dead_letters.send(message, stage=stage, error=error, attempts=attempts,
                                    event_id=event_id, drop_value=retry.drop_value)
        except DeadLetterRefused as refused:
            retry.refusals += 1
            retry.drop_value = retry.drop_value or refused.too_large
            # Once more at least (without its value if too large; review 47-e F6), then stop
            # rather than skip the record (a loss): a restart resumes here once it is fixed.
            if retry.refusals > 1 and self.settings.retry.exhausted(retry.refusals):
                raise FatalKafkaError(
                    f"{refused}; Kafka refused it {retry.refusals} times, so the consumer "
                    "stops rather than skip the record: check that the topic exists, that "
                    "this consumer may write to it, and its max.message.bytes") from refused
            self._retry_later(message, retry, "dead_letter_refused", refused)
            return
        except DeliveryError as delivery_error:
            # Not the record's fault (a broker away, a timeout): retried without limit.
            self._retry_later(message, retry, "dead_letter_failed", delivery_error)
            return
        self._counts["dead_lettered"] += 1
        self._acknowledge(message)
        # At once, not at the next commit_interval_s: a crash before the commit would send
        # the same dead letter again (nothing else records it). Dead letters are rare.
        self._commit()

    def _retry_later(self, message: KafkaMessage, retry: PartitionRetry | None, reason: str,
                     error: BaseException | None) -> None:
        """Pause the partition and rewind it to `message`, to be resumed after a backoff."""
        tp = (message.topic(), message.partition())
        retry = retry or PartitionRetry(offset=message.offset())
        retry.waits += 1
        delay = self.settings.retry.backoff(retry.waits, self._rng)
        retry.not_before = self._clock() + delay
        self._retries[tp] = retry
        self._rewound.add(tp)
        partition = TopicPartition(tp[0], tp[1], message.offset())
        self._consumer.pause([partition])
        try:
            self._consumer.seek(partition)
        except KafkaException as seek_error:
            # Resuming without the rewind would skip the records fetched after this one.
            # Stopping is safe: a restart resumes from the committed offsets.
            raise FatalKafkaError(f"cannot rewind {tp[0]}[{tp[1]}] to offset "
                                 f"{message.offset()} for a retry: {seek_error}") from seek_error
        self._counts["retries"] += 1
        # Waiting for another worker's claim is expected, not a problem worth a warning; a
        # store outage is said once by StoreOutage, not at each partition's retry.
        level = logging.DEBUG if error is None or reason == "store_failed" else logging.WARNING
        log.log(level, "event=retry_scheduled reason=%s topic=%s partition=%d offset=%d "
                "failures=%d delay_s=%.3f error=%s", reason, *tp, message.offset(),
                retry.failures, delay, "" if error is None else shown_repr(error)[:300])

    def _rewind_held(self, held: list[KafkaMessage], tp: object = None) -> bool:
        """Rewind each partition to its first `held` record, read again and dead-lettered as
        usual (its topic's hold is over); whether `tp` was one of them."""
        for message in held:
            self._retry_later(message, None, "decode_hold_ended", None)
        return any((message.topic(), message.partition()) == tp for message in held)

    def _acknowledge(self, message: KafkaMessage) -> None:
        tp = (message.topic(), message.partition())
        self._retries.pop(tp, None)
        self._store_offset(tp, message.offset() + 1)

    def _store_offset(self, tp: tuple[str, int], offset: int) -> None:
        try:
            self._consumer.store_offsets(offsets=[TopicPartition(tp[0], tp[1], offset)])
        except KafkaException as error:
            # The partition was revoked meanwhile; its new owner redelivers the record and
            # the dedup store reports it as a duplicate.
            log.info("event=offset_not_stored topic=%s partition=%d error=%s", *tp, error)
            return
        self._stored[tp] = offset
        self._stored_since_commit = True

    def _store_positions(self) -> None:
        """After a batch handled to its end: consumer/client.py's positions_past(), but not a
        partition awaiting a retry or holding records (consumer/decode_guard.py)."""
        for tp, offset in positions_past(self._consumer, self._stored, lambda tp: tp in
                                         self._retries or self._mismatch.holds(tp)):
            self._store_offset(tp, offset)

    def _resume_due(self) -> None:
        if self._fresh:
            # After a rebalance a partition must not stay paused by a retry of an earlier
            # assignment (unless a retry of this one paused it since); resume() of an
            # unpaused partition is a no-op.
            fresh = [p for p in self._fresh if (p.topic, p.partition) not in self._rewound]
            if fresh:
                self._consumer.resume(fresh)
            self._fresh = []
        now = self._clock()
        due = [tp for tp in self._rewound if self._retries[tp].not_before <= now]
        if due:
            self._consumer.resume([TopicPartition(topic, partition) for topic, partition in due])
            self._rewound.difference_update(due)

    def _commit(self, consumer: Any = None) -> None:
        """Commit the stored offsets synchronously; a refused commit only means redelivery."""
        self._last_commit = self._clock()
        self._stored_since_commit = False  # first: a fatal refusal leaves nothing to commit
        self._stored_since_commit = commit_stored(
            self._consumer if consumer is None else consumer, self.settings.group_id)

    def _login_refused(self) -> None:
        """Before the subscription: a poll (no record to return yet) serves error_cb."""
        self._consumer.poll(0)
        raise_reported(self._reported, at_start=not self._assigned,
                       group=self.settings.group_id)

    def _forget(self, partitions: list[TopicPartition]) -> None:
        for partition in partitions:
            tp = (partition.topic, partition.partition)
            self._retries.pop(tp, None)
            self._stored.pop(tp, None)
            self._rewound.discard(tp)
        self._mismatch.forget((p.topic, p.partition) for p in partitions)

    def _on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._fresh.extend(partitions)
        self._assigned = True
        # Low 57: an incremental round that adds nothing is no news; an eager empty list is.
        level = logging.DEBUG if not partitions and self.settings.incremental else logging.INFO
        log.log(level, "event=partitions_assigned group=%s partitions=%s",
                self.settings.group_id, _names(partitions))

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        # Still the owner: commit what is done, by `consumer` (in a stop, review 47-e F4).
        if self._stored_since_commit:
            self._commit(consumer)
        self._forget(partitions)
        log.info("event=partitions_revoked group=%s partitions=%s", self.settings.group_id,
                 _names(partitions))

    def _on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        # No longer the owner: a commit would be refused; the new owner redelivers.
        self._forget(partitions)
        log.warning("event=partitions_lost group=%s partitions=%s", self.settings.group_id,
                    _names(partitions))

    def _shutdown(self) -> None:
        try:
            if self._stored_since_commit:
                self._commit()
        finally:
            # The consumer's close leaves the group (on_revoke commits anything stored since)
            # and may raise: close_all keeps the error the loop leaves with, and closes the
            # dead-letter writer all the same (review 43).
            consumer, self._consumer = self._consumer, None
            close_all(consumer, self._dead_letters)
            log.info("event=consumer_stopped group=%s processed=%d duplicates=%d "
                     "dead_lettered=%d retries=%d", self.settings.group_id,
                     *self._counts.values())


def _names(partitions: list[TopicPartition]) -> str:
    return ",".join(f"{p.topic}[{p.partition}]" for p in partitions)
