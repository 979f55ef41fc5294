"""Which database a connection reads, and the check that the relay's cleanup deletes in the
relay's own (QA 61-a F-3).

The relay cleans the table it reads: `cleanup.dsn` serves both, and `relay.dsn`, when set, is
the relay's own. Set to another database (a staging copy with a table of the same name), the
cleanup deleted by id there: the relay's delivered rows stayed, and rows of the other table
with the same ids (a restored copy of the outbox) would have gone undelivered. Two DSNs of one
database (another role, host name or option) are fine: they are compared by what Postgres
answers, the database's name and its cluster's system identifier (DatabaseIdentity.same).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg

from cdc_router.config.model import RouterConfig
from cdc_router.errors import ConfigError
from cdc_router.postgres import one_line, session_options
from cdc_router.relay.guard import DatabaseIdentity

log = logging.getLogger("cdc_router.relay")


def cluster_id(conn: psycopg.Connection[Any]) -> str | None:
    """The system identifier of the cluster `conn` reads (a physical standby shares it), or
    None when the role may not read it (pg_control_system())."""
    try:
        cluster = conn.execute("SELECT system_identifier::text FROM pg_control_system()"
                               ).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        return None
    return str(cluster[0]) if cluster else None


def database_identity(conn: psycopg.Connection[Any]) -> DatabaseIdentity:
    """The database `conn` reads: its name and its cluster's system identifier (None, which
    DatabaseIdentity.same passes, when the role may not read it)."""
    row = conn.execute("SELECT current_database()").fetchone()
    assert row is not None
    return DatabaseIdentity(str(row[0]), cluster_id(conn))


def check_cleanup_database(config: RouterConfig, source: str | None = None,
                           connect: Callable[..., psycopg.Connection[Any]] = psycopg.connect
                           ) -> None:
    """ConfigError when relay.dsn and cleanup.dsn are set and name different databases, with
    the cleanup on. Postgres not answering is said and passed (the relay's own start fails or
    waits on it; the cleanup's check says its refusals)."""
    relay_dsn, cleanup_dsn = config.relay_settings().dsn, config.cleanup.dsn
    if config.cleanup.mode == "none" or not relay_dsn or not cleanup_dsn or \
            relay_dsn == cleanup_dsn:
        return
    try:
        relay, cleanup = (_identity(relay_dsn, connect), _identity(cleanup_dsn, connect))
    except psycopg.Error as error:
        log.warning("event=cleanup_database_check_skipped error=%r: whether cleanup.dsn and "
                    "relay.dsn name one database is not known", one_line(error))
        return
    if not relay.same(cleanup):
        raise ConfigError(
            f"cleanup.dsn names database {cleanup} and relay.dsn database {relay}: the cleanup "
            "would delete the delivered rows' ids in the other database, and the relay's rows "
            "would stay", source=source, field="cleanup.dsn/relay.dsn",
            hint="the relay cleans the table it reads: point cleanup.dsn at the relay's "
                 "database (or leave relay.dsn unset, cleanup.dsn serves both)")


def _identity(dsn: str, connect: Callable[..., psycopg.Connection[Any]]) -> DatabaseIdentity:
    with connect(dsn, autocommit=True,
                 **session_options(dsn, "cdc-router-relay-check")) as conn:
        return database_identity(conn)


def primary_database(conn: psycopg.Connection[Any]) -> DatabaseIdentity:
    """The database the connection reads; ConfigError on a standby (QA 48-c F1: its snapshots
    leave out the primary's running transactions, so the position passed rows for good)."""
    row = conn.execute("SELECT pg_is_in_recovery(), current_database()").fetchone()
    assert row is not None
    if row[0]:
        raise ConfigError(
            "the database is a standby (pg_is_in_recovery()): its snapshots do not show the "
            "primary's running transactions, and their rows would be skipped for good",
            field="relay.dsn", hint="point the relay at the primary (with several hosts in the "
            "DSN, add target_session_attrs=read-write)")
    return DatabaseIdentity(str(row[1]), cluster_id(conn))
