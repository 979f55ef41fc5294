"""The replay lines: at most SAID_PER_MINUTE a minute (router/replay_log.py)."""

from __future__ import annotations

import logging

import pytest

from cdc_router.router.replay import ReplayFilter
from cdc_router.router.replay_log import (
    RUN_IDLE_S,
    SAID_PER_MINUTE,
    SUMMED_PER_MINUTE,
    WARNED_PER_MINUTE,
    ReplayLines,
)


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


def test_a_dead_lettered_ids_warning_has_its_own_cap_and_says_how_many_it_left_out(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 53-c F17: after 100 ordinary replay lines the minute's cap swallowed the WARNING
    # telling the operator that a republish of a dead-lettered id delivered nothing.
    now = [0.0]
    replay = ReplayFilter(window_ms=10**12, max_ids=10**6)
    for i in range(WARNED_PER_MINUTE + 5):
        replay.add_pending(f"dead-{i}", 1, dead_lettered=True)
    lines = ReplayLines(replay, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="cdc_router.router"):
        for i in range(SAID_PER_MINUTE + 1):
            lines.dropped(f"e-{i}", f"offset={i}")
        lines.dropped("dead-0", "offset=500")
        for i in range(1, WARNED_PER_MINUTE + 5):
            lines.dropped(f"dead-{i}", f"offset={500 + i}")
        now[0] = 60.0
        lines.dropped("e-later", "offset=9999")
    warned = [record.getMessage() for record in caplog.records
              if record.levelno == logging.WARNING]
    assert warned[0].startswith("event=replay_dropped id='dead-0' offset=500: the id was "
                                "dead-lettered; ")
    assert sum(line.startswith("event=replay_dropped ") for line in warned) == WARNED_PER_MINUTE
    assert warned[-2].startswith(f"event=replay_warnings_capped per_minute={WARNED_PER_MINUTE}")
    assert warned[-1].startswith("event=replay_warnings_left_out count=5: ")


def _summaries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage().partition(":")[0] for record in caplog.records
            if record.getMessage().startswith("event=replays_dropped ")]


def test_a_run_of_replays_past_the_cap_is_summed_up_when_it_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 64-a F-9: a 40k-row re-snapshot logged 100 lines and the cap's line, never its count.
    now = [0.0]
    lines = ReplayLines(clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="cdc_router.router"):
        for i in range(3 * SAID_PER_MINUTE):
            now[0] = i * 0.1
            lines.dropped(f"e-{i}", f"offset={i}")
        lines.run_ended()  # a record that is no replay
        lines.run_ended()
        now[0] = 120.0
        for i in range(SAID_PER_MINUTE):  # a short run in another minute: each one said
            lines.dropped(f"f-{i}", f"offset={i}")
        lines.run_ended()
    assert _summaries(caplog) == [
        f"event=replays_dropped count={3 * SAID_PER_MINUTE} unsaid={2 * SAID_PER_MINUTE} "
        "seconds=29 run=ended"]
    assert lines.run == 0


def test_a_run_after_which_nothing_is_read_is_summed_up_when_idle(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 65 (low): a re-snapshot's run after which the router read nothing more was summed
    # up only at the next record, hours later maybe.
    now = [0.0]
    lines = ReplayLines(clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="cdc_router.router"):
        for i in range(2 * SAID_PER_MINUTE):
            now[0] = i * 0.1
            lines.dropped(f"e-{i}", f"offset={i}")
        now[0] += RUN_IDLE_S - 0.5  # a pause within the run: not its end
        lines.idle()
        assert _summaries(caplog) == [] and lines.run == 2 * SAID_PER_MINUTE
        now[0] += 0.5
        lines.idle()
        lines.idle()
    assert _summaries(caplog) == [
        f"event=replays_dropped count={2 * SAID_PER_MINUTE} unsaid={SAID_PER_MINUTE} "
        "seconds=24 run=ended"]
    assert lines.run == 0


def test_a_run_longer_than_a_minute_is_summed_up_each_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    lines = ReplayLines(clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="cdc_router.router"):
        for i in range(2 * SAID_PER_MINUTE):
            lines.dropped(f"e-{i}", f"offset={i}")
        now[0] = 61.0
        for i in range(SAID_PER_MINUTE + 5):
            lines.dropped(f"g-{i}", f"offset={i}")
        now[0] = 70.0
        lines.run_ended()
    assert _summaries(caplog) == [
        f"event=replays_dropped count={2 * SAID_PER_MINUTE} unsaid={SAID_PER_MINUTE} "
        "seconds=61 run=goes on",
        f"event=replays_dropped count={SAID_PER_MINUTE + 5} unsaid=5 seconds=9 run=ended"]


def test_replays_alternating_with_new_events_are_summed_up_once_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 65 of QA 64-a F-9: an incremental snapshot or a republish under live writes
    # alternates replays with new events, and each run's end said a line: 9,900 summaries of
    # count=1 in 50 s past the cap, which is there to bound the lines (QA 47-d F2). A few
    # runs (two tables re-snapshotted) are still said at once.
    now = [0.0]
    lines = ReplayLines(clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="cdc_router.router"):
        for i in range(10_000):
            now[0] = i * 0.005
            lines.dropped(f"e-{i}", f"offset={i}")
            lines.run_ended()  # a record that is no replay
        now[0] = 61.0
        lines.run_ended()  # the next record, at the minute's turn: what was held back
    said = [record.getMessage() for record in caplog.records]
    # The lines, the cap's, SUMMED_PER_MINUTE runs' summaries, then the turn's.
    assert len(said) == SAID_PER_MINUTE + 1 + SUMMED_PER_MINUTE + 1, len(said)
    summaries = [line.split(" seconds=")[0] for line in said
                 if line.startswith("event=replays_dropped ")]
    held = 10_000 - SAID_PER_MINUTE - SUMMED_PER_MINUTE
    assert summaries == ["event=replays_dropped count=1 unsaid=1"] * SUMMED_PER_MINUTE + [
        f"event=replays_dropped count={held} unsaid={held}"]
    assert lines.run == 0
