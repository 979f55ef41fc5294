"""What every Postgres user here needs: checked table names, one-line errors, chunked deletes.

The outbox setup and tools, the router's cleanup, the dedup store and the example service all
name tables from configuration, report psycopg errors to people, and delete old rows without
long locks; `outbox init` and `status` both read the publication. Each of those is written
once, here. Identifiers always go through psycopg.sql,
never through string formatting.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from cdc_router.errors import ConfigError, on_one_line

MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: Postgres would silently truncate longer names
# A table's rows in the order they were inserted, whatever its columns: the inserting
# transaction (`age(xmin)`, oldest first, wraparound-safe; frozen rows first), then the command
# within it (`cmin`), then the row's place. Neither the heap's order (an outbox the cleanup
# deletes from reuses its space) nor `created_at` (a transaction's rows tie on its now()) is.
INSERT_ORDER = "age(xmin) DESC, cmin::text::bigint, ctid"
_QUOTED_PART = re.compile(r'"((?:[^"]|"")*)"')  # SQL's "...", with "" for a quote inside


def check_identifier(name: str, what: str) -> str:
    """`name` unchanged if Postgres can use it as one identifier; ConfigError naming `what`."""
    if not name or len(name.encode()) > MAX_IDENTIFIER_BYTES:
        raise ConfigError(f"not a usable Postgres identifier (1 to {MAX_IDENTIFIER_BYTES} "
                          "bytes)", field=what, value=name)
    return name


def split_table(qualified: str, what: str = "table") -> tuple[str, str]:
    """`schema.table` or `table` (schema `public`) → (schema, table), both checked.

    A name is taken as written, case included (`public.OutBox` is the table "OutBox"); a part
    may also be double-quoted as in SQL (`public."Out.Box"`), the quotes are then removed.
    """
    parts = _name_parts(qualified, what)
    if len(parts) > 2:
        raise ConfigError("expected schema.table or table", field=what, value=qualified)
    schema, table = parts if len(parts) == 2 else ("public", parts[0])
    return check_identifier(schema, what), check_identifier(table, what)


def _name_parts(qualified: str, what: str) -> list[str]:
    parts, rest = [], qualified
    while True:
        if rest.startswith('"'):
            quoted = _QUOTED_PART.match(rest)
            if quoted is None or (quoted.end() < len(rest) and rest[quoted.end()] != "."):
                raise ConfigError("unbalanced double quotes", field=what, value=qualified,
                                  hint='write schema."Table", doubling any " inside')
            parts.append(quoted.group(1).replace('""', '"'))
            rest = rest[quoted.end():]
        else:
            part = rest.partition(".")[0]
            parts.append(part)
            rest = rest[len(part):]
        if not rest:
            return parts
        rest = rest[1:]  # the dot


def unquoted(table: str) -> str:
    """`table` without SQL quotes, in schema public when it names none."""
    name = table.replace('"', "")
    return name if "." in name else f"public.{name}"


def table_identifier(qualified: str, what: str = "table") -> sql.Identifier:
    """`schema.table` or `table` as a quoted SQL identifier; ConfigError names `what`."""
    return sql.Identifier(*split_table(qualified, what))


def regclass_text(qualified: str, what: str = "table") -> str:
    """The table's quoted name as text, for `%s::regclass`: the cast folds unquoted names."""
    return table_identifier(qualified, what).as_string(None)


def catalog_text(value: object) -> str:
    """A name or text read from Postgres as str. In a SQL_ASCII database psycopg decodes no
    text and gives bytes, whose str() is "b'txid'" (review 46 F6): read them as UTF-8."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def column_types(conn: psycopg.Connection[Any], qualified: str,
                 what: str = "table") -> dict[str, str]:
    """Column name -> its SQL type (format_type) of a table, in column order; {} when the table
    does not exist (or is not readable)."""
    return {catalog_text(name): catalog_text(kind) for name, kind in conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid "
        "= to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (regclass_text(qualified, what),)).fetchall()}


# The router's own sessions (relay, relay lock, cleanup) against a Postgres host that vanishes
# without a FIN or RST (a dead VM, a dropped route): a query waited on the kernel's TCP
# retries, about 15 minutes, and a SIGTERM with it (review 44). Keepalives find an idle
# connection dead in about 10 + 3 x 5 s, tcp_user_timeout a send unacknowledged for 30 s.
_CONNECT_TIMEOUT_S = 5  # short: the caller tries again, and a dead host must not hold it long
_ENVIRONMENT = {"connect_timeout": "PGCONNECT_TIMEOUT", "application_name": "PGAPPNAME"}
_LIVENESS = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5",
             "keepalives_count": "3", "tcp_user_timeout": "30000"}


def session_options(dsn: str, application_name: str) -> dict[str, Any]:
    """psycopg.connect() keywords for one of the router's own sessions: a short connect
    timeout, its application_name, and liveness settings, each unless the DSN, its libpq
    environment variable or a service file sets it (a keyword would outrank those)."""
    try:
        given = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:  # connect() says what is wrong with it
        given = {}
    if "service" in given or os.environ.get("PGSERVICE"):
        return {}  # its pg_service.conf entry decides, as the operator wrote it
    given |= {key: "" for key, variable in _ENVIRONMENT.items() if os.environ.get(variable)}
    defaults = {"connect_timeout": _CONNECT_TIMEOUT_S, "application_name": application_name,
                **_LIVENESS}
    return {key: value for key, value in defaults.items() if key not in given}


@dataclass(frozen=True)
class Publication:
    """A publication as the catalog has it."""

    operations: tuple[str, ...]  # what it publishes, of insert, update, delete, truncate
    tables: tuple[str, ...]  # schema.table, unquoted, as pg_publication_tables names them
    via_root: bool  # publish_via_partition_root


_PUBLICATION = """
SELECT p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate,
       coalesce(array_agg(t.schemaname || '.' || t.tablename ORDER BY 1)
                FILTER (WHERE t.tablename IS NOT NULL), '{}'), p.pubviaroot
FROM pg_publication p LEFT JOIN pg_publication_tables t ON t.pubname = p.pubname
WHERE p.pubname = %s GROUP BY 1, 2, 3, 4, 6
"""


def read_publication(conn: psycopg.Connection[Any], name: str) -> Publication | None:
    """The publication `name`, or None when there is none."""
    row = conn.execute(_PUBLICATION, (name,)).fetchone()
    if row is None:
        return None
    operations = tuple(op for op, on in zip(("insert", "update", "delete", "truncate"), row[:4],
                                            strict=True) if on)
    return Publication(operations, tuple(row[4]), bool(row[5]))


# Connection failures carry no SQLSTATE: libpq's FATAL texts (lc_messages C) that no waiting
# cures. Elsewhere (a server still starting, refused connections) a client tries again.
# Also libpq's own refusals, before or at the handshake (QA 46-a: `sslmode=require` against a
# server without TLS, or a bad PGSSLMODE, had the cleanup retry for ever as the outbox grew).
# Review 51-d F7: a pg_hba.conf `reject` line, a role without LOGIN or without CONNECT on the
# database were retried as an outage, for ever, where a wrong password stopped at start.
_REFUSED_FOR_GOOD = re.compile(r"password authentication failed|role \S+ does not exist|"
                               r"database \S+ does not exist|no pg_hba\.conf entry|"
                               r"pg_hba\.conf rejects connection|is not permitted to log in|"
                               r"permission denied for database|"
                               r"server does not support SSL|connection is bad: invalid")


def refused_for_good(error: psycopg.Error) -> bool:
    """Whether no retry cures `error`: the role lacks a privilege, or the server refuses
    these credentials (a wrong DSN is configuration, not an outage)."""
    return isinstance(error, psycopg.errors.InsufficientPrivilege) or (
        error.sqlstate is None and _REFUSED_FOR_GOOD.search(str(error)) is not None)


# A relation, schema or column missing, or no privilege on it: the deploy's fault (a migration
# not run, a grant missing), which every statement on it meets, not one row's (review 47-e F7).
MISSING_OR_FORBIDDEN = frozenset({"42P01", "3F000", "42703", "42501"})
# 42501 (insufficient_privilege) is also Postgres's row-level-security refusal ("new row
# violates row-level security policy"), which depends on the row (reread 57-a F-2): one row's
# fault wherever a policy may apply (a handler's tables), the deploy's only where none does.
INSUFFICIENT_PRIVILEGE = "42501"


def deploy_fault(error: psycopg.Error, *, row_security: bool = False) -> bool:
    """Whether neither a retry nor another row cures `error`: MISSING_OR_FORBIDDEN, a database
    that does not exist (3D000), an authorization refused (class 28), or a connection refused
    for good (refused_for_good). The dedup store's statements (its table has no row-level
    security) and the idempotent consumer's handlers are judged by it (QA 57-c F-3); with
    `row_security` (a handler's tables, which may have a policy), a 42501 is no deploy fault."""
    state = error.sqlstate or ""
    if row_security and state == INSUFFICIENT_PRIVILEGE:
        return False
    return state in MISSING_OR_FORBIDDEN or state == "3D000" or state.startswith("28") or \
        refused_for_good(error)


# Postgres went away or will not serve a session: a shutdown, a crash, a server still starting.
_SERVER_GONE = frozenset({"57P01", "57P02", "57P03"})


def server_unreachable(error: psycopg.Error) -> bool:
    """Whether `error` says Postgres is not there to answer: the connection lost (no SQLSTATE:
    libpq's own), a connection exception (class 08), the server shutting down or starting.

    Review 54-m F-6: a deadlock, a full disk, a statement timeout are OperationalErrors too, of
    a server that answered: the query failed, Postgres is up."""
    state = error.sqlstate
    return isinstance(error, psycopg.OperationalError) and (
        state is None or state.startswith("08") or state in _SERVER_GONE)


def require_outbox_grants(conn: psycopg.Connection[Any], table: str, field: str, *,
                   delete: bool = True) -> None:
    """A ConfigError unless the session's role may DELETE rows of `table`, an existing table
    named in config `field`, and SELECT its columns (a DELETE ... WHERE reads them); without
    `delete`, SELECT them only (the relay's reads: review 51-d F9)."""
    name = regclass_text(table, field)
    deletes = "has_table_privilege(%(table)s::regclass, 'DELETE') AND " if delete else ""
    row = conn.execute(f"SELECT {deletes}has_any_column_privilege(%(table)s::regclass, "
                       "'SELECT')", {"table": name}).fetchone()
    if not (row and row[0]):
        raise ConfigError("the connection's role may not "
                          + ("DELETE from the outbox table (or SELECT its columns)" if delete
                             else "SELECT from the outbox table"), field=field, value=table,
                          hint=f"GRANT SELECT{', DELETE' if delete else ''} ON it TO that role")


def missing_table(table: str, field: str) -> ConfigError:
    """The error of an outbox table named in config `field` that Postgres does not show."""
    return ConfigError("the outbox table does not exist (or is not readable)", field=field,
                       value=table, hint="name it as schema.table, case as created (`cdc-router "
                       "outbox init` creates one)")


def table_columns(conn: psycopg.Connection[Any], table: str, field: str,
                  required: Mapping[str, str]) -> dict[str, str]:
    """column_types of `table`, named in config `field`; a ConfigError when it is not there,
    or lacks a column of `required` (config field -> column name)."""
    types = column_types(conn, table, field)
    if not types:
        raise missing_table(table, field)
    for named_in, column in required.items():
        if column not in types:
            raise ConfigError(f"the outbox table {table} has no column {column!r}",
                              field=named_in, value=column, hint="name the table's column "
                              f"(it has {', '.join(list(types)[:12])})")
    return types


def utc_now_for(column_type: str) -> sql.Composable:
    """now(), to compare with a column of `column_type` (format_type). A timestamp without time
    zone holds UTC here (write_event, outbox init's default), so it gets UTC's wall clock; a
    timestamptz gets now() itself: compared with a plain timestamp, Postgres would read that
    timestamp in the session's TimeZone, hours off outside UTC."""
    if column_type.endswith("with time zone"):  # format_type: "timestamp(6) with time zone"
        return sql.SQL("now()")
    return sql.SQL("(now() AT TIME ZONE 'UTC')")


def row_fault(error: psycopg.Error) -> bool:
    """Whether one row can have caused `error` (not the server, the role or the table): a
    value its column cannot hold (SQLSTATE class 22), a constraint such as another table's
    foreign key to it (23), a trigger's RAISE (P0); a NUL the client refuses to send."""
    return isinstance(error, psycopg.DataError) or (error.sqlstate or "")[:2] in ("22", "23",
                                                                                  "P0")


def one_line(error: BaseException) -> str:
    """A psycopg error as one line for a person: the server's message, without LINE 1/caret.

    Errors from the server carry their primary message apart; a client-side error (refused
    connection, bad DSN) spans lines that are all worth reading, so they are joined.
    """
    primary = getattr(getattr(error, "diag", None), "message_primary", None)
    text = str(primary or error)
    return on_one_line(text) or type(error).__name__


def column_hint(error: BaseException) -> str:
    """For a column the table does not have, the `outbox` commands' option that names it
    (QA 48-a F-low-1: `outbox stats` on a renamed created_at said only that it did not exist)."""
    if not isinstance(error, psycopg.errors.UndefinedColumn):
        return ""
    return ("; name the table's columns with --column DEFAULT=NAME (as given to `outbox init`), "
            "e.g. --column created_at=occurred_at, and a table without headers or created_at "
            "with --column headers= or --column created_at=")


def delete_in_chunks(conn: psycopg.Connection[Any], table: sql.Composable,
                     where: sql.Composable, params: Sequence[Any] | Mapping[str, Any], *,
                     batch_size: int, order_by: sql.Composable | None = None) -> Iterator[int]:
    """Delete the rows matching `where`, `batch_size` a transaction; yields each chunk's count.

    One short transaction per chunk (a savepoint inside the caller's): row locks and WAL bursts
    stay small on a busy table. The chunks end with the first short one; a caller that stops
    iterating stops deleting. `where` takes its values from `params`.
    """
    if batch_size < 1:
        # The loop ends on a short chunk: a chunk of 0 rows is never short, it would spin.
        raise ConfigError("must be at least 1", field="batch_size", value=batch_size)
    order = sql.SQL(" ORDER BY {}").format(order_by) if order_by is not None else sql.SQL("")
    # By (tableoid, ctid): the chunk's rows are found once and deleted without a second index
    # lookup. A ctid alone is unique only within one partition: on a partitioned table it also
    # deleted the rows of other partitions at the same place (QA 53-h F2). The ctid = ANY keeps
    # the delete a TID scan (of each partition), the pair picks the chunk's row out of it.
    chunk = sql.SQL("WITH chunk AS MATERIALIZED (SELECT tableoid AS chunk_rel, ctid AS chunk_tid "
                    "FROM {table} WHERE {where}{order} LIMIT {limit}) "
                    "DELETE FROM {table} AS target USING chunk "
                    "WHERE target.ctid = ANY(ARRAY(SELECT chunk_tid FROM chunk)) "
                    "AND target.tableoid = chunk.chunk_rel AND target.ctid = chunk.chunk_tid"
                    ).format(table=table, where=where, order=order, limit=sql.Literal(batch_size))
    return _chunks(conn, chunk, params, batch_size)


def _chunks(conn: psycopg.Connection[Any], chunk: sql.Composed,
            params: Sequence[Any] | Mapping[str, Any], batch_size: int) -> Iterator[int]:
    while True:
        with conn.transaction():
            deleted = max(conn.execute(chunk, params).rowcount, 0)
        yield deleted
        if deleted < batch_size:
            return


# A prepared transaction's lock has no pid in pg_locks and no row in pg_stat_activity (QA 57-b
# F-2): the lock hints of status and of the cleanup name where it is.
PREPARED_HINT = ("pg_prepared_xacts for a prepared transaction (two-phase commit), whose lock has "
                 "no pid: COMMIT PREPARED or ROLLBACK PREPARED its gid")
