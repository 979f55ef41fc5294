"""What the idempotent consumer says of a dedup store outage: one warning when it starts, one
again at most every REPEAT_S while it lasts, one line when the store answers again.

Each record that meets the outage is retried on its own partition's backoff (consumer/loop.py),
so a line per retry was one per partition per retry: 55 warnings in 12 s on 4 partitions with
Postgres down (QA 61-b F6), the outage's start lost among them and its end unsaid.

A store that flaps (fails again within REPEAT_S of the last line) is not said at once: such an
outage is said only once it lasts REPEAT_S, and one that ends sooner is counted
(short_outages=N) in the next dedup_store_unavailable line, or, when none comes, in a
dedup_store_short_outages line at the first answered call REPEAT_S after the last line
(review 63: flaps followed by a stable store were said in debug lines only): a warning and a
recovery at most every REPEAT_S, however often it flaps.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import psycopg

from cdc_router.consumer.dedup.postgres_rules import contention
from cdc_router.dead_letter import shown_repr
from cdc_router.errors import NestedEventBusy

log = logging.getLogger("cdc_router.consumer.loop")

# While the store stays away, a line this often says that it still is (and since when): often
# enough for an operator watching the log, far below a line per retry.
REPEAT_S = 30.0


class StoreOutage:
    """The dedup store's state as its calls found it: failed() on each DedupStoreError,
    answered() on each call it answered (a handler's failure included)."""

    def __init__(self, store: str, clock: Callable[[], float], *,
                 repeat_s: float = REPEAT_S) -> None:
        self._store = store
        self._clock = clock
        self._repeat_s = repeat_s
        self._since: float | None = None
        self._said_at = -math.inf  # when its last line was said
        self._failures = 0
        # Hold-down: an outage that begins within repeat_s of the last line (a flapping store)
        # is said only if it lasts repeat_s; one that ends first is counted in the next line.
        self._quiet = False
        self._short = 0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, error: BaseException) -> str:
        """A call failed: said at the outage's start, then at most every `repeat_s`. The retry's
        reason: 'store_failed' for an outage (its retry lines are debug ones), or
        'store_contention' for workers contending (a deadlock, a serialization failure, a
        nested event another worker holds), where the store answered: no outage, and no
        `dedup_store_unavailable` line (review rv62b)."""
        cause = error.__cause__
        if isinstance(error, NestedEventBusy) or (
                isinstance(cause, psycopg.Error) and contention(cause)):
            self.answered()
            return "store_contention"
        now = self._clock()
        self._failures += 1
        shown = shown_repr(error)[:300]
        if self._since is None:
            self._since = now
            # Hold-down: a store back within repeat_s of the last line is flapping.
            self._quiet = now - self._said_at < self._repeat_s
            if not self._quiet:
                self._said_unavailable(now, shown)
        elif now - self._said_at >= self._repeat_s:
            if self._quiet:  # a flap that lasted: said now, as an outage
                self._said_unavailable(now, shown)
            else:
                self._said_at = now
                log.warning("event=dedup_store_still_unavailable store=%s for_s=%.0f "
                            "failures=%d error=%s", self._store, now - self._since,
                            self._failures, shown)
        return "store_failed"

    def _said_unavailable(self, now: float, shown: str) -> None:
        """The outage's first line, with the flaps left unsaid since the last one."""
        flaps = f" short_outages={self._short}" if self._short else ""
        self._said_at, self._quiet, self._short = now, False, 0
        log.warning("event=dedup_store_unavailable store=%s error=%s%s reason=%r", self._store,
                    shown, flaps, "each record is retried without limit, none is skipped or "
                    "dead-lettered: its partition waits (backoff up to retry.max_backoff_s) "
                    "and the others go on; a line every "
                    f"{self._repeat_s:.0f} s while it lasts, one when it ends")

    def answered(self) -> None:
        """A call was answered: the outage, if one was said, has ended; short outages not
        said yet are, once REPEAT_S has passed since the last line."""
        if self._since is None:
            if self._short and self._clock() - self._said_at >= self._repeat_s:
                self._said_at, short, self._short = self._clock(), self._short, 0
                log.warning("event=dedup_store_short_outages store=%s count=%d reason=%r",
                            self._store, short, "the store failed and answered again within "
                            f"{self._repeat_s:.0f} s of the last line, this many times: each "
                            "record was retried, none skipped; it answers now")
            return
        if self._quiet:  # a flap, unsaid: counted in the next warning
            self._short += 1
            log.debug("event=dedup_store_flapped store=%s outage_s=%.1f failures=%d",
                      self._store, self._clock() - self._since, self._failures)
        else:
            self._said_at = self._clock()
            log.info("event=dedup_store_recovered store=%s outage_s=%.1f failures=%d",
                     self._store, self._said_at - self._since, self._failures)
        self._since, self._failures, self._quiet = None, 0, False
