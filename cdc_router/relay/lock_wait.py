"""A relay read that waits on a lock of its table says so (QA 67-a F-2: a migration's ACCESS
EXCLUSIVE lock held a read for 60 s without a line).

Each read first locks the table as its SELECT does (ACCESS SHARE, reader.py's _columns_now);
an ALTER TABLE, a LOCK TABLE or a VACUUM FULL holding a stronger lock makes it wait, with no
timeout (a lock_timeout would add the backoff to the delay once the lock is gone). Once it has
waited LOCK_WAIT_WARN_S, one WARNING names the table and the sessions holding the lock
(pg_blocking_pids, read on a short connection of its own); once the read goes on, one INFO.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import psycopg

from cdc_router.postgres import one_line, session_options

log = logging.getLogger("cdc_router.relay")

# How long a read waits on the table's lock before it is said.
LOCK_WAIT_WARN_S = 10.0


class LockWait:
    """Around the statement that takes the table's lock: `blockers()` names the sessions
    holding it (called on a timer thread, only once the wait is long; it may raise)."""

    def __init__(self, table: str, blockers: Callable[[], str]) -> None:
        self._table, self._blockers = table, blockers
        self._warned = False
        self._started = 0.0
        self._timer: threading.Timer | None = None

    def __enter__(self) -> LockWait:
        self._started = time.monotonic()
        self._timer = threading.Timer(LOCK_WAIT_WARN_S, self._warn)
        self._timer.daemon = True
        self._timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        assert self._timer is not None
        self._timer.cancel()
        self._timer.join()  # a warning being written ends before the line after it
        if self._warned:
            log.info("event=relay_read_lock_wait_over table=%s waited_s=%.1f", self._table,
                     time.monotonic() - self._started)

    def _warn(self) -> None:
        try:
            blocking = self._blockers()
        except psycopg.Error as error:  # the warning is said without them
            blocking = f"unknown ({one_line(error)})"
        self._warned = True
        log.warning("event=relay_read_waiting_on_lock table=%s waited_s=%.1f blocking_pids=%s "
                    "hint='a session holds a lock on the table that its reads wait for (a "
                    "migration's ALTER TABLE, LOCK TABLE, VACUUM FULL): see pg_locks and "
                    "pg_stat_activity for those pids; the read goes on once it ends'",
                    self._table, time.monotonic() - self._started, blocking)


def blocking_pids(dsn: str, pid: int, connect: Callable[..., psycopg.Connection[Any]]) -> str:
    """The pids of the sessions whose locks session `pid` waits for, as Postgres's array text
    (`{4242}`), read on a connection of its own: the waiting one is busy."""
    with connect(dsn, autocommit=True, **session_options(dsn, "cdc-router-relay-locks")) as conn:
        row = conn.execute("SELECT pg_blocking_pids(%s)::text", (pid,)).fetchone()
    return str(row[0]) if row is not None else "{}"
