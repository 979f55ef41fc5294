"""The shared Postgres helpers: one-line error text and the chunked delete, without a server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from cdc_router.cli._postgres import database
from cdc_router.config.dsn import dsn_problem, refused_dsn
from cdc_router.config.load import load_config
from cdc_router.errors import ConfigError
from cdc_router.postgres import (
    delete_in_chunks,
    one_line,
    refused_for_good,
    session_options,
    utc_now_for,
)


class _Diag:
    message_primary = 'relation "public.nope" does not exist'


class _ServerError(psycopg.errors.UndefinedTable):
    diag = _Diag()  # type: ignore[assignment]


def test_a_server_error_is_its_primary_message_without_the_caret() -> None:
    error = _ServerError('relation "public.nope" does not exist\nLINE 1: SELECT * FROM public.'
                         'nope\n                      ^')

    assert one_line(error) == 'relation "public.nope" does not exist'


def test_a_client_error_keeps_every_line_on_one() -> None:
    error = psycopg.OperationalError('connection to server at "127.0.0.1", port 9 failed: '
                                     'Connection refused\n\tIs the server running on that host?\n')

    assert one_line(error) == ('connection to server at "127.0.0.1", port 9 failed: Connection '
                               "refused; Is the server running on that host?")


def test_an_error_without_text_is_its_class_name() -> None:
    assert one_line(psycopg.InterfaceError()) == "InterfaceError"


class _Transaction:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _Result:
    def __init__(self, rowcount: int) -> None:
        self.rowcount = rowcount


class ChunkedConnection:
    """Answers each DELETE with the next of `counts`, one transaction per statement."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts
        self.statements: list[tuple[str, Any]] = []
        self.transactions = 0

    def transaction(self) -> _Transaction:
        self.transactions += 1
        return _Transaction()

    def execute(self, query: sql.Composed, params: Any) -> _Result:
        self.statements.append((query.as_string(None), params))
        return _Result(self.counts.pop(0))


def test_chunks_go_on_until_a_short_one_each_in_its_own_transaction() -> None:
    conn = ChunkedConnection([3, 3, 1, 3])

    counts = list(delete_in_chunks(conn, sql.Identifier("public", "t"),  # type: ignore[arg-type]
                                   sql.SQL("age > %s"), (7,), batch_size=3,
                                   order_by=sql.Identifier("age")))

    assert counts == [3, 3, 1]
    assert conn.transactions == 3
    statement, params = conn.statements[0]
    assert statement == (
        'WITH chunk AS MATERIALIZED (SELECT tableoid AS chunk_rel, ctid AS chunk_tid FROM '
        '"public"."t" WHERE age > %s ORDER BY "age" LIMIT 3) DELETE FROM "public"."t" AS target '
        "USING chunk WHERE target.ctid = ANY(ARRAY(SELECT chunk_tid FROM chunk)) "
        "AND target.tableoid = chunk.chunk_rel AND target.ctid = chunk.chunk_tid")
    assert params == (7,)


def test_a_chunk_is_deleted_by_partition_and_place_not_by_place_alone() -> None:
    # QA 53-h F2: a ctid is unique only within one partition; matched alone, `outbox purge`
    # and the dedup store's purge also deleted the rows of other partitions at the same place.
    conn = ChunkedConnection([0])

    list(delete_in_chunks(conn, sql.Identifier("t"), sql.SQL("true"), (),  # type: ignore[arg-type]
                          batch_size=10))

    statement = conn.statements[0][0]
    assert "target.tableoid = chunk.chunk_rel AND target.ctid = chunk.chunk_tid" in statement
    assert "ctid = ANY" in statement  # keeps the delete a TID scan


@pytest.mark.parametrize("batch_size", [0, -1])
def test_a_batch_below_one_is_refused_before_any_statement(batch_size: int) -> None:
    conn = ChunkedConnection([])

    with pytest.raises(ConfigError, match="batch_size"):
        delete_in_chunks(conn, sql.Identifier("t"), sql.SQL("true"), (),  # type: ignore[arg-type]
                         batch_size=batch_size)

    assert conn.statements == []


@pytest.mark.parametrize(("column_type", "now"), [
    ("timestamp with time zone", "now()"),
    ("timestamp(6) with time zone", "now()"),  # how format_type prints timestamptz(6)
    ("timestamp without time zone", "(now() AT TIME ZONE 'UTC')"),
    ("timestamp(3) without time zone", "(now() AT TIME ZONE 'UTC')"),
    ("date", "(now() AT TIME ZONE 'UTC')"),
])
def test_now_is_compared_in_the_columns_own_type(column_type: str, now: str) -> None:
    # A timestamptz compared with UTC's wall clock is read in the session's TimeZone: hours off
    # outside UTC (review, session 25; timestamptz(6) was missed at first).
    assert utc_now_for(column_type).as_string(None) == now


def test_the_routers_own_sessions_notice_a_vanished_host_unless_the_dsn_says_otherwise() -> None:
    # Review 44: without keepalives or tcp_user_timeout a query to a host gone without a FIN
    # waited about 15 minutes on the kernel's retries, and a SIGTERM with it.
    options = session_options("postgresql://u@db:5432/app", "cdc-router-relay")
    assert options["application_name"] == "cdc-router-relay"
    assert options["connect_timeout"] == 5
    assert options["keepalives"] == "1" and options["tcp_user_timeout"] == "30000"
    chosen = session_options("host=db keepalives_idle=60 tcp_user_timeout=0 "
                             "application_name=mine", "cdc-router-relay")
    assert "keepalives_idle" not in chosen and "tcp_user_timeout" not in chosen
    assert "application_name" not in chosen and chosen["keepalives_count"] == "3"
    assert session_options("not a = dsn '", "x")["connect_timeout"] == 5  # connect() says why



def test_a_libpq_variable_or_service_outranks_the_sessions_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 44-3: a keyword outranks libpq's environment and service file.
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "30")
    monkeypatch.setenv("PGAPPNAME", "ops")
    options = session_options("host=db", "cdc-router-relay")
    assert "connect_timeout" not in options and "application_name" not in options
    assert options["tcp_user_timeout"] == "30000"
    assert session_options("service=outbox", "cdc-router-relay") == {}


class _OnePublication:
    """Answers read_publication()'s query with one catalog row, or with none."""

    def __init__(self, row: tuple[Any, ...] | None) -> None:
        self.row = row

    def execute(self, query: str, params: tuple[str]) -> _OnePublication:
        assert "pg_publication" in query and params == ("cdc_router_outbox",)
        return self

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.row


def test_a_publication_is_read_as_its_operations_tables_and_root_flag() -> None:
    from cdc_router.ops.database import publication_state
    from cdc_router.postgres import Publication, read_publication

    # (pubinsert, pubupdate, pubdelete, pubtruncate, tables, pubviaroot)
    row = (True, False, True, False, ["public.outbox"], True)
    found = read_publication(_OnePublication(row), "cdc_router_outbox")  # type: ignore[arg-type]
    assert found == Publication(("insert", "delete"), ("public.outbox",), True)
    state = publication_state(_OnePublication(row), "cdc_router_outbox")  # type: ignore[arg-type]
    assert (state.exists, state.operations, state.tables, state.via_root) == (
        True, ("insert", "delete"), ("public.outbox",), True)
    none = _OnePublication(None)
    assert read_publication(none, "cdc_router_outbox") is None  # type: ignore[arg-type]
    assert not publication_state(_OnePublication(None),  # type: ignore[arg-type]
                                 "cdc_router_outbox").exists


@pytest.mark.parametrize(("dsn", "problem"), [
    ("postgresql://u:s3cret@127.0.0.1:5432/db?sslmode=bogus", "its sslmode 'bogus' is not one"),
    ("postgresql://u:s3cret@127.0.0.1:99999/db", "its port '99999' is not one from 1 to 65535"),
    ("host=127.0.0.1,::1 port=1,0 password=s3cret", "its port '0' is not one from 1 to 65535"),
    ("host=127.0.0.1 port=abc password=s3cret", "its port 'abc' is not an integer"),
    ("host=127.0.0.1 port=1 sslmode=Require password=s3cret", "its sslmode 'Require' is not"),
    ("host=127.0.0.1 port=1 target_session_attrs=master", "its target_session_attrs 'master'"),
    ("host=127.0.0.1 port=1 keepalives_idle=1.5", "its keepalives_idle '1.5' is not an")])
def test_a_dsn_libpq_refuses_before_contacting_a_server_is_a_problem_naming_the_option(
        dsn: str, problem: str) -> None:
    # Review 46-2 F5: it passed load, then the relay retried libpq's "connection is bad:
    # invalid sslmode value" forever and the cleanup warned forever.
    found = dsn_problem(dsn)
    assert found is not None and found.startswith(problem), found
    assert "s3cret" not in found
    with pytest.raises(psycopg.OperationalError, match="connection is bad"):
        psycopg.connect(dsn, connect_timeout=1)  # what libpq says of it, with no server


@pytest.mark.parametrize(("dsn", "problem"), [
    ("host=127.0.0.1 password=s3cret tail", "not a Postgres connection string"),
    ("postgresql://u:s3cret s@127.0.0.1/db", "not a Postgres connection string"),
    ("postgresql://u:p%zzs3cret@127.0.0.1/db", "not a Postgres connection string"),
    ("host=127.0.0.1 password='s3cret", "not a Postgres connection string"),
    ("host=127.0.0.1 pasword=s3cret", "its option 'pasword' is not one of libpq's connection "
     "parameters: did you mean 'password'?"),
    ("postgresql://u:s3cret@127.0.0.1/db?sslmod=require", "its option 'sslmod' is not one"),
    # reread 58-r F-5: a piece of a password that reads as an option is not quoted
    ("host=127.0.0.1 password=s3cret tail_s3cret=1", "not a Postgres connection string")])
def test_a_dsn_libpq_cannot_parse_is_a_problem_that_never_quotes_its_words(
        dsn: str, problem: str) -> None:
    # QA 57-c: libpq's own reason quotes the string's words ('missing "=" after "tail"',
    # 'unexpected spaces found in "s3cret s"'), a password's among them; an unknown option's
    # name is no secret and is the likeliest typo.
    found = dsn_problem(dsn)
    assert found is not None and found.startswith(problem), found
    assert "s3cret" not in found and "tail" not in found
    with pytest.raises(psycopg.ProgrammingError):
        psycopg.connect(dsn, connect_timeout=1)  # libpq refuses it before any server


@pytest.mark.parametrize(("dsn", "environment", "problem"), [
    ("host=127.0.0.1 port=1 password=s3cret sslmode=bogus", {},
     "its sslmode 'bogus' is not one libpq takes: disable, allow"),
    ("host=127.0.0.1 port=abc password=s3cret", {}, "its port 'abc' is not an integer"),
    ("host=127.0.0.1 password=s3cret tail", {}, "not a Postgres connection string"),
    # No DSN check knows it: libpq's own words name the option and the value.
    ("host=127.0.0.1 port=1 password=s3cret require_auth=bogus", {},
     "its require_auth 'bogus' is not one libpq takes"),
    ("host=127.0.0.1 port=1 password=s3cret", {"PGSSLMODE": "bogus"},
     "its sslmode 'bogus' is not one libpq takes: disable, allow, prefer, require, verify-ca, "
     "verify-full (from the environment variable PGSSLMODE: fix or unset it)"),
    ("host=127.0.0.1 password=s3cret", {"PGPORT": "abc"},
     "its port 'abc' is not an integer (from the environment variable PGPORT: fix or unset "
     "it)")])
def test_refused_dsn_says_what_libpq_refused_before_asking_any_server(
        monkeypatch: pytest.MonkeyPatch, dsn: str, environment: dict[str, str],
        problem: str) -> None:
    # Reread 59 F-2: these read "Postgres refuses the dedup store's connection".
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    with pytest.raises(psycopg.Error) as refused:
        psycopg.connect(dsn, connect_timeout=1)  # the real libpq: no server is asked
    said = refused_dsn(dsn, refused.value)
    assert said is not None and said.startswith(problem), said
    assert "s3cret" not in said


@pytest.mark.parametrize("message", [
    'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused',
    'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  '
    'password authentication failed for user "postgres"',
    'connection failed: connection to server at "127.0.0.1", port 5432 failed: server does not '
    "support SSL, but SSL was required"])
def test_refused_dsn_leaves_a_server_or_its_absence_to_the_caller(message: str) -> None:
    assert refused_dsn("host=127.0.0.1 sslmode=require", psycopg.OperationalError(message)) \
        is None


@pytest.mark.parametrize("error", [
    psycopg.errors.InsufficientPrivilege("permission denied for schema rvs"),
    psycopg.errors.UndefinedTable('relation "outbox" does not exist')])
def test_refused_dsn_leaves_a_servers_programming_error_to_the_caller(
        error: psycopg.Error) -> None:
    # Review rv62b: a role without USAGE on the outbox's schema was told "field 'cleanup.dsn':
    # not a Postgres connection string" (the server's 42501 is a ProgrammingError too).
    assert refused_dsn("postgresql://relay:x@db:5432/postgres", error) is None


@pytest.mark.parametrize("dsn", [
    "postgresql://postgres:Pa@ssW0rd@127.0.0.1:5432/postgres",
    "postgresql://postgres:pa/ssW0rd@127.0.0.1:5432/postgres",
    "postgres://postgres:9911/ssW0rd@127.0.0.1:5432/postgres"])
def test_a_password_with_an_at_or_a_slash_not_percent_encoded_is_never_shown(dsn: str) -> None:
    # QA 64-b: libpq ends the user info at the first '@' (or a '/' before it), so the rest of
    # the password became the host, port or database: `outbox stats` said "Postgres at
    # postgres:pa/ssW0rd@127.0.0.1:5432/postgres: failed to resolve host 'postgres'", `status`
    # "its port 'pa' is not an integer", the relay "failed to resolve host 'ssW0rd@...'".
    problem = "its user or password holds an '@' or a '/' that is not percent-encoded"
    for said in (dsn_problem(dsn), refused_dsn(dsn, psycopg.OperationalError(
            "connection failed: failed to resolve host 'ssW0rd@127.0.0.1'"))):
        assert said is not None and said.startswith(problem), said
        assert "ssW0rd" not in said and "write '@' as %40 and '/' as %2F" in said
    with pytest.raises(ConfigError, match=problem) as error, database(dsn):
        pass
    assert "ssW0rd" not in str(error.value)


def test_a_database_name_with_an_at_is_refused_with_the_way_to_write_it() -> None:
    # Review 64 (low): `postgresql://u:p@h/my@db` (libpq: database my@db) cannot be told from a
    # password `p@ss/x` written as is, so it is refused too: the line now says so, and %40
    # (which libpq decodes in the database name) is the way.
    said = dsn_problem("postgresql://u:p@h/my@db")
    assert said is not None and "or its database name an '@', which reads the same: write " \
        "'@' as %40" in said, said
    assert dsn_problem("postgresql://u:p@h/my%40db") is None
    assert psycopg.conninfo.conninfo_to_dict("postgresql://u:p@h/my%40db")["dbname"] == "my@db"


@pytest.mark.parametrize("dsn", [
    "postgresql://u:p%40ss%2Fw@h:5432/db", "postgresql://h/db?user=u&password=p@ss/w",
    "postgresql://u:p?ss@h/db", "host=h password=p@ss/w",
    "postgresql://u:p@h:5432/db?sslmode=verify-full&target_session_attrs=prefer-standby",
    "host=a,b port=5432,,5433", "host=h port=' 5432 ' keepalives=0", "dbname=x"])
def test_a_dsn_libpq_takes_has_no_problem(dsn: str) -> None:
    assert dsn_problem(dsn) is None


def test_the_relay_refuses_at_load_a_dsn_libpq_refuses(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    config.write_text("source: {topics: [raw]}\nroutes: [{topic: a}]\nrelay: {table: "
                      "public.outbox, dsn: 'postgresql://u:s3cret@h/db?sslmode=bogus'}\n",
                      "utf-8")
    with pytest.raises(ConfigError, match=r"field 'relay.dsn': its sslmode 'bogus'") as error:
        load_config(config, {})
    assert "s3cret" not in str(error.value)
    with pytest.raises(ConfigError, match=r"field 'cleanup.dsn': its port '99999'"):
        load_config(config, {
            "CDC_ROUTER__RELAY__DSN": "host=h", "CDC_ROUTER__CLEANUP__MODE": "delete",
            "CDC_ROUTER__CLEANUP__DSN": "host=h port=99999 password=s3cret"})


class _SqlAsciiCatalog:
    """Answers column_types()'s query as psycopg does in a SQL_ASCII database: bytes."""

    def execute(self, query: str, params: tuple[str]) -> _SqlAsciiCatalog:
        assert "pg_attribute" in query and params == ('"public"."outbox"',)
        return self

    def fetchall(self) -> list[tuple[bytes, bytes]]:
        return [(b"id", b"uuid"), (b"seq", b"bigint"), (b"txid", b"xid8")]


def test_column_types_of_a_sql_ascii_database_are_text_not_bytes_reprs() -> None:
    # Review 46 F6: str(b'txid') is "b'txid'", and the relay's checks found no txid column.
    from cdc_router.postgres import column_types

    types = column_types(_SqlAsciiCatalog(), "public.outbox")  # type: ignore[arg-type]
    assert types == {"id": "uuid", "seq": "bigint", "txid": "xid8"}


@pytest.mark.parametrize(("message", "for_good"), [
    ('connection failed: connection to server at "127.0.0.1", port 15432 failed: server does '
     "not support SSL, but SSL was required", True),
    ('connection is bad: invalid sslmode value: "bogus"', True),  # PGSSLMODE, no DSN to check
    ('connection failed: connection to server at "127.0.0.1", port 15432 failed: FATAL:  '
     'password authentication failed for user "postgres"', True),
    # Review 51-d F7: pg_hba.conf's `reject`, NOLOGIN, no CONNECT were retried for ever.
    ('connection failed: connection to server at "127.0.0.1", port 15432 failed: FATAL:  '
     'pg_hba.conf rejects connection for host "127.0.0.1", user "rejected", database '
     '"postgres", no encryption', True),
    ('connection failed: connection to server at "127.0.0.1", port 15432 failed: FATAL:  role '
     '"nolog" is not permitted to log in', True),
    ('connection failed: connection to server at "127.0.0.1", port 15432 failed: FATAL:  '
     'permission denied for database "app"\nDETAIL:  User does not have CONNECT privilege.',
     True),
    ('connection failed: connection to server at "127.0.0.1", port 15432 failed: Connection '
     "refused", False),
    ("connection failed: FATAL:  the database system is starting up", False),
])
def test_what_no_retry_cures_is_told_from_an_outage(message: str, for_good: bool) -> None:
    # QA 46-a F5: sslmode=require against a server without TLS had the cleanup retry for ever.
    assert refused_for_good(psycopg.OperationalError(message)) is for_good
