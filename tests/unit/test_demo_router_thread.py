"""The demo keeps what stopped its router and says it (QA, session 29)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from cdc_router.errors import CdcRouterError, ConfigError
from cdc_router.local.demo import _RouterThread


class _Stopping:
    def __init__(self, failure: BaseException) -> None:
        self._failure = failure

    def run(self) -> None:
        raise self._failure


def _stopped(failure: BaseException) -> _RouterThread:
    thread = _RouterThread(cast(Any, _Stopping(failure)))
    thread.start()
    thread.join(timeout=10)
    return thread


def test_a_router_error_is_raised_as_it_is_not_printed_as_a_thread_traceback() -> None:
    thread = _stopped(ConfigError("topic cdc-router.dlq does not exist",
                                  field="dead_letter.topic"))
    with pytest.raises(ConfigError, match=r"field 'dead_letter\.topic'"):
        thread.raise_failure()


def test_anything_else_is_one_line_naming_it() -> None:
    thread = _stopped(RuntimeError("boom"))
    with pytest.raises(CdcRouterError, match=r"the demo's router stopped: RuntimeError\('boom'\)"):
        thread.raise_failure()
