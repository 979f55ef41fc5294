"""The one duration syntax of the command line (`outbox purge`, `dedup purge --every`)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cdc_router.cli._durations import parse_duration, parse_since
from cdc_router.errors import ConfigError


@pytest.mark.parametrize(("text", "expected"), [
    ("500ms", timedelta(milliseconds=500)), ("30s", timedelta(seconds=30)),
    ("15m", timedelta(minutes=15)), ("12h", timedelta(hours=12)), ("7d", timedelta(days=7)),
    ("2w", timedelta(weeks=2))])
def test_every_unit_reads_the_same_for_every_command(text: str, expected: timedelta) -> None:
    assert parse_duration(text, option="--older-than") == expected
    assert parse_duration(text, option="--older-than", allow_zero=True) == expected


def test_zero_only_where_the_command_allows_it() -> None:
    assert parse_duration("0s", option="--older-than", allow_zero=True) == timedelta(0)
    with pytest.raises(ConfigError, match="positive number"):
        parse_duration("0s", option="--older-than")


@pytest.mark.parametrize("text", ["", "7", "7x", "-1d", "1.5h", "7 days"])
def test_bad_durations_name_the_option_and_value(text: str) -> None:
    with pytest.raises(ConfigError, match="--older-than") as caught:
        parse_duration(text, option="--older-than", allow_zero=True)
    assert repr(text) in str(caught.value)


def test_since_takes_an_iso_time_utc_unless_it_says_or_a_duration_back_from_now() -> None:
    now_ms = 1_800_000_000_000
    assert parse_since("2h", option="--since", now_ms=now_ms) == now_ms - 7_200_000
    assert parse_since("2027-01-15T08:00:00", option="--since", now_ms=now_ms) == \
        parse_since("2027-01-15T09:00:00+01:00", option="--since", now_ms=now_ms) == \
        1_800_000_000_000
    with pytest.raises(ConfigError, match="ISO-8601 time or a duration"):
        parse_since("yesterday", option="--since", now_ms=now_ms)


def test_since_keeps_milliseconds_and_refuses_a_time_before_the_year_1() -> None:
    # 0001-01-01 east of UTC came out of republish as "year 0 is out of range", a traceback;
    # a float product lost the last millisecond (review, session 25).
    now_ms = 1_800_000_000_000
    assert parse_since("2026-12-01T00:00:00.001Z", option="--since", now_ms=now_ms) == \
        1_796_083_200_001
    assert parse_since("0001-01-01T00:00:00Z", option="--since", now_ms=now_ms) == \
        -62_135_596_800_000
    for text in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:00:00-14:00"):
        with pytest.raises(ConfigError, match="'--since': is outside the years 1 to 9999"):
            parse_since(text, option="--since", now_ms=now_ms)
    assert parse_since("9999-12-31T23:59:59.999Z", option="--since", now_ms=now_ms) == \
        253_402_300_799_999



@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf"])
def test_seconds_options_refuse_what_is_not_a_finite_number(value: str) -> None:
    # Review 31: nan passed click's FloatRange (its comparisons are false): `status --watch nan`
    # raised with exit 1, `connectors wait --timeout nan` never returned.
    from click.testing import CliRunner

    from cdc_router.cli import main

    wait = CliRunner().invoke(main, ["connectors", "wait", "x", "--timeout", value])
    watch = CliRunner().invoke(main, ["status", "-c", "router.yaml", "--watch", value])
    assert (wait.exit_code, watch.exit_code) == (1, 3)  # connectors: 1, status: 3
    assert "not a finite number of seconds" in wait.output + watch.output


@pytest.mark.parametrize("value", ["1e12", "1e308", "604801"])
def test_seconds_options_refuse_more_than_a_week(value: str) -> None:
    # Review 48-e F15: `status --watch 1e12` reported once, then time.sleep raised OverflowError.
    from click.testing import CliRunner

    from cdc_router.cli import main

    wait = CliRunner().invoke(main, ["connectors", "wait", "x", "--timeout", value])
    watch = CliRunner().invoke(main, ["status", "-c", "router.yaml", "--watch", value])
    assert (wait.exit_code, watch.exit_code) == (1, 3)  # connectors: 1, status: 3
    assert wait.output.count("is over a week (604,800 seconds)") == 1, wait.output
    assert "is over a week (604,800 seconds)" in watch.output, watch.output
