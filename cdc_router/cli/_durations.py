"""Durations on the command line (`--older-than 7d`, `--every 1h`), one syntax for every command."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from cdc_router.errors import ConfigError

_UNITS = {"ms": "milliseconds", "s": "seconds", "m": "minutes", "h": "hours", "d": "days",
          "w": "weeks"}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d|w)\s*$")
# Longer than any retention window or look-back: a time this far back is before year 1 (or
# out of Postgres' and Python's range) for some commands, and a typo for all of them.
_LONGEST = timedelta(days=100 * 365)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A --since outside these (0001-01-01 east of UTC, 9999-12-31 west of it) has no Python date.
_YEAR_1_MS = (datetime(1, 1, 1, tzinfo=UTC) - _EPOCH) // timedelta(milliseconds=1)
_YEAR_10000_MS = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // timedelta(milliseconds=1) + 1


def parse_duration(text: str, *, option: str, allow_zero: bool = False) -> timedelta:
    """`500ms`, `90s`, `15m`, `12h`, `7d`, `2w` as a timedelta; anything else is a ConfigError.

    Zero is refused unless `allow_zero`: for a retention window it would mean "forget all".
    """
    match = _DURATION.match(text)
    if match is None or (not match.group(1).strip("0") and not allow_zero):
        kind = "whole" if allow_zero else "positive"
        raise ConfigError(f"must be a {kind} number with a unit ms, s, m, h, d or w",
                          source="command line", field=option, value=text, hint="e.g. 7d")
    digits = match.group(1).lstrip("0") or "0"
    try:  # past 19 digits, past 100 years whatever the unit (QA 33-b: "not positive")
        duration = timedelta(**{_UNITS[match.group(2)]: int(digits)}) if len(digits) < 20 \
            else timedelta.max
    except OverflowError:
        duration = timedelta.max
    if duration > _LONGEST:
        raise ConfigError("must be at most 100 years (36500d)", source="command line",
                          field=option, value=text)
    return duration


def parse_since(text: str, *, option: str, now_ms: int) -> int:
    """`--since`: an ISO-8601 time (UTC unless it says otherwise) or a duration back from now
    (`2h`), as epoch milliseconds."""
    if _DURATION.match(text):
        since_ms = now_ms - parse_duration(text, option=option, allow_zero=True) // timedelta(
            milliseconds=1)
    else:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ConfigError("must be an ISO-8601 time or a duration back from now",
                              source="command line", field=option, value=text,
                              hint="e.g. 2026-12-01T09:30:00Z or 2h") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        since_ms = (moment - _EPOCH) // timedelta(milliseconds=1)  # exact, no float
    if not _YEAR_1_MS <= since_ms < _YEAR_10000_MS:
        raise ConfigError("is outside the years 1 to 9999 (UTC), which Python's dates hold",
                          source="command line", field=option, value=text,
                          hint="e.g. 2026-12-01T09:30:00Z or 2h")
    return since_ms


# Longer than any wait or watch interval a command takes; time.sleep() raised OverflowError
# past time_t's range (review 48-e F15: `status --watch 1e12`).
LONGEST_SECONDS = 7 * 86_400


class Seconds(click.FloatRange):
    """A number of seconds in a range, finite and at most LONGEST_SECONDS (review 31: `nan`
    passed click's ranges, whose comparisons it fails; `status --watch nan` raised,
    `connectors wait --timeout nan` never returned; `inf` is no timeout either)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        seconds = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        if seconds > LONGEST_SECONDS:
            self.fail(f"{value!r} is over a week ({LONGEST_SECONDS:,} seconds)", param, ctx)
        return super().convert(seconds, param, ctx)
