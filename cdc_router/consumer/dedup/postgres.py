"""Postgres dedup store: the dedup row and the handler's own writes commit in ONE transaction.

Table (default `public.cdc_router_dedup`):

    consumer_group text, event_id text, processed_at timestamptz,
    PRIMARY KEY (consumer_group, event_id)

run_once opens a transaction, inserts the dedup row with `ON CONFLICT DO NOTHING`, and calls
the effect with the same connection only when the row is new. Commit makes both durable, a
raise or a crash neither. An effect that swallows a database error (the transaction is then
aborted, and its COMMIT would silently roll back) makes run_once raise EffectAborted, never
return DONE. A second worker inserting the same key waits on the first one's
row lock and then sees the conflict, so concurrent duplicates never both run; it waits at most
`lock_timeout_s` and then answers BUSY (retried later, its consumer polling on): a frozen
worker's open transaction held its partition's new owner for the whole freeze (QA 35-b).

A run_once called inside another one's effect (a handler deduplicating sub-events) is a
savepoint of the outer transaction. Where it would answer BUSY it raises NestedEventBusy, a
DedupStoreError: the outer transaction rolls back and the outer event is retried. A BUSY the
handler could ignore let the outer event commit, and the sub-event's effect was lost (review
46 F2); so the outer run_once also refuses to commit after a nested BUSY the handler caught.

Retention: `purge(older_than)` deletes rows older than the window in bounded batches. A
redelivery of an event older than the window is no longer recognised and runs again, so the
window must exceed the longest time a record can be redelivered after it was first
processed (consumer lag, offset resets, topic replays).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from cdc_router.config.dsn import refused_dsn
from cdc_router.consumer.checks import check_all
from cdc_router.consumer.dedup.postgres_rules import (
    IDLE_IN_TRANSACTION_TIMEOUT,
    UNSTORABLE_TEXT,
    check_committable,
    contention,
    effects_fault,
)
from cdc_router.consumer.dedup.postgres_schema import create_dedup_schema
from cdc_router.consumer.dedup.store import (
    DedupKey,
    DedupStoreError,
    DedupStoreRefused,
    DedupStoreUnreachable,
    NestedEventBusy,
    Outcome,
    run_effect,
)
from cdc_router.consumer.retry import finite_number, whole_number
from cdc_router.errors import ConfigError
from cdc_router.postgres import (
    delete_in_chunks,
    deploy_fault,
    one_line,
    refused_for_good,
    server_unreachable,
    session_options,
    table_identifier,
)

log = logging.getLogger(__name__)

DEFAULT_TABLE = "public.cdc_router_dedup"


# Postgres's lock_timeout is an int of milliseconds (about 24.8 days): a longer one refused
# every claim (reread 52-l F5).
_MAX_LOCK_TIMEOUT_S = 2_147_483.647

# How the store's errors for a connection it could not open begin (the CLI adds its option).
CONNECTION_FAILURES = ("cannot connect to the dedup database",
                       "Postgres refuses the dedup store's connection",
                       "libpq refuses the dedup store's DSN, before asking any server")


class PostgresDedupStore:
    """Dedup rows in Postgres, committed atomically with the effect's writes (psycopg 3).

    The effect receives the open `psycopg.Connection`; everything it executes on it is part
    of the dedup transaction. It must not commit or roll back itself (nested
    `conn.transaction()` blocks are savepoints and fine). Each thread that uses a store gets
    a connection of its own (review 33: the consumer and `run_purge_loop` sharing one
    connection nested their transactions, and run_once returned DONE for effects that never
    committed); it connects lazily and reconnects after a broken connection.
    """

    def __init__(self, conninfo: str, *, table: str = DEFAULT_TABLE,
                 connect_timeout_s: int = 10, lock_timeout_s: float = 5.0) -> None:
        # Review 52-c F-med-5: "5" and NaN were raw TypeError / ValueError tracebacks.
        check_all("PostgresDedupStore", [
                (isinstance(conninfo, str), "conninfo",
                 "must be a libpq connection string or URL", type(conninfo).__name__),
                (isinstance(table, str), "table", "must be a table name, schema.table", table),
                (whole_number(connect_timeout_s), "connect_timeout_s",
                 "must be a whole number of seconds, at least 1", connect_timeout_s),
                (finite_number(lock_timeout_s) and 0 <= lock_timeout_s <= _MAX_LOCK_TIMEOUT_S,
                 "lock_timeout_s", "must be a finite number of seconds, at least 0 (0: wait for "
                 f"ever) and at most {_MAX_LOCK_TIMEOUT_S:g} (Postgres's lock_timeout limit)",
                 lock_timeout_s)])
        self._conninfo = conninfo
        # Only the dedup row's INSERT waits at most this long (0: for ever); the effect's own
        # statements keep the session's lock_timeout.
        self._lock_wait = None if lock_timeout_s <= 0 else sql.SQL(
            "SET LOCAL lock_timeout = {}").format(sql.Literal(f"{round(lock_timeout_s * 1000)}ms"))
        try:
            self._table = table_identifier(table)
        except ConfigError as error:  # QA 61-b F6: named as the other fields are
            raise ConfigError(str(error), source="PostgresDedupStore") from None
        self._table_name = table
        # Bounds how long a store call hangs on an unreachable server before it becomes a
        # retryable DedupStoreError.
        self._connect_timeout_s = connect_timeout_s
        self._local = threading.local()  # .conn: this thread's connection
        self._opened: list[psycopg.Connection[tuple[object, ...]]] = []  # for close()
        self._lock = threading.Lock()

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        conn: psycopg.Connection[tuple[object, ...]] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            try:
                # Keepalives and tcp_user_timeout, as on the router's own sessions: a host
                # gone without a FIN held run_once (and the consumer's stop) for the kernel's
                # TCP retries, about 15 minutes (review 46 F3).
                conn = psycopg.connect(self._conninfo, autocommit=True, **{
                    **session_options(self._conninfo, "cdc-router-consumer"),
                    "connect_timeout": self._connect_timeout_s})
            except psycopg.Error as error:
                # Review 51-d F6: retried for ever as an outage. A DSN libpq refuses (an
                # unknown option, an invalid value) was too (QA 57-c F-5); no server was
                # asked, so not "Postgres refuses" (reread 58-r F-8, reread 59 F-2).
                if (problem := refused_dsn(self._conninfo, error)) is not None:
                    # from None: psycopg's text may quote the DSN's words, a password's
                    raise DedupStoreRefused(f"{CONNECTION_FAILURES[2]}: {problem}") from None
                if refused_for_good(error):
                    raise DedupStoreRefused(f"{CONNECTION_FAILURES[1]}: {one_line(error)}; "
                                            f"{_refusal_advice(error)}") from error
                raise DedupStoreUnreachable(
                    f"{CONNECTION_FAILURES[0]}: {one_line(error)}") from error
            self._local.conn = conn
            with self._lock:
                self._opened = [*(c for c in self._opened if not c.closed), conn]
        return conn

    def _forget_broken(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and conn.broken:
            self.close_own()

    def close_own(self) -> None:
        """Close the calling thread's connection only (a thread leaving a shared store)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def ensure_schema(self) -> None:
        """Create the dedup table and its retention index when missing (idempotent; no DDL,
        no lock, when both exist)."""
        try:
            conn = self._connection()
            with conn.transaction():
                create_dedup_schema(conn, self._table, self._table_name)
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable,
                psycopg.errors.DuplicateObject):
            # Replicas starting together race on IF NOT EXISTS (it is not atomic in the
            # catalog); the loser finds what the winner created.
            return
        except psycopg.Error as error:
            self._forget_broken()
            # A server gone mid-statement is an outage too (exit 75), not the table's fault.
            failure = DedupStoreUnreachable if server_unreachable(error) else DedupStoreError
            raise failure(f"cannot create {self._table_name}: {one_line(error)}") from error

    def run_once(self, key: DedupKey,
                 effect: Callable[[psycopg.Connection[tuple[object, ...]]], None]) -> Outcome:
        """Insert the dedup row and run `effect(conn)` in one transaction; see the module doc."""
        conn = self._connection()
        insert = sql.SQL("INSERT INTO {} (consumer_group, event_id) VALUES (%s, %s)"
                         " ON CONFLICT DO NOTHING").format(self._table)
        # Called inside another run_once's effect (a handler deduplicating sub-events), its
        # rows commit with the outer transaction, as a savepoint.
        nested = conn.info.transaction_status != TransactionStatus.IDLE
        if not nested or not hasattr(self._local, "busy"):
            self._local.busy = set()  # the nested keys found BUSY, and not done since
        busy: set[DedupKey] = self._local.busy
        in_effect = committing = False
        try:
            with conn.transaction():
                if self._lock_wait is not None:
                    conn.execute(self._lock_wait)
                inserted = conn.execute(insert, (key.consumer_group, key.event_id)).rowcount
                if self._lock_wait is not None:
                    conn.execute("SET LOCAL lock_timeout TO DEFAULT")
                if inserted == 0:
                    busy.discard(key)
                    return Outcome.DUPLICATE
                in_effect = True
                run_effect(effect, conn)
                in_effect = False
                check_committable(conn, key)
                if busy and not nested:  # the handler caught a NestedEventBusy and went on
                    raise _nested_busy(min(busy, key=str))
                busy.discard(key)
                committing = True
            if not nested and conn.info.transaction_status != TransactionStatus.IDLE:
                raise DedupStoreError(f"the dedup transaction of event {key.event_id} did not "
                                      "commit: its connection was inside another transaction")
            return Outcome.DONE
        except psycopg.Error as error:
            # A connection lost under the effect (a failover, pg_terminate_backend) is the
            # database's outage, retried without limit, not the handler's failure.
            # Not a session the server ended for idling in this transaction longer than its
            # idle_in_transaction_session_timeout: the handler's pace, met at every retry
            # (review 47-e F2: retried as an outage for ever, the effect's calls repeated).
            lost = conn.broken and error.sqlstate != IDLE_IN_TRANSACTION_TIMEOUT
            self._forget_broken()
            if isinstance(error, psycopg.errors.LockNotAvailable) and not in_effect \
                    and not committing and not lost:
                if nested:
                    busy.add(key)
                    raise _nested_busy(key) from error
                return Outcome.BUSY  # another worker's transaction holds this event's row
            if not in_effect and not committing and not lost and deploy_fault(error):
                raise self._unusable(error) from error
            # A deadlock or serialization failure in the effect is contention between
            # workers, retried like the same error at COMMIT, not counted (review 46 F9).
            # An event id the database's encoding cannot hold is the record's fault (review
            # 47-e F3: retried as an outage for ever): retried, then dead-lettered.
            if (in_effect or (committing and effects_fault(error))
                    or error.sqlstate in UNSTORABLE_TEXT) and not lost \
                    and not contention(error):
                raise  # the handler's own failure: its retries and dead-lettering apply
            raise DedupStoreError(f"dedup transaction failed for event {key.event_id}: "
                                  f"{one_line(error)}") from error
        except DedupStoreError:
            self._forget_broken()
            raise
        except BaseException as error:
            lost = in_effect and conn.broken  # the handler wrapped a lost connection's error
            self._forget_broken()
            if lost and isinstance(error, Exception):
                raise DedupStoreError(f"dedup transaction failed for event {key.event_id}: "
                                      f"the connection to Postgres was lost while the effect "
                                      f"ran ({one_line(error)})") from error
            raise

    def check_usable(self) -> None:
        """What the consumers ask at start (QA 57-c F-2): DedupStoreRefused unless this store
        can connect and insert into its table (an INSERT of no row: the table, its columns and
        the INSERT grant are checked, nothing is written); DedupStoreError when Postgres does
        not answer (an outage, no verdict)."""
        probe = sql.SQL("INSERT INTO {} (consumer_group, event_id) SELECT %s, %s WHERE false"
                        ).format(self._table)
        conn = self._connection()
        try:
            with conn.transaction():
                conn.execute(probe, ("", ""))
        except psycopg.Error as error:
            self._forget_broken()
            if deploy_fault(error):
                raise self._unusable(error) from error
            raise DedupStoreError(f"cannot check the dedup table {self._table_name}: "
                                  f"{one_line(error)}") from error

    def _unusable(self, error: psycopg.Error) -> DedupStoreRefused:
        """The store's statements refused for good (review 47-e F7: retried as an outage for
        ever, every partition stalled): no table, schema or column, or no grant on them."""
        return DedupStoreRefused(
            f"the dedup table {self._table_name} cannot be used: {one_line(error)}; create it "
            "(`cdc-router dedup init`, or the store's ensure_schema()) and grant this role "
            "SELECT, INSERT, UPDATE and DELETE on it")

    def stale_cutoff(self, older_than: timedelta) -> datetime:
        """The database's `now() - older_than`: to count, then purge, the same rows."""
        try:
            row = self._connection().execute("SELECT now() - %s", (older_than,)).fetchone()
        except psycopg.Error as error:
            self._forget_broken()
            raise DedupStoreError(
                f"cannot read the time from {self._table_name}'s database: "
                f"{one_line(error)}") from error
        assert row is not None and isinstance(row[0], datetime)
        return row[0]

    def count_stale(self, older_than: timedelta, *, consumer_group: str | None = None,
                    cutoff: datetime | None = None) -> int:
        """How many rows purge(older_than) would delete now (for a dry run), or before
        `cutoff` when given (see stale_cutoff)."""
        query = sql.SQL("SELECT count(*) FROM {} WHERE {}").format(
            self._table, self._stale(consumer_group, cutoff))
        try:
            row = self._connection().execute(
                query, _stale_params(older_than, consumer_group, cutoff)).fetchone()
        except psycopg.Error as error:
            self._forget_broken()
            raise DedupStoreError(
                f"cannot count rows of {self._table_name}: {one_line(error)}") from error
        stale = row[0] if row else 0
        assert isinstance(stale, int)  # count(*) is a bigint
        return stale

    @staticmethod
    def _stale(consumer_group: str | None, cutoff: datetime | None) -> sql.Composable:
        """Rows older than %(window)s (or %(cutoff)s), of %(group)s only when a group is given."""
        group = sql.SQL(" AND consumer_group = %(group)s") if consumer_group else sql.SQL("")
        older = "processed_at < %(cutoff)s" if cutoff else "processed_at < now() - %(window)s"
        return sql.SQL(older + "{}").format(group)

    def purge(self, older_than: timedelta, *, batch_size: int = 5000,
              consumer_group: str | None = None, cutoff: datetime | None = None) -> int:
        """Delete rows processed more than `older_than` ago, `batch_size` rows a transaction.

        Short transactions keep locks and WAL bursts small on a busy table. Returns how many
        rows were deleted. Rows inside the window are never touched. With `cutoff` (see
        stale_cutoff), rows processed before it: those count_stale counted with it.
        """
        chunks = delete_in_chunks(self._connection(), self._table,
                                  self._stale(consumer_group, cutoff),
                                  _stale_params(older_than, consumer_group, cutoff),
                                  batch_size=batch_size)
        deleted = 0
        try:
            for count in chunks:
                deleted += count
        except psycopg.Error as error:
            self._forget_broken()
            raise DedupStoreError(f"purge of {self._table_name} failed after {deleted} rows: "
                                  f"{one_line(error)}") from error
        log.info("event=dedup_purged table=%s group=%s deleted=%d older_than_s=%d",
                 self._table_name, consumer_group or "*", deleted, older_than.total_seconds())
        return deleted

    def close(self) -> None:
        """Close every connection the store opened (call it when its threads are done with
        it); the next call of any thread reconnects."""
        with self._lock:
            opened, self._opened = self._opened, []
        for conn in opened:
            conn.close()


def _refusal_advice(error: psycopg.Error) -> str:
    """What to check for a connection refused for good: TLS or the login (QA 57-c F-5: an
    invalid sslmode value was given the login's advice; it is refused_dsn's now)."""
    if "server does not support SSL" in str(error):
        return ("the server does not speak TLS: set sslmode=prefer (or disable) in the DSN, "
                "or enable ssl on the server")
    return ("check the DSN's user, password and database, that the role may log in (LOGIN) "
            "and CONNECT to the database, and that pg_hba.conf lets this host in")


def _nested_busy(busy: DedupKey) -> NestedEventBusy:
    return NestedEventBusy(
        f"event {busy.event_id}, deduplicated inside another event's effect, is held by "
        "another worker's open transaction: the outer event's transaction is rolled back and "
        "retried, so that it never commits without this event's effect")


def _stale_params(older_than: timedelta, consumer_group: str | None,
                  cutoff: datetime | None) -> dict[str, Any]:
    return {"window": older_than, "group": consumer_group, "cutoff": cutoff}


def run_purge_loop(store: PostgresDedupStore, older_than: timedelta, *, every: timedelta,
                   stop: threading.Event, batch_size: int = 5000,
                   consumer_group: str | None = None) -> None:
    """Purge every `every` until `stop` is set; a failed purge is logged and tried next time.

    Only `consumer_group`'s rows when given (other services keep theirs), else every group's.
    Run it in its own thread; the store may be the consumer's (each thread its connection).
    """
    while not stop.is_set():
        try:
            store.purge(older_than, batch_size=batch_size, consumer_group=consumer_group)
        except (DedupStoreError, DedupStoreRefused) as error:
            log.warning("event=dedup_purge_failed error=%s", error)
        stop.wait(every.total_seconds())
    store.close_own()
