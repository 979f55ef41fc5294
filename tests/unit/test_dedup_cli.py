"""`cdc-router dedup`: the window parser and the one-line errors, without a database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.cli._durations import parse_duration
from cdc_router.consumer.dedup.postgres import PostgresDedupStore
from cdc_router.errors import ConfigError


@pytest.mark.parametrize(("text", "expected"), [
    ("90s", timedelta(seconds=90)), ("15m", timedelta(minutes=15)), ("12h", timedelta(hours=12)),
    ("7d", timedelta(days=7)), ("2w", timedelta(weeks=2)), (" 3 d ", timedelta(days=3))])
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text, option="--older-than") == expected


@pytest.mark.parametrize("text", ["7", "7x", "d", "-1d", "0d", "1.5h", ""])
def test_bad_durations_name_the_option_and_value(text: str) -> None:
    with pytest.raises(ConfigError, match="--older-than") as caught:
        parse_duration(text, option="--older-than")
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize("text", ["36501d", "99999999d", "999999999999d", "9" * 19 + "w"])
def test_durations_past_100_years_are_refused_not_overflowed(text: str) -> None:
    # Past that, `now - duration` is before year 1 or timedelta overflows: a traceback before.
    with pytest.raises(ConfigError, match=r"field '--since': must be at most 100 years"):
        parse_duration(text, option="--since")
    assert parse_duration("36500d", option="--since") == timedelta(days=36500)


def test_a_duration_of_thousands_of_digits_is_refused_before_int_reads_it() -> None:
    # int() refuses more than 4,300 digits with a ValueError of its own; QA 33-b: 20 digits
    # and more were "not positive", where they are too long.
    for digits in (20, 5000):
        with pytest.raises(ConfigError, match=r"must be at most 100 years \(36500d\)"):
            parse_duration("9" * digits + "d", option="--older-than")


def test_a_bad_window_is_one_line_and_exit_1() -> None:
    result = CliRunner().invoke(main, ["dedup", "purge", "--older-than", "soon"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: command line: field '--older-than': must be a positive number with a unit "
        "ms, s, m, h, d or w (got 'soon'); e.g. 7d"]


@pytest.mark.parametrize("command", [["purge", "--older-than", "7d"], ["init"]])
def test_an_unreachable_database_is_one_line_and_exit_1(command: list[str]) -> None:
    # A one-shot command, not a service: 1, not DedupStoreUnreachable's 75 (QA 61-b F4).
    result = CliRunner().invoke(main, ["dedup", *command, "--dsn",
                                       "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"])
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: cannot connect to the dedup database")


def test_a_server_gone_mid_statement_is_exit_1_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 61-w W-2: a restart during CREATE TABLE (DedupStoreUnreachable, not a connection
    # failure's text) left `dedup init` with the service's 75.
    from cdc_router.consumer.dedup import DedupStoreUnreachable

    def gone(self: PostgresDedupStore) -> None:
        raise DedupStoreUnreachable("the dedup database went away: terminating connection")

    monkeypatch.setattr(PostgresDedupStore, "ensure_schema", gone)
    result = CliRunner().invoke(main, ["dedup", "init", "--dsn", "postgresql://unused"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: the dedup database went away: terminating connection"]


@pytest.mark.parametrize("table", ["a.b.c", "", ".x", "x."])
def test_bad_table_names_are_config_errors(table: str) -> None:
    with pytest.raises(ConfigError, match="table"):
        PostgresDedupStore("postgresql://unused", table=table)


def test_constructing_a_store_makes_no_connection() -> None:
    PostgresDedupStore("postgresql://nobody@127.0.0.1:1/none")  # lazily connected: no error


@pytest.mark.parametrize("group", ["", "  "])
def test_an_empty_group_is_refused_not_taken_for_every_group(group: str) -> None:
    # Review 47-e F8: `--group "$GROUP"` with GROUP unset purged every group's rows.
    result = CliRunner().invoke(main, ["dedup", "purge", "--dsn", "postgresql://u@h/db",
                                       "--older-than", "7d", "--group", group, "--yes"])
    assert result.exit_code == 1
    assert "field '--group': is empty: name a consumer group" in result.output


def test_an_empty_every_is_refused_not_taken_for_a_single_pass() -> None:
    # Review 48-e F13: `--every "$PURGE_EVERY"` with the variable unset purged once and exited.
    result = CliRunner().invoke(main, ["dedup", "purge", "--dsn", "postgresql://u@h/db",
                                       "--older-than", "7d", "--every", "", "--yes"])
    assert result.exit_code == 1
    assert "field '--every': must be a positive number with a unit" in result.output
