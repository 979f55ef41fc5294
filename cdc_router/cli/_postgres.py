"""Postgres for the commands that take --dsn: the option, and a connection whose failures
read as one line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
import psycopg
from click.core import ParameterSource

from cdc_router.cli._options import EnvOption
from cdc_router.config.dsn import dsn_problem, misread_user_info, refused_dsn
from cdc_router.errors import ConfigError, DatabaseError
from cdc_router.postgres import column_hint, one_line

DEFAULT_DSN = "postgresql://postgres:postgres@127.0.0.1:15432/postgres"
DSN_HINT = "check --dsn (env CDC_ROUTER_PG_DSN)"  # where a command's Postgres comes from

dsn_option = click.option(
    "--dsn", envvar="CDC_ROUTER_PG_DSN", default=DEFAULT_DSN, cls=EnvOption,
    help="Postgres connection string [env CDC_ROUTER_PG_DSN; default: the local stack].")


@contextmanager
def database(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection whose failures become one-line DatabaseErrors naming host, port and db."""
    where = _where(dsn)
    try:
        connection = psycopg.connect(dsn, connect_timeout=10)
    except psycopg.Error as error:
        if (problem := refused_dsn(dsn, error)) is not None:  # no server asked (reread 59 F-2)
            raise ConfigError(problem, field=dsn_named()) from None
        raise DatabaseError(f"Postgres at {where}: {one_line(error)}; {DSN_HINT}") from error
    try:
        with connection as conn:
            yield conn
    except psycopg.Error as err:
        raise DatabaseError(f"Postgres at {where}: {one_line(err)}{column_hint(err)}") from err


def dsn_named() -> str:
    """The --dsn in use as its errors name it: CDC_ROUTER_PG_DSN when it came from there
    (review 53-c F18: an error of the variable's value named --dsn, which was not given)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.get_parameter_source("dsn") is ParameterSource.ENVIRONMENT:
        return "CDC_ROUTER_PG_DSN"
    return "--dsn"


def changed_database(conn: psycopg.Connection[Any], dsn: str) -> str:
    """The first line of a command that changes a database: which one it connected to (host,
    port and database, never the password), and when --dsn was left at its default, that it
    is the local stack's (QA 55-b F-5: `outbox init` changed the default's without a word)."""
    info = conn.info
    default = (" (the default --dsn: the local stack; pass --dsn or set CDC_ROUTER_PG_DSN "
               "for another)") if dsn == DEFAULT_DSN and dsn_named() == "--dsn" else ""
    return f"Postgres {info.host}:{info.port}/{info.dbname}{default}"


def _where(dsn: str) -> str:  # never the DSN itself: it may carry a password
    if misread_user_info(dsn):  # its host, port or database would be a piece of the password
        raise ConfigError(dsn_problem(dsn) or "not a connection string", field=dsn_named())
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        # libpq's reason quotes the string's words, a password among them.
        raise ConfigError(dsn_problem(dsn) or "not a connection string",
                          field=dsn_named()) from None
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"
