"""`cdc-router relay` checks its own table before the cleanup's check of the same table, so
that the error names relay.table (QA 61-a F-5: "field 'cleanup.table'")."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
import yaml
from click.testing import CliRunner

from cdc_router.cli import relay
from cdc_router.cli.relay import check_table
from cdc_router.config.model import RouterConfig
from cdc_router.errors import ConfigError
from cdc_router.postgres import missing_table
from cdc_router.relay.reader import OutboxReader

DSN = "postgresql://relay@db:5432/postgres"


class Reader:
    """An OutboxReader whose snapshot() raises `failure`; counts its resets."""

    def __init__(self, failure: BaseException | None) -> None:
        self.failure, self.resets = failure, 0

    def snapshot(self) -> Any:
        if self.failure is not None:
            raise self.failure
        return None

    def reset(self) -> None:
        self.resets += 1


def _config() -> RouterConfig:
    return RouterConfig.model_validate({
        "source": {"group_id": "shop"}, "routes": [{"topic": "orders"}],
        "relay": {"table": "public.nosuch", "dsn": DSN},
        "cleanup": {"mode": "delete", "table": "public.nosuch", "dsn": DSN}})


def test_a_missing_table_is_named_by_the_relays_field_and_the_file() -> None:
    reader = Reader(missing_table("public.nosuch", "relay.table"))
    with pytest.raises(ConfigError) as raised:
        check_table(_config(), DSN, "router.yaml", cast(OutboxReader, reader))
    assert str(raised.value).startswith("router.yaml: field 'relay.table': the outbox table "
                                        "does not exist"), raised.value
    assert reader.resets == 1


def test_postgres_not_answering_is_left_to_the_relays_start() -> None:
    reader = Reader(psycopg.OperationalError("connection refused"))
    check_table(_config(), DSN, "router.yaml", cast(OutboxReader, reader))
    assert reader.resets == 1


def test_the_relay_command_says_its_own_tables_error_before_the_cleanups(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump(_config().model_dump(mode="json", exclude_none=True)))
    monkeypatch.setattr(relay, "OutboxReader", lambda *args, **kwargs: Reader(
        missing_table("public.nosuch", "relay.table")))
    monkeypatch.setattr(relay, "check_cleanup_database", lambda *args: None)

    def cleanup_check(cleaner: Any, source: str) -> None:  # as the real one words it
        raise missing_table("public.nosuch", "cleanup.table")

    monkeypatch.setattr(relay, "check_cleanup", cleanup_check)
    result = CliRunner().invoke(relay.cli, ["-c", str(config), "--metrics-port", "0"])
    assert isinstance(result.exception, ConfigError), result.output
    assert "field 'relay.table'" in str(result.exception), result.exception
