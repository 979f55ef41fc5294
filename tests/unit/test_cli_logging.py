"""The CLI's log levels for the HTTP clients under the schema registry's and Connect's."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from cdc_router.cli import HTTP_LOGGERS, main


@pytest.fixture(autouse=True)
def _restore_levels() -> Iterator[None]:
    names = ("", *HTTP_LOGGERS)
    levels = {name: logging.getLogger(name).level for name in names}
    logging.getLogger().setLevel(logging.INFO)  # as `run --log-level info` sets the root
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_http_clients_log_no_info_line_per_request() -> None:
    # QA 36-c: `level=INFO logger=httpx2 HTTP Request: POST ...` for every registry request
    # in the router's log, one of them before its one-line start-up refusal.
    result = CliRunner().invoke(main, ["outbox", "init", "--print"])

    assert result.exit_code == 0, result.output
    assert set(HTTP_LOGGERS) >= {"httpx", "httpx2"}
    for name in HTTP_LOGGERS:
        assert not logging.getLogger(name).isEnabledFor(logging.INFO)
        assert logging.getLogger(name).isEnabledFor(logging.WARNING)


def test_verbose_shows_them() -> None:
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    result = CliRunner().invoke(main, ["-v", "outbox", "init", "--print"])

    assert result.exit_code == 0, result.output
    assert logging.getLogger("httpx2").isEnabledFor(logging.INFO)
