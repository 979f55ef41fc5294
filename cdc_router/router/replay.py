"""The router's replay filter: the event ids it delivered recently, so Debezium's replays drop.

After a crash Debezium re-emits the events since its last flushed offset. Each id the router
delivers is remembered here and written, in the same Kafka transaction as the delivery, to a
changelog topic, from which a restarted or newly assigned router restores it.

The changelog's records, the marks, are router/marks.py's (importable from here too). A mark
counts only for its own source.group_id: pipelines may share one changelog.

Memory is bounded twice: ids older than `window_ms` are forgotten, and beyond `max_ids` the oldest
go first. A replay of an id forgotten by either bound is delivered again: size the window to
cover Debezium's replays (minutes after a Connect crash) and the raw topic's retention.

Each id costs about 120 bytes (tests/bench/replay_memory.py: 1,000,000 ids restored, 187 MB of
RSS against 75 MB with none): a canonical uuid is kept as its 16 bytes (56 of object), in one set
of every id (33 bytes an id) and in its batch's list (8); a batch, not each id, has a timestamp.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Callable, Iterable
from operator import itemgetter

from cdc_router.router.lost_commits import Key, OwnBatches
from cdc_router.router.marks import (
    BATCH_KEY_PREFIX,
    DEAD_LETTERED_KEY_PREFIX,
    MARK_MAX_BYTES,
    REPLAYED_KEY_PREFIX,
    ChangelogRecord,
    changelog_records,
    mark_owner,
    parse_changelog,
)
from cdc_router.router.replay_keys import BATCH_MAX_IDS, compact_key, runs_of

__all__ = ["BATCH_KEY_PREFIX", "DEAD_LETTERED_KEY_PREFIX", "MARK_MAX_BYTES",
           "REPLAYED_KEY_PREFIX", "ChangelogRecord", "ReplayFilter", "changelog_records",
           "compact_key", "mark_owner", "parse_changelog"]

log = logging.getLogger("cdc_router.router")

Record = tuple[bytes | None, bytes | None]  # a changelog record's key and value

_OTHER_GROUPS_KEPT = 20
# A restore reads the changelog from its first record timestamped within the window, less this
# (QA 65-b F-5: it read every mark, most too old to keep). A record's timestamp is at least its
# mark's time, which the window counts from: the router stamps the mark, then produces it, and
# librdkafka stamps the record then, on the same clock (CreateTime). A topic that stamps the
# broker's clock (message.timestamp.type LogAppendTime) may stamp it earlier by as much as the
# broker's clock lags the router's: an hour of that is allowed.
CHANGELOG_CLOCK_MARGIN_MS = 3_600_000
class ReplayFilter:
    """Ids delivered within the window; a batch's ids count only once its transaction commits.

    Delivered ids are kept by batch, oldest first, one timestamp per batch: a committed batch
    takes the time of its last add_pending (the time its changelog record carries), restore()
    groups consecutive ids of one timestamp. An id delivered again (a changelog with repeated
    marks) lives until its last batch expires.
    """

    def __init__(self, *, window_ms: int, max_ids: int) -> None:
        self._window_ms = window_ms
        self._max_ids = max_ids
        self._keys: set[Key] = set()  # every delivered id
        self._batches: deque[tuple[int, list[Key]]] = deque()  # (delivered_ms, keys), oldest first
        # Keys held by more than one batch: how many of their batches may expire before them.
        self._repeats: dict[Key, int] = {}
        self._pending: dict[Key, None] = {}  # the open batch's ids, in order
        self._own = OwnBatches()  # committed since the changelog's last read (lost_commits.py)
        self._replayed: list[str] = []  # the open batch's ids dropped as replays
        # Dead-lettered ids among the known and pending ones: a replay of one is dropped, but
        # was never delivered, so its row is no cleanup's (review 32-2).
        self._dead: set[Key] = set()
        self._pending_dead: set[Key] = set()
        self._pending_ms = 0
        # seen() then add_pending() of the same id is the router's per-event path: one
        # conversion serves both.
        self._last_id = ""
        self._last_key: Key = ""
        # Ids forgotten inside the window to stay within max_ids (QA 30-c: a restore that
        # forgot thousands said so only in an INFO line's numbers).
        self.crowded_out = 0
        # A restore that stopped with max_ids ids, all marked after this (restore_slices):
        # the older marks within the window were not read, which max_ids would forget.
        self.full_since_ms: int | None = None
        self._warned = False
        # Groups other than ours whose marks restore() read (new_group_check names them).
        self.other_groups: set[str] = set()

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def max_ids(self) -> int:
        return self._max_ids

    def changelog_since_ms(self, now_ms: int) -> int | None:
        """The time a restore at `now_ms` reads the changelog's records from (see
        CHANGELOG_CLOCK_MARGIN_MS): every mark older than it is past the window. None: from
        the beginning (a window longer than the epoch; a negative time would be Kafka's
        "latest" or "earliest")."""
        since_ms = now_ms - self._window_ms - CHANGELOG_CLOCK_MARGIN_MS
        return since_ms if since_ms > 0 else None

    def _key(self, event_id: str) -> Key:
        if event_id is not self._last_id:
            self._last_key = compact_key(event_id)
            self._last_id = event_id
        return self._last_key

    def seen(self, event_id: str) -> bool:
        """True if the id was delivered, or is being delivered in the open batch (a replay,
        which commit() returns)."""
        key = self._key(event_id)
        if key in self._pending or key in self._keys:
            if key not in self._dead and key not in self._pending_dead:
                self._replayed.append(event_id)
            return True
        return False

    def dead_lettered(self, event_id: str) -> bool:
        """True if the id the filter holds came from a dead letter's mark, not a delivery."""
        key = self._key(event_id)
        return key in self._dead or key in self._pending_dead

    def delivered(self, event_id: str) -> bool:
        """True if a committed mark says the id was delivered (not dead-lettered); unlike
        seen(), counts no replay."""
        key = compact_key(event_id)
        return key in self._keys and key not in self._dead

    def add_pending(self, event_id: str, now_ms: int, *, dead_lettered: bool = False) -> None:
        key = self._key(event_id)
        self._pending[key] = None
        if dead_lettered:
            self._pending_dead.add(key)
        if now_ms > self._pending_ms:
            self._pending_ms = now_ms

    def commit(self, now_ms: int) -> list[str]:
        """The batch's transaction committed: its ids are now delivered. Returns the ids the
        batch dropped as replays, whose rows the cleanup deletes too (an id reused by a new
        row: QA 32-a saw such rows stay until the next start's sweep)."""
        replayed = self._replayed
        if self._pending:
            keys = list(self._pending)
            self._own.add(self._remember(keys, self._pending_ms) or (self._pending_ms, keys))
        self._dead |= self._pending_dead
        self.abort()
        self.expire(now_ms)
        self._warn_if_crowded()
        return replayed

    def abort(self) -> None:
        """The batch's transaction aborted: its records never became visible."""
        self._replayed = []
        self._pending_dead = set()
        self._pending.clear()
        self._pending_ms = 0

    def restore(self, entries: Iterable[tuple[str, int]], now_ms: int) -> None:
        """Remember delivered ids (from the changelog), in any order, then apply both bounds."""
        self._remember_runs(runs_of(entries))
        self.expire(now_ms)

    def restore_changelog(self, records: Iterable[Record], now_ms: int, *, group: str) -> int:
        """restore() `group`'s marks of changelog records (key, value); how many there were
        (restore_slices() of one slice)."""
        return self.restore_slices([(None, records)], now_ms, group=group)[0]

    def restore_slices(self, slices: Iterable[tuple[Callable[[], int] | None,
                                                  Iterable[Record]]],
                       now_ms: int, *, group: str) -> tuple[int, int]:
        """restore() `group`'s marks of changelog records (key, value), in slices newest first
        (router/changelog_restore.py): (unread_before, records), where every mark the changelog
        holds outside this and the newer slices is older than unread_before(), asked once the
        slice was read (None: the last slice).
        Slices are taken only while an older one could hold a mark kept: until the filter holds
        max_ids ids, all marked after unread_before (an older mark would be the first crowded
        out). How many marks there were, and how many slices were read.

        The ids this filter committed since the last read and the records lack (every mark
        committed since: kafka/changelog_reader.py catch_up) are forgotten: Kafka lost their
        commit. The marks of several changelog partitions come interleaved: they are put in
        time order before max_ids forgets the oldest, not the first read (review 45), in
        chunks of a quarter of max_ids: what a restore holds beyond the filter stays small,
        and each chunk keeps the newest max_ids of what it and the filter hold, so all of
        them do (and a slice merged after a newer one keeps what a read in order kept)."""
        unconfirmed = self._own.unconfirmed() if self._own else None
        # A later assignment reads again the marks this instance wrote since the last one:
        # an id the filter holds, marked no later than its newest batch, is not held twice
        # (review 45: the repeats cost about half again the memory of each such id). As of
        # before the restore: an id a newer slice gave may have a newer mark in an older one.
        newest = self._batches[-1][0] if self._batches else None
        restored = taken = 0
        try:
            for unread_before, records in slices:
                taken += 1
                restored += self._restore_records(records, now_ms, group, unconfirmed, newest)
                if unread_before is None:
                    break
                if self._full_since(start_ms := unread_before()):
                    self.full_since_ms = start_ms
                    break
        except BaseException:
            if unconfirmed is not None:
                self._own.keep(unconfirmed)
            raise
        if unconfirmed is not None:
            self._forget_lost(unconfirmed)
            self._own.clear()
        self._warn_if_crowded()
        return restored, taken

    def _full_since(self, start_ms: int) -> bool:
        """Whether the filter holds max_ids ids, each marked after `start_ms`."""
        return len(self._keys) >= self._max_ids and bool(self._batches) \
            and self._batches[0][0] > start_ms

    def _restore_records(self, records: Iterable[Record], now_ms: int, group: str,
                         unconfirmed: set[Key] | None, newest: int | None) -> int:
        runs: list[tuple[int, list[Key]]] = []
        dead_keys: list[Key] = []
        restored = held = 0
        dead, replayed = DEAD_LETTERED_KEY_PREFIX.encode(), REPLAYED_KEY_PREFIX.encode()
        try:
            for key, value in records:
                marks = parse_changelog(key, value, group=group)
                restored += len(marks)
                if unconfirmed:
                    unconfirmed.difference_update(compact_key(event_id) for event_id, _ in marks)
                # Not a `dlq replay` mark, which no router wrote: it keeps its id for a window
                # from then.
                if newest is not None and not (key or b"").startswith(replayed):
                    marks = [(event_id, delivered_ms) for event_id, delivered_ms in marks
                             if delivered_ms > newest or compact_key(event_id) not in self._keys]
                owner = mark_owner(key)
                if owner not in (None, group) and len(self.other_groups) < _OTHER_GROUPS_KEPT:
                    self.other_groups.add(owner)
                record_runs = runs_of(marks)
                runs += record_runs
                if key is not None and key.startswith(dead):
                    dead_keys += (known for _, keys in record_runs for known in keys)
                held += len(marks)
                if held * 4 >= self._max_ids:
                    self._restore_runs(runs, dead_keys, now_ms)
                    runs, dead_keys, held = [], [], 0
        finally:  # what a read that failed part way returned: its retry reads on after it
            self._restore_runs(runs, dead_keys, now_ms)  # (review 59-r2 F-1)
        return restored

    def _forget_lost(self, keys: set[Key]) -> None:
        """Forget ids this filter committed whose marks the changelog does not hold (every
        batch is looked at: a clock stepped back puts a later commit's anywhere)."""
        if not keys:
            return
        self._keys -= keys
        self._dead -= keys
        for _, batch in self._batches:
            if not keys.isdisjoint(batch):
                batch[:] = [key for key in batch if key not in keys]
        log.warning("event=lost_commit_ids_forgotten ids=%d hint='the dedup changelog lacks "
                    "the marks of batches this instance committed: Kafka lost their commit, "
                    "and their records, read again, are delivered again'", len(keys))

    def _restore_runs(self, runs: list[tuple[int, list[Key]]], dead_keys: list[Key],
                      now_ms: int) -> None:
        self._remember_runs(runs)
        self.expire(now_ms)
        self._dead.update(known for known in dead_keys if known in self._keys)  # still held

    def _warn_if_crowded(self) -> None:
        """One WARNING the first time max_ids, not the window, forgets ids (or a restore
        stopped at max_ids before the window's start: the older marks, unread, uncounted)."""
        unread = self.full_since_ms is not None
        if (self.crowded_out or unread) and not self._warned:
            self._warned = True
            log.warning("event=dedup_max_ids_reached max_ids=%d forgotten=%d older_unread=%s: "
                        "ids delivered within dedup.window_ms were forgotten (or left unread "
                        "by the restore) to stay within dedup.max_ids; Debezium replays of them "
                        "would be delivered again. Raise dedup.max_ids (about 120 bytes of "
                        "memory an id) or shorten dedup.window_ms", self._max_ids,
                        self.crowded_out, str(unread).lower())

    def _remember(self, keys: list[Key], delivered_ms: int) -> tuple[int, list[Key]] | None:
        """Add one timestamp's keys as the newest, joining the newest batch if it has that time."""
        self._count(keys)
        batches = self._batches
        joined = 0
        if batches and batches[-1][0] == delivered_ms:
            newest = batches[-1][1]
            joined = max(0, BATCH_MAX_IDS - len(newest))
            newest.extend(keys[:joined])
        if joined == 0 and len(keys) <= BATCH_MAX_IDS:
            batch = (delivered_ms, keys)  # no copy: a commit's batch is OwnBatches' too
            batches.append(batch)
            return batch
        for start in range(joined, len(keys), BATCH_MAX_IDS):
            batches.append((delivered_ms, keys[start:start + BATCH_MAX_IDS]))
        return None

    def _remember_runs(self, runs: list[tuple[int, list[Key]]]) -> None:
        """Add (delivered_ms, keys) runs of any order where their times put them."""
        runs.sort(key=itemgetter(0))  # stable, and linear for runs already in order
        if runs and self._batches and runs[0][0] < self._batches[-1][0]:
            for _, keys in runs:
                self._count(keys)
            if runs[-1][0] < self._batches[0][0]:  # all older (a restore's older slice)
                self._batches.extendleft(reversed(runs))
            else:
                self._batches = deque(heapq.merge(self._batches, runs, key=itemgetter(0)))
            return
        for delivered_ms, keys in runs:
            self._remember(keys, delivered_ms)

    def _count(self, keys: list[Key]) -> None:
        known, repeats = self._keys, self._repeats
        for key in keys:
            if key in known:
                repeats[key] = repeats.get(key, 0) + 1
            else:
                known.add(key)

    def expire(self, now_ms: int) -> None:
        """Forget batches older than the window, then the oldest ids beyond max_ids."""
        horizon = now_ms - self._window_ms
        self._own.trim(horizon, self._max_ids)
        batches = self._batches
        while batches:
            delivered_ms, keys = batches[0]
            if delivered_ms < horizon:
                self._forget(keys, len(keys))
                batches.popleft()
                continue
            over = len(self._keys) - self._max_ids
            if over <= 0:
                return
            held = len(self._keys)
            dropped = self._forget(keys, over)
            self.crowded_out += held - len(self._keys)
            if dropped == len(keys):
                batches.popleft()
            else:
                del keys[:dropped]

    def _forget(self, keys: list[Key], wanted: int) -> int:
        """Drop `keys` from the front until `wanted` ids are forgotten (a repeated key only
        counts at its last batch); how many keys were dropped."""
        known, repeats = self._keys, self._repeats
        forgotten = 0
        for dropped, key in enumerate(keys, 1):
            left = repeats.get(key) if repeats else None
            if left is None:
                known.discard(key)
                if self._dead:
                    self._dead.discard(key)
                forgotten += 1
                if forgotten == wanted:
                    return dropped
            elif left == 1:
                del repeats[key]
            else:
                repeats[key] = left - 1
        return len(keys)
