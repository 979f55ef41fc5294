"""Passwords in Postgres DSNs and Connect URLs through the real CLI (QA 64-b F-1, F-2): one
with an '@' or '/' written as is is refused (or, for a URL's '@', taken) without showing any
piece of it, and the percent-encoded form the refusal asks for reaches the real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
import yaml
from click.testing import CliRunner, Result

from cdc_router.cli import main
from tests.integration.support import (
    StackEndpoints,
    create_outbox_table,
    drop_outbox_table,
    free_port,
    unique,
)

pytestmark = pytest.mark.integration

PASSWORD = "Pa@ss/W0rd"  # each piece is looked for in every output
PIECES = ("Pa@ss", "ss/W0rd", "W0rd")


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), env={"CDC_ROUTER_PG_DSN": None,
                                                     "CDC_ROUTER_CONNECT_URL": None})


def _shown(result: Result, *secrets: str) -> list[str]:
    """The pieces of a secret anything the command printed holds."""
    return [secret for secret in secrets if secret in result.output]


@pytest.fixture(scope="module")
def role(stack: StackEndpoints) -> Iterator[tuple[str, str]]:
    """A role whose password holds '@' and '/', which may read an outbox table of its own."""
    name, table = unique("pw"), unique("pwobx")
    create_outbox_table(stack.postgres_dsn, table)
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{PASSWORD}'")
        conn.execute(f"GRANT SELECT ON public.{table} TO {name}")
    try:
        yield name, table
    finally:
        drop_outbox_table(stack.postgres_dsn, table)
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {name}")
            conn.execute(f"DROP ROLE IF EXISTS {name}")


def _dsn(stack: StackEndpoints, user: str, password: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(stack.postgres_dsn)
    return f"postgresql://{user}:{password}@127.0.0.1:{params['port']}/{params['dbname']}"


def test_a_dsn_password_with_an_unencoded_at_or_slash_is_refused_and_encoded_it_connects(
        stack: StackEndpoints, role: tuple[str, str], tmp_path: Path) -> None:
    # QA 64-b F-1: libpq read a piece of the password as host, port or database, and the
    # errors quoted it ("Postgres at postgres:pa/ssW0rd@127.0.0.1...").
    user, table = role
    raw, encoded = _dsn(stack, user, PASSWORD), _dsn(stack, user, quote(PASSWORD, safe=""))
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": stack.bootstrap_servers},
                                      "source": {"topics": ["raw"]},
                                      "routes": [{"topic": "out"}]}))
    advice = "write '@' as %40 and '/' as %2F"

    stats = _cli("outbox", "stats", "--dsn", raw, "--table", f"public.{table}")
    status = _cli("status", "-c", str(config), "--dsn", raw, "--connect-url", stack.connect_url)
    encoded_stats = _cli("outbox", "stats", "--dsn", encoded, "--table", f"public.{table}")

    assert stats.exit_code == 1, stats.output
    assert stats.stderr.startswith("error: field '--dsn': its user or password holds an '@' "
                                   "or a '/' that is not percent-encoded"), stats.output
    assert advice in stats.stderr
    assert status.exit_code == 3, status.output
    assert status.stderr.startswith("error: --dsn: its user or password holds an '@'"), \
        status.output
    assert advice in status.stderr
    assert (_shown(stats, *PIECES), _shown(status, *PIECES)) == ([], [])
    assert encoded_stats.exit_code == 0, encoded_stats.output  # the real server takes it
    assert f"public.{table}" in encoded_stats.stdout
    assert _shown(encoded_stats, *PIECES, quote(PASSWORD, safe="")) == []


@pytest.mark.parametrize("character", ["/", "?", "#"])
def test_a_connect_url_password_ending_the_authority_is_refused_and_encoded_it_is_taken(
        stack: StackEndpoints, character: str) -> None:
    # QA 64-b F-2: `u:12/S3c@127.0.0.1` made httpx dial host 'u' port 12 while the line named
    # 127.0.0.1, and the error showed the password.
    address = stack.connect_url.removeprefix("http://")
    secret = f"Url{character}S3c"

    raw = _cli("connectors", "--url", f"http://u:{secret}@{address}", "list")
    encoded = _cli("connectors", "--url", f"http://u:{quote(secret, safe='')}@{address}", "list",
                   "-o", "json")

    assert raw.exit_code == 1, raw.output
    assert "its user info holds a '/', '?' or '#' that is not percent-encoded" in raw.stderr
    assert "write them as %2F, %3F and %23" in raw.stderr
    assert _shown(raw, "S3c") == [], raw.output
    assert encoded.exit_code == 0, encoded.output  # Connect answers (it asks no password)
    assert isinstance(json.loads(encoded.stdout), list), encoded.output


def test_a_connect_url_password_with_an_at_is_taken_and_never_shown(
        stack: StackEndpoints) -> None:
    # QA 64-b F-2: masked up to its first '@': 'unreachable at http://u:*****@S3c@...'.
    address = stack.connect_url.removeprefix("http://")
    port = free_port()  # nothing listens there

    listed = _cli("connectors", "--url", f"http://u:Url@S3c@{address}", "list")
    unreachable = _cli("connectors", "--url", f"http://u:Url@S3c@127.0.0.1:{port}", "list")

    assert listed.exit_code == 0, listed.output  # httpx ends the user info at the last '@'
    assert unreachable.exit_code == 1, unreachable.output
    assert unreachable.stderr.startswith(
        f"error: Kafka Connect unreachable at http://u:*****@127.0.0.1:{port}: "), \
        unreachable.output
    assert (_shown(listed, "S3c"), _shown(unreachable, "S3c")) == ([], [])
