"""Closing a process's clients on its way out without hiding why it leaves.

Called from a `finally:`, `close_all` sees the error the process is leaving with, if any
(sys.exc_info). A close that fails then is logged and the error stands: a consumer's close
runs its revoke callback and may raise (a fenced member, a lost broker), and raised from the
`finally:` it would replace the error that stopped the process, and its exit code (review,
session 30). On a clean way out the first failure is raised, once every client is closed.

A consumer replaced in-process (stranded or fenced) is closed aside (`close_aside`), before
its successor joins: on a thread of its own, waited for CLOSE_WAIT_S at most. Such a
client may be slow to let go (a consumer's close waits for its group's coordinator), and its
close must not hold the loop unbounded (review 40-1 F5). One that outlasts the wait is given up
to its thread and counted with the blocked calls (kafka/watchdog.py blocked_calls): renewals
stop while more than 3 are blocked, and the program then exits without finalizers (review 41-1).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from cdc_router.kafka.watchdog import AbandonableCall, blocked_calls

log = logging.getLogger("cdc_router")
# How long a replaced client's close is waited for
CLOSE_WAIT_S = 5.0


class Closable(Protocol):
    def close(self) -> object: ...


def close_all(*clients: Closable | None) -> None:
    """Close each client given (None is skipped), in order; see the module's docstring."""
    leaving = sys.exc_info()[1]
    first: Exception | None = None
    for client in clients:
        if client is None:
            continue
        try:
            client.close()
        except Exception as failure:
            if leaving is not None:
                log.warning("event=close_failed client=%s error=%s leaving_on=%s",
                            type(client).__name__, _line(failure), _line(leaving))
            elif first is None:
                first = failure
    if first is not None:
        raise first


def close_aside(client: Closable, name: str) -> None:
    """Close a replaced `client` (see the module's docstring); a failure is logged, never
    raised: the client is out of use already."""
    try:
        if AbandonableCall(f"close-{name}", client.close).run(CLOSE_WAIT_S):
            return
    except Exception as failure:
        log.info("event=close_failed client=%s error=%s (replaced already)", name,
                 _line(failure))
        return
    log.warning("event=close_given_up client=%s waited_s=%.0f blocked_calls=%d: the replaced "
                "client's close goes on on a thread of its own", name, CLOSE_WAIT_S,
                blocked_calls())


Rebalance = Callable[[Any, Any], None]


class Generations:
    """Rebalance callbacks bound to the consumer subscribed with them: once it is replaced
    (retire()), its callbacks do nothing. Its close, aside, runs them on its own thread, where
    they must not touch the batch or the partitions of the consumer that replaced it."""

    def __init__(self) -> None:
        self._current = 0

    def subscribe(self, consumer: Any, topics: Sequence[str], on_assign: Rebalance,
                  on_revoke: Rebalance, on_lost: Rebalance) -> None:
        """consumer.subscribe(topics) with the callbacks bound to it."""
        consumer.subscribe(list(topics), on_assign=self._bound(on_assign),
                           on_revoke=self._bound(on_revoke), on_lost=self._bound(on_lost))

    def _bound(self, callback: Rebalance) -> Rebalance:
        generation = self._current

        def call(consumer: Any, partitions: Any) -> None:
            if generation == self._current:
                callback(consumer, partitions)
        return call

    def retire(self) -> None:
        self._current += 1


def _line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
