"""The relay's backoff after a failed batch or a failed Postgres read, and the line that says
the reads went on after failures (QA 67-a F-3: after a backoff of up to 30 s nothing said it
resumed; only the metric cdc_router_consecutive_aborts went back to 0)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("cdc_router.relay")

# Backoff after a failed batch or a Postgres failure: doubles from the first to the last.
BACKOFF_S = (0.5, 30.0)


def wait_out(reason: str, failures: int, wait: Callable[[float], object]) -> None:
    """Say the failure (the `failures`-th in a row) and wait its backoff."""
    low, high = BACKOFF_S
    delay = min(high, low * 2 ** (failures - 1))
    log.warning("event=batch_failed consecutive=%d backoff_s=%.1f reason=%r", failures,
                delay, reason)
    wait(delay)


class ReadFailures:
    """Postgres reads that failed in a row (not the aborts' count: no producer renewal,
    review 43), and the one line when a read succeeds after them."""

    def __init__(self, table: str, wait: Callable[[float], object]) -> None:
        self._table, self._wait = table, wait
        self.count = 0
        self._since = 0.0  # monotonic, at the first failure of the run

    def failed(self, reason: str) -> None:
        if not self.count:
            self._since = time.monotonic()
        self.count += 1
        wait_out(reason, self.count, self._wait)

    def succeeded(self) -> None:
        if self.count:
            log.info("event=read_resumed table=%s failures=%d after_s=%.1f", self._table,
                     self.count, time.monotonic() - self._since)
        self.count = 0
