"""PostgresDedupStore's connection options (no database: psycopg.connect is replaced)."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_router.consumer.dedup import postgres
from cdc_router.consumer.dedup.postgres import PostgresDedupStore
from cdc_router.errors import ConfigError


def connect_options(monkeypatch: pytest.MonkeyPatch, dsn: str) -> dict[str, Any]:
    """The keywords the store's first connection of `dsn` is opened with."""
    seen: dict[str, Any] = {}

    class Connection:
        closed = False

    def connect(conninfo: str, **options: Any) -> Connection:
        seen.update(options, conninfo=conninfo)
        return Connection()

    monkeypatch.setattr(postgres.psycopg, "connect", connect)
    PostgresDedupStore(dsn, connect_timeout_s=7)._connection()
    return seen


def test_the_store_connects_with_the_liveness_options_of_the_routers_sessions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 46 F3: without keepalives and tcp_user_timeout a Postgres host gone without a
    # FIN held run_once, and the consumer's stop, for the kernel's TCP retries (~15 min).
    monkeypatch.delenv("PGAPPNAME", raising=False)
    options = connect_options(monkeypatch, "host=db dbname=app")
    assert options["keepalives"] == "1" and options["tcp_user_timeout"] == "30000"
    assert options["autocommit"] is True and options["connect_timeout"] == 7
    assert options["application_name"] == "cdc-router-consumer"


def test_the_dsns_own_liveness_settings_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    options = connect_options(monkeypatch, "host=db tcp_user_timeout=0 keepalives_idle=60")
    assert "tcp_user_timeout" not in options and "keepalives_idle" not in options
    assert options["keepalives_count"] == "3"


@pytest.mark.parametrize(("refusal", "for_good"), [
    ('FATAL:  password authentication failed for user "app"', True),
    ('FATAL:  role "app" does not exist', True),
    ("Connection refused", False),  # a server away: waited for, as before
    ("FATAL:  the database system is starting up", False),
])
def test_a_connection_refused_for_good_stops_the_consumer_at_its_first_record(
        monkeypatch: pytest.MonkeyPatch, refusal: str, for_good: bool) -> None:
    # Review 51-d F6: a wrong password was retried for ever as an outage ("retry_scheduled
    # reason=store_failed"), every partition held, though the DSN is fixed in the process.
    import psycopg

    from cdc_router.errors import DedupStoreError, DedupStoreRefused
    from tests.unit.consumer_fakes import Harness, rec

    def connect(conninfo: str, **options: Any) -> None:
        raise psycopg.OperationalError('connection failed: connection to server at "127.0.0.1"'
                                       f", port 5432 failed: {refusal}")

    monkeypatch.setattr(postgres.psycopg, "connect", connect)
    store = PostgresDedupStore("postgresql://app:wrong@127.0.0.1/app")
    harness = Harness({0: [rec("a", {"n": 1})]}, store=store)
    if not for_good:
        with pytest.raises(DedupStoreError, match="cannot connect to the dedup database"):
            store.run_once(postgres.DedupKey("g", "a"), lambda conn: None)
        return
    with pytest.raises(DedupStoreRefused) as stopped:
        harness.run()
    assert str(stopped.value).startswith("Postgres refuses the dedup store's connection: ")
    assert refusal in str(stopped.value) and str(stopped.value).endswith(
        "check the DSN's user, password and database, that the role may log in (LOGIN) and "
        "CONNECT to the database, and that pg_hba.conf lets this host in")
    assert harness.effects == [] and harness.stored_offset_of(0) == 0


@pytest.mark.parametrize(("dsn", "problem"), [
    ("host=db password=s3cret tail", "not a Postgres connection string"),
    ("postgresql://u:s3cret s@db/x", "not a Postgres connection string"),
    ("host=db pasword=s3cret", "its option 'pasword' is not one of libpq's connection "
     "parameters: did you mean 'password'?"),
    # Reread 59 F-2: an invalid value read "Postgres refuses the dedup store's connection".
    ("host=127.0.0.1 port=1 password=s3cret sslmode=bogus", "its sslmode 'bogus' is not one "
     "libpq takes: disable, allow, prefer, require, verify-ca, verify-full"),
    ("host=127.0.0.1 port=1 password=s3cret target_session_attrs=bogus",
     "its target_session_attrs 'bogus' is not one libpq takes: any, read-write"),
    ("host=127.0.0.1 port=abc password=s3cret", "its port 'abc' is not an integer")])
def test_a_dsn_libpq_refuses_is_said_so_naming_the_option_and_never_quoting_its_words(
        dsn: str, problem: str) -> None:
    # QA 57-c: the refusal quoted psycopg's text, 'missing "=" after "tail"', 'unexpected
    # spaces found in "s3cret s"': a piece of the password in the consumer's logs. The real
    # psycopg.connect: libpq refuses these before it contacts any server.
    from cdc_router.errors import DedupStoreRefused

    with pytest.raises(DedupStoreRefused) as refused:
        PostgresDedupStore(dsn).check_usable()
    said = str(refused.value)
    assert said.startswith("libpq refuses the dedup store's DSN, before asking any server: "
                           f"{problem}"), said
    assert "s3cret" not in said and "tail" not in said and "Postgres refuses" not in said
    assert refused.value.__cause__ is None and refused.value.__suppress_context__


def test_a_pg_variable_libpq_refuses_is_named_as_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_router.errors import DedupStoreRefused

    monkeypatch.setenv("PGSSLMODE", "bogus")
    with pytest.raises(DedupStoreRefused) as refused:
        PostgresDedupStore("host=127.0.0.1 port=1").check_usable()
    assert str(refused.value) == (
        "libpq refuses the dedup store's DSN, before asking any server: its sslmode 'bogus' is "
        "not one libpq takes: disable, allow, prefer, require, verify-ca, verify-full (from "
        "the environment variable PGSSLMODE: fix or unset it)")


def test_a_server_without_tls_gets_advice_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 57-c F-5: it got the advice for a refused login (user, password, pg_hba.conf).
    import psycopg

    from cdc_router.errors import DedupStoreRefused

    text = ('connection failed: connection to server at "127.0.0.1", port 5432 failed: server '
            "does not support SSL, but SSL was required")

    def connect(conninfo: str, **options: Any) -> None:
        raise psycopg.OperationalError(text)

    monkeypatch.setattr(postgres.psycopg, "connect", connect)
    with pytest.raises(DedupStoreRefused) as refused:
        PostgresDedupStore("host=db sslmode=require").check_usable()
    assert str(refused.value) == f"Postgres refuses the dedup store's connection: {text}; " \
        "the server does not speak TLS: set sslmode=prefer (or disable) in the DSN, or " \
        "enable ssl on the server"


@pytest.mark.parametrize(("options", "field"), [
    ({"lock_timeout_s": "5"}, "lock_timeout_s"),
    ({"lock_timeout_s": float("nan")}, "lock_timeout_s"),
    ({"lock_timeout_s": float("inf")}, "lock_timeout_s"),
    ({"lock_timeout_s": -1}, "lock_timeout_s"),
    ({"lock_timeout_s": 30 * 86400}, "lock_timeout_s"),  # reread 52-l F5: Postgres's limit
    ({"connect_timeout_s": "x"}, "connect_timeout_s"),
    ({"connect_timeout_s": 0}, "connect_timeout_s"),
    ({"connect_timeout_s": True}, "connect_timeout_s"),
    ({"table": 7}, "table"),
])
def test_bad_numbers_are_a_config_error_naming_the_field(options: dict[str, Any],
                                                          field: str) -> None:
    # Review 52-c F-med-5: "5" was a TypeError traceback, NaN a ValueError one.
    with pytest.raises(ConfigError) as raised:
        PostgresDedupStore("host=db", **options)
    assert raised.value.field == field
    assert "\n" not in str(raised.value) and f"field {field!r}" in str(raised.value)


def test_a_conninfo_that_is_not_a_string_is_named_by_its_type_only() -> None:
    with pytest.raises(ConfigError, match=r"field 'conninfo'.*got 'bytes'"):
        PostgresDedupStore(b"postgresql://u:secret@db/app")  # type: ignore[arg-type]


def test_lock_timeout_zero_still_means_wait_for_ever() -> None:
    PostgresDedupStore("host=db", lock_timeout_s=0)
    PostgresDedupStore("host=db", lock_timeout_s=2_147_483.647)  # Postgres's largest
    PostgresDedupStore("host=db", lock_timeout_s=0.5, connect_timeout_s=3)


def test_a_server_that_does_not_answer_at_ensure_schema_exits_75(
        capsys: pytest.CaptureFixture[str]) -> None:
    # QA 61-b F4: the README's snippet and the example called ensure_schema() before run()
    # and exited 1 while Postgres restarted; 75 is "a restart may cure it".
    from cdc_router.consumer.dedup import DedupStoreUnreachable
    from cdc_router.examples.fulfillment import main

    dsn = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"
    with pytest.raises(DedupStoreUnreachable, match="cannot connect to the dedup database") as \
            raised:
        PostgresDedupStore(dsn).ensure_schema()
    assert raised.value.exit_code == 75
    assert main(["--bootstrap", "127.0.0.1:1", "--dsn", dsn, "--topic", "payments"]) == 75
    assert capsys.readouterr().err.startswith("error: cannot connect to the dedup database")


def test_a_server_gone_mid_statement_is_unreachable_and_a_refusal_is_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    from cdc_router.consumer.dedup import DedupStoreError, DedupStoreUnreachable

    class Connection:
        closed = broken = False

        def __init__(self, error: psycopg.Error) -> None:
            self.error = error

        def transaction(self) -> Any:
            import contextlib
            return contextlib.nullcontext()

        def execute(self, statement: object, params: object = None) -> None:
            raise self.error

    for error, kind in ((psycopg.OperationalError("server closed the connection"),
                         DedupStoreUnreachable),
                        (psycopg.errors.InsufficientPrivilege("permission denied for schema"),
                         DedupStoreError)):
        monkeypatch.setattr(postgres.psycopg, "connect",
                            lambda *_, error=error, **__: Connection(error))
        with pytest.raises(DedupStoreError, match=r"cannot create public\.cdc_router_dedup") as \
                raised:
            PostgresDedupStore("host=db").ensure_schema()
        assert type(raised.value) is kind


def test_a_table_name_of_too_many_parts_is_named_with_the_store() -> None:
    # QA 61-b F6: the only field of the store's whose error lacked its class.
    with pytest.raises(ConfigError, match=r"^PostgresDedupStore: field 'table': expected "
                                          r"schema\.table or table \(got 'a\.b\.c\.d'\)$"):
        PostgresDedupStore("host=db", table="a.b.c.d")
