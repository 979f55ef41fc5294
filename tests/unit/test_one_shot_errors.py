"""A one-shot command's failure with a dependency down is one line naming where (review 53-c
F5): the dedup commands name --dsn as the outbox commands do (Kafka: test_cli_errors.py)."""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.kafka.logs import librdkafka_logger


def test_dedup_commands_name_the_dsn_option_when_postgres_is_down() -> None:
    dsn = "postgresql://u@127.0.0.1:1/db?connect_timeout=2"
    for command in (["init"], ["purge", "--older-than", "1d", "--yes"]):
        result = CliRunner().invoke(main, ["dedup", *command, "--dsn", dsn])
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith("error: cannot connect to the dedup database: ")
        assert result.stderr.endswith("; check --dsn (env CDC_ROUTER_PG_DSN)\n")
        assert result.stderr.count("\n") == 1


def test_run_keeps_librdkafka_lines(caplog: pytest.LogCaptureFixture) -> None:
    from cdc_router.cli import _LONG_RUNNING

    assert {"run", "relay"} <= set(_LONG_RUNNING)
    with caplog.at_level(logging.ERROR):
        librdkafka_logger().error("FAIL line")
    assert "FAIL line" in caplog.text
