"""In-memory dedup store, for tests and demos only.

Not safe across restarts (a restarted process forgets every done mark, so redelivered
records run their effect again) nor across replicas (each process has its own marks).
Within one process it is exact: the effect and the done mark are recorded under one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from cdc_router.consumer.dedup.store import DedupKey, Outcome, run_effect


class MemoryDedupStore:
    """Done marks in a dict guarded by a lock; the effect's context is None."""

    def __init__(self) -> None:
        self._done: set[DedupKey] = set()
        self._lock = threading.Lock()

    def run_once(self, key: DedupKey, effect: Callable[[None], None]) -> Outcome:
        """Run `effect(None)` unless `key` is done; a raising effect leaves the key not done."""
        # Holding the lock across the effect makes concurrent duplicates wait instead of
        # running twice; a test store has no throughput to protect.
        with self._lock:
            if key in self._done:
                return Outcome.DUPLICATE
            run_effect(effect, None)
            self._done.add(key)
            return Outcome.DONE

    def is_done(self, key: DedupKey) -> bool:
        """Whether `key` is recorded as done."""
        with self._lock:
            return key in self._done

    def close(self) -> None:
        """Nothing to release."""
