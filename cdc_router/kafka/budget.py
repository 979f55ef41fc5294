"""How often a client that failed for good may be replaced in-process.

A renewal (a new producer for a fenced one, a new consumer for a fenced or stranded member)
mends what a broker outage or a coordinator move leaves behind. What keeps coming back is no
such accident: two processes sharing one instance id, a group that never takes the member. So
each kind of renewal is allowed at most MAX_RENEWALS times in RENEWAL_WINDOW_S; past that the
error stands and the process stops, loudly, for its supervisor. Used by the router's
ProducerRenewal (router/renewal.py) and the idempotent consumer (consumer/loop.py).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from cdc_router.kafka.watchdog import blocked_calls

log = logging.getLogger("cdc_router")

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


def unblocked_enough(blocked: Callable[[], int] | None = None) -> bool:
    """Whether the librdkafka calls given up and still blocked (kafka/watchdog.py: a hung
    producer call, a replaced consumer's close, a membership lookup) are few enough for one
    more renewal; each holds a client's threads and sockets, which only a restart frees."""
    count = (blocked or blocked_calls)()
    if count <= MAX_RENEWALS:
        return True
    log.error("event=renewal_budget_spent blocked_calls=%d: more than %d given-up librdkafka "
              "calls are still blocked, each holding a client's threads and sockets; this one "
              "ends the process, which frees them", count, MAX_RENEWALS)
    return False
