"""A watching `status` runs each check in a worker process: a crash costs that check only."""

from __future__ import annotations

import os
import signal

import pytest

from cdc_router.ops.isolated import CRASHED, IsolatedChecks


def check(value: int, *, crash: bool = False) -> int:
    if crash:
        os.kill(os.getpid(), signal.SIGSEGV)  # as librdkafka did (QA, session 28)
    if value < 0:
        raise ValueError(f"no check of {value}")
    return value


def test_a_crashed_check_is_a_reason_and_the_next_check_gets_a_new_worker() -> None:
    checks = IsolatedChecks(check)
    try:
        assert checks(1) == 1
        assert checks(2, crash=True) == CRASHED
        assert checks(3) == 3
        with pytest.raises(ValueError, match="no check of -1"):
            checks(-1)  # a failure of the check is raised, not taken for a crash
        assert checks(4) == 4
    finally:
        checks.close()
