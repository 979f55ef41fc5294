"""librdkafka's log lines: the same line, numbers aside, once a window (QA session 27-b: a
Kafka outage logged 7,116 ERROR lines in 6 minutes)."""

from __future__ import annotations

import logging

from cdc_router.kafka.logs import RepeatFilter


def _record(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("cdc_router.librdkafka", level, __file__, 1, "%s", (message,),
                             None)


def test_a_repeated_line_passes_once_a_window_and_then_counts_the_rest() -> None:
    now = [0.0]
    repeats = RepeatFilter(window_s=60, clock=lambda: now[0])
    line = "FAIL [rdkafka#producer-1]: Connect to ipv4#127.0.0.1:19092 failed (after {}ms)"
    passed = []
    for second in range(130):
        now[0] = float(second)
        record = _record(line.format(second % 7))
        if repeats.filter(record):
            passed.append(record.getMessage())
    assert len(passed) == 3  # at 0 s, 60 s and 120 s
    assert passed[1].endswith("(59 like it in the last 60s not logged)")
    assert repeats.filter(_record("another line"))  # other lines are not held
    assert repeats.filter(_record(line.format(1), logging.WARNING))  # nor other levels
