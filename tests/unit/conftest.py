"""The unit suite's membership lookups run at once, on the test's thread, so that a fake clock
alone decides when a check sees its answer (tests/unit/test_membership.py runs the real thread);
each test starts with no login refusal noted (kafka/logs.py keeps one for 300 s, and a start
that times out after one is a refused login: kafka/start.py)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import pytest

from cdc_router.kafka import logs, membership


def at_once(lookup: Callable[[], bool]) -> Future[bool]:
    """lookup() on the caller's thread, its answer given before this returns."""
    answer: Future[bool] = Future()
    try:
        answer.set_result(lookup())
    except Exception as failure:
        answer.set_exception(failure)
    return answer


@pytest.fixture(autouse=True)
def lookups_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(membership, "in_thread", at_once)


@pytest.fixture(autouse=True)
def no_refusal_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "_REFUSALS", [])
