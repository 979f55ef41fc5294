"""The dedup changelog's restore at a start: the newest marks first, back only as far as one
could still be kept (review 66 F-2).

The replay filter keeps the ids of the last `dedup.window_ms`, at most the newest
`dedup.max_ids`. A busy changelog's window holds far more (the default 7 days at 100 events a
second: 60 million ids, of which the default million are the newest 2.8 hours), and read in
order every one was parsed and most crowded out (review 66: 500,000 marks read in 18.9 s to
keep the newest 50,000). So the restore reads backwards in time slices: first the records
timestamped in the last FIRST_SLICE_MS, to the end; then each older slice, its span grown 2 to 8
times (by how many ids the last held), up to where the one before started
(kafka/changelog_reader.py); and stops once the
filter holds max_ids ids all marked after the slice's start (ReplayFilter.restore_slices), or
at the window's start (with the clock margin, ReplayFilter.changelog_since_ms).

Why that stop loses nothing: a record below a slice's start is timestamped before the slice's
time (Kafka's ListOffsets by time), and a mark's time is at most its record's (the producer
stamps the record after the mark, by the same clock: router/replay.py
CHANGELOG_CLOCK_MARGIN_MS), so every mark left unread is older than every id held, and a read
of it would have been the first crowded out. A broker-stamped changelog (LogAppendTime: its
records say so) may stamp a record before its mark by as much as the leader's clock lags, and
leaders' clocks differ: there the ids held must be newer than the slice's start and that
margin (an hour, as the window's start allows). Only this group's marks count toward max_ids;
other groups' records are read and passed over. Later reads go on from the ends as before.

Why that growth: a quiet changelog (the filter never fills) costs log8(window / FIRST_SLICE_MS)
slices, 5 for the default 7 days, each a time lookup per partition and a consumer (about 25 ms
on a test stack); a busy one whose rate is steady reads about 1.25 times the span that holds
max_ids ids, and at worst (the rate grows older) 8 times the span before the last slice.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Protocol

from cdc_router.router.replay import CHANGELOG_CLOCK_MARGIN_MS, Record, ReplayFilter

# The first slice: a few minutes hold a quiet changelog's recent marks and a busy one's first
# ids, in one lookup; each next slice doubles the span read.
FIRST_SLICE_MS = 300_000
# Each next span, over the last: what the ids held so far say fills max_ids, within these. At
# least twice (a slice as long as all before it: the time lookups stay logarithmic), at most 8
# times (a busy changelog's first minutes may hold few of this group's ids, or a spike).
MIN_GROWTH = 2
MAX_GROWTH = 8


class SlicedChangelog(Protocol):
    """kafka/changelog_reader.py ChangelogReader's surface for a restore."""

    def catch_up(self, *, since_ms: int | None = None) -> Iterable[Record]: ...

    def older(self, since_ms: int) -> Iterable[Record]: ...

    def older_left(self) -> bool: ...

    def older_done(self) -> None: ...

    @property
    def broker_stamped(self) -> bool: ...


def restore_newest(replay: ReplayFilter, changelog: SlicedChangelog, now_ms: int, *,
                   group: str) -> tuple[int, int]:
    """`group`'s marks into `replay`, newest slices first (see the module doc); the marks read
    and the slices read. A read that went on from before (a later assignment's) is one slice."""
    slices = _slices(replay, changelog, now_ms)
    try:
        return replay.restore_slices(slices, now_ms, group=group)
    finally:
        slices.close()
        changelog.older_done()


Slice = tuple[Callable[[], int] | None, Iterable[Record]]  # ReplayFilter.restore_slices


def _slices(replay: ReplayFilter, changelog: SlicedChangelog,
            now_ms: int) -> Generator[Slice, None, None]:
    """(start_ms, records) newest first, the last's start None (restore_slices)."""
    since_ms = replay.changelog_since_ms(now_ms)
    if since_ms is None:  # a window longer than the epoch: every record, in one read
        yield None, changelog.catch_up(since_ms=None)
        return
    span = FIRST_SLICE_MS
    start = max(now_ms - span, since_ms)
    yield _unread_before(changelog, start, since_ms), changelog.catch_up(since_ms=start)
    while start > since_ms and changelog.older_left():
        span *= _growth(len(replay), replay.max_ids)
        start = max(now_ms - span, since_ms)
        yield _unread_before(changelog, start, since_ms), changelog.older(start)


def _unread_before(changelog: SlicedChangelog, start: int,
                   since_ms: int) -> Callable[[], int] | None:
    """What every mark left unread below a slice starting at `start` is older than, once the
    slice was read: its start; a broker-stamped record's time may precede its mark's by as
    much as the broker's clock lags (CHANGELOG_CLOCK_MARGIN_MS allowed, as for the window's
    start). None: the window's start, the last slice."""
    if start <= since_ms:
        return None
    return lambda: start + (CHANGELOG_CLOCK_MARGIN_MS if changelog.broker_stamped else 0)


def _growth(held: int, max_ids: int) -> int:
    """How many times longer the span read next is: as many as the ids held so far say fill
    max_ids (and a quarter more), at least MIN_GROWTH, at most MAX_GROWTH."""
    wanted = -(-max_ids * 5 // (4 * max(held, 1)))  # ceil(1.25 * max_ids / held)
    return min(MAX_GROWTH, max(MIN_GROWTH, wanted))
