"""The relay's loop: it owns the clients, reads batches of outbox rows, and delivers each batch
in one Kafka transaction with the relay's position.

Start: wait for the table's advisory lock (relay/lock.py); init_transactions with the table's
transactional id, which fences a previous relay of the table and aborts its open transaction;
restore the replay filter from the dedup changelog; read the position (guard.py) back from the
position topic. Then each cycle: take a snapshot when no read is in progress, fetch up to
relay.batch_rows wanted rows, run each through the router's step (router/step.py: replay check,
route, serialize; a row that fails is a dead letter), and commit records, dead letters,
changelog marks and the next position in one transaction (router/transaction.py). A full batch
is followed at once by the next; a short one ends the read, and the loop sleeps
relay.poll_interval_ms.

How close to exactly once: the position moves only with a committed transaction, and the
records of a transaction that did not commit are invisible to read_committed readers. A crash
(kill -9 included) re-sends the uncommitted batch, which no reader saw: nothing is doubled. The
replay filter and its changelog are the second net, for what the position cannot cover: a
position lost or reset, or rows delivered by `cdc-router run` from the same table and changelog.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from confluent_kafka import KafkaException, Producer

from cdc_router import __version__
from cdc_router.config.compiled import CompiledConfig
from cdc_router.errors import BatchFailed, DatabaseError, DeliveryError, FatalKafkaError, LockLost
from cdc_router.kafka.changelog_reader import ChangelogReader
from cdc_router.kafka.closing import close_all
from cdc_router.kafka.producer import LatchingProducer
from cdc_router.kafka.start import init_failure
from cdc_router.postgres import one_line
from cdc_router.relay.backoff import ReadFailures, wait_out
from cdc_router.relay.guard import RelayPosition
from cdc_router.relay.letters import row_letter
from cdc_router.relay.lock import TableLock
from cdc_router.relay.lost_commit import STOP_READ_BACK_S, CommittedPosition
from cdc_router.relay.reader import OutboxReader, RelayRow, read_failure
from cdc_router.relay.start import (
    READ_TIMEOUT_S,
    Changelogs,
    Records,
    hand_left_behind,
    restore_filter,
    stored_position,
    topic_records,
)
from cdc_router.router import clients, debezium
from cdc_router.router.destinations import recheck_grants, require_own_topics
from cdc_router.router.grants import OperationsFactory, admin_operations
from cdc_router.router.metrics import RouterMetrics
from cdc_router.router.poison import PoisonIsolation, abort_batch, produce_isolated, record_refusals
from cdc_router.router.renewal import RENEW_AFTER_ABORTS, ProducerRenewal
from cdc_router.router.replay_log import ReplayLines
from cdc_router.router.step import (
    DeadLettered,
    Duplicate,
    RecordStep,
    Routed,
    StepResult,
    decode_letter,
)
from cdc_router.router.timestamps import DescribeFactory, admin_describe
from cdc_router.router.transaction import Transaction
from cdc_router.router.values import Delivered

log = logging.getLogger("cdc_router.relay")

# How often the lock's connection is asked whether it is still there: a lost lock stops the
# relay within this (the fencing already stops a successor's zombie at its next commit).
LOCK_CHECK_S = 1.0


class OutboxRelay:
    """Relays one outbox table's rows to their destinations until stop() is called."""

    def __init__(self, compiled: CompiledConfig, *, dsn: str, instance_id: str,
                 metrics: RouterMetrics | None = None,
                 on_delivered: Callable[[Sequence[Delivered]], None] | None = None,
                 producer_factory: Callable[[dict[str, Any]], Any] = Producer,
                 connect: Callable[..., psycopg.Connection[Any]] = psycopg.connect,
                 reader: OutboxReader | None = None, lock: TableLock | None = None,
                 records: Records | None = None, changelogs: Changelogs = ChangelogReader,
                 on_started: Callable[[], None] = lambda: None,
                 describe_factory: DescribeFactory = admin_describe,
                 operations_factory: OperationsFactory = admin_operations) -> None:
        """Builds no client: run() does (the producer on first use). Tests hand fakes: the
        table's `reader` and `lock`, `records(kafka_config, topic, what)`, every committed
        (key, value) of the position topic, and `changelogs`, the changelog's (restore_filter).
        `on_started`: once the start's checks passed (the cleanup's worker: QA 61-a F-5)."""
        config = self._config = compiled.config
        self._relay = config.relay_settings()
        # schema.table as Postgres resolves it: `outbox` and `public.outbox` are one table,
        # with one position, one transactional id.
        self._table = self._relay.qualified_table
        self._instance_id, self._metrics = instance_id, metrics or RouterMetrics()
        self._on_delivered, self._on_started = on_delivered, on_started
        self._stop = threading.Event()
        self._lock = lock or TableLock(dsn, self._relay.table, connect=connect)
        self._reader = reader or OutboxReader(dsn, self._relay, config.source, connect=connect)
        self._records, self._changelogs = records or topic_records, changelogs
        self._replay = self._metrics.dedup_filter(config.dedup)
        self._replay_lines = ReplayLines(self._replay)  # its dead-lettered ids warned (53-g)
        self._producer = LatchingProducer(clients.watched(clients.producer_config(
            config, self._relay.producer_instance), self._metrics.throttled.inc),
            producer_factory)
        # `is not None`: an empty ReplayFilter is falsy (it has a length).
        seen = self._replay.seen if self._replay is not None else (lambda _: False)
        self._destinations = clients.destinations(config, self._producer, operations_factory)
        self._describe = clients.topic_describe(config, describe_factory)
        limits = clients.timestamp_limits(self._describe, config)
        self._step = RecordStep(compiled, self._destinations.partitions, seen=seen,
                                timestamp_limits=limits)
        self._poison = PoisonIsolation(record_refusals(config.delivery.record_timestamp),
                                       limits=limits)
        self._dead_letter_max_bytes = clients.dead_letter_limit(config)
        # JetStream routes: published and acked at each batch's commit, before Kafka's.
        self._publisher = clients.jetstream_publisher(config, self._relay.producer_instance)
        self._txn = Transaction(self._producer, None, delivery=config.delivery,
                                changelog_topic=config.dedup.changelog_topic
                                if self._replay is not None else None,
                                bootstrap=config.kafka.bootstrap_servers, sleep=self._stop.wait,
                                mark_group=config.source.group_id, publisher=self._publisher,
                                stopping=self._stop.is_set,
                                fenced_hint="another relay of the table may have taken over")
        self._position_key = self._table.encode()
        self.position = RelayPosition()
        # Exactly once, read back after an abort and at a renewal (relay/lost_commit.py).
        self._committed = CommittedPosition(checks=config.delivery.guarantee == "exactly_once")
        self._reread, self._aborts = False, 0
        self._read_failures = ReadFailures(self._table, self._stop.wait)
        self._pending_abort = False  # an abort that failed, to finish before the next batch
        self._renewal, self._needs_init = ProducerRenewal(), False
        self._lock_checked, self.last_poll = 0.0, time.monotonic()

    def stop(self) -> None:
        """Finish the batch, commit it and return; safe from a signal handler."""
        self._stop.set()

    def run(self) -> None:
        """Wait for the table's lock, then relay until stop(); raises FatalKafkaError, or
        LockLost when the lock is lost (exit 75: the process should start again)."""
        self._step.preflight()
        if not self._lock.acquire(self._standing_by):
            self._lock.release()  # a standby stopped: its connection (review 43)
            log.info("event=stopped instance=%s table=%s standby=true", self._instance_id,
                     self._table)  # QA 53-a: as the active one says it
            return
        try:
            self._start()
            while not self._stop.is_set():
                self.last_poll = time.monotonic()
                self._check_lock()
                try:
                    if not self._cycle():
                        self._stop.wait(self._relay.poll_interval_ms / 1000)
                except FatalKafkaError as failure:
                    if not self._renewal.allows(failure):
                        raise
                    self._renew(str(failure))
            if self._committed.held:  # the last batch's rows go once its commit is read back
                try:
                    self._reposition(STOP_READ_BACK_S)
                except (KafkaException, DeliveryError, LockLost) as failure:
                    self._committed.unconfirmed_at_stop(self._table, failure, self._config)
        except BaseException:
            if self._replay is not None:
                self._replay.abort()
            self._txn.discard()
            raise
        finally:
            self._reader.reset()
            self._lock.release()
            close_all(self._publisher)
            log.info("event=stopped instance=%s table=%s", self._instance_id, self._table)

    # Start ----------------------------------------------------------------------------------

    def _standing_by(self, seconds: float) -> bool:
        """Wait while another relay holds the lock: a standby is healthy (/healthz)."""
        self.last_poll = time.monotonic()
        return self._stop.wait(seconds)

    def _start(self) -> None:
        try:
            self._reader.snapshot()  # the table and its columns are checked before anything
        except psycopg.Error as error:
            raise DatabaseError(f"the relay cannot read {self._table}: {one_line(error)}") \
                from error
        try:
            self._txn.init()  # fences the previous relay of this table, aborts its batch
        except BatchFailed as failure:
            raise init_failure(failure, self._producer) from failure
        require_own_topics(self._config, self._destinations.partitions, self._describe,
                           read_refused=self._destinations.read_refused, relay=True)
        self._dead_letter_max_bytes = clients.dead_letter_limit(self._config, self._describe)
        kafka = clients.common_config(self._config)
        restored = restore_filter(self._config, self._replay, self._changelogs, kafka)
        self.position = stored_position(self._config, self._records, kafka, self._reader.database)
        self._committed.confirm(self.position)
        hand_left_behind(self._config, self._reader, self.position, self._replay,
                         self._on_delivered)
        log.info("event=relay_started instance=%s table=%s position=%s dedup_ids=%d restored=%d "
                 "version=%s", self._instance_id, self._table, self.position.to_json().decode(),
                 len(self._replay or ()), restored, __version__)  # ids held, marks read: 66-c
        self._on_started()

    def _reposition(self, timeout_s: float = READ_TIMEOUT_S) -> None:
        """Go on from the stored position, read back within `timeout_s`; when Kafka lost this
        relay's last commit, the filter reads the changelog first (relay/lost_commit.py).
        Raises KafkaException."""
        self._check_lock(at_once=True)  # a successor's position is no lost commit
        kafka = clients.common_config(self._config)
        stored = stored_position(self._config, self._records, kafka, self._reader.database,
                                 timeout_s=timeout_s)
        if self._committed.lost(stored, self._table) and self._replay is not None:
            restored = restore_filter(self._config, self._replay, self._changelogs, kafka,
                                      timeout_s=timeout_s)  # a stop's bound too
            log.info("event=restored_after_lost_commit restored=%d dedup_ids=%d", restored,
                     len(self._replay))
        self._hand(self._committed.confirm(stored))
        self.position, self._reread = stored, False

    def _check_lock(self, *, at_once: bool = False) -> None:
        """LockLost once the lock's connection is gone (asked every LOCK_CHECK_S, or at once)."""
        now = time.monotonic()
        if not at_once and now - self._lock_checked < LOCK_CHECK_S:
            return
        self._lock_checked = now
        if not self._lock.held():
            raise LockLost(f"the relay lost its lock on {self._table} (its Postgres "
                           "connection dropped); another relay may take over: exiting, "
                           "start it again to wait for the lock")

    # One batch ------------------------------------------------------------------------------

    def _renew(self, reason: str) -> None:
        """A new producer after the old one failed for good on its own (router/renewal.py),
        only while this relay still holds its table's lock (else another relay may own the id
        by now); once it is initialised (_cycle), the batch is read again from the stored
        position."""
        self._check_lock(at_once=True)
        log.warning("event=producer_renewed table=%s reason=%r", self._table, reason)
        if self._replay is not None:
            self._replay.abort()
        self._txn.renew()  # first: the grants' check builds the new producer (as the router)
        recheck_grants(self._config, self._destinations, relay=True)
        self._pending_abort, self._needs_init = False, True

    def _cycle(self) -> bool:
        """Read and deliver one batch; True when the next one should follow at once."""
        limit = self._relay.batch_rows
        if self._needs_init:
            try:
                self._txn.init()
            except (BatchFailed, KafkaException) as failure:
                self._back_off(f"starting a new producer: {failure}")
                return True
            self._needs_init, self._reread = False, True
        if self._reread:
            try:
                self._reposition()
            except KafkaException as failure:
                self._back_off(f"reading the relay position back: {failure}")
                return True
        if self._pending_abort:  # an abort failing after its retries: as the router (QA 36-b)
            self._renew("the aborted batch's abort did not complete")
            return True
        try:
            position = self.position
            if position.reading is None:
                position = position.start_read(self._reader.snapshot())
            rows = self._reader.fetch(position, limit)
        except psycopg.Error as error:
            self._reader.reset()
            self._read_failures.failed(read_failure(error, self._table))
            return True
        self._read_failures.succeeded()
        # A batch cut at relay.batch_bytes is full: the read goes on after it.
        full = len(rows) if rows.truncated else limit
        following = position.after_batch(len(rows), full, rows[-1].seq if rows else None)
        if not rows:  # nothing between the two snapshots: no commit needed
            self._replay_lines.idle()  # a run of replays that is over (review 66)
            self.position, self._reread = following, self._committed.overdue()  # confirm it
            return False
        try:
            self._deliver(rows, following)
        except (BatchFailed, KafkaException) as failure:
            self._abort(failure)
            return True
        self.position = following
        return len(rows) == full

    def _deliver(self, rows: list[RelayRow], following: RelayPosition) -> None:
        self._txn.begin()
        for row in rows:
            self._handle(row, self._result(row))
        self._txn.progress(self._config.relay_position_topic, self._position_key,
                           following.to_json())
        committed = self._txn.commit()
        now_ms = int(time.time() * 1000)
        replayed = self._replay.commit(now_ms) if self._replay is not None else []
        handed = self._committed.committed(following, committed.with_replays(replayed))
        self._poison.committed()
        self._renewal.committed()
        self._aborts = 0
        self._metrics.consecutive_aborts.set(0)
        self._metrics.committed(committed, now_ms)
        self._hand(handed)

    def _hand(self, confirmed: list[Delivered]) -> None:
        """Confirmed deliveries to the cleanup (relay/lost_commit.py says when)."""
        if self._on_delivered is not None and confirmed:
            self._on_delivered(confirmed)

    def _result(self, row: RelayRow) -> StepResult:
        if row.undecodable is not None:  # a SQL_ASCII database's text, not UTF-8
            return decode_letter(row.undecodable)
        return self._step.decoded(lambda: debezium.event_from_row(
            row.values, self._config.source, columns=self._reader.columns, tx_id=row.txid,
            via_connect=False))

    def _handle(self, row: RelayRow, result: StepResult) -> None:
        self._replay_lines.read(isinstance(result, Duplicate))  # a run's summary (review 66)
        source = (self._table, 0, row.seq)
        if isinstance(result, Routed):
            record = result.record
            refused = produce_isolated(self._txn, self._poison, record, source,
                                       self._destinations.check_refusal)
            if refused is None:
                self._remember(record.event_id)
                self._txn.delivered(Delivered(record.event_id, record.topic,
                                              result.event.created_at_ms))
                return
            result = DeadLettered("produce", DeliveryError(refused), record.event_id,
                                  result.event)
        if isinstance(result, DeadLettered):
            self._dead_letter(row, result)
        elif isinstance(result, Duplicate):
            self._txn.passed_over(None)  # an id reused (QA 44-a: not a word said)
            self._replay_lines.dropped(result.event_id, f"table={self._table} seq={row.seq}")
        else:
            self._txn.passed_over(result.reason)

    def _dead_letter(self, row: RelayRow, result: DeadLettered) -> None:
        """The row as read, as JSON (relay/letters.py), is the raw value."""
        letter = row_letter(self._config, self._table, row, self._reader.columns, result,
                            max_bytes=self._dead_letter_max_bytes)
        self._txn.dead_letter(self._config.dead_letter.topic, letter)
        if result.marked_id is not None:
            self._remember(result.marked_id, dead_lettered=True)
        log.warning("event=dead_letter stage=%s table=%s seq=%d id=%s error=%s reason=%r",
                    result.stage, self._table, row.seq, result.shown_id,
                    type(result.error).__name__, letter.reason)

    def _remember(self, event_id: str, *, dead_lettered: bool = False) -> None:
        if self._replay is not None:
            now_ms = int(time.time() * 1000)
            self._replay.add_pending(event_id, now_ms, dead_lettered=dead_lettered)
            self._txn.mark(event_id, now_ms, dead_lettered=dead_lettered)

    # Failures -------------------------------------------------------------------------------

    def _abort(self, failure: BaseException) -> None:
        """Abort the batch (the position stays, so it is read again); isolate the records at
        fault, or back off."""
        if self._replay is not None:
            self._replay.abort()
        cause, reason = abort_batch(self._txn, self._poison, self._destinations, failure,
                                    who="relay")
        self._metrics.aborted.labels(cause).inc()
        if cause == "abort_failed":
            self._pending_abort = True  # a renewal reads the position back
        elif self._committed.unconfirmed:
            self._reread = True
        if cause != "record_refused":
            self._back_off(reason)
            if self._aborts % RENEW_AFTER_ABORTS == 0:  # as the router (router/renewal.py)
                self._renew(f"{self._aborts} batches failed in a row: {reason}")

    def _back_off(self, reason: str) -> None:
        self._aborts += 1
        self._metrics.consecutive_aborts.set(self._aborts)
        wait_out(reason, self._aborts, self._stop.wait)
