"""The replay lines: at most SAID_PER_MINUTE a minute (router/replay_log.py)."""

from __future__ import annotations

import logging

import pytest

from cdc_router.router.replay_log import SAID_PER_MINUTE, ReplayLines


def test_replays_are_said_one_by_one_up_to_the_minutes_cap(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 47-d F2: a republish of 37,500 delivered rows wrote 41,993 lines in 20 s.
    now = [0.0]
    lines = ReplayLines(clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="cdc_router.router"):
        for i in range(3 * SAID_PER_MINUTE):
            lines.dropped(f"e-{i}", f"offset={i}")
        now[0] = 60.0
        lines.dropped("later", "offset=9999")
    said = [record.getMessage() for record in caplog.records]
    assert said[0] == "event=replay_dropped id='e-0' offset=0"
    assert sum("event=replay_dropped " in line for line in said) == SAID_PER_MINUTE + 1
    assert sum("event=replay_lines_capped" in line for line in said) == 1
    assert said[-1] == "event=replay_dropped id='later' offset=9999"
