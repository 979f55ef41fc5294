"""Deleting, or ageing out, outbox rows whose events are committed on their destination topics.

The router hands over each batch's delivered ids after its Kafka transaction committed. `delete`:
a worker thread deletes them by id, in batches, at once. `retention`: the same, once the row's
created_at is `retention_ms` old by Postgres's clock; ids wait in a heap by due time, so a row
that is not due (even one dated in the future) holds up no other.

A killed router loses the ids it had committed but not yet deleted. With a `sweep`
(CommittedIds: the dedup changelog, whose marks commit with the deliveries) the worker also reads
every committed id back, from the changelog's start and then as it grows, and deletes those rows
too: the cleanup converges after any crash. Without one (dedup disabled, or at_least_once) such
rows stay for `cdc-router outbox purge --older-than`.

Memory is bounded: beyond MAX_PENDING_IDS the oldest ids are given up, and their rows stay for
the sweep or `outbox purge` (never guessed at by age: with several raw partitions or router
instances, no single instance knows what the others have delivered). A Postgres or Kafka failure
never stops routing: the ids wait, and the worker retries with backoff.
Ids of events sent to the dead-letter topic are never handed over, nor swept: their rows stay.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from contextlib import suppress
from typing import Any, Protocol

import psycopg
from confluent_kafka import KafkaException
from prometheus_client import CollectorRegistry
from psycopg import sql

from cdc_router import postgres
from cdc_router.config.cleanup import CleanupSettings
from cdc_router.config.outbox_columns import OutboxColumnNames
from cdc_router.errors import CdcRouterError, ConfigError
from cdc_router.outbox import age as cleanup_age
from cdc_router.postgres import one_line, row_fault, table_identifier
from cdc_router.router.cleanup_failures import failure_reason, start_refusal
from cdc_router.router.cleanup_queue import PendingIds
from cdc_router.router.metrics import cleanup_metrics
from cdc_router.router.values import Delivered

log = logging.getLogger("cdc_router.router.cleanup")

# Ids kept while Postgres is unreachable, or in retention mode until their rows are old enough;
# beyond this the oldest are given up (their rows stay for the sweep or `outbox purge`): memory
# is bounded, and no undelivered row is ever touched.
MAX_PENDING_IDS = 2_000_000
# Ids the sweep reads per step, in delete batches: it feeds the queue only while the queue is
# short, so that the live ids go first and the queue stays small.
SWEEP_BATCHES = 10
LOG_EVERY_S = 30.0  # a summary line, not one per batch
# A DELETE waits this long at most for a row another transaction has locked (a session idle in
# transaction, a report with FOR UPDATE): it then fails with a warning naming the lock and is
# tried again, instead of holding every later delete silently for as long as the lock lasts.
_LOCK_TIMEOUT = "5s"
_MAX_BACKOFF_S = 30.0
# A stop's drain that deletes nothing for this long gives up: the worker is held up (a changelog
# read in a broker outage waits up to 30 s; a dead Postgres), and the next start's sweep finds
# the rest. Shorter than _LOCK_TIMEOUT: a row lock is not worth a stop 5 s longer.
_STALLED_S = 3.0


class CommittedIdSource(Protocol):
    """Where the sweep reads committed ids from (cdc_router.router.committed_ids.CommittedIds)."""

    def next(self, max_ids: int) -> list[tuple[str, int]]: ...

    def close(self) -> None: ...


class OutboxCleaner:
    """Runs the cleanup policy on its own thread; `delivered()` is called by the router."""

    def __init__(self, settings: CleanupSettings, *, id_column: str,
                 created_at_column: str | None, created_at_unit: str = "auto",
                 registry: CollectorRegistry | None = None, sweep: CommittedIdSource | None = None,
                 names: OutboxColumnNames | None = None) -> None:
        """`created_at_unit`: source.created_at_unit, how an integer created_at is read."""
        self._settings = settings
        self._names = names if names is not None and names.renamed else None  # a rename: _types
        self._id_column = id_column
        self._created_at_column = created_at_column
        self._created_at_unit = created_at_unit
        # Checked here, so that a bad name stops `run` at once rather than the worker thread.
        self._table = table_identifier(settings.table, "cleanup.table")
        self._retention_ms = (settings.retention_ms or 0) if settings.mode == "retention" else None
        self._sweep_source = sweep
        self._sweep_retry_at, self._sweep_backoff = 0.0, 0.5
        self._pending = PendingIds(self._retention_ms, MAX_PENDING_IDS)
        self._stop = threading.Event()
        self._stopping = threading.Event()  # no new changelog read: deletes only
        self._thread: threading.Thread | None = None
        self._crashed: Exception | None = None  # what ended the worker
        self._conn: psycopg.Connection[Any] | None = None
        self._deleted_total = 0
        self._column_types: dict[str, str] | None = None
        self._lag_s = 0.0
        self._logged_deleted, self._logged_at = 0, time.monotonic()
        self._unsaid_given_up, self._said_given_up_at = 0, float("-inf")
        self._given_up_lock = threading.Lock()
        self.deleted, self.lag, self.given_up, self.swept, self.kept = cleanup_metrics(registry)

    # Called by the router, after commit ----------------------------------------------------

    def delivered(self, events: Sequence[Delivered]) -> None:
        """Events committed on their destinations: their rows may go now (or when aged)."""
        if self._settings.mode == "none":
            return
        if isinstance(self._crashed, ConfigError):  # the table dropped, a column renamed
            raise self._crashed
        if self._crashed is not None:
            crashed = f"{type(self._crashed).__name__}: {one_line(self._crashed)}"
            raise CdcRouterError(f"the outbox cleanup stopped ({crashed}): delivered "
                                 "rows would no longer be deleted, so the router stops; start "
                                 "it again, and report this line")
        now_ms = int(time.time() * 1000)
        self._enqueue([(event.event_id, event.created_at_ms or now_ms) for event in events],
                      now_ms)

    def _enqueue(self, entries: Sequence[tuple[str, int]], now_ms: int) -> None:
        """Queued; ids given up at the bound are counted, and said once a minute (review 47-b
        F5: in retention mode a steady 25 events/s for a day's retention filled the queue with
        Postgres up, and ids were dropped without a line)."""
        given_up = self._pending.add(entries, now_ms)
        if not given_up:
            return
        self.given_up.inc(given_up)
        with self._given_up_lock:  # the router's thread and the sweep's (review 47-f F5)
            self._unsaid_given_up += given_up
            if time.monotonic() - self._said_given_up_at < 60:
                return
            self._said_given_up_at = time.monotonic()
            log.warning("event=cleanup_ids_given_up count=%d pending=%d: delivered ids beyond "
                        "what the cleanup holds in memory; their rows stay until the next "
                        "start's sweep or `outbox purge` (retention mode holds every id for "
                        "retention_ms: keep events/s x retention under %d)",
                        self._unsaid_given_up, MAX_PENDING_IDS, MAX_PENDING_IDS)
            self._unsaid_given_up = 0

    # Lifecycle -----------------------------------------------------------------------------

    def check(self) -> None:
        """At start: a table or column Postgres lacks, a role that may not delete, refused
        credentials are a ConfigError (review 43); Postgres not answering is not."""
        if self._settings.mode == "none" or not self._settings.dsn:
            return
        try:
            with psycopg.connect(self._settings.dsn, **postgres.session_options(
                    self._settings.dsn, "cdc-router-cleanup")) as conn:
                self._types(conn)
                postgres.require_outbox_grants(conn, self._settings.table, "cleanup.table")
        except psycopg.Error as error:
            if (refused := start_refusal(self._settings.dsn, error)) is not None:
                raise refused from None
            log.warning("event=cleanup_check_skipped error=%r", one_line(error))

    def start(self) -> None:
        """Once: a second call (a second run()'s on_started) starts no second worker (rv62b)."""
        if self._settings.mode == "none" or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="outbox-cleanup", daemon=True)
        self._thread.start()

    def stop(self, drain_timeout_s: float = 10.0) -> None:
        """Delete what is due, then stop: within `drain_timeout_s`, and only while the deletes
        get on; a worker held up is waited for _STALLED_S in all (QA 41-a F-4: in a broker
        outage it sat in a changelog read, and the stop waited 10 s, then 10 s more)."""
        if self._thread is None:
            return
        self._stopping.set()
        now = time.monotonic()
        deadline, progress_at, left = now + drain_timeout_s, now, self._due_count()
        while left and self._thread.is_alive() and now < deadline and \
                now - progress_at < _STALLED_S:
            time.sleep(0.05)
            now, before, left = time.monotonic(), left, self._due_count()
            if left < before:
                progress_at = now
        self._stop.set()
        # The thread ends at once unless it is held up: then the stall's window is spent.
        # The worker closes its clients as it ends (_run): never under it, from here.
        self._thread.join(timeout=max(0.1, min(deadline, progress_at + _STALLED_S) - now))

    def pending_count(self) -> int:
        return self._pending.count()

    def _due_count(self) -> int:
        return self._pending.due_count(int(time.time() * 1000))

    # The worker ----------------------------------------------------------------------------

    def _run(self) -> None:
        """The worker, and what ends it unforeseen: the router's next commit stops the router
        (QA 33-b: the thread died, the router went on, the outbox grew)."""
        try:
            self._work()
        except Exception as error:
            self._crashed = error
            log.error("event=cleanup_stopped error=%r", f"{type(error).__name__}: "
                      f"{one_line(error)}")
        finally:
            with suppress(psycopg.Error):
                self._drop_connection()
            if self._sweep_source is not None:
                with suppress(KafkaException):
                    self._sweep_source.close()

    def _work(self) -> None:
        backoff = 0.5
        interval_s = self._settings.interval_ms / 1000
        while not self._stop.is_set():
            try:
                swept = self._sweep()
                if self._stop.is_set():
                    break  # a read held up past the stop: the connection is closed
                worked = self._delete_due()
                backoff = 0.5
            except psycopg.Error as error:
                reason = failure_reason(error, connected=self._conn is not None,
                                        table=self._settings.table)
                log.warning("event=cleanup_failed error=%r retry_in_s=%.1f pending=%d%s",
                            one_line(error), backoff, self.pending_count(),
                            f" reason={reason!r}" if reason else "")
                self._drop_connection()
                # An ALTER TABLE may be the cause (`text = uuid`): read the types again.
                self._column_types = None
                self._update_lag()  # QA 54-b F-3: it froze at 0 while Postgres was down
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            self._update_lag()
            self._log_progress()
            if not worked and not swept:
                self._stop.wait(interval_s)

    def _sweep(self) -> bool:
        """Queue the next committed ids from the changelog; True if some came."""
        if self._sweep_source is None or self._stopping.is_set() or \
                time.monotonic() < self._sweep_retry_at:
            return False
        batch_size = self._settings.batch_size
        if self._pending.due_at_least(batch_size):
            return False  # deletes first: the queue stays short
        try:
            found = self._sweep_source.next(batch_size * SWEEP_BATCHES)
        except (KafkaException, CdcRouterError) as error:
            # Kafka's trouble must not stop the deletes: they go on, the sweep tries again.
            log.warning("event=cleanup_sweep_failed error=%r retry_in_s=%.1f", str(error),
                        self._sweep_backoff)
            self._sweep_retry_at = time.monotonic() + self._sweep_backoff
            self._sweep_backoff = min(self._sweep_backoff * 2, _MAX_BACKOFF_S)
            return False
        self._sweep_backoff = 0.5
        self._enqueue(found, int(time.time() * 1000))
        self.swept.inc(len(found))
        return bool(found)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            assert self._settings.dsn is not None
            conn = psycopg.connect(self._settings.dsn, autocommit=True, **postgres.session_options(
                self._settings.dsn, "cdc-router-cleanup"))
            conn.execute(f"SET lock_timeout = '{_LOCK_TIMEOUT}'")  # a constant, not input
            self._conn = conn
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _delete_due(self) -> bool:
        """Delete up to one batch of delivered ids that are due; True if there were any."""
        now_ms = int(time.time() * 1000)
        batch = self._pending.take(now_ms, self._settings.batch_size)
        if not batch:
            return False
        conn = self._connection()
        try:
            deleted, not_yet = self._delete(conn, batch, now_ms)
        except psycopg.Error as error:
            if not row_fault(error):
                raise
            # One row (an id its column cannot hold, a foreign key to it, a trigger's RAISE)
            # fails the batch, and the next round would take the same (review 45): one by one.
            self._delete_each(conn, batch, now_ms)
        else:
            self._settle(batch, deleted, not_yet)
        return True

    def _settle(self, done: list[str], deleted: int, not_yet: list[tuple[int, str]]) -> None:
        """The ids `done` leave the queue; rows still young wait again."""
        self._pending.settle(done, not_yet)
        self._deleted_total += max(deleted, 0)
        self.deleted.inc(max(deleted, 0))
        log.debug("event=outbox_rows_deleted rows=%d", deleted)

    def _delete_each(self, conn: psycopg.Connection[Any], batch: list[str], now_ms: int) -> None:
        """Id by id, a row fault keeping its row; any other failure is raised after the ids
        before it are settled and their kept rows reported (review 46: a lock timeout at a
        later id lost the line and the counter, and each retry found the same rows again).
        An id twice in the batch (the live id and the sweep's copy of it) is tried once, so a
        kept row is named and counted once (review 50-b F6: rows=2 for one row)."""
        deleted, not_yet, reason, done, kept = 0, [], "", 0, []
        tried: set[str] = set()
        try:
            for event_id in batch:
                if event_id in tried:
                    done += 1
                    continue
                tried.add(event_id)
                try:
                    one, later = self._delete(conn, [event_id], now_ms)
                except psycopg.Error as error:
                    if not row_fault(error):
                        raise
                    kept.append(event_id)
                    reason = one_line(error)
                else:
                    deleted += one
                    not_yet += later
                done += 1
        finally:
            self._settle(batch[:done], deleted, not_yet)
            if kept:  # one line a batch (review 45-2: a trigger refusing every row logged each)
                self.kept.inc(len(kept))
                log.warning("event=cleanup_rows_kept rows=%d ids=%s reason=%r", len(kept),
                            ",".join(map(repr, kept[:10])), reason)

    def _delete(self, conn: psycopg.Connection[Any], batch: list[str],
                now_ms: int) -> tuple[int, list[tuple[int, str]]]:
        """Delete the batch's rows; (rows deleted, (due ms, id) of rows Postgres finds young)."""
        types = self._types(conn)
        where = sql.SQL("{} = ANY(%s::{}[])").format(sql.Identifier(self._id_column),
                                                      sql.SQL(types[self._id_column]))
        if self._retention_ms is None or self._created_at_column is None:
            return conn.execute(sql.SQL("DELETE FROM {} WHERE {}").format(self._table, where),
                                (batch,)).rowcount, []
        # Retention: the due time came from the router's clock (or, for swept ids, from the
        # delivery time); Postgres's created_at and clock decide. Rows still young wait again.
        created = sql.Identifier(self._created_at_column)
        kind, unit = types[self._created_at_column], self._created_at_unit
        old = cleanup_age.older_than(created, kind, unit)
        gone = {row[0] for row in conn.execute(sql.SQL(
            "DELETE FROM {} WHERE {} AND {} RETURNING {}::text").format(
            self._table, where, old, sql.Identifier(self._id_column)),
            (batch, self._retention_ms)).fetchall()}
        rest = [event_id for event_id in batch if event_id not in gone]
        if not rest:
            return len(gone), []
        young = conn.execute(sql.SQL("SELECT {}::text, {} FROM {} WHERE {}").format(
            sql.Identifier(self._id_column), cleanup_age.created_ms(created, kind, unit),
            self._table, where), (rest,)).fetchall()
        # Never sooner than the next round: a clock behind Postgres's must not spin the worker.
        soonest = now_ms + self._settings.interval_ms
        ageless = [str(event_id) for event_id, created_ms in young if created_ms is None]
        if ageless:
            # NULL or 'infinity' never grows retention_ms old: waiting again would spin for
            # ever, so such a row stays, as a dead-lettered one does.
            log.warning("event=cleanup_row_kept reason=%r ids=%s",
                        "created_at is NULL or infinity, so the row never reaches retention_ms",
                        ",".join(ageless[:10]))
        return len(gone), [(max(int(created_ms) + self._retention_ms, soonest), str(event_id))
                           for event_id, created_ms in young if created_ms is not None]

    def _types(self, conn: psycopg.Connection[Any]) -> dict[str, str]:
        """The table's column types (uuid, text, ...), read once and again after a failure:
        the id's for the array cast, created_at's for the retention cutoff; a column listed
        over a rename, the first of its names the table has. A table or column it lacks, or a
        created_at no time compares with, is a ConfigError (the router stops at its commit)."""
        if self._column_types is None:
            if self._names is not None:
                table = self._names.for_table(postgres.column_types(conn, self._settings.table))
                self._id_column, self._created_at_column = table.id, table.created_at
            created = self._created_at_column if self._retention_ms is not None else None
            needed = {"source.outbox.id": self._id_column,
                      **({"source.outbox.created_at": created} if created else {})}
            types = postgres.table_columns(conn, self._settings.table, "cleanup.table", needed)
            if created:
                cleanup_age.require_comparable(types[created], created, self._settings.table)
            self._column_types = types
        return self._column_types

    def _log_progress(self) -> None:
        """One INFO line per LOG_EVERY_S at most, while rows are being deleted."""
        deleted, now = self._deleted_total, time.monotonic()
        if deleted > self._logged_deleted and now - self._logged_at >= LOG_EVERY_S:
            log.info("event=outbox_rows_deleted rows=%d total=%d pending=%d lag_s=%.1f",
                     deleted - self._logged_deleted, deleted, self.pending_count(), self._lag_s)
            self._logged_deleted, self._logged_at = deleted, now

    def _update_lag(self) -> None:
        now_ms, oldest = int(time.time() * 1000), self._pending.oldest_due_since()
        # Lag: how long the oldest id has been due (retention's planned wait does not count).
        self._lag_s = 0.0 if oldest is None else max(0.0, (now_ms - oldest) / 1000)
        self.lag.set(self._lag_s)
