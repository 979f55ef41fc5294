"""How often a client that failed for good may be replaced in-process.

A renewal (a new producer for a fenced one, a new consumer for a fenced or stranded member)
mends what a broker outage or a coordinator move leaves behind. What keeps coming back is no
such accident: two processes sharing one instance id, a group that never takes the member. So
each kind of renewal is allowed at most MAX_RENEWALS times in RENEWAL_WINDOW_S; past that the
error stands and the process stops, loudly, for its supervisor. Used by the router's
ProducerRenewal (router/renewal.py) and the idempotent consumer (consumer/loop.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

MAX_RENEWALS = 3
RENEWAL_WINDOW_S = 600.0


class RenewalBudget:
    """spend(): whether one more renewal fits in the window (and, if it does, counts it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._spent: deque[float] = deque()

    def spend(self) -> bool:
        now = self._clock()
        while self._spent and now - self._spent[0] > RENEWAL_WINDOW_S:
            self._spent.popleft()
        if len(self._spent) >= MAX_RENEWALS:
            return False
        self._spent.append(now)
        return True
