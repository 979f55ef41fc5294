"""The checks of a watching `status` (--watch, --serve), each in a process of its own.

librdkafka (2.16) can crash the process (SIGSEGV in its main thread) when the Kafka cluster
restarts while a check's admin and consumer calls are in flight (QA session 28: five times in a
loop of checks over a broker restart). For a single check that costs one run; for a watch or the
exporter it would end the whole service. In a child process (spawned, not forked: the parent's
librdkafka threads do not survive a fork), a crash costs one check. A child costs about a
second of start-up, against a watch's 30 s between checks.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

CRASHED = ("the check's process died (librdkafka can crash when Kafka restarts during a "
           "check); checking again at the next tick")
# Each part's calls have their own timeouts (a few of 10 to 30 s); a check past this is stuck
# on something none of them bounds, and is ended (review 49-b F1: a lock on the outbox).
CHECK_DEADLINE_S = 120
HUNG = (f"the check did not answer within {CHECK_DEADLINE_S} s and was ended; checking "
        "again at the next tick")


def _run(check: Callable[..., Any], answer: Connection, args: tuple[Any, ...],
         kwargs: dict[str, Any]) -> None:
    try:
        result: tuple[bool, Any] = (True, check(*args, **kwargs))
    except Exception as error:  # the parent raises it: a failure of the check, not a crash
        result = (False, error)
    answer.send(result)
    answer.close()


class IsolatedChecks:
    """call(*args, **kwargs): `check(*args, **kwargs)` in a child process; CRASHED (a str)
    when the child died without an answer, HUNG when it gave none within the deadline.
    close() ends a child still running."""

    def __init__(self, check: Callable[..., Any], deadline_s: float = CHECK_DEADLINE_S) -> None:
        self._check, self._deadline_s = check, deadline_s
        self._context = multiprocessing.get_context("spawn")
        self._process: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        receiving, sending = self._context.Pipe(duplex=False)
        process = self._process = self._context.Process(
            target=_run, args=(self._check, sending, args, kwargs), daemon=True)
        process.start()
        sending.close()
        try:
            if not receiving.poll(self._deadline_s):
                self.close()
                return HUNG
            ok, value = receiving.recv()
        except EOFError:
            return CRASHED
        except BaseException:  # Ctrl-C or SIGTERM while waiting: the child goes too
            self.close()
            raise
        finally:
            receiving.close()
            process.join()
            self._process = None
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """End a child still running: SIGTERM, then SIGKILL after 5 s (a stopped child, in a
        frozen cgroup or under a debugger, keeps a SIGTERM pending: QA 49-h F1)."""
        if self._process is not None and self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=5)
            if self._process.is_alive():
                self._process.kill()
