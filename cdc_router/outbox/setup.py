"""Creating the outbox table and what Debezium needs around it: publication, heartbeat, role.

`init_steps()` lists the idempotent setup (table, heartbeat table, insert-only publication,
least-privilege replication role); `init_outbox()` runs what is missing and says what it did;
`render_psql()` prints it for a DBA.
Identifiers always go through psycopg.sql, never through string formatting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Literal

import psycopg
from psycopg import sql

from cdc_router.errors import ConfigError
from cdc_router.outbox.existing import (
    NothingCaptured,
    check_existing_table,
    column_type_warnings,
    publication_warnings,
)
from cdc_router.outbox.role import (
    PASSWORD_LEFT,
    PRINTED_PASSWORD_LEFT,
    ROLE_LEFT,
    ensure_password,
    set_password_statement,
    unread_by_debezium_roles,
)
from cdc_router.outbox.table import OutboxSchema
from cdc_router.postgres import (
    check_identifier,
    column_types,
    regclass_text,
    split_table,
    table_identifier,
)

DEFAULT_PUBLICATION = "cdc_router_outbox"
DEFAULT_HEARTBEAT_TABLE = "public.debezium_heartbeat"
# The outbox's size check: the payload's and headers' text, in bytes. Debezium sends both as
# JSON strings, which escaping can double, inside an envelope of a few kB: 2 x 4 MB stays well
# under the 16 MiB that connectors/outbox-connector.json lets its raw change events have
# (MAX_RECORD_BYTES). A bigger row would make Connect's producer refuse its change event and
# kill the connector's task on it for good, holding up every later event: refused at INSERT
# instead, in the writer's transaction. Rows within it but over delivery.max_payload_bytes
# reach the router, which dead-letters them with the reason.
MAX_EVENT_BYTES = 4_000_000
# connectors/outbox-connector.json's MAX_RECORD_BYTES: the largest raw change event.
MAX_RECORD_BYTES = 16 * 1024 * 1024
SIZE_CHECK = "cdc_router_event_size"
# A schema-qualified name SQL reads the same unquoted (lower case, no special characters).
_PLAIN_SQL_NAME = re.compile(r"[a-z_][a-z0-9_$]*(\.[a-z_][a-z0-9_$]*)?")
# The advisory lock init_outbox() holds for its transaction: "cdrinit", a high half no relay
# lock key has (relay/lock.py: "cdcr" and a table's oid).
INIT_LOCK = 0x63647269_6E697400


@dataclass(frozen=True)
class CaptureSetup:
    """The objects Debezium needs besides the outbox table itself."""

    publication: str = DEFAULT_PUBLICATION
    heartbeat_table: str = DEFAULT_HEARTBEAT_TABLE
    replication_role: str | None = None

    def __post_init__(self) -> None:
        check_identifier(self.publication, "publication")
        split_table(self.heartbeat_table, "heartbeat_table")
        if self.replication_role is not None:
            check_identifier(self.replication_role, "replication_role")


def _outbox_ddl(schema: OutboxSchema) -> sql.Composed:
    columns = schema.columns
    lines = [sql.SQL("{} uuid PRIMARY KEY").format(sql.Identifier(columns.id))]
    lines += [sql.SQL("{} text NOT NULL").format(sql.Identifier(name))
              for name in (columns.aggregatetype, columns.aggregateid, columns.type)]
    lines.append(sql.SQL("{} {} NOT NULL").format(sql.Identifier(columns.payload),
                                                  sql.SQL(schema.payload_type)))
    if columns.headers is not None:
        lines.append(sql.SQL("{} jsonb").format(sql.Identifier(columns.headers)))
    if columns.created_at is not None:
        # timestamp(6) without time zone: Debezium sends it as MicroTimestamp (an epoch number);
        # the UTC default keeps that number right whatever the writing session's TimeZone is.
        lines.append(sql.SQL("{} timestamp(6) NOT NULL DEFAULT (now() AT TIME ZONE 'UTC')")
                     .format(sql.Identifier(columns.created_at)))
    lines.append(_size_check(schema))
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} (\n    {}\n)").format(
        schema.identifier, sql.SQL(",\n    ").join(lines))


@dataclass(frozen=True)
class Step:
    """One idempotent piece of the setup: skipped when `done_query` answers true."""

    label: str
    statement: sql.Composed
    done_query: sql.Composed
    verb: str = "created"
    verb_if_done: str = "exists"
    # CREATE PUBLICATION / CREATE ROLE have no IF NOT EXISTS: printed SQL must guard them.
    guarded: bool = False
    # Changes the role's attributes: done only to a role init creates, or with alter_role.
    alters_role: bool = False
    creates_role: bool = False  # the CREATE ROLE, which a printed script gives the password


def _exists(query: str, *values: str) -> sql.Composed:
    return sql.SQL(query).format(*map(sql.Literal, values))


def init_steps(schema: OutboxSchema, setup: CaptureSetup) -> list[Step]:
    """The outbox, heartbeat table, publication and (optionally) role, in creation order.

    The role's password is not a step (see set_password_statement): it is set apart so that
    no plain-text password is ever printed or sent as SQL text.
    """
    outbox_schema, _ = split_table(schema.table)
    heartbeat_schema, _ = split_table(setup.heartbeat_table, "heartbeat_table")
    if split_table(schema.table) == split_table(setup.heartbeat_table, "heartbeat_table"):
        # Review 50-d F15: granted the role INSERT and UPDATE on the outbox, and Debezium's
        # heartbeat would write its (id, ts) rows there.
        raise ConfigError("the heartbeat table is the outbox table: Debezium's heartbeat "
                          "would write into the outbox, and its role could write outbox rows",
                          field="--heartbeat-table", value=setup.heartbeat_table,
                          hint=f"name a table of its own (default {DEFAULT_HEARTBEAT_TABLE})")
    heartbeat = table_identifier(setup.heartbeat_table, "heartbeat_table")
    quoted_outbox = regclass_text(schema.table)
    quoted_heartbeat = regclass_text(setup.heartbeat_table, "heartbeat_table")
    steps = [Step(f"schema {name}", sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                      sql.Identifier(name)),
                  _exists("SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = {})", name))
             for name in sorted({outbox_schema, heartbeat_schema} - {"public"})]
    steps += [
        Step(f"table {schema.table}", _outbox_ddl(schema),
             _exists("SELECT to_regclass({}) IS NOT NULL", quoted_outbox)),
        Step(f"table {setup.heartbeat_table}", sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (id int PRIMARY KEY, ts timestamptz NOT NULL)"
        ).format(heartbeat), _exists("SELECT to_regclass({}) IS NOT NULL", quoted_heartbeat)),
        # Insert-only: deleting processed rows must never put anything on the raw topic. The
        # heartbeat table stays out: Debezium's heartbeat advances the slot with a logical
        # decoding message instead (see connectors/README.md).
        Step(f"publication {setup.publication}", sql.SQL(
            "CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert', "
            # A partitioned outbox: its inserts are published under the outbox's own name
            # (the connector's table.include.list), not each leaf partition's.
            "publish_via_partition_root = true)").format(
                sql.Identifier(setup.publication), schema.identifier),
             _exists("SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = {})",
                     setup.publication), guarded=True),
    ]
    role_name = setup.replication_role
    if role_name is None:
        return steps
    role = sql.Identifier(role_name)
    steps += [
        Step(f"role {role_name}", sql.SQL("CREATE ROLE {} WITH LOGIN REPLICATION").format(role),
             _exists("SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = {})", role_name),
             guarded=True, creates_role=True),
        Step(f"role {role_name} LOGIN REPLICATION",
             sql.SQL("ALTER ROLE {} WITH LOGIN REPLICATION").format(role),
             _exists("SELECT rolcanlogin AND rolreplication FROM pg_roles WHERE rolname = {}",
                     role_name), verb="altered", verb_if_done="ok", guarded=True,
             alters_role=True),
    ]
    steps += [Step(f"USAGE on schema {name} to {role_name}",
                   sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(name), role),
                   _exists("SELECT has_schema_privilege({}, {}, 'USAGE')", role_name, name),
                   verb="granted", verb_if_done="ok")
              for name in sorted({outbox_schema, heartbeat_schema})]
    steps += [
        Step(f"SELECT on {schema.table} to {role_name}",
             sql.SQL("GRANT SELECT ON {} TO {}").format(schema.identifier, role),
             _exists("SELECT has_table_privilege({}, {}, 'SELECT')", role_name, quoted_outbox),
             verb="granted", verb_if_done="ok"),
        # INSERT/UPDATE so that heartbeat.action.query can upsert; SELECT for its RETURNING.
        Step(f"SELECT, INSERT, UPDATE on {setup.heartbeat_table} to {role_name}",
             sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(heartbeat, role),
             _exists("SELECT has_table_privilege({0}, {1}, 'SELECT') AND has_table_privilege("
                     "{0}, {1}, 'INSERT') AND has_table_privilege({0}, {1}, 'UPDATE')",
                     role_name, quoted_heartbeat), verb="granted", verb_if_done="ok"),
    ]
    return steps


def _size_check(schema: OutboxSchema) -> sql.Composed:
    """The CHECK that refuses a row too big for the pipeline (MAX_EVENT_BYTES): the payload's
    and headers' text, or a bytea payload's own bytes (Debezium sends them as base64).

    The text is concat(column), not column::text: Postgres drops a cast to the column's own
    type, so a check written on a text payload blocked changing it to jsonb (QA, session 29);
    concat takes any type and stays as written.
    """
    columns = schema.columns
    payload = sql.Identifier(columns.payload)
    size = sql.SQL("octet_length({})").format(payload) if schema.payload_type == "bytea" else \
        sql.SQL("octet_length(concat({}))").format(payload)
    if columns.headers is not None:
        size = sql.SQL("{} + octet_length(concat({}))").format(
            size, sql.Identifier(columns.headers))
    return sql.SQL("CONSTRAINT {} CHECK ({} <= {})").format(
        sql.Identifier(SIZE_CHECK), size, sql.Literal(MAX_EVENT_BYTES))


def add_size_check_statement(schema: OutboxSchema) -> sql.Composed:
    """The size check for a table created before it existed: NOT VALID reads none of the rows
    there, but the ALTER TABLE takes a short exclusive lock, so init only prints it."""
    return sql.SQL("ALTER TABLE {} ADD {} NOT VALID").format(schema.identifier,
                                                              _size_check(schema))


def render_psql(steps: list[Step], password_role: str | None = None, *,
                alter_role: bool = False) -> str:
    """The steps as a psql script (`--print`): guarded ones inside \\if blocks.

    psql rather than DO blocks: no dependency on PL/pgSQL, and the password can come from a
    psql variable (`psql -v replication_password=...`) instead of the script's text. As
    init_outbox does, a role that exists keeps its password and attributes, with a \\warn of
    what it lacks, unless `alter_role` (review 53-c F14: the script reset an application
    role's password and gave it REPLICATION).
    """
    lines = []
    for step in steps:
        statement = step.statement.as_string(None) + ";"
        guard = [f"SELECT NOT ({step.done_query.as_string(None)}) AS missing \\gset",
                 "\\if :missing"]
        if step.alters_role and not alter_role:
            lines += [*guard, f"  \\warn {_psql_text(ROLE_LEFT.format(role=password_role))}",
                      "\\endif"]
        elif step.creates_role and not alter_role and password_role is not None:
            password = set_password_statement(password_role).as_string(None)
            lines += [*guard, f"  {statement}", f"  {password};", "\\else",
                      f"  \\warn {_psql_text(PRINTED_PASSWORD_LEFT.format(role=password_role))}",
                      "\\endif"]
        elif step.guarded:
            lines += [*guard, f"  {statement}", "\\endif"]
        else:
            lines.append(statement)
        lines.append("")
    if password_role is not None and alter_role:
        lines.append(set_password_statement(password_role).as_string(None) + ";")
    return "\n".join(lines).rstrip() + "\n"


def _psql_text(text: str) -> str:
    """`text` as one quoted argument of a psql meta-command (no variable is read in it)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class InitReport:
    """What init_outbox() did: (verb, label, changed) per step."""

    steps: tuple[tuple[str, str, bool], ...]
    password: Literal["set", "unchanged", "left as is"] | None
    warnings: tuple[str, ...]
    notes: tuple[str, ...] = ()  # what to set elsewhere for this table (router.yaml, connector)

    @property
    def changed(self) -> bool:
        return any(changed for _, _, changed in self.steps) or self.password == "set"

    @property
    def not_ready(self) -> tuple[str, ...]:
        """The warnings that mean Debezium captures nothing from the outbox (with their fix)."""
        return tuple(warning for warning in self.warnings if isinstance(warning, NothingCaptured))


def init_outbox(conn: psycopg.Connection[Any], schema: OutboxSchema, setup: CaptureSetup, *,
                replication_password: str | None = None, relay: bool = False,
                alter_role: bool = False) -> InitReport:
    """Create what is missing, all or nothing (one transaction, or a savepoint in the caller's).

    A replication role init creates gets LOGIN REPLICATION and the password. One that exists
    already is left as it is (review 50-d F12: it may be an application's, whose password init
    replaced): what it lacks is warned, unless `alter_role`, which sets them as for a new one
    (the password only where this session cannot read pg_authid or it does not match).
    `relay`: the table is the relay's, which reads it with SQL: a publication that leaves it
    out is no problem.
    """
    done, warnings, role = [], [], setup.replication_role
    with conn.transaction():
        # Review 50-d F11: inits run at once (one per replica at a deploy) failed but one, on
        # CREATE ... IF NOT EXISTS's unique index race; they now take turns (per database).
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (INIT_LOCK,))
        check_existing_table(conn, schema)
        found = conn.execute("SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = %s)",
                             (role,)).fetchone() if role is not None else None
        alter_role = alter_role or not (found and found[0])
        if role is not None and alter_role and not replication_password:
            # QA 50-h F3: asked up front, it was asked for a role left as is, only to compare.
            why = "sets its password (--alter-role)" if found and found[0] else "creates it"
            raise ConfigError(f"--replication-role {role} needs a password: init {why}",
                              field="--replication-password",
                              hint="pass --replication-password or set CDC_ROUTER_DB_PASSWORD")
        for step in init_steps(schema, setup):
            row = conn.execute(step.done_query).fetchone()
            if row is not None and row[0]:
                done.append((step.verb_if_done, step.label, False))
            elif step.alters_role and not alter_role:
                done.append(("left", step.label, False))
                warnings.append(ROLE_LEFT.format(role=role))
            else:
                conn.execute(step.statement)
                done.append((step.verb, step.label, True))
        password: Literal["set", "unchanged", "left as is"] | None = None
        if role is not None and replication_password is not None:
            password = ensure_password(conn, role, replication_password, alter=alter_role)
        if password == "left as is":
            warnings.append(PASSWORD_LEFT.format(role=role))
        warnings += column_type_warnings(conn, schema) + size_check_warnings(conn, schema) + \
            publication_warnings(conn, schema, setup.publication, relay=relay)
        if not relay:
            warnings += unread_by_debezium_roles(conn, schema.table, setup.publication,
                                                 setup.heartbeat_table, role)
        notes = _notes(conn, schema, setup)
    return InitReport(tuple(done), password, tuple(warnings), notes)


def _notes(conn: psycopg.Connection[Any], schema: OutboxSchema,
           setup: CaptureSetup) -> tuple[str, ...]:
    notes = []
    if column_types(conn, schema.table).get(schema.columns.payload) == "bytea":
        # The shipped connector sends no schemas, and binary.handling.mode base64 gives the
        # column a string schema: the router cannot tell its base64 from JSON text by itself.
        # Read from the table (review 50-d F7: said of a jsonb table for --payload-type bytea).
        notes.append("a bytea payload needs `source: {payload_type: bytes}` in router.yaml "
                     "unless the connector sends schemas with binary.handling.mode bytes (the "
                     "shipped connectors/outbox-connector.json sends none)")
    if not _PLAIN_SQL_NAME.fullmatch(setup.heartbeat_table):
        # The connector pastes it into heartbeat.action.query as SQL: unquoted, it folds.
        quoted = regclass_text(setup.heartbeat_table, "heartbeat_table")
        notes.append(f"the heartbeat table's name is case-sensitive SQL: give the connector "
                     f"HEARTBEAT_TABLE='{quoted}' (connectors/README.md)")
    return tuple(notes)


def size_check_warnings(conn: psycopg.Connection[Any], schema: OutboxSchema) -> list[str]:
    # An existing table is never altered by init (the lock; another owner): say what to run.
    row = conn.execute("SELECT EXISTS (SELECT FROM pg_constraint WHERE conrelid = "
                       "to_regclass(%s) AND conname = %s)",
                       (regclass_text(schema.table), SIZE_CHECK)).fetchone()
    if row is None or row[0]:
        return []
    # The statement fits the table as it is, whatever this command's flags say.
    types = column_types(conn, schema.table)
    if schema.columns.payload not in types:
        return []  # not an outbox this command knows how to size
    actual = replace(schema, payload_type="bytea" if types[schema.columns.payload] == "bytea"
                     else "jsonb", columns=schema.columns.model_copy(update={
                         "headers": schema.columns.headers if schema.columns.headers in types
                         else None}))
    return [f"{schema.table} has no size check {SIZE_CHECK}: a row too big for Kafka would stop "
            "Debezium's task for good (connectors/README.md, \"Big rows\"); when writers can "
            f"wait a moment, run: {add_size_check_statement(actual).as_string(conn)}"]
