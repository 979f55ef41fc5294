"""One active relay per outbox table: a session-level Postgres advisory lock.

The lock lives on a connection of its own, opened before anything else and held for the relay's
life. A second relay for the same table waits, trying the lock every WAIT_S; when the first one
dies its connection drops, Postgres releases the lock, and the second takes it within WAIT_S.
(A host that vanishes without closing its sockets holds the lock until Postgres notices the
dead connection: the server's tcp_keepalives_* settings bound that.)

The lock only keeps a second relay idle; it is not what makes a takeover safe. Both relays of a
table share one Kafka transactional id, so the newcomer's init_transactions fences the old one
(KIP-98): a relay that lost its lock but still runs cannot commit another batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import psycopg

from cdc_router.config.dsn import refused_dsn
from cdc_router.errors import DatabaseError
from cdc_router.postgres import (
    missing_table,
    one_line,
    refused_for_good,
    regclass_text,
    session_options,
)

log = logging.getLogger("cdc_router.relay")

# "cdcr": the high half of the lock key, so that the lock cannot be mistaken for another
# application's advisory lock on the same table's oid (the low half).
LOCK_CLASS = 0x63646372
WAIT_S = 0.5  # a takeover comes at most this long after the lock is released
_MAX_BACKOFF_S = 30.0  # between tries while Postgres is away: a takeover at most this late


def _raise_if_for_good(error: psycopg.Error, table: str, dsn: str) -> None:
    """Raise, as one line, an error that retrying the lock cannot cure: the table is not there,
    the role may not read it, or the server refuses these credentials. Waiting would leave a
    relay that never starts while its /healthz answers like a standby's."""
    if isinstance(error, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
        raise missing_table(table, "relay.table") from error
    if (problem := refused_dsn(dsn, error)) is not None:  # a PG* variable's (reread 59 F-2)
        raise DatabaseError(f"the relay cannot lock {table}: {problem}; check relay.dsn, "
                            "else cleanup.dsn") from None
    if refused_for_good(error):
        # Review 51-d F9: a wrong password named no setting.
        raise DatabaseError(f"the relay cannot lock {table}: {one_line(error)}; check the "
                            "user, password and grants of relay.dsn, else cleanup.dsn "
                            "(CDC_ROUTER__RELAY__DSN, CDC_ROUTER__CLEANUP__DSN)") from error


class TableLock:
    """The advisory lock of one outbox table, on a dedicated connection."""

    def __init__(self, dsn: str, table: str, *,
                 connect: Callable[..., psycopg.Connection[Any]] = psycopg.connect) -> None:
        self._dsn = dsn
        self._name = table
        self._table = regclass_text(table, "relay.table")
        self._connect = connect
        self._conn: psycopg.Connection[Any] | None = None
        self._held = False

    def acquire(self, wait: Callable[[float], bool]) -> bool:
        """Wait until the lock is ours (True), or until `wait(seconds)` returns True (stop)."""
        waiting_logged, backoff = False, WAIT_S
        while True:
            try:
                if self._try():
                    log.info("event=lock_acquired table=%s", self._table)
                    return True
                backoff = WAIT_S
                if not waiting_logged:
                    log.info("event=lock_waiting table=%s detail='another relay holds the "
                             "table; taking over when it stops'", self._table)
                    waiting_logged = True
            except psycopg.Error as error:
                _raise_if_for_good(error, self._name, self._dsn)
                log.warning("event=lock_failed table=%s error=%r retry_in_s=%.1f", self._table,
                            one_line(error), backoff)
                self.release()
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
            if wait(backoff):
                return False

    def held(self) -> bool:
        """Whether the lock is still ours: its connection still answers."""
        if not self._held or self._conn is None:
            return False
        try:
            self._conn.execute("SELECT 1")
        except psycopg.Error as error:
            log.warning("event=lock_lost table=%s error=%r", self._table, one_line(error))
            self._held = False
        return self._held

    def release(self) -> None:
        """Close the connection; Postgres releases the lock with it."""
        conn, self._conn, self._held = self._conn, None, False
        if conn is not None:
            with suppress(psycopg.Error):  # gone either way (and a lock with it)
                conn.close()

    def _try(self) -> bool:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect(self._dsn, autocommit=True, **session_options(
                self._dsn, "cdc-router-relay-lock"))
        row = self._conn.execute(
            "SELECT pg_try_advisory_lock((%s::bigint << 32) | %s::regclass::oid::bigint)",
            (LOCK_CLASS, self._table)).fetchone()
        self._held = bool(row and row[0])
        return self._held
