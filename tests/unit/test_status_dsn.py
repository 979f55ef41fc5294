"""`status` names where its DSN came from when Postgres refuses it for good (QA 44-a); a
malformed address argument is a check it cannot make (exit 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_router.cli.status import _status_dsn
from cdc_router.config.model import RouterConfig
from cdc_router.ops import database
from cdc_router.outbox.table import OutboxSchema

REFUSED = ('connection failed: connection to server at "127.0.0.1", port 15432 failed: '
           'FATAL:  password authentication failed for user "postgres"')


def _refusing(message: str) -> Any:
    def connect(*args: object, **kwargs: object) -> None:
        raise psycopg.OperationalError(message)
    return connect


def test_a_refused_password_names_the_setting_the_dsn_came_from(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database.psycopg, "connect", _refusing(REFUSED))
    wal, publication, outbox = database.probe_database(
        "postgresql://postgres:wrong@127.0.0.1:15432/postgres", None, None,
        OutboxSchema(), source="cleanup.dsn of the config")
    for section in (wal, publication, outbox):
        assert section.error is not None
        assert "password authentication failed" in section.error
        assert "cleanup.dsn of the config" in section.error


def test_an_option_libpq_refuses_is_named_not_blamed_on_postgres(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Reread 59 F-2: "Postgres: connection is bad: invalid sslmode value", though no server
    # was asked (the real libpq: PGSSLMODE is no DSN's that status checks first).
    monkeypatch.setenv("PGSSLMODE", "bogus")
    wal, _, _ = database.probe_database("host=127.0.0.1 port=1", None, None, OutboxSchema(),
                                        source="cleanup.dsn of the config")
    assert wal.error == (
        "libpq refuses the DSN, before asking any server: its sslmode 'bogus' is not one libpq "
        "takes: disable, allow, prefer, require, verify-ca, verify-full (from the environment "
        "variable PGSSLMODE: fix or unset it) (the DSN comes from cleanup.dsn of the config: "
        "fix it there)")


def test_an_outage_is_not_blamed_on_the_dsn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database.psycopg, "connect", _refusing(
        'connection failed: connection to server at "127.0.0.1", port 15432 failed: '
        "Connection refused"))
    wal, _, _ = database.probe_database("postgresql://127.0.0.1:15432/postgres", None, None,
                                        OutboxSchema())
    assert wal.error is not None and "DSN comes from" not in wal.error


@pytest.mark.parametrize(("option", "cleanup", "relay", "picked", "named"), [
    ("postgresql://a", "postgresql://b", None, "postgresql://a", "--dsn or CDC_ROUTER_PG_DSN"),
    (None, "postgresql://b", "postgresql://c", "postgresql://b", "cleanup.dsn"),
    (None, None, "postgresql://c", "postgresql://c", "relay.dsn"),
    (None, None, None, "postgresql://postgres", "set --dsn or CDC_ROUTER_PG_DSN"),
])
def test_status_picks_its_dsn_in_order_and_names_where_it_came_from(
        option: str | None, cleanup: str | None, relay: str | None, picked: str,
        named: str) -> None:
    config = RouterConfig.model_validate({
        "source": {"group_id": "shop", "topics": ["raw"]}, "routes": [{"topic": "orders"}],
        "cleanup": {"dsn": cleanup},
        **({"relay": {"table": "outbox", "dsn": relay}} if relay else {})})
    dsn, source = _status_dsn(option, config)
    assert dsn.startswith(picked) and named in source


@pytest.mark.parametrize(("argument", "said"), [
    (["--connect-url", "notaurl"], "error: --connect-url: Kafka Connect URL 'notaurl' is not "
     "valid (no http:// or https:// before the host)"),
    (["--connect-url", "http://h:abc"], "--connect-url: Kafka Connect URL 'http://h:abc' is not "
     "valid"),
    (["--dsn", "notadsn"], "error: --dsn: "),
    # QA 49-h F3: a port out of range probed and exited 2; a leading blank was shown stripped.
    (["--connect-url", "http://127.0.0.1:99999"], "Kafka Connect URL 'http://127.0.0.1:99999' "
     "is not valid (its port 99999 is not one from 1 to 65535)"),
    (["--connect-url", " http://127.0.0.1:8083"], "is not valid (a blank before it)"),
    # QA 64-b: probed as a broker nobody reaches ("Broker transport failure"), unlike the
    # same text in kafka.bootstrap_servers
    (["--bootstrap-servers", "svc:BsS3c@127.0.0.1:9092"], "error: --bootstrap-servers: each "
     "server must be host:port (a hostname, an IPv4 address or [IPv6]), several separated by "
     "commas: a server's address holds no credentials: set kafka.sasl_username and "
     "kafka.sasl_password (got '*****@127.0.0.1:9092')"),
    (["--bootstrap-servers", "kafka"], "error: --bootstrap-servers: each server must be "
     "host:port"),
])
def test_a_malformed_address_argument_exits_unknown_before_any_probe(
        monkeypatch: pytest.MonkeyPatch, argument: list[str], said: str) -> None:
    # Review 49-b F3: a malformed --connect-url exited 2 (critical), a malformed --dsn 3.
    from click.testing import CliRunner

    from cdc_router.cli import main
    from cdc_router.cli import status as status_command

    def no_probe(check: object) -> None:
        raise AssertionError("probed")

    monkeypatch.setattr(status_command, "IsolatedChecks", no_probe)
    example = Path(__file__).parents[2] / "cdc_router" / "examples" / "router.yaml"
    result = CliRunner().invoke(main, ["status", "-c", str(example), *argument])
    assert result.exit_code == 3, result.output
    assert said in result.output and "\n" not in result.output.strip()
