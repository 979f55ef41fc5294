"""Which event ids a pipeline delivered, from the dedup changelog and the dead-letter topic, and
how many of its letters are not delivered: for `cdc-router dlq replay` (router/dlq_letters.py
plans it) and `status`. Values in, values out.

Delivered ids. The router marks in the dedup changelog every id it delivers and also every id
it dead-letters past stage decode (dead_letter.marks_delivery: so that a replay of it by
Debezium is not dead-lettered twice). The marks of dead letters are keyed `dead:`
(DEAD_LETTERED_KEY_PREFIX) and are no delivery. An id counts as delivered when
- a replay delivered it: the key of its mark starts with REPLAYED_KEY_PREFIX, or
- it has more `batch:` marks than it has dead letters of versions before the `dead:` key (those
  marked their letters with `batch:`; their letters name no dlq.source.group, which came
  after; a letter without a group whose id has a `dead:` mark is of the versions between, and
  took no `batch:` mark): the others are deliveries (the router delivered it after its replay
  filter forgot it, or its row, dead-lettered at decode, came back fixed). A letter of a later
  version takes no mark away: its `dead:` mark may have left the changelog (its retention)
  while the letter stays, and the id's `batch:` mark is then a delivery all the same (review
  43).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping

from cdc_router.dead_letter import marks_delivery
from cdc_router.router.dlq_letters import Letter, OursTest, of_this_pipeline
from cdc_router.router.replay import (
    DEAD_LETTERED_KEY_PREFIX,
    REPLAYED_KEY_PREFIX,
    parse_changelog,
)


def delivered_ids(marks: Iterable[tuple[bytes | None, bytes | None]],
                  letters: Iterable[Letter], *, group: str) -> dict[str, int]:
    """Event id -> delivered ms of every id `group` delivered, from the changelog's records and
    every letter of the dead-letter topic (see the module doc)."""
    counts: Counter[str] = Counter()
    dead_marks: Counter[str] = Counter()
    latest: dict[str, int] = {}
    replayed: set[str] = set()
    by_replay_prefix, dead_prefix = REPLAYED_KEY_PREFIX.encode(), DEAD_LETTERED_KEY_PREFIX.encode()
    for key, value in marks:
        if key is not None and key.startswith(dead_prefix):
            dead_marks.update(event_id for event_id, _ in parse_changelog(key, value,
                                                                          group=group))
            continue
        by_replay = key is not None and key.startswith(by_replay_prefix)
        for event_id, delivered_ms in parse_changelog(key, value, group=group):
            counts[event_id] += 1
            latest[event_id] = max(latest.get(event_id, delivered_ms), delivered_ms)
            if by_replay:
                replayed.add(event_id)
    ungrouped = Counter(letter.event_id for letter in letters
                        if letter.event_id and letter.from_router and
                        letter.source_group is None and letter.replay_of is None and
                        marks_delivery(letter.stage))
    # A letter without a group whose mark is still there as dead: is of the versions between
    # the two (review 43-2): it took no batch: mark either.
    return {event_id: latest[event_id] for event_id, count in counts.items()
            if event_id in replayed or
            count > max(0, ungrouped[event_id] - dead_marks[event_id])}


def undelivered(letters: Iterable[Letter], delivered: Collection[str],
                settled: Collection[tuple[int, int]], ours: OursTest,
                previous: Mapping[int, tuple[int, int | None]],
                done_now: Collection[tuple[int, int]] = ()) -> dict[int, int]:
    """Partition -> this pipeline's letters, as `status` tells them (dead_letter.of_pipeline:
    one naming no source is ours), not delivered: their id none of `delivered`, and not
    `settled` (superseded by a newer letter, or skipped by the rules). Counted by a complete
    `dlq replay` for `status` (QA 52-b M1). Before `previous` (partition -> the offset the
    last complete replay committed, and its count), no more than that count: a mark older
    than dedup.window_ms has left the changelog, and its letter would count again (a
    delivery, once true, stays true), less the letters there this replay did (`done_now`)."""
    below: Counter[int] = Counter()
    after: Counter[int] = Counter()
    for letter in letters:
        if not of_this_pipeline(letter, ours) or (letter.partition, letter.offset) in settled \
                or (letter.event_id is not None and letter.event_id in delivered):
            continue
        position, _ = previous.get(letter.partition, (-1, None))
        (below if letter.offset < position else after)[letter.partition] += 1
    done = Counter(p for p, offset in done_now if offset < previous.get(p, (-1, None))[0])
    counted = {p: max(0, count - done[p]) for p, (_, count) in previous.items()
               if count is not None}
    return {p: min(below[p], counted.get(p, below[p])) + after[p] for p in {*below, *after}}
