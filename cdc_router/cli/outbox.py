"""`cdc-router outbox`: create the outbox and what Debezium needs; write events from scripts.

The option decorators (`dsn_option`, `schema_options`) and `database()` are meant for every
command of this group, so that a new command (stats, purge, ...) is one function.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import NoReturn

import click
import psycopg

from cdc_router.cli._durations import parse_duration, parse_since
from cdc_router.cli._options import EnvOption, config_option
from cdc_router.cli._outbox_options import key_value, schema_options
from cdc_router.cli._output import age_text, emit, output_option
from cdc_router.cli._plan import confirm
from cdc_router.cli._postgres import DEFAULT_DSN, changed_database, database, dsn_option
from cdc_router.config.json_bounds import MAX_JSON_DEPTH
from cdc_router.config.load import load_config
from cdc_router.config.relay import DEFAULT_SEQ_COLUMN, DEFAULT_TXID_COLUMN
from cdc_router.errors import ConfigError, DatabaseError, InvalidEventError
from cdc_router.outbox import (
    DEFAULT_HEARTBEAT_TABLE,
    DEFAULT_PUBLICATION,
    CaptureSetup,
    OutboxSchema,
    init_outbox,
    init_steps,
    outbox_stats,
    purge_cutoff,
    relay_columns_ddl,
    render_ddl,
    render_psql,
    write_event,
)
from cdc_router.outbox import purge as purge_rows
from cdc_router.outbox.relay_columns import (
    add_relay_columns,
    partitioned_by,
    rewrite_warning,
    seq_not_null_fix,
)
from cdc_router.outbox.republish import (
    RowSelection,
    change_event,
    count_rows,
    ids_for_column,
    key_columns,
    outbox_rows,
)
from cdc_router.outbox.tools import relay_outbox_column
from cdc_router.postgres import column_types, table_columns
from cdc_router.router.republish import check_republish, raw_topic
from cdc_router.router.republish import republish as republish_events


@click.group("outbox")
def cli() -> None:
    """The outbox table, its publication and replication role; writing events."""


@cli.command()
@dsn_option
@schema_options
@click.option("--publication", default=DEFAULT_PUBLICATION, show_default=True,
              help="Insert-only publication Debezium reads (publication.name).")
@click.option("--heartbeat-table", default=DEFAULT_HEARTBEAT_TABLE, show_default=True,
              help="Table that Debezium's heartbeat.action.query upserts.")
@click.option("--replication-role", help="Also create this least-privilege role for Debezium.")
@click.option("--replication-password", envvar="CDC_ROUTER_DB_PASSWORD",
              help="The role's password [env CDC_ROUTER_DB_PASSWORD].")
@click.option("--alter-role", is_flag=True, help="Also give a --replication-role that exists "
              "LOGIN REPLICATION and the password (by default only a role init creates).")
@click.option("--relay", "relay_columns", is_flag=True,
              help="Also add the columns `cdc-router relay` reads (txid, seq) and their "
              "indexes. On a table with rows this rewrites it under an exclusive lock "
              "(INSERTs wait): asked first, refused without a terminal unless --yes.")
@click.option("--yes", is_flag=True, help="Do not ask (--relay on a table with rows).")
@click.option("--print", "print_sql", is_flag=True,
              help="Print a psql script instead (psql -v replication_password=... -f -).")
def init(dsn: str, schema: OutboxSchema, publication: str, heartbeat_table: str,
         replication_role: str | None, replication_password: str | None, alter_role: bool,
         relay_columns: bool, yes: bool, print_sql: bool) -> None:
    """Create the outbox, heartbeat table, publication (and role) if missing; idempotent."""
    setup = CaptureSetup(publication, heartbeat_table, replication_role)
    relay_ddl = relay_columns_ddl(schema.table, DEFAULT_TXID_COLUMN, DEFAULT_SEQ_COLUMN) \
        if relay_columns else []
    if print_sql:
        click.echo(render_psql(init_steps(schema, setup), replication_role,
                               alter_role=alter_role) +
                   render_ddl(relay_ddl), nl=False)
        return
    if replication_role is not None and alter_role and not replication_password:
        raise ConfigError("--alter-role needs a password", field="--replication-password",
                          hint="pass --replication-password or set CDC_ROUTER_DB_PASSWORD")
    with database(dsn) as conn:
        click.echo(changed_database(conn, dsn))
        if relay_columns:  # refused before anything is made (review 34-2, QA 46-c: NULL seqs)
            partitioned_by(conn, schema.table, DEFAULT_SEQ_COLUMN, "--table")
            seq_not_null_fix(conn, schema.table, DEFAULT_SEQ_COLUMN)
            if rewrite := rewrite_warning(conn, schema.table, DEFAULT_TXID_COLUMN,
                                          DEFAULT_SEQ_COLUMN):
                click.echo(f"warning: {rewrite}", err=True)
                confirm("rewrite it now?", yes)
        report = init_outbox(conn, schema, setup, replication_password=replication_password,
                             relay=relay_columns, alter_role=alter_role)
        conn.commit()
        relay_changed = relay_columns and add_relay_columns(
            conn, schema.table, DEFAULT_TXID_COLUMN, DEFAULT_SEQ_COLUMN)
    for verb, label, _ in report.steps:
        click.echo(f"{verb:<8} {label}")
    if relay_ddl:
        click.echo(f"ensured  relay columns {DEFAULT_TXID_COLUMN}, {DEFAULT_SEQ_COLUMN} on "
                   f"{schema.table}")
    if report.password is not None:
        click.echo(f"password of role {replication_role}: {report.password}")
    for warning in report.warnings:
        if warning not in report.not_ready:
            click.echo(f"warning: {warning}", err=True)
    for note in report.notes:
        click.echo(f"note: {note}")
    for problem in report.not_ready:  # QA 55-a F-5: it said "outbox ready", exit 0
        click.echo(f"error: outbox not ready: {problem}", err=True)
    if report.not_ready:
        sys.exit(1)
    # QA 46-b F5: it said "nothing changed" after adding the relay's columns and indexes.
    click.echo("outbox ready" + ("" if report.changed or relay_changed else " (nothing changed)"))


@cli.command()
@dsn_option
@schema_options
@click.option("--aggregate-type", required=True, help="What the event is about (Order).")
@click.option("--aggregate-id", required=True, help="Which one (42).")
@click.option("--type", "event_type", required=True, help="Event type (OrderPaid).")
@click.option("--payload", required=True, help="JSON object or array; '-' reads stdin.")
@click.option("--header", "headers", multiple=True, metavar="KEY=VALUE",
              help="A string header; repeatable.")
@click.option("--event-id", help="Event id (UUID); default: a new UUIDv7.")
def write(dsn: str, schema: OutboxSchema, aggregate_type: str, aggregate_id: str,
          event_type: str, payload: str, headers: tuple[str, ...],
          event_id: str | None) -> None:
    """Write one event to the outbox (committed) and print its id."""
    text = sys.stdin.read() if payload == "-" else payload
    try:
        # Review 50-d F2: floats lost digits (12345678901234567.89 became 12345678901234568,
        # 1.10 became 1.1); as Decimals, write_event writes each number as given.
        value = json.loads(text, parse_float=Decimal, parse_constant=_not_json_constant)
    except json.JSONDecodeError as error:
        raise ConfigError(f"not valid JSON: {error.msg}", field="--payload") from error
    except ValueError as error:  # NaN, Infinity; an integer of over 4,300 digits
        raise ConfigError(f"not valid JSON: {error}", field="--payload") from None
    except RecursionError:  # review 50-d F17: a traceback
        raise ConfigError(f"nested deeper than the router reads ({MAX_JSON_DEPTH} levels)",
                          field="--payload") from None
    if not isinstance(value, dict | list):
        raise ConfigError("must be a JSON object or array", field="--payload", value=text)
    header_map = dict(key_value(item, "--header") for item in headers)
    try:
        with database(dsn) as conn, conn.transaction():
            written = write_event(conn, aggregate_type=aggregate_type,
                                  aggregate_id=aggregate_id, type=event_type, payload=value,
                                  headers=header_map or None, event_id=event_id, schema=schema)
    except InvalidEventError as error:  # review 53-c F12: it named write_event's parameters
        name, _, problem = str(error).partition(" ")
        if name not in _WRITE_OPTIONS:
            raise
        raise ConfigError(problem.removeprefix("is "), field=_WRITE_OPTIONS[name]) from None
    except DatabaseError as error:
        cause = error.__cause__
        if not isinstance(cause, psycopg.errors.UniqueViolation) or not (
                cause.diag.message_detail or "").startswith(f"Key ({schema.columns.id})="):
            raise
        raise ConfigError(f"event id {event_id} is already in {schema.table}: leave "
                          "--event-id out for a new one", field="--event-id") from None
    click.echo(written)


# write_event's parameters named in its errors, as this command's options
_WRITE_OPTIONS = {"aggregate_type": "--aggregate-type", "aggregate_id": "--aggregate-id",
                  "type": "--type", "event_id": "--event-id"}


def _not_json_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON (RFC 8259); send null or a string")


@cli.command()
@dsn_option
@schema_options
@output_option
def stats(dsn: str, schema: OutboxSchema, output: str) -> None:
    """Rows pending in the outbox, the age of the oldest, the table's size."""
    with database(dsn) as conn:
        found = outbox_stats(conn, schema)
    emit(found, output, lambda s: (
        f"table        {s.table}\nrows         {s.rows}\n"
        f"oldest       {age_text(s.oldest_age_s)}"  # QA 48-a F-low-2: 881328355.0s ago
        f"{'' if schema.columns.created_at else ' (the table has no created_at column)'}\n"
        f"size         {s.table_bytes / 1024 / 1024:.1f} MiB"))


@cli.command()
@dsn_option
@schema_options
@click.option("--older-than", required=True, metavar="DURATION",
              help="Delete rows created longer ago than this: 30s, 15m, 12h, 7d.")
@click.option("--batch-size", type=click.IntRange(min=1), default=5000, show_default=True,
              help="Rows per DELETE (each in its own short transaction).")
@click.option("--dry-run", is_flag=True, help="Only count the rows that would go.")
@click.option("--yes", is_flag=True, help="Do not ask.")
@click.option("--force", is_flag=True, help="Purge a relay's outbox too, whose rows are "
              "events the relay has not delivered yet.")
def purge(dsn: str, schema: OutboxSchema, older_than: str, batch_size: int, dry_run: bool,
          yes: bool, force: bool) -> None:
    """Delete old outbox rows, oldest first, in bounded chunks.

    Rows go whether or not the router has delivered their events: Debezium took each event from
    the WAL when its transaction committed, so check the router's lag before purging recent rows.
    A `cdc-router relay` reads its events from the table itself: its outbox needs --force.
    """
    window = parse_duration(older_than, option="--older-than", allow_zero=True)
    older_than_ms = window // timedelta(milliseconds=1)
    with database(dsn) as conn:
        relay_column = relay_outbox_column(conn, schema)
        if relay_column is not None and not force and not dry_run:
            raise ConfigError(
                f"{schema.table} is a relay's outbox (its xid8 column {relay_column} is "
                "`cdc-router relay`'s): the relay deletes each row it delivered, so these rows "
                "are events not delivered yet (or dead letters' rows; at least once, also "
                "rows a killed relay delivered that its next start could not prove delivered, "
                "with dedup off or past dedup.window_ms), and purging them loses the "
                "undelivered ones; check the relay's lag (`cdc-router status`), "
                "`cdc-router dlq list` and whether their ids are on the destinations, then add "
                "--force", field="--force")
        # One cutoff for the count and the delete: not rows aged past it while one answers.
        before = purge_cutoff(conn, schema, older_than_ms)
        count = purge_rows(conn, schema, older_than_ms, batch_size, dry_run=True, before=before)
        click.echo(f"{count} rows of {schema.table} are older than {older_than}")
        if dry_run or count == 0:
            return
        confirm("delete them?", yes)
        conn.rollback()  # end the counting transaction; each chunk commits on its own
        conn.autocommit = True
        deleted = purge_rows(conn, schema, older_than_ms, batch_size, before=before)
    click.echo(f"deleted {deleted} rows")


@cli.command()
@config_option()
@click.option("--dsn", envvar="CDC_ROUTER_PG_DSN", cls=EnvOption,
              help="Postgres connection string [env CDC_ROUTER_PG_DSN; default: cleanup.dsn, "
                   "else the local stack].")
@click.option("--since", metavar="TIME", help="Rows created at or after TIME: ISO-8601 (UTC "
              "unless it says) or a duration back from now (2h).")
@click.option("--ids", "id_lists", multiple=True, metavar="ID[,ID...]",
              help="Only these event ids; repeatable.")
@click.option("--id", "exact_ids", multiple=True, metavar="ID",
              help="Only this event id, exactly as written (commas and spaces kept); "
                   "repeatable.")
@click.option("--topic", help="The raw change topic [default: the config's source topic].")
@click.option("--key-columns", "key_setting", metavar="COLUMNS",
              help="The connector's message.key.columns (its whole value, or the outbox "
                   "table's columns in it, e.g. aggregateid), so that each row goes to the raw "
                   "partition Debezium gave it [default: the id, Debezium's key without it].")
@click.option("--dry-run", is_flag=True, help="Only count the rows.")
@click.option("--yes", is_flag=True, help="Do not ask.")
def republish(config_path: Path, dsn: str | None, since: str | None, id_lists: tuple[str, ...],
              exact_ids: tuple[str, ...], topic: str | None, key_setting: str | None,
              dry_run: bool, yes: bool) -> None:
    """Re-emit outbox rows onto the raw topic, after a lost slot or a connector reset.

    The rows become change events shaped like Debezium's; the running router routes them and
    drops those it already delivered (its replay filter), so each event arrives once.
    """
    if (since is None) == (not id_lists and not exact_ids):
        raise ConfigError("give --since, or --ids/--id (one of them)", field="--since/--ids")
    config = load_config(config_path, env=os.environ).config
    check_republish(config)
    target = raw_topic(config, topic)
    now_ms = int(time.time() * 1000)
    given = [("--id", event_id) for event_id in exact_ids]
    for item in id_lists:
        if not (parts := [part.strip() for part in item.split(",") if part.strip()]):
            raise ConfigError("no ids given", field="--ids", value=item)  # review 53-c F13
        given += [("--ids", part) for part in parts]
    schema = config.source.outbox.outbox_schema(config.cleanup.table)
    if since is not None and schema.columns.created_at is None:
        raise ConfigError("the outbox has no created_at column, so --since cannot tell which "
                          "rows are recent", source=str(config_path),
                          field="source.outbox.created_at", hint="select the rows with "
                          "--ids/--id, or name the column that holds their time there")
    with database(dsn or config.cleanup.dsn or DEFAULT_DSN) as conn:
        # A column listed with several names (a rename): the first of them the table has.
        if schema.listed:
            schema = schema.for_table(column_types(conn, schema.table, "cleanup.table"))
        key = key_columns(key_setting, schema)
        types = table_columns(conn, schema.table, "cleanup.table",
                              {f"--key-columns ({column})": column for column in key})
        # Review 53-c F11: a column the table lacks was blamed on --column, which republish
        # has not: its names are the config's. Those its SQL names (it reads rows with `*`,
        # and the router says what a change event lacks).
        for name in ("id", "created_at"):
            if (column := getattr(schema.columns, name)) is not None and column not in types:
                raise ConfigError(f"the outbox table {schema.table} has no column {column!r}",
                                  source=str(config_path), field=f"source.outbox.{name}",
                                  value=column, hint=f"name the table's {name} column there "
                                  f"(it has {', '.join(list(types)[:12])})" + (
                                      ", or null for a table without one"
                                      if name == "created_at" else ""))
        selection = RowSelection(since_ms=parse_since(since, option="--since", now_ms=now_ms)) \
            if since is not None else ids_for_column(given, types.get(schema.columns.id, ""),
                                                     schema.columns.id)
        # With --yes no prompt waits between the count and the stream: both read one snapshot,
        # so exactly the rows counted go (QA 67-b F-5); a prompt's wait holds no transaction.
        if one_snapshot := yes and not dry_run:
            conn.commit()
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        count, oldest, missing = count_rows(conn, schema, selection)
        if not one_snapshot:
            conn.commit()
        click.echo(f"{count} rows of {schema.table} to republish onto {target}")
        if missing:  # purged, or mistyped (QA 47-d F3); a script must not go on (53-c F13)
            named = [given[(selection.ids or ()).index(event_id)] for event_id in missing]
            raise ConfigError(
                f"not in {schema.table}: {', '.join(repr(value) for _, value in named)}; "
                "nothing was republished", field="/".join(sorted({o for o, _ in named})),
                hint="a delivered row may have been deleted by the cleanup: leave those ids out")
        _warn_beyond_window(oldest, now_ms, config.dedup.window_ms)
        if dry_run or count == 0:
            return
        confirm("republish them?", yes)
        events = (change_event(row, schema, binary_handling=config.source.binary_handling,
                               ts_ms=now_ms, key=key, types=types)
                  for row in outbox_rows(conn, schema, selection))
        done = republish_events(config, target, events)
    click.echo(f"republished {done} change events onto {target}{_against_count(done, count)}; "
               "the router drops those it already delivered")


def _against_count(done: int, counted: int) -> str:
    """What differs from the count: the rows are read by a second query, after the count and
    its prompt, so rows written or deleted between are in it or not (QA 67-b F-5: "50950 rows
    ... to republish", then "republished 50960", without a word)."""
    if done > counted:
        return f" ({done - counted} more than counted: rows written since the count)"
    if done < counted:
        return f" ({counted - done} fewer than counted: rows deleted since the count)"
    return ""


def _warn_beyond_window(oldest_us: int | None, now_ms: int, window_ms: int) -> None:
    if oldest_us is None:
        return
    if now_ms - oldest_us // 1000 > window_ms:
        # QA 33-c: the line named the oldest row's time, not the window's edge.
        click.echo(f"warning: rows created before {_utc((now_ms - window_ms) * 1000)} "
                   f"(now less dedup.window_ms; the oldest selected: {_utc(oldest_us)}): an "
                   "event delivered longer ago than that is forgotten by the replay filter and "
                   "would be delivered again", err=True)


def _utc(epoch_us: int) -> str:
    """ISO-8601 UTC of epoch microseconds, or the number where Python's years end."""
    try:
        return (datetime(1970, 1, 1) + timedelta(microseconds=epoch_us)).isoformat() + "Z"
    except OverflowError:
        return f"{epoch_us} us since 1970"
