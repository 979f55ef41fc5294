"""The cleanup's queue of delivered ids whose rows are still to go (router/cleanup.py).

`delete` mode: ids are due at once, in a FIFO of (event id, due since). `retention` mode: ids wait
in a heap by due time (created or delivered + retention_ms), so that a row not due yet (even one
dated in the future) holds up no other, and join the FIFO when due. Bounded: beyond `limit` the
oldest are given up (add() says how many). Thread-safe: the router hands ids over on its thread,
the cleanup's worker takes and settles them on its own.
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from collections.abc import Sequence
from itertools import islice


class PendingIds:
    def __init__(self, retention_ms: int | None, limit: int) -> None:
        self._retention_ms = retention_ms
        self._limit = limit
        self._due: deque[tuple[str, int]] = deque()  # (event id, due since: epoch ms), FIFO
        self._waiting: list[tuple[int, str]] = []  # retention: heap of (due at: epoch ms, id)
        self._lock = threading.Lock()

    def add(self, entries: Sequence[tuple[str, int]], now_ms: int) -> int:
        """(event id, created or delivered ms): due now (delete) or after the retention. The
        number of ids given up to stay within the limit."""
        given_up = 0
        with self._lock:
            if self._retention_ms is None:
                self._due.extend((event_id, now_ms) for event_id, _ in entries)
            else:
                for event_id, since_ms in entries:
                    heapq.heappush(self._waiting, (since_ms + self._retention_ms, event_id))
            while len(self._due) + len(self._waiting) > self._limit:
                self._due.popleft() if self._due else heapq.heappop(self._waiting)
                given_up += 1
        return given_up

    def count(self) -> int:
        with self._lock:
            return len(self._due) + len(self._waiting)

    def due_count(self, now_ms: int) -> int:
        with self._lock:
            return len(self._due) + sum(1 for due_ms, _ in self._waiting if due_ms <= now_ms)

    def due_at_least(self, count: int) -> bool:
        with self._lock:
            return len(self._due) >= count

    def take(self, now_ms: int, size: int) -> list[str]:
        """Up to `size` due ids (left queued until settled)."""
        with self._lock:
            while self._waiting and self._waiting[0][0] <= now_ms:
                due_ms, event_id = heapq.heappop(self._waiting)
                self._due.append((event_id, due_ms))
            return [event_id for event_id, _ in islice(self._due, size)]

    def settle(self, done: list[str], not_yet: list[tuple[int, str]]) -> None:
        """The ids `done` (the queue's head) leave the queue; rows still young wait again."""
        with self._lock:
            # add() may have trimmed the queue meanwhile: pop only what was deleted.
            for event_id in done:
                if self._due and self._due[0][0] == event_id:
                    self._due.popleft()
            for entry in not_yet:
                heapq.heappush(self._waiting, entry)

    def oldest_due_since(self) -> int | None:
        """Since when (epoch ms) the oldest due id has been due."""
        with self._lock:
            return self._due[0][1] if self._due else None
