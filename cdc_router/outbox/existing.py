"""What `outbox init` reads of an outbox table and a publication that exist already, and says
about them: neither is ever altered (another owner; other subscribers), so what is off is
refused or warned with what to run instead.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from cdc_router.errors import ConfigError
from cdc_router.outbox.table import OPTIONAL_COLUMNS, OutboxSchema
from cdc_router.postgres import (
    MAX_IDENTIFIER_BYTES,
    column_types,
    read_publication,
    regclass_text,
    split_table,
)


def check_existing_table(conn: psycopg.Connection[Any], schema: OutboxSchema) -> None:
    """ConfigError when the table exists without an outbox's columns: published, its every
    row would be dead-lettered at decode, which is where the user would first hear of it."""
    types = column_types(conn, schema.table)
    missing = [column for column in schema.columns.required if column not in types]
    if types and missing:
        raise ConfigError(f"the table exists and is not an outbox: it has no column "
                          f"{', '.join(map(repr, missing))}", field="--table",
                          value=schema.table,
                          hint="name its columns with --column DEFAULT=NAME, or pick another "
                               "--table")
    # Review 53-c F10: init said "outbox ready", and `outbox write` and `stats` then failed.
    absent = [(key, column) for key in OPTIONAL_COLUMNS
              if (column := getattr(schema.columns, key)) is not None and column not in types]
    if types and absent:
        key, column = absent[0]
        given = "the default name" if column == key else f"--column {key}={column}"
        raise ConfigError(f"the table exists without its {key} column {column!r} ({given})",
                          field="--table", value=schema.table,
                          hint=f"name the table's {key} column with --column {key}=NAME, or "
                               f"give --column {key}= for a table without one")


# The id types write_event's UUID text goes into (review 50-d F7: a bigint id refused it).
_UUID_HOLDERS = ("uuid", "text", "character varying")


def column_type_warnings(conn: psycopg.Connection[Any], schema: OutboxSchema) -> list[str]:
    """What an existing table's id and payload types make of write_event (which always
    writes a UUID id, and a payload as --payload-type says) and of the router (a bytea payload
    needs `source.payload_type: bytes`): review 50-d F7, init said only "exists"."""
    types, columns = column_types(conn, schema.table), schema.columns
    payload, id_type = types.get(columns.payload), types.get(columns.id)
    warnings = []
    if payload is not None and (payload == "bytea") != (schema.payload_type == "bytea"):
        warnings.append(
            f"{schema.table}'s payload column {columns.payload} is {payload}, not "
            f"{schema.payload_type} (--payload-type): write_event and `outbox write` need the "
            f"table's type (--payload-type {'bytea' if payload == 'bytea' else 'jsonb'}), and "
            "router.yaml's source.payload_type "
            f"{'bytes' if payload == 'bytea' else 'auto or json (bytes dead-letters every event)'}")
    if id_type is not None and not id_type.startswith(_UUID_HOLDERS):
        warnings.append(f"{schema.table}'s id column {columns.id} is {id_type}: write_event and "
                        "`outbox write` always write a UUID, which it refuses; write its rows "
                        "with your own INSERT, or give the outbox a uuid id")
    return warnings


class NothingCaptured(str):
    """A publication warning that means Debezium captures no row of the outbox (inserts not
    published, the table not in it): `outbox init` then ends "outbox not ready", exit 1
    (QA 55-a F-5: it said "outbox ready"), as `status` calls it critical."""

    __slots__ = ()


def publication_warnings(conn: psycopg.Connection[Any], schema: OutboxSchema,
                         publication_name: str, *, relay: bool = False) -> list[str]:
    # An existing publication is never altered (it may serve others); say what is off instead.
    publication = read_publication(conn, publication_name)
    if publication is None:
        return []
    outbox_schema, outbox_table = split_table(schema.table)
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_publication_tables t WHERE t.pubname = p.pubname AND"
        " t.schemaname = %s AND t.tablename = %s),"
        " (SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s))"
        " FROM pg_publication p WHERE p.pubname = %s",
        (outbox_schema, outbox_table, regclass_text(schema.table),
         publication_name)).fetchone()
    included, partitioned = row if row is not None else (False, False)
    warnings: list[str] = []
    if "insert" not in publication.operations and not relay:
        # The table's every row is an insert: pgoutput leaves them all out of the stream, and
        # the rows written meanwhile are not sent later, when the publication is fixed.
        pub = sql.Identifier(publication_name).as_string(None)
        warnings.append(NothingCaptured(
            f"publication {publication_name} does not publish inserts (publish = "
            f"'{', '.join(publication.operations)}'): Debezium captures no outbox row; run "
            f"`ALTER PUBLICATION {pub} SET (publish = 'insert')`, then `cdc-router outbox "
            "republish` for the rows written before"))
    if set(publication.operations) - {"insert"}:
        warnings.append(f"publication {publication_name} publishes more than inserts: deleting "
                        "processed outbox rows will reach Kafka, and an UPDATE of a row's id "
                        "reaches the router as an insert of the new id, delivered again")
    # A relay table needs no publication: adding it would make Debezium capture it too
    # (QA 36-c).
    if not included and not relay:
        # A partitioned table's partitions may be listed under their own names: not others'.
        # Review 64: `FOR TABLES IN SCHEMA other` with no table there yet read as empty.
        others = () if partitioned else \
            publication.tables or _schemas_published(conn, publication_name)
        warnings.append(NothingCaptured(
            own_publication_fix(publication_name, schema.table, others) if others else
            publication_fix(publication_name, schema.table,
                            partitioned=bool(partitioned) and not publication.via_root)))
    if included and not relay:
        warnings += filter_warnings(publication_name, schema, *publication_filter(
            conn, publication_name, schema.table))
    return warnings


def _schemas_published(conn: psycopg.Connection[Any], publication: str) -> tuple[str, ...]:
    """`every table of schema S` for each schema `publication` publishes whole (`FOR TABLES IN
    SCHEMA`, Postgres 15 and later): another pipeline's, even while S has no table."""
    if conn.info.server_version < 150000:
        return ()
    rows = conn.execute("SELECT n.nspname::text FROM pg_publication_namespace pn JOIN "
                        "pg_namespace n ON n.oid = pn.pnnspid JOIN pg_publication p ON p.oid "
                        "= pn.pnpubid WHERE p.pubname = %s ORDER BY 1", (publication,)).fetchall()
    return tuple(f"every table of schema {row[0]}" for row in rows)


def own_publication(table: str) -> str:
    """The name `outbox init` advises for a publication of `table`'s own:
    `cdc_router_<schema>_<table>`, and when that passes Postgres's 63 bytes, cut with a hash
    of the whole name (review 64: cut alone, two long names could meet), as the relay's
    index names are (outbox/relay_columns.py)."""
    schema_name, table_name = split_table(table)
    own = "cdc_router_" + re.sub(r"[^a-z0-9_]", "_", f"{schema_name}_{table_name}".lower())
    if len(own) <= MAX_IDENTIFIER_BYTES:  # ASCII alone: characters are bytes
        return own
    digest = hashlib.sha256(own.encode()).hexdigest()[:8]
    return f"{own[:MAX_IDENTIFIER_BYTES - len(digest) - 1]}_{digest}"


def publication_fix(publication: str, table: str, *, partitioned: bool) -> str:
    """What to run when `publication` does not publish the outbox `table` under its name:
    Debezium captures nothing from it, and the rows written meanwhile are not streamed later.
    `partitioned`: the table is partitioned and the publication publishes partitions under
    their own names (publish_via_partition_root false), whether or not the table is in it."""
    pub = sql.Identifier(publication).as_string(None)
    # Quoted: unquoted, public.OutBox names public.outbox (review 47-b F1).
    add = f"ALTER PUBLICATION {pub} ADD TABLE {regclass_text(table)}"
    if partitioned:
        cause = (f"does not publish the partitioned {table} under its own name, which the "
                 "connector's table.include.list matches (publish_via_partition_root is false)")
        fix = (f"`ALTER PUBLICATION {pub} SET (publish_via_partition_root = true)`, and "
               f"`{add}` if the table is not in it")
    else:
        cause, fix = f"does not include {table}", f"`{add}`"
    return (f"publication {publication} {cause}: Debezium captures nothing from it; run "
            f"{fix}, then `cdc-router outbox republish` for the rows written before")


def own_publication_fix(publication: str, table: str, others: Sequence[str]) -> str:
    """What to run when `publication`, which `outbox init` found existing, publishes other
    tables and not the outbox `table`: another pipeline's, most likely (two teams left on
    the default --publication), whose connector would capture this outbox too once it is
    added there (QA 63-b L-4: init advised ADD TABLE to another team's publication). A
    publication of this outbox's own is the advice; ADD TABLE only for one connector of both."""
    listed = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    return (f"publication {publication} does not include {table}: Debezium captures nothing "
            f"from it; it publishes {listed}, another pipeline's most likely: give this outbox "
            f"a publication of its own, `cdc-router outbox init --table {table} --publication "
            f"{own_publication(table)}`, named in its connector's publication.name, rather "
            "than adding the table to that one, which would stream its rows to that "
            "pipeline's connector too "
            f"(`ALTER PUBLICATION {sql.Identifier(publication).as_string(None)} ADD TABLE "
            f"{regclass_text(table)}` only if one connector captures both); then "
            "`cdc-router outbox republish` for the rows written before")


# pg_publication_rel's row filter and column list of one table (Postgres 15 and later).
_FILTER = """
SELECT pg_get_expr(r.prqual, r.prrelid),
       (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a
        WHERE a.attrelid = r.prrelid AND a.attnum = ANY (r.prattrs::int2[]))
FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
WHERE p.pubname = %s AND r.prrelid = to_regclass(%s)
"""


def publication_filter(conn: psycopg.Connection[Any], publication: str,
                       table: str) -> tuple[str | None, list[str] | None]:
    """The row filter (its WHERE expression) and column list with which `publication`
    publishes `table`: None for either it does not have (always, before Postgres 15)."""
    if conn.info.server_version < 150000:
        return None, None
    row = conn.execute(_FILTER, (publication, regclass_text(table))).fetchone()
    return (row[0], row[1]) if row is not None else (None, None)


def filter_warnings(publication: str, schema: OutboxSchema, row_filter: str | None,
                    columns: list[str] | None) -> list[str]:
    """Review 50-d F13: a row filter drops the rows it filters out for good, a column list the
    outbox columns it leaves out of every event; neither was said."""
    return [warning for warning in (row_filter_problem(publication, schema.table, row_filter),
                                    column_list_problem(publication, schema, columns))
            if warning is not None]


def _without_it(publication: str, table: str) -> str:
    return (f"publish the outbox without it (`ALTER PUBLICATION "
            f"{sql.Identifier(publication).as_string(None)} SET TABLE {regclass_text(table)}` "
            "where the publication serves nothing else)")


def row_filter_problem(publication: str, table: str, row_filter: str | None) -> str | None:
    """What a row filter on the outbox loses, and what to run; None without one."""
    if row_filter is None:
        return None
    return (f"publication {publication} publishes {table} only WHERE {row_filter}: the rows "
            "it filters out never reach Kafka, nor later when it is dropped; "
            f"{_without_it(publication, table)}, then `cdc-router outbox republish` for the "
            "rows written before")


def column_list_problem(publication: str, schema: OutboxSchema,
                        columns: list[str] | None) -> str | None:
    """What a column list leaving out outbox columns loses; None when it leaves out none."""
    outbox = [name for name in schema.columns.model_dump().values() if name is not None]
    missing = [name for name in outbox if columns is not None and name not in columns]
    if not missing:
        return None
    return (f"publication {publication} publishes only the columns {', '.join(columns or [])} "
            f"of {schema.table}: every event lacks {', '.join(missing)}; "
            f"{_without_it(publication, schema.table)}")
