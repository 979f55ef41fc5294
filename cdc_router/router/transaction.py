"""One batch of the router: its records, dead letters, changelog marks and consumed offsets.

Exactly once (KIP-98 transactions, KIP-447 offsets with the group metadata): everything of a
batch commits in one transaction (read_committed readers see all of it or none), the offsets
with it. At least once: an idempotent producer; the changelog marks are produced only once
every record of the batch is acknowledged, and the offsets committed only once the marks are,
so a mark never stands for an event that was not delivered.

Its clients are handed in (every path is unit-tested with fakes). The relay has no consumer:
its progress is a record (progress()), sent with the marks. JetStream records wait for commit().
Kafka errors (kafka.errors.classify): retriable -> the same call again after a backoff;
abortable -> BatchFailed (the caller aborts and rewinds); fatal or fenced -> FatalKafkaError.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from cdc_router.config.delivery import DeliverySettings
from cdc_router.dead_letter import DeadLetter
from cdc_router.errors import (
    EXIT_RESTART,
    BatchFailed,
    ConfigError,
    DeliveryError,
    FatalKafkaError,
    JetStreamError,
    JetStreamRefused,
    RecordRefused,
    TransactionInDoubt,
    fatal_kafka_error,
)
from cdc_router.kafka.commit_stamp import commit_metadata
from cdc_router.kafka.errors import (
    RECORD_REFUSED,
    ErrorAction,
    classify,
    describe,
    kafka_error_of,
    likely_cause,
    rival_hint,
    size_refusal,
    still_failing_hint,
)
from cdc_router.kafka.producer import DeliveryFailure, LatchingProducer, RecordCoordinates
from cdc_router.nats.publisher import JetStreamPublisher, NatsMessage
from cdc_router.router.clients import Timeouts
from cdc_router.router.replay import BATCH_KEY_PREFIX, DEAD_LETTERED_KEY_PREFIX, changelog_records
from cdc_router.router.routing import OutboundRecord
from cdc_router.router.values import Batch, Committed, Delivered

log = logging.getLogger("cdc_router.router")

# Retries of one transactional call on a retriable error; about 9 s in all, then the batch
# fails and the loop's own backoff (router/loop.py) takes over.
RETRY_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)
# Transactional calls whose unanswered end leaves the transaction in doubt (TransactionInDoubt).
_IN_DOUBT_STEPS = ("offsets", "commit")


class Transaction:
    """The open batch and the procedure that commits it; see the module doc."""

    def __init__(self, producer: LatchingProducer, consumer: Any, *,
                 delivery: DeliverySettings, changelog_topic: str | None, bootstrap: str,
                 sleep: Callable[[float], object] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 mark_group: str | None, mark_key_prefix: str = BATCH_KEY_PREFIX,
                 publisher: JetStreamPublisher | None = None,
                 stopping: Callable[[], bool] = lambda: False,
                 fenced_hint: str | None = None) -> None:
        """`consumer`: None for a batch that consumes nothing (`outbox republish`);
        `mark_key_prefix` keys the changelog marks, `mark_group` names their pipeline;
        `publisher` delivers JetStream routes' records; once `stopping()`, a failed call is
        not retried; `fenced_hint`: who else may take this transactional id (by default
        the router's rivals, rival_hint)."""
        self._producer, self._publisher, self.consumer = producer, publisher, consumer
        self._delivery, self._exactly_once = delivery, delivery.guarantee == "exactly_once"
        self._changelog_topic, self._mark_key_prefix = changelog_topic, mark_key_prefix
        self._mark_group, self._bootstrap = mark_group, bootstrap
        self._timeouts = Timeouts(delivery.transaction_timeout_ms)
        self._sleep, self._clock = sleep, clock
        self._stopping = stopping
        self.fenced_hint = fenced_hint or rival_hint(delivery.transactional_id, mark_group,
                                                     producer.transactional_id)
        self._batch, self._open = Batch(), False

    @property
    def open(self) -> bool:
        return self._open

    @property
    def records(self) -> int:
        return self._batch.records

    @property
    def partitions(self) -> Collection[tuple[str, int]]:
        """The input partitions the open batch holds records of (none once it ended)."""
        return self._batch.offsets.keys()

    @property
    def sources(self) -> list[RecordCoordinates]:
        """The input records whose output this batch produced."""
        return list(self._batch.sources)

    def init(self) -> None:
        """Register the transactional id, fencing a previous incarnation (exactly once)."""
        if self._exactly_once:
            # One try: its timeout already covers waiting out a predecessor's transaction.
            self._call(lambda: self._producer.init_transactions(self._timeouts.init_s), "init",
                       backoffs=())

    def begin(self) -> None:
        if self._open:
            return
        if self._exactly_once:
            self._call(self._producer.begin_transaction, "begin")
        self._batch, self._open = Batch(started=self._clock()), True

    def due(self) -> bool:
        """The batch is big or old enough to commit."""
        return self._open and (
            self._batch.records >= self._delivery.commit_max_records
            or (self._clock() - self._batch.started) * 1000 >= self._delivery.commit_interval_ms)

    def consumed(self, topic: str, partition: int, offset: int, undone: int | None = None) -> None:
        """The batch's offsets move past `offset`; `undone`: see kafka/commit_stamp.py."""
        self._batch.offsets[(topic, partition)] = offset + 1
        self._batch.undelivered[(topic, partition)] = undone

    def produce(self, record: OutboundRecord, source: RecordCoordinates, *,
                alone: bool = False) -> None:
        """Queue one destination record; `alone` delivers what came before, then only it.

        Raises RecordRefused when librdkafka refuses it on the spot, BatchFailed when a
        delivery failed (this one alone, or an earlier one). A JetStream record waits for the
        commit (ConfigError when there is no publisher).
        """
        if record.nats:
            self._queue_nats(record, source)
            return
        try:
            if alone:
                self._producer.flush(self._timeouts.call_s)
            self._producer.produce(record.topic, key=record.key, value=record.value,
                                   headers=list(record.headers), partition=record.partition,
                                   timestamp_ms=record.timestamp_ms, source=source)
            self._batch.sources.append(source)
            if alone:
                self._producer.flush(self._timeouts.call_s)
        except KafkaException as failure:
            error = kafka_error_of(failure)
            if error is not None and error.code() in RECORD_REFUSED and \
                    not error.txn_requires_abort():  # the transaction's refusal, no record's
                raise RecordRefused(error, size_refusal(error, record.key, record.value,
                                                        record.headers)) from failure
            raise self._failed(failure) from failure
        except DeliveryError as failure:
            raise self._failed(failure) from failure
        self._batch.records += 1

    def _queue_nats(self, record: OutboundRecord, source: RecordCoordinates) -> None:
        if self._publisher is None:
            raise ConfigError(f"routes[{record.route_index}] publishes to NATS JetStream, "
                              "and this transaction was given no JetStream publisher",
                              hint="build it with clients.jetstream_publisher(config, ...)")
        headers = {name: value.decode() for name, value in record.headers}
        self._batch.nats.append(NatsMessage(record.topic, record.value, headers,
                                            record.event_id))
        self._batch.nats_sources.append(source)
        self._batch.sources.append(source)
        self._batch.records += 1

    def dead_letter(self, topic: str, letter: DeadLetter) -> None:
        """Queue one dead letter (sized by dead_letter(max_bytes=...) to fit)."""
        self._send(topic, letter.key, letter.value, list(letter.headers))
        self._batch.dead_letter_stages.append(letter.stage)
        self._batch.records += 1

    def mark(self, event_id: str, now_ms: int, *, dead_lettered: bool = False) -> None:
        """Record `event_id` as delivered in the changelog, so that a replay of it drops;
        `dead_lettered`: as dead-lettered, which is no delivery for the cleanup's sweep.

        The batch's ids go out at commit in one changelog record (router/replay.py): exactly
        once inside the transaction, visible with the records; at least once only after the
        records' acks.
        """
        if self._changelog_topic is None:
            return
        (self._batch.dead_marks if dead_lettered else self._batch.marks).append(event_id)
        self._batch.marked_ms = now_ms

    def delivered(self, delivered: Delivered) -> None:
        self._batch.delivered.append(delivered)

    def passed_over(self, skip_reason: str | None) -> None:
        """A record that delivers nothing: skipped for `skip_reason`, or (None) a replay dropped
        as a duplicate. Counted at commit: an aborted batch's records are read again."""
        self._batch.passed_over.append(skip_reason)

    def progress(self, topic: str, key: bytes, value: bytes) -> None:
        """A record that says how far the batch got (the relay's position), sent at commit
        with the marks: in the transaction (exactly once), or after the records' acks."""
        self._batch.progress.append((topic, key, value))

    def commit(self) -> Committed:
        """Commit the open batch, as a numbered procedure; what it made visible. Raises
        BatchFailed (abort and rewind) or FatalKafkaError."""
        consumer, producer, wait_s = self.consumer, self._producer, self._timeouts.call_s
        # The commit stamp (kafka/commit_stamp.py): `status` reads the group's last commit.
        now_ms, notes = int(time.time() * 1000), self._batch.undelivered
        offsets = [TopicPartition(t, p, o, metadata=commit_metadata(now_ms, notes.get((t, p))))
                   for (t, p), o in self._batch.offsets.items()]
        # 0. Publish the batch's JetStream records and wait for every ack, before the marks
        #    and offsets, which must never move past an event JetStream has not stored (a crash
        #    re-publishes them: the stream's window drops Nats-Msg-Id = event id duplicates).
        #    Its Kafka records first: a refusal's abort then purges none in flight (QA 36-d).
        if self._batch.nats:
            self._flush()
        self._publish()
        if self._exactly_once:
            self._send_marks()
        # 1. Deliver every record and dead letter of the batch (exactly once: and its marks);
        #    a single failed delivery fails the whole batch.
        self._flush()
        if self._exactly_once:
            # 2. Add the consumed offsets to the transaction with the group's metadata
            #    (KIP-447): a zombie of an older generation cannot commit them. (The relay
            #    has no consumer: its progress record is in the transaction already.)
            if consumer is not None and offsets:
                self._call(lambda: producer.send_offsets_to_transaction(
                    offsets, consumer.consumer_group_metadata(), wait_s), "offsets")
            # 3. Commit: records, dead letters, changelog marks and offsets become visible
            #    together, or (on any failure) none of them.
            self._call(lambda: producer.commit_transaction(wait_s), "commit")
        else:
            # 2. Only now the changelog marks: every record they stand for is acknowledged.
            self._send_marks()
            # 3. Deliver the marks.
            self._flush()
            # 4. Commit the offsets: every record and mark of the batch is durable.
            if consumer is not None and offsets:
                self._call(lambda: consumer.commit(offsets=offsets, asynchronous=False),
                           "offsets")
        b = self._batch
        self._reset()
        return Committed(b.delivered, b.dead_letter_stages, b.passed_over, b.offsets)

    def abort(self) -> list[DeliveryFailure]:
        """Abort the open batch; the deliveries that failed in it, for the poison isolation.

        Raises BatchFailed when the abort itself cannot complete (call it again later), and
        FatalKafkaError when the producer reports a fatal error (a fence) meanwhile.
        """
        try:
            failures = self._producer.take_failures()
            if self._exactly_once and self._open:
                self._call(lambda: self._producer.abort_transaction(self._timeouts.call_s),
                           "abort")
            failures += self._producer.take_failures()
        except DeliveryError as failure:
            raise self._failed(failure) from failure
        self._producer.clear_latched()
        self._reset()
        return failures

    def discard(self) -> None:
        """Forget the open batch after an unexpected failure; abort it if Kafka lets us."""
        try:
            if self._open:  # else nothing to abort (nor a refused producer to build again)
                self.abort()
        except (BatchFailed, FatalKafkaError, KafkaException) as failure:
            log.warning("event=abort_failed error=%r", str(failure))
        finally:
            self._reset()

    def forget(self) -> None:
        """Forget the open batch unaborted, stopping in an outage (nothing of it committed; the
        broker aborts it at its timeout, and the next start fences it)."""
        self._reset()

    def renew(self) -> None:
        """Forget the open batch and start over on a new producer (LatchingProducer.renew),
        after the old one failed for good on its own (router/renewal.py); init() it next."""
        self._reset()
        self._producer.renew()

    def _reset(self) -> None:
        self._batch, self._open = Batch(), False

    def _send_marks(self) -> None:
        if self._changelog_topic is not None:
            marks = [*changelog_records(self._batch.marks, self._batch.marked_ms,
                                        self._mark_key_prefix, group=self._mark_group),
                     *changelog_records(self._batch.dead_marks, self._batch.marked_ms,
                                        DEAD_LETTERED_KEY_PREFIX, group=self._mark_group)]
            for mark in marks:
                self._send(self._changelog_topic, mark.key, mark.value, [])
        for topic, key, value in self._batch.progress:
            self._send(topic, key, value, [])

    def _publish(self) -> None:
        if not self._batch.nats or self._publisher is None:
            return
        if self._exactly_once and self._clock() - self._batch.started > self._timeouts.call_s:
            # Published, they would stand beside what the re-read makes of them (review 47-h).
            raise BatchFailed("the batch outlived delivery.transaction_timeout_ms (Kafka aborted "
                              "it): its JetStream records are not published, it is read again")
        try:
            acks = self._publisher.publish_batch(self._batch.nats)
        except JetStreamRefused as failure:
            sources = self._batch.nats_sources
            raise BatchFailed(str(failure), refused={
                sources[index]: reason for index, reason in failure.refused.items()}) \
                from failure
        except JetStreamError as failure:
            raise BatchFailed(str(failure)) from failure
        if acks.duplicates:
            log.info("event=jetstream_duplicates count=%d", acks.duplicates)
        self._batch.nats = []  # a retried commit() must not publish them again

    def _send(self, topic: str, key: bytes | None, value: bytes | None,
              headers: list[tuple[str, bytes]]) -> None:
        try:
            self._producer.produce(topic, key=key, value=value, headers=headers)
        except (KafkaException, DeliveryError) as failure:
            raise self._failed(failure) from failure

    def _flush(self) -> None:
        try:
            self._producer.flush(self._timeouts.call_s)
        except DeliveryError as failure:
            raise self._failed(failure) from failure

    def _failed(self, failure: BaseException) -> BaseException:
        """The error that ends the batch: FatalKafkaError when fatal, else BatchFailed."""
        error = kafka_error_of(failure)
        if error is not None and classify(error) is ErrorAction.FATAL:
            return fatal_kafka_error(f"Kafka refused this producer for good ({describe(error)}); "
                                     f"{likely_cause(error, self.fenced_hint)}", error)
        return BatchFailed(str(failure), error)

    def _settle_in_doubt(self, name: str, failure: KafkaException, conflict: bool) -> None:
        """Raise TransactionInDoubt when a commit or its offsets got no answer through every
        retry, or a call is refused while such a one is unresolved (_CONFLICT, or `conflict`):
        librdkafka lets only the same call resume, and refuses the abort. The batch is
        forgotten; the next process's init_transactions settles the transaction either way."""
        if self._exactly_once and (conflict or name in _IN_DOUBT_STEPS):
            self._reset()
            raise TransactionInDoubt(
                f"Kafka transaction step {name!r} got no answer (after retries): {failure}; "
                "librdkafka lets this process neither finish nor abort the transaction, so it "
                f"exits with {EXIT_RESTART}: start it again (a supervisor restarts a router) "
                "and the next start settles the transaction and goes on from what Kafka "
                "committed") from failure

    def _call(self, step: Callable[[], None], name: str,
              backoffs: tuple[float, ...] = RETRY_BACKOFF_S) -> None:
        """Run a transactional call, retrying retriable errors; BatchFailed when abortable or
        still failing after the retries, FatalKafkaError when fatal."""
        for attempt, backoff in enumerate((*backoffs, None)):
            try:
                step()
                return
            except KafkaException as failure:
                error = kafka_error_of(failure)
                action = classify(error) if error is not None else ErrorAction.ABORT
                if action is ErrorAction.FATAL and error is not None:
                    if name == "commit" and attempt:  # the try before may have committed:
                        self._settle_in_doubt(name, failure, True)  # a restart reads its ids
                    consumer = name == "offsets" and not self._exactly_once
                    cause = "" if consumer else f"; {likely_cause(error, self.fenced_hint)}"
                    raise fatal_kafka_error(  # at least once, 'offsets' is the consumer's
                        f"Kafka transaction step {name!r} failed for good: {describe(error)}"
                        f"{cause}", error, consumer=consumer) from failure
                if action is ErrorAction.ABORT:
                    raise BatchFailed(f"step {name!r}: {failure}", error) from failure
                conflict = error is not None and error.code() == KafkaError._CONFLICT
                if backoff is None or conflict or self._stopping():
                    self._settle_in_doubt(name, failure, conflict)
                    tries = f"{attempt + 1} tries" if attempt else "its one try"
                    raise BatchFailed(f"Kafka transaction step {name!r} still fails after "
                                      f"{tries}: {failure}; "
                                      f"{still_failing_hint(error, self._bootstrap)}", error) \
                        from failure
                log.info("event=retry step=%s attempt=%d error=%s", name, attempt + 1, failure)
                self._sleep(backoff)
