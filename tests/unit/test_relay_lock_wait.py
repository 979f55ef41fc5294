"""A relay read waiting on its table's lock says so once, and once more when it goes on (QA
67-a F-2: 60 s of a migration's ACCESS EXCLUSIVE lock without a line)."""

from __future__ import annotations

import re
import threading

import psycopg
import pytest

from cdc_router.relay import lock_wait
from cdc_router.relay.lock_wait import LockWait


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(record.levelname, record.getMessage()) for record in caplog.records
            if "lock" in record.getMessage()]


def test_a_read_that_waits_past_the_threshold_is_said_once_with_the_blocking_pids(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(lock_wait, "LOCK_WAIT_WARN_S", 0.05)
    with caplog.at_level("INFO", logger="cdc_router.relay"), \
            LockWait("public.outbox", lambda: "{4242}"):
        threading.Event().wait(0.3)  # the read waiting on the lock
    lines = _lines(caplog)
    assert len(lines) == 2, lines
    assert lines[0][0] == "WARNING" and re.match(
        r"event=relay_read_waiting_on_lock table=public.outbox waited_s=0\.\d "
        r"blocking_pids=\{4242\} hint='.*pg_locks", lines[0][1]), lines
    assert lines[1][0] == "INFO" and re.fullmatch(
        r"event=relay_read_lock_wait_over table=public.outbox waited_s=0\.\d", lines[1][1])


def test_a_short_wait_says_nothing_and_the_blockers_are_not_asked(
        caplog: pytest.LogCaptureFixture) -> None:
    asked: list[bool] = []
    with caplog.at_level("INFO", logger="cdc_router.relay"), \
            LockWait("public.outbox", lambda: str(asked.append(True))):
        pass
    assert _lines(caplog) == [] and asked == []


def test_blockers_that_cannot_be_read_leave_the_warning_said(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(lock_wait, "LOCK_WAIT_WARN_S", 0.01)

    def refused() -> str:
        raise psycopg.OperationalError("too many connections")

    with caplog.at_level("INFO", logger="cdc_router.relay"), LockWait("public.outbox", refused):
        threading.Event().wait(0.2)
    lines = _lines(caplog)
    assert "blocking_pids=unknown (too many connections)" in lines[0][1], lines
    assert len(lines) == 2
