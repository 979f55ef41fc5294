"""`cdc-router relay` checks that its own table exists and may be read before the cleanup's
check of the same table, so that the error names relay.table (QA 61-a F-5: "field
'cleanup.table'")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from click.testing import CliRunner

from cdc_router.cli import relay
from cdc_router.cli.relay import check_table
from cdc_router.config.model import RouterConfig
from cdc_router.errors import ConfigError

DSN = "postgresql://relay@db:5432/postgres"


class Database:
    """A connection answering the catalog's column list (`columns`, [] for no table) and the
    role's SELECT privilege (`readable`)."""

    def __init__(self, columns: list[tuple[str, str]], readable: bool = True) -> None:
        self.columns, self.readable = columns, readable
        self.rows: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Database:  # as psycopg.connect
        return self

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def execute(self, query: str, params: Any = None) -> Database:
        self.rows = list(self.columns) if "pg_attribute" in query else [(self.readable,)]
        return self

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None


def _config() -> RouterConfig:
    return RouterConfig.model_validate({
        "source": {"group_id": "shop"}, "routes": [{"topic": "orders"}],
        "relay": {"table": "public.nosuch", "dsn": DSN},
        "cleanup": {"mode": "delete", "table": "public.nosuch", "dsn": DSN}})


@pytest.mark.parametrize(("database", "said"), [
    (Database([]), "field 'relay.table': the outbox table does not exist"),
    (Database([("id", "uuid")], readable=False),
     "field 'relay.table': the connection's role may not SELECT from the outbox table"),
])
def test_a_table_the_relay_cannot_read_is_named_by_its_field_and_the_file(
        database: Database, said: str) -> None:
    with pytest.raises(ConfigError) as raised:
        check_table(_config(), DSN, "router.yaml", database)
    assert str(raised.value).startswith(f"router.yaml: {said}"), raised.value


def test_a_readable_table_passes() -> None:
    check_table(_config(), DSN, "router.yaml", Database([("id", "uuid")]))


def test_a_schema_the_role_may_not_use_is_named_as_the_relays_table() -> None:
    # Review rv62b: swallowed here, then said by the cleanup's check as "field 'cleanup.dsn':
    # not a Postgres connection string".
    class NoUsage(Database):
        def execute(self, query: str, params: Any = None) -> Database:
            raise psycopg.errors.InsufficientPrivilege("permission denied for schema rvs")

    with pytest.raises(ConfigError) as raised:
        check_table(_config(), DSN, "router.yaml", NoUsage([]))
    assert str(raised.value).startswith(
        "router.yaml: field 'relay.table': the connection's role may not read the outbox "
        "table: permission denied for schema rvs (got 'public.nosuch'); GRANT USAGE ON SCHEMA"), \
        raised.value


def test_postgres_not_answering_is_left_to_the_relays_start() -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError("connection refused")

    check_table(_config(), DSN, "router.yaml", refused)


def test_the_relay_command_says_its_own_tables_error_before_the_cleanups(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump(_config().model_dump(mode="json", exclude_none=True)))
    monkeypatch.setattr(relay.psycopg, "connect", Database([]))
    monkeypatch.setattr(relay, "check_cleanup_database", lambda *args: None)

    def cleanup_check(cleaner: Any, source: str) -> None:  # as the real one words it
        raise ConfigError("the outbox table does not exist", field="cleanup.table")

    monkeypatch.setattr(relay, "check_cleanup", cleanup_check)
    result = CliRunner().invoke(relay.cli, ["-c", str(config), "--metrics-port", "0"])
    assert isinstance(result.exception, ConfigError), result.output
    assert "field 'relay.table'" in str(result.exception), result.exception
