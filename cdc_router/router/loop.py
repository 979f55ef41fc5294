"""The router's loop: it owns the clients and the batch's life (begin, commit, abort); each raw
record it polls goes through the step into the batch (router/batch_writer.py). Rebalances: an
assignment first restores the replay filter from the changelog; a revocation commits the open
batch; lost partitions abort it.

A failed batch aborts and rewinds to the committed offsets. When the poison isolation
(router/poison.py) names the input records at fault, the re-read isolates them; else the failure
is the cluster's (broker down, coordinator moving, commit timeout): the loop backs off (BACKOFF_S),
logs each abort at WARNING, counts them in cdc_router_consecutive_aborts, dead-letters nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

from cdc_router import __version__
from cdc_router.config.compiled import CompiledConfig
from cdc_router.errors import BatchFailed, FatalKafkaError, GrantRevoked, MemberFenced
from cdc_router.kafka.changelog_reader import ChangelogReader
from cdc_router.kafka.closing import Generations, close_all, close_aside
from cdc_router.kafka.consumer import next_records, rewind_to_committed
from cdc_router.kafka.membership import ListedFactory, admin_listed
from cdc_router.kafka.producer import LatchingProducer
from cdc_router.kafka.reader import ReadTimedOut
from cdc_router.kafka.rival import Holder, admin_holder, check_rival
from cdc_router.kafka.start import init_failure
from cdc_router.kafka.throttle import ThrottleWatch
from cdc_router.nats.publisher import JetStreamPublisher
from cdc_router.router import clients
from cdc_router.router.assignment import restore_assigned, restore_if_lost
from cdc_router.router.batch_writer import BatchWriter
from cdc_router.router.destinations import recheck_grants, require_own_topics
from cdc_router.router.grants import OperationsFactory, admin_operations
from cdc_router.router.letter_limit import narrowed_letters_limit
from cdc_router.router.lost_commits import CommitLedger
from cdc_router.router.metrics import RouterMetrics
from cdc_router.router.poison import (
    LetterTooLarge,
    PoisonIsolation,
    abort_batch,
    record_refusals,
)
from cdc_router.router.renewal import RENEW_AFTER_ABORTS, ProducerRenewal
from cdc_router.router.step import RecordStep
from cdc_router.router.timestamps import DescribeFactory, admin_describe
from cdc_router.router.transaction import Transaction
from cdc_router.router.values import Delivered

log = logging.getLogger("cdc_router.router")

# Records handed to the step per poll; the longest a poll waits for the first (and a stop).
POLL_BATCH = 500
POLL_WAIT_S = 0.1

# Backoff after batches aborted in a row for no record's fault: doubles from the first to the
# last. 30 s stays far below max.poll.interval.ms (300 s), so the group keeps us meanwhile.
BACKOFF_S = (0.5, 30.0)


class OutboxRouter:
    """Routes the raw change topic's outbox events until stop() is called."""

    def __init__(self, compiled: CompiledConfig, *, instance_id: str,
                 metrics: RouterMetrics | None = None,
                 on_delivered: Callable[[Sequence[Delivered]], None] | None = None,
                 on_started: Callable[[], None] = lambda: None,
                 producer_factory: Callable[[dict[str, Any]], Any] = Producer,
                 consumer_factory: Callable[[dict[str, Any]], Any] = Consumer,
                 changelog_factory: Callable[[dict[str, Any], str], Any] = ChangelogReader,
                 clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[float], object] | None = None,
                 publisher: JetStreamPublisher | None = None,
                 describe_factory: DescribeFactory = admin_describe,
                 operations_factory: OperationsFactory = admin_operations,
                 members_factory: ListedFactory = admin_listed,
                 holder_factory: Callable[[dict[str, Any]], Holder] = admin_holder) -> None:
        """Factories build the clients in run() (tests hand fakes); `wait(seconds)`: each
        backoff, interrupted by stop(); `publisher`: JetStream routes' (default: nats.url's);
        `on_started`: called when the start's checks passed (the cleanup's worker: QA 61-a F-5)."""
        config = self._config = compiled.config
        self._instance_id = instance_id
        self._metrics = metrics or RouterMetrics()
        self._on_delivered, self._on_started = on_delivered, on_started
        self._consumer_factory = consumer_factory
        self._generations = Generations()
        self._clock = clock
        self._stop = threading.Event()
        self._wait = wait or self._stop.wait
        self._timeouts = clients.Timeouts(config.delivery.transaction_timeout_ms)
        self._replay = self._metrics.dedup_filter(config.dedup)
        common = clients.common_config(config)
        # The consumers share the client id; a consumer_byte_rate quota delays their fetches
        # and was said by nothing but librdkafka's request timeouts (fixer 58-a; the
        # changelog's restore read too, reread 58-r F-6).
        self._fetch_throttle = ThrottleWatch(str(common.get("client.id", "")),
                                             on_throttle=self._metrics.fetch_throttled.inc,
                                             requests="fetch")
        self._changelog = None if not config.dedup.enabled else changelog_factory(
            {**common, "throttle_cb": self._fetch_throttle}, config.dedup.changelog_topic)
        produced = clients.watched(clients.producer_config(config, instance_id),
                                   self._metrics.throttled.inc)
        self._producer = LatchingProducer(produced, producer_factory)
        self._destinations = clients.destinations(config, self._producer, operations_factory, clock)
        self._describe = clients.topic_describe(config, describe_factory)
        limits = clients.timestamp_limits(self._describe, config)
        self._step = RecordStep(compiled, self._destinations.partitions,
                                seen=self._replay.seen if self._replay is not None
                                else lambda event_id: False,
                                timestamp_limits=limits)
        self._poison = PoisonIsolation(record_refusals(config.delivery.record_timestamp),
                                       limits=limits)
        self._writer = BatchWriter(config, self._step, poison=self._poison,
                                   destinations=self._destinations, replay=self._replay,
                                   dead_letter_max_bytes=clients.dead_letter_limit(config))
        self._renewal = ProducerRenewal()
        self._ledger = CommitLedger()  # router/lost_commits.py
        self._membership = clients.membership_watch(config, instance_id, members_factory, clock)
        self._holder = holder_factory(clients.common_config(config))  # lazy: kafka/rival.py
        self._publisher = publisher or clients.jetstream_publisher(config, instance_id)
        self._consumer: Any = None
        self._txn: Transaction | None = None
        self._consecutive_aborts, self._after_refusal = 0, False  # last abort: a refusal?
        self._pending_abort = self._needs_rewind = self._needs_init = False
        self.last_poll = clock()
        self._revoked: set[tuple[str, int]] = set()  # by the callbacks, for next_records

    # Lifecycle ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish its batch, commit and return; safe from a signal handler."""
        self._stop.set()

    def run(self) -> None:
        """Consume until stop(); raises FatalKafkaError when it cannot go on, ConfigError when
        a dead-letter or changelog topic is refused. Also raises, before consuming anything, a
        CdcRouterError from a serializer's preflight (an Avro schema missing from the schema
        registry is configuration, not a poison event)."""
        self._step.preflight()
        consumer = self._consumer = self._consumer_factory(self._consumer_config())
        txn = self._txn = Transaction(self._producer, consumer, delivery=self._config.delivery,
                                      changelog_topic=self._config.dedup.changelog_topic
                                      if self._replay is not None else None,
                                      bootstrap=self._config.kafka.bootstrap_servers,
                                      mark_group=self._config.source.group_id,
                                      sleep=self._wait, publisher=self._publisher,
                                      stopping=self._stop.is_set)
        try:
            try:
                txn.init()
            except BatchFailed as failure:
                raise init_failure(failure, self._producer) from failure
            require_own_topics(self._config, self._destinations.partitions, self._describe,
                               read_refused=self._destinations.read_refused)
            self._writer.dead_letter_max_bytes = clients.dead_letter_limit(self._config,
                                                                            self._describe)
            self._subscribe(consumer)
            log.info("event=started instance=%s guarantee=%s topics=%s version=%s",
                     self._instance_id, self._config.delivery.guarantee,
                     ",".join(self._config.source.topics), __version__)
            self._on_started()
            while not self._stop.is_set():
                try:
                    if self._recovered():
                        self._poll_once(self._consumer, txn)
                        self._membership.check(self._consumer)  # QA 39-c: never rejoined
                except FatalKafkaError as failure:
                    if isinstance(failure, GrantRevoked):
                        recheck_grants(self._config, self._destinations)
                    if isinstance(failure, MemberFenced):  # QA 65-a F-3: the newer one wins
                        check_rival(self._holder, self._consumer, self._config.source.group_id,
                                    self._consumer_config().get("group.instance.id"),
                                    self._instance_id)
                    if not self._renewal.allows(failure):
                        raise
                    if isinstance(failure, MemberFenced):
                        self._rejoin(failure.detail)
                    else:
                        self._renew(str(failure))
            if txn.open and not self._pending_abort:
                self._commit(backoff=False)  # one try: no retries once stopping
            if txn.open:  # its abort failed (an outage): the next start fences it
                log.warning("event=stopped_uncommitted records=%d", txn.records)
                txn.forget()
        except BaseException:
            # The batch's offsets may cover a record not produced: no commit by the close's revoke
            if self._replay is not None:
                self._replay.abort()
            txn.discard()
            raise
        finally:
            consumer, self._consumer = self._consumer, None
            close_all(consumer, self._changelog, self._publisher)  # keeps run()'s error
            log.info("event=stopped instance=%s", self._instance_id)

    def _poll_once(self, consumer: Any, txn: Transaction) -> None:
        try:
            messages = next_records(consumer, POLL_BATCH, POLL_WAIT_S, self._revoked)
        except KafkaException as failure:
            # The cluster, not a record (a broker restarting answers NOT_LEADER, ...): abort,
            # rewind, back off; a fatal error still stops the router (_abort raises it).
            self._abort(failure)
            return
        if not messages and not txn.open:
            self._producer.serve()  # idle: its log lines come now, not at the next batch
            self._writer.idle()  # and a run of replays' summary (review 65)
        if self._needs_rewind or self._pending_abort:  # a callback aborted the batch: these
            return  # are read again after the rewind, not twice in one transaction (review 45)
        self.last_poll = self._clock()
        self._metrics.observe_lag(consumer, self.last_poll,
                                  self._config.source.held_partition_warning_s,
                                  lambda: {*txn.partitions, *_partitions(messages)})
        for message in messages:
            try:
                self._writer.write(txn, message)
            except (BatchFailed, KafkaException) as failure:
                self._abort(failure)
                return  # the rest of this poll is re-read after the rewind
            # commit_max_records holds within a poll too; after a failed commit the rest of
            # this poll is re-read after the rewind, like after any abort.
            if txn.due() and not self._commit():
                return
        # Caught up (a poll short of a full batch): commit now, so that nothing waits for
        # commit_interval_ms on a quiet stream; under load batches grow to pay the round trips.
        if txn.due() or (txn.open and len(messages) < POLL_BATCH):
            self._commit()

    # Commit, abort, recovery ----------------------------------------------------------------

    def _renew(self, reason: str) -> None:
        """A new producer after the old one failed for good on its own (router/renewal.py);
        the batch is forgotten and read again, the topics' metadata and grants asked again."""
        assert self._txn is not None
        log.warning("event=producer_renewed reason=%r", reason)
        if self._txn.open and not self._pending_abort:  # else _abort counted it (QA 54-b F-5)
            self._metrics.aborted.labels("renewal").inc()  # its batch is read again
        if self._replay is not None:
            self._replay.abort()
        self._txn.renew()  # first: the grants' check builds the new producer (review 38)
        recheck_grants(self._config, self._destinations)
        self._pending_abort, self._needs_init, self._needs_rewind = False, True, True

    def _consumer_config(self) -> dict[str, Any]:
        return {**clients.consumer_config(self._config, self._instance_id),
                "throttle_cb": self._fetch_throttle, **self._metrics.reach.client_config()}

    def _rejoin(self, reason: str) -> None:
        """A new consumer for a fenced or stranded one, which reads its aborted batch again."""
        assert self._txn is not None
        log.warning("event=consumer_renewed reason=%r", reason)
        if self._txn.open:  # the old member's offsets: a new producer's init ends it (review
            self._renew("its consumer was fenced with a batch open")  # 37: an abort may be fenced)
        stale = self._consumer
        self._txn.consumer = self._consumer = self._consumer_factory(self._consumer_config())
        self._generations.retire()  # the stale one's callbacks (its close runs them) do nothing
        close_aside(stale, "consumer")  # before the new one joins; bounded (review 40-1 F5)
        self._subscribe(self._consumer)

    def _subscribe(self, consumer: Any) -> None:
        self._generations.subscribe(consumer, self._config.source.topics, self._on_assign,
                                    self._on_revoke, self._on_lost)

    def _commit(self, *, backoff: bool = True) -> bool:
        """Commit the open batch; False when it failed and was aborted (rewind pending)."""
        assert self._txn is not None
        try:
            committed = self._txn.commit()
        except BatchFailed as failure:
            self._abort(failure, backoff=backoff)
            return False
        now_ms = int(time.time() * 1000)
        # Only now do the ids count as delivered; replays' rows go too (an id reused).
        replayed = self._replay.commit(now_ms) if self._replay is not None else []
        self._poison.committed()
        self._renewal.committed()
        self._ledger.committed(committed.offsets)
        self._after_refusal = False
        if self._consecutive_aborts:  # said once: the fix worked (QA 60-a F-3)
            log.info("event=batch_committed_after_aborts aborted=%d", self._consecutive_aborts)
        self._consecutive_aborts = 0
        self._metrics.consecutive_aborts.set(0)
        self._metrics.committed(committed, now_ms)
        if self._on_delivered is not None and (committed.delivered or replayed):
            self._on_delivered(committed.with_replays(replayed))
        return True

    def _abort(self, failure: BaseException, *, backoff: bool = True) -> None:
        """Abort the open batch and rewind; isolate the records at fault, or back off."""
        assert self._txn is not None
        if self._replay is not None:
            self._replay.abort()
        self._needs_rewind = True
        try:
            cause, why = abort_batch(self._txn, self._poison, self._destinations, failure,
                                     who="router")
        except LetterTooLarge as refused:  # QA 57-a F-3 (router/letter_limit.py)
            self._metrics.aborted.labels("letter_too_large").inc()
            self._writer.dead_letter_max_bytes = narrowed_letters_limit(
                self._config, self._describe, refused, self._writer.dead_letter_max_bytes)
            self._after_refusal = True  # the batch is read again, its letters fitted
            return
        epoch_bump = self._after_refusal and cause not in ("abort_failed", "record_refused")
        self._metrics.aborted.labels("epoch_bump" if epoch_bump else cause).inc()
        if cause == "abort_failed":
            self._pending_abort = True
            self._back_off(why, backoff, cause)
            return
        if cause == "record_refused":
            self._after_refusal = True
            return
        if epoch_bump:
            # Refused records leave a gap in the producer's sequence numbers: librdkafka fails
            # the next transaction once (OUT_OF_ORDER_SEQUENCE_NUMBER, "requires epoch bump",
            # measured on Kafka 4.x) and bumps its epoch on that abort (KIP-360). Not the
            # cluster's fault: no backoff.
            self._after_refusal = False
            log.warning("event=batch_aborted cause=epoch_bump reason=%r", why)
            return
        self._back_off(why, backoff, cause)

    def _back_off(self, reason: str, wait: bool, cause: str = "cluster") -> None:
        self._consecutive_aborts += 1
        self._metrics.consecutive_aborts.set(self._consecutive_aborts)
        low, high = BACKOFF_S
        delay = min(high, low * 2 ** (self._consecutive_aborts - 1))
        log.warning("event=batch_aborted cause=%s consecutive=%d backoff_s=%.1f reason=%r",
                    cause, self._consecutive_aborts, delay if wait else 0.0, reason)
        if self._consecutive_aborts % RENEW_AFTER_ABORTS == 0:  # router/renewal.py
            self._renew(f"{self._consecutive_aborts} batches aborted in a row: {reason}")
        if wait:
            self._wait(delay)

    def _recovered(self) -> bool:
        """Finish a failed abort, a new producer's init, the rewind; False (backed off) if not."""
        assert self._txn is not None
        try:
            if self._pending_abort:  # QA 36-b: a new producer's init ends what its abort did not
                self._renew("the aborted batch's abort did not complete")
            if self._needs_init:
                self._txn.init()
                self._needs_init = False
            if self._needs_rewind:
                restore_if_lost(self._ledger, rewind_to_committed(
                    self._consumer, self._timeouts.call_s), config=self._config,
                    replay=self._replay, changelog=self._changelog)
                self._needs_rewind = False
        except (BatchFailed, KafkaException, ReadTimedOut) as failure:
            rewinding = not self._needs_init  # its committed offsets or the changelog failed
            self._back_off(f"recovering from an aborted batch: {failure}", True)
            if rewinding and self._consecutive_aborts % RENEW_AFTER_ABORTS == 0:  # QA 41-a
                self._rejoin(f"{self._consecutive_aborts} aborts in a row, rewind: {failure}")
            return False
        return True

    # Consumer events -----------------------------------------------------------------------

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Before reading new partitions, learn every id delivered so far (any instance) and the
        destinations' partition counts afresh (QA 30: stale counts moved an aggregate)."""
        self._destinations.clear()
        committed = restore_assigned(consumer, partitions, config=self._config,
                                     replay=self._replay, changelog=self._changelog,
                                     timeouts=self._timeouts, clock=self._clock,
                                     ledger=self._ledger)
        self._metrics.assigned(partitions, committed)

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Commit what the batch holds while the group's generation still owns it."""
        self._revoked.update((tp.topic, tp.partition) for tp in partitions)
        if self._txn is not None and self._txn.open:
            self._commit(backoff=False)  # no sleeping inside a rebalance

    def _on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Our generation is gone: the batch's offsets can't commit, so it must abort."""
        self._revoked.update((tp.topic, tp.partition) for tp in partitions)
        if self._txn is not None and self._txn.open:
            self._abort(BatchFailed("partitions lost"), backoff=False)


def _partitions(messages: list[Message]) -> set[tuple[str, int]]:
    """The (topic, partition) of each record of a poll (a record has both)."""
    return {cast(tuple[str, int], (message.topic(), message.partition()))
            for message in messages}
