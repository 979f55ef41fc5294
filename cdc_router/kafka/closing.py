"""Closing a process's clients on its way out without hiding why it leaves.

Called from a `finally:`, `close_all` sees the error the process is leaving with, if any
(sys.exc_info). A close that fails then is logged and the error stands: a consumer's close
runs its revoke callback and may raise (a fenced member, a lost broker), and raised from the
`finally:` it would replace the error that stopped the process, and its exit code (review,
session 30). On a clean way out the first failure is raised, once every client is closed.
"""

from __future__ import annotations

import logging
import sys
from typing import Protocol

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


def _line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
