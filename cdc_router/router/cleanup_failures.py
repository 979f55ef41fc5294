"""Why the outbox cleanup's Postgres failed it: a DELETE, for its `event=cleanup_failed` line;
the start check, for the error that stops the router.

The worker retries every failure (a Postgres restart or a failover mends many), so the line is
all an operator gets: for a cause that lasts, it names the setting and the fix, as the start
check does (review 49-b F4: a revoked DELETE grant, or a DSN on a read-only server, logged only
Postgres's message, for ever, while the outbox grew).
"""

from __future__ import annotations

import psycopg

from cdc_router.config.dsn import refused_dsn
from cdc_router.errors import ConfigError
from cdc_router.postgres import PREPARED_HINT, one_line, refused_for_good


def start_refusal(dsn: str, error: psycopg.Error) -> ConfigError | None:
    """The start check's error for a connection no retry mends, or None: libpq refusing an
    option (a PG* variable's; the config's DSN is checked at load: reread 59 F-2), Postgres
    refusing the login (review 43)."""
    if (problem := refused_dsn(dsn, error)) is not None:
        return ConfigError(problem, field="cleanup.dsn")
    if refused_for_good(error):
        return ConfigError(f"Postgres refuses the cleanup: {one_line(error)}",
                           field="cleanup.dsn", hint="check its user, password, grants and "
                           "pg_hba.conf's lines for it (CDC_ROUTER__CLEANUP__DSN)")
    return None


def failure_reason(error: psycopg.Error, *, connected: bool, table: str) -> str:
    """What `error` means for the cleanup of `table` and what to do; "" when Postgres's own
    message says it all. `connected`: whether a connection was open when it failed."""
    if isinstance(error, psycopg.errors.LockNotAvailable):
        return ("another transaction holds a lock on rows to delete (see pg_locks, and "
                f"{PREPARED_HINT}); the deletes wait for it, routing goes on")
    if not connected:
        return ("cannot connect with cleanup.dsn (CDC_ROUTER__CLEANUP__DSN): tried again, "
                "which mends a Postgres restart; if it lasts, check its host, port, user and "
                "password; routing goes on, the rows wait")
    if isinstance(error, psycopg.errors.InsufficientPrivilege):
        return (f"field 'cleanup.table': the role of cleanup.dsn (CDC_ROUTER__CLEANUP__DSN) "
                f"may not DELETE from {table} (or SELECT its columns): GRANT SELECT, DELETE ON "
                f"{table} TO that role; tried again meanwhile, routing goes on, the rows wait")
    if isinstance(error, psycopg.errors.ReadOnlySqlTransaction):
        return ("field 'cleanup.dsn': its session is read-only (a hot standby, an old primary "
                "after a failover, or default_transaction_read_only on for its role or "
                "database): point CDC_ROUTER__CLEANUP__DSN at the primary (with several hosts, "
                "add target_session_attrs=read-write); tried again meanwhile, which mends a "
                "failover; routing goes on, the rows wait")
    context = getattr(error.diag, "context", None)
    if context:  # QA 57-b F-5: a trigger's own error read as the router's, without its CONTEXT
        return (f"raised inside a function Postgres ran for the DELETE on {table} (a trigger "
                f"on it?): {' | '.join(context.split(chr(10)))}: fix or drop that function; "
                "tried again meanwhile, routing goes on, the rows wait")
    return ""
