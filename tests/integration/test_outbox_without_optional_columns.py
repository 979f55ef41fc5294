"""The `outbox` commands on a table without headers and created_at, the EventRouter SMT's own
schema (review 50-d F6): `--column headers=` / `--column created_at=` say so."""

from __future__ import annotations

import psycopg
import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from tests.integration.support import StackEndpoints, unique

pytestmark = pytest.mark.integration


def test_write_stats_and_purge_on_a_table_without_headers_or_created_at(
        stack: StackEndpoints) -> None:
    table = f"public.{unique('legacy')}"
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id uuid PRIMARY KEY, aggregatetype varchar(255) "
                     "NOT NULL, aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, "
                     "payload text, extra int)")
    absent = ["--dsn", stack.postgres_dsn, "--table", table, "--column", "headers=",
              "--column", "created_at="]
    try:
        written = CliRunner().invoke(main, [
            "outbox", "write", *absent, "--aggregate-type", "O", "--aggregate-id", "1",
            "--type", "T", "--payload", '{"a": 1}'])
        stats = CliRunner().invoke(main, ["outbox", "stats", *absent])
        purged = CliRunner().invoke(main, ["outbox", "purge", *absent, "--older-than", "1d",
                                           "--yes"])
        missing = CliRunner().invoke(main, ["outbox", "stats", "--dsn", stack.postgres_dsn,
                                            "--table", table])
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {table}")

    assert written.exit_code == 0, written.output
    assert stats.exit_code == 0, stats.output
    assert "rows         1\n" in stats.stdout
    assert "oldest       - (the table has no created_at column)" in stats.stdout
    assert purged.exit_code == 1
    assert "the outbox has no created_at column, so rows have no age" in purged.stderr
    assert "--column created_at=NAME" in purged.stderr
    assert missing.exit_code != 0
    assert "--column headers= or --column created_at=" in missing.stderr
