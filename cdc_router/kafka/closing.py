"""Closing a process's clients on its way out without hiding why it leaves.

Called from a `finally:`, `close_all` sees the error the process is leaving with, if any
(sys.exc_info). A close that fails then is logged and the error stands: a consumer's close
runs its revoke callback and may raise (a fenced member, a lost broker), and raised from the
`finally:` it would replace the error that stopped the process, and its exit code (review,
session 30). On a clean way out the first failure is raised, once every client is closed.

A client replaced in-process (a stranded or fenced consumer, a reader left without metadata)
is closed aside (`close_aside`), on a thread of its own that is not waited for: such a client
may be slow to let go (its LeaveGroup to a coordinator that does not answer), and its close must
hold neither the loop nor the process's exit (review 40-1 F5).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

log = logging.getLogger("cdc_router")


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
    """Close a replaced `client` on a daemon thread; a failure is logged, never raised."""
    def close() -> None:
        try:
            client.close()
        except Exception as failure:  # it is out of use: nothing more to do with it
            log.info("event=close_failed client=%s error=%s (replaced already)", name,
                     _line(failure))

    threading.Thread(target=close, name=f"cdc-router-close-{name}", daemon=True).start()


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
