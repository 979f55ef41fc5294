"""What the router remembers of the schema registry's answers, and how long they took.

QA 55-c F-2: with auto_register off, every event of a data-named subject the registry lacks
asked the registry again, inside the batch; a registry answering in 4 s let one such event
through every 4 s and every other route waited behind it, while nothing said the registry was
slow. A subject's answer that it is missing or incompatible (what a registration mends) that
took SLOW_LOOKUP_S or more to come is now remembered for REFUSAL_MEMORY_S, and such a lookup is
logged (event=registry_slow), at most once every SLOW_LOG_INTERVAL_S. Another definite 4xx still
dead-letters its event but is not remembered (reread 55-r F-6: a 403 may be an auth proxy's or
a token refresh's passing answer, which the memory made every event's for 10 s). A quick
refusal is not remembered: asking again costs milliseconds, and a subject registered meanwhile
(`schemas register`, then `dlq replay`) is used by the next event (CI rehearsal at 6eff9ba: the
memory dead-lettered the event after a registration). An outage is never remembered: it stops
the router (exit 75), as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from cdc_router.config.redact import shown_url

log = logging.getLogger("cdc_router.serde.registry")

T = TypeVar("T")

# Long enough that a slow registry costs one round trip per subject in this time, not one per
# event (a 4 s answer: 40% of the stream's time at most, not all of it); short enough that a
# subject registered with `cdc-router schemas register` is used within seconds. Not the batch:
# a batch ends when commit_interval_ms or commit_max_records says, which would tie what the
# registry is asked to the delivery settings; the events refused meanwhile are dead-lettered
# with the registry's own answer, to replay as every other one of that subject.
REFUSAL_MEMORY_S = 10.0
SLOW_LOOKUP_S = 1.0  # a registry on a LAN answers in milliseconds
SLOW_LOG_INTERVAL_S = 60.0  # one line a minute: a slow registry is slow for every lookup


class RefusedSubjects:
    """The registry's refusal of each subject (by the caller's key), for REFUSAL_MEMORY_S."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._refused: dict[Hashable, tuple[float, str]] = {}

    def __bool__(self) -> bool:
        return bool(self._refused)

    def remember(self, key: Hashable, reason: str, took_s: float) -> None:
        """Remember the refusal of `key`, if it took SLOW_LOOKUP_S or more to come."""
        if took_s >= SLOW_LOOKUP_S:
            self._refused[key] = (self._clock() + REFUSAL_MEMORY_S, reason)

    def recall(self, key: Hashable) -> str | None:
        """The reason the registry gave for `key` less than REFUSAL_MEMORY_S ago, else None."""
        found = self._refused.get(key)
        if found is None:
            return None
        if self._clock() >= found[0]:
            del self._refused[key]
            return None
        return found[1]


class SlowLookups:
    """Logs registry lookups that take SLOW_LOOKUP_S or more, at most once an interval."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._said = float("-inf")
        self.last_s = 0.0  # how long the last lookup took (a refusal's: remembered if slow)
        self._count = 0
        self._worst = 0.0

    def timed(self, url: str, what: str, step: Callable[[], T]) -> T:
        """step(), whose time is noted: it asked the registry at `url` to `what`."""
        started = self._clock()
        try:
            return step()
        finally:
            self.last_s = self._clock() - started
            self.note(url, what, self.last_s)

    def note(self, url: str, what: str, took_s: float) -> None:
        if took_s < SLOW_LOOKUP_S:
            return
        self._count += 1
        self._worst = max(self._worst, took_s)
        now = self._clock()
        if now - self._said < SLOW_LOG_INTERVAL_S:
            return
        shown = shown_url(url)
        log.warning("event=registry_slow url=%s seconds=%.1f what=%r slow_lookups=%d "
                    "worst_s=%.1f hint=%r", shown, took_s, what, self._count,
                    self._worst, f"lookups of {SLOW_LOOKUP_S:.0f} s or more since the last "
                    "such line (counted in slow_lookups): every event waiting on one waits "
                    "with its batch; check the registry's load and the network to it",
                    extra={_SLOW_LOOKUP: (shown, took_s, what)})
        self._said, self._count, self._worst = now, 0, 0.0


_SLOW_LOOKUP = "registry_slow_lookup"  # the LogRecord attribute: (url, seconds, what)


class _AsWarningLine(logging.Filter):
    def __init__(self, echo: Callable[[str], None]) -> None:
        super().__init__()
        self._echo = echo

    def filter(self, record: logging.LogRecord) -> bool:
        slow = getattr(record, _SLOW_LOOKUP, None)
        if slow is None:
            return True
        url, took_s, what = slow
        self._echo(f"warning: the schema registry at {url} took {took_s:.1f} s to {what}; "
                   "check its load and the network to it")
        return False


@contextmanager
def slow_lookups_shown(echo: Callable[[str], None]) -> Iterator[None]:
    """Within: a slow lookup goes to `echo` as one `warning:` line, not as the router's
    event=registry_slow line. For one-shot commands (reread 55-r F-4: with no logging set up,
    Python's last resort wrote that line to stderr, with a hint about a batch they have
    none of); `status` passes an echo that shows nothing, its registry section being its word."""
    shown = _AsWarningLine(echo)
    log.addFilter(shown)
    try:
        yield
    finally:
        log.removeFilter(shown)


SLOW = SlowLookups()  # one per process: its line is about the registry, not a caller
