"""The replay filter: ids count once committed, both memory bounds, the changelog format, the
compact keys of uuids."""

from __future__ import annotations

import json
import random
import uuid
from collections import OrderedDict
from collections.abc import Iterator

import pytest

from cdc_router.kafka.reader import ReadTimedOut
from cdc_router.router.replay import (
    DEAD_LETTERED_KEY_PREFIX,
    MARK_MAX_BYTES,
    REPLAYED_KEY_PREFIX,
    ReplayFilter,
    changelog_records,
    compact_key,
    mark_owner,
    parse_changelog,
)
from tests.unit.router_fakes import FakeChangelog


def test_pending_ids_count_within_the_batch_and_only_survive_a_commit():
    replay = ReplayFilter(window_ms=60_000, max_ids=10)
    replay.add_pending("a", 1_000)
    assert replay.seen("a")
    replay.abort()
    assert not replay.seen("a")
    replay.add_pending("b", 1_000)
    replay.commit(1_000)
    assert replay.seen("b") and len(replay) == 1


def test_commit_returns_the_batchs_replays_once_and_an_abort_forgets_them():
    replay = ReplayFilter(window_ms=60_000, max_ids=10)
    replay.add_pending("a", 1_000)
    assert replay.commit(1_000) == []
    assert replay.seen("a") and not replay.seen("b")
    replay.abort()  # the batch that saw "a" again never committed
    assert replay.seen("a")
    replay.add_pending("c", 2_000)
    assert replay.seen("c")  # within its own batch
    assert replay.commit(2_000) == ["a", "c"]
    assert replay.commit(3_000) == []


def test_replays_of_dead_lettered_ids_are_not_returned_and_forgotten_with_the_window():
    replay = ReplayFilter(window_ms=60_000, max_ids=10)
    replay.add_pending("d", 1_000, dead_lettered=True)
    assert replay.seen("d")  # within its own batch
    assert replay.commit(1_000) == []
    assert replay.seen("d") and replay.commit(2_000) == []
    [mark] = changelog_records(["r"], 1_000, DEAD_LETTERED_KEY_PREFIX)
    replay.restore_changelog([(mark.key, mark.value)], 1_000, group="g")
    assert replay.seen("r") and replay.commit(2_000) == []
    replay.expire(200_000)  # the window passed: both forgotten, the dead set with them
    assert not replay.seen("d") and not replay._dead
    [old] = changelog_records(["o"], 1_000, DEAD_LETTERED_KEY_PREFIX)  # a mark the topic kept
    replay.restore_changelog([(old.key, old.value)], 200_000, group="g")  # past the window
    assert not replay.seen("o") and not replay._dead  # review 32-3
    replay.add_pending("d", 200_000)  # delivered this time
    replay.commit(200_000)
    assert replay.seen("d") and replay.commit(201_000) == ["d"]


def test_ids_older_than_the_window_are_forgotten():
    replay = ReplayFilter(window_ms=1_000, max_ids=10)
    replay.restore([("old", 0), ("new", 5_000)], now_ms=5_500)
    assert not replay.seen("old")
    assert replay.seen("new")


def test_beyond_max_ids_the_oldest_go_first():
    replay = ReplayFilter(window_ms=10**9, max_ids=3)
    replay.restore([(f"id{i}", i) for i in range(5)], now_ms=10)
    assert [replay.seen(f"id{i}") for i in range(5)] == [False, False, True, True, True]


def test_ids_max_ids_forgets_inside_the_window_are_counted_and_warned_once(caplog):
    # QA 30-c: a restore that forgot 3,397 of them said so only as an INFO line's numbers.
    replay = ReplayFilter(window_ms=10**9, max_ids=3)
    records = changelog_records([f"id{i}" for i in range(5)], 10, group="g")
    with caplog.at_level("WARNING", logger="cdc_router.router"):
        replay.restore_changelog([(r.key, r.value) for r in records], 20, group="g")
        for i in range(5, 8):
            replay.add_pending(f"id{i}", 30)
            replay.commit(30)
    assert replay.crowded_out == 5
    [warning] = [r.getMessage() for r in caplog.records]
    assert "max_ids=3 forgotten=2" in warning and "Raise dedup.max_ids" in warning


def test_ids_the_window_forgets_are_not_counted_as_crowded_out():
    replay = ReplayFilter(window_ms=1_000, max_ids=10)
    replay.restore([("old", 0), ("new", 5_000)], now_ms=5_500)
    assert replay.crowded_out == 0


def test_a_batch_of_ids_is_one_changelog_record_that_round_trips():
    ids = [f"6f1c-{i}" for i in range(1000)] + ["crème ✓"]
    [record] = changelog_records(ids, 1234)
    assert record.key.startswith(b"batch:6f1c-0#")
    # Review 2, session 26: a later batch may start with the same id; compaction must not
    # take it for the same record and drop the other ids of the first.
    assert changelog_records(ids[:1], 1235)[0].key != record.key
    assert parse_changelog(record.key, record.value) == [(i, 1234) for i in ids]
    assert changelog_records([], 1234) == []


def test_a_batch_over_mark_max_bytes_takes_several_records_each_under_it():
    ids = [f"{i:08d}-" + "x" * 40 for i in range(5000)]
    records = changelog_records(ids, 7)
    assert len(records) > 1 and all(len(r.value) <= MARK_MAX_BYTES for r in records)
    assert len({r.key for r in records}) == len(records)  # compaction keeps them all
    assert [i for r in records for i, _ in parse_changelog(r.key, r.value)] == ids
    [huge] = changelog_records(["y" * (MARK_MAX_BYTES + 1)], 7)  # one id is never split
    assert parse_changelog(huge.key, huge.value) == [("y" * (MARK_MAX_BYTES + 1), 7)]


def test_one_record_per_id_of_earlier_versions_is_read_too():
    value = json.dumps({"ts": 1234}).encode()  # what earlier versions wrote, key: the id
    assert parse_changelog(b"6f1c", value) == [("6f1c", 1234)]
    assert parse_changelog(b"\xff", value) == []


def test_changelog_garbage_is_ignored():
    [record] = changelog_records(["a"], 1)
    assert parse_changelog(None, record.value) == []
    assert parse_changelog(b"x", None) == []
    assert parse_changelog(b"x", b"{not json") == []
    assert parse_changelog(b"x", b'{"other": 1}') == []
    assert parse_changelog(b"x", b"[1]") == []
    assert parse_changelog(b"x", b'{"ts": "soon", "ids": ["a"]}') == []
    assert parse_changelog(b"x", b'{"ts": 5, "ids": ["a", 7, null]}') == [("a", 5)]


UUID = "6f1c2a4e-8b3d-4c5e-9f60-718293a4b5c6"


def test_a_canonical_uuid_is_kept_as_its_16_bytes_and_any_other_string_as_itself():
    assert compact_key(UUID) == bytes.fromhex(UUID.replace("-", ""))
    for other in (UUID.upper(), f"{{{UUID}}}", UUID.replace("-", ""), UUID[:-1] + "g",
                  UUID[:-2] + " 6", UUID[:-2] + "_6", "+" + UUID[1:], UUID[:-1] + "٦",
                  UUID.replace("-", ":"), "order-42", ""):
        assert compact_key(other) == other
    digits_only = "12345678-1234-4234-8234-123456789012"  # exact either way: kept as a str
    assert compact_key(digits_only) == digits_only


def test_a_pipeline_restores_its_own_marks_and_unnamed_ones_never_anothers():
    # Review, session 26: two pipelines on the default changelog, both with integer ids.
    ours = changelog_records(["1", "2"], 1_000, group="orders")
    theirs = changelog_records(["1", "3"], 1_000, group="billing")
    unnamed = changelog_records(["4"], 1_000)  # written before marks named their group
    assert ours[0].key != theirs[0].key  # compaction keeps both batches
    assert json.loads(ours[0].value)["group"] == "orders"
    replay = ReplayFilter(window_ms=60_000, max_ids=10)
    records = [(r.key, r.value) for r in (*ours, *theirs, *unnamed)]
    assert replay.restore_changelog(records, 1_000, group="orders") == 3
    assert [replay.seen(i) for i in ("1", "2", "3", "4")] == [True, True, False, True]
    assert parse_changelog(theirs[0].key, theirs[0].value) == [("1", 1_000), ("3", 1_000)]


def test_a_marks_key_names_its_group_whatever_the_group_holds():
    for group in ("orders", "a:b", "x#1", "dé", ""):
        for prefix in ("batch:", REPLAYED_KEY_PREFIX, DEAD_LETTERED_KEY_PREFIX):
            record = changelog_records(["1:2", "3"], 1_000, prefix, group=group)[0]
            assert mark_owner(record.key) == (group or None)  # no router has an empty group
    assert mark_owner(changelog_records(["1"], 1_000)[0].key) is None  # no group (earlier)
    for key in (None, b"", b"some-id", b"batch:x:g:1", b"batch:9:g:1#a", b"\xff\xfe",
                "batch:²:g:1".encode(), b"batch:" + b"9" * 5000 + b":g:1"):
        assert mark_owner(key) is None


def test_restore_collects_the_other_groups_whose_marks_share_the_changelog():
    ours = changelog_records(["9"], 1_000, group="orders")
    theirs = changelog_records(["1", "2"], 1_000, group="orders-old")
    unnamed = changelog_records(["3"], 1_000)
    replay = ReplayFilter(window_ms=60_000, max_ids=10)
    records = [(r.key, r.value) for r in (*ours, *theirs, *unnamed)]
    assert replay.restore_changelog(records, 1_000, group="orders") == 2
    assert replay.other_groups == {"orders-old"}


def test_another_spelling_of_a_uuid_is_another_id():
    replay = ReplayFilter(window_ms=60_000, max_ids=10)
    replay.restore([(UUID, 1_000)], now_ms=1_000)
    assert replay.seen(UUID)
    assert not replay.seen(UUID.upper()) and not replay.seen(f"{{{UUID}}}")
    replay.add_pending(UUID.upper(), 1_000)
    assert replay.seen(UUID.upper()) and not replay.seen(f"{{{UUID}}}")
    replay.commit(1_000)
    assert len(replay) == 2


def test_batches_expire_oldest_first_each_at_the_time_of_its_last_id():
    replay = ReplayFilter(window_ms=100, max_ids=100)
    for delivered_ms, event_id in [(0, "a"), (50, "b"), (60, "c")]:
        replay.add_pending(event_id, delivered_ms)
        replay.add_pending(f"{event_id}2", delivered_ms - 40)  # the batch keeps its latest
        replay.commit(delivered_ms)
    replay.expire(now_ms=120)  # horizon 20: the batch of 0 goes, the batch of 50 stays
    assert [replay.seen(i) for i in ("a", "a2", "b", "b2", "c", "c2")] == [
        False, False, True, True, True, True]
    replay.expire(now_ms=155)
    assert [replay.seen(i) for i in ("b", "b2", "c", "c2")] == [False, False, True, True]
    assert len(replay) == 2


def test_max_ids_trims_the_oldest_batch_partly():
    replay = ReplayFilter(window_ms=10**9, max_ids=6)
    for batch in range(3):
        replay.restore([(f"{batch}-{i}", batch) for i in range(4)], now_ms=10)
    assert len(replay) == 6
    assert [replay.seen(f"1-{i}") for i in range(4)] == [False, False, True, True]
    assert all(replay.seen(f"2-{i}") for i in range(4)) and not replay.seen("0-3")
    replay.add_pending("new", 10)
    replay.commit(10)
    assert not replay.seen("1-2") and replay.seen("1-3") and replay.seen("new")


def test_ids_of_an_aborted_batch_are_forgotten_and_never_committed_later():
    replay = ReplayFilter(window_ms=60_000, max_ids=10)
    replay.add_pending(UUID, 1_000)
    replay.add_pending("x", 1_000)
    replay.abort()
    replay.add_pending("y", 2_000)
    replay.commit(2_000)
    assert not replay.seen(UUID) and not replay.seen("x") and replay.seen("y")
    assert len(replay) == 1
    replay.commit(2_000)  # an empty batch remembers nothing
    assert len(replay) == 1


def test_restore_reads_both_changelog_formats_and_an_id_marked_twice_lives_to_its_last_mark():
    old = [(UUID.encode(), json.dumps({"ts": 1_000}).encode()),
           (b"order-1", json.dumps({"ts": 1_000}).encode())]
    new = [(r.key, r.value) for r in changelog_records(["b", UUID], 5_000)]
    replay = ReplayFilter(window_ms=3_000, max_ids=10)
    for key, value in old + new:
        replay.restore(parse_changelog(key, value), now_ms=5_000)
    assert [replay.seen(i) for i in (UUID, "order-1", "b")] == [True, False, True]
    assert len(replay) == 2
    replay.expire(now_ms=8_001)
    assert len(replay) == 0 and not replay.seen(UUID)


class Reference:
    """The filter as it was (an ordered dict of id -> time), with a commit's ids at the time of
    the batch's last add_pending: what the compact filter must answer."""

    def __init__(self, window_ms: int, max_ids: int) -> None:
        self.window_ms, self.max_ids = window_ms, max_ids
        self.delivered: OrderedDict[str, int] = OrderedDict()
        self.pending: dict[str, int] = {}

    def seen(self, event_id: str) -> bool:
        return event_id in self.pending or event_id in self.delivered

    def commit(self, now_ms: int) -> None:
        latest = max(self.pending.values(), default=0)
        self.restore([(i, latest) for i in self.pending], now_ms)
        self.pending.clear()

    def restore(self, entries: list[tuple[str, int]], now_ms: int) -> None:
        for event_id, delivered_ms in entries:
            self.delivered[event_id] = delivered_ms
            self.delivered.move_to_end(event_id)
        horizon = now_ms - self.window_ms
        while self.delivered:
            oldest_id, oldest_ms = next(iter(self.delivered.items()))
            if oldest_ms >= horizon and len(self.delivered) <= self.max_ids:
                break
            del self.delivered[oldest_id]


def test_the_compact_filter_answers_as_the_ordered_dict_did():
    rng = random.Random(14)
    uuids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(40)]
    pool = uuids + [u.upper() for u in uuids[:10]] + [f"{{{u}}}" for u in uuids[:5]] + \
        [f"order-{i}" for i in range(20)]
    compact, reference = ReplayFilter(window_ms=500, max_ids=25), Reference(500, 25)
    now = 0
    for _ in range(3000):
        now += rng.randint(0, 30)  # the clock never goes back
        operation = rng.random()
        if operation < 0.5:
            event_id = rng.choice(pool)
            if not compact.seen(event_id):
                compact.add_pending(event_id, now)
                reference.pending[event_id] = now
        elif operation < 0.6:
            compact.commit(now)
            reference.commit(now)
        elif operation < 0.65:
            compact.abort()
            reference.pending.clear()
        elif operation < 0.75:
            entries = [(rng.choice(pool), now) for _ in range(rng.randint(1, 8))]
            compact.restore(entries, now)
            reference.restore(entries, now)
        else:
            compact.expire(now)
            reference.restore([], now)
        assert [compact.seen(i) for i in pool] == [reference.seen(i) for i in pool]
        assert len(compact) == len(reference.delivered)


def _marks(ids: list[str], delivered_ms: int) -> list[tuple[bytes, bytes]]:
    return [(mark.key, mark.value) for mark in changelog_records(ids, delivered_ms, group="g")]


@pytest.mark.parametrize("max_ids", [4, 1])  # 1: the restore goes in chunks of one record
def test_max_ids_forgets_the_oldest_marks_whatever_order_partitions_are_read_in(
        max_ids: int) -> None:
    # Review 45: the marks of two changelog partitions come interleaved, and max_ids forgot
    # the first read, here the newest, which are the ids Debezium is likeliest to replay.
    now = 10_000_000
    replay = ReplayFilter(window_ms=3_600_000, max_ids=max_ids)
    replay.restore_changelog([*_marks(["recent-1"], now - 1_000),
                              *_marks(["old-1", "old-2", "old-3"], now - 3_000_000),
                              *_marks(["recent-2"], now - 500)], now, group="g")
    assert len(replay) == max_ids
    assert replay.seen("recent-2")
    assert replay.seen("recent-1") == (max_ids > 1)
    assert not replay.seen("old-1")


def test_marks_older_than_the_filters_newest_are_put_in_time_order() -> None:
    now = 10_000_000
    replay = ReplayFilter(window_ms=3_600_000, max_ids=3)
    replay.restore_changelog(_marks(["new-1", "new-2"], now - 1_000), now, group="g")
    # A later assignment reads another partition's older marks: they go first when max_ids
    # forgets, and the window forgets them in their turn, not behind the newer ones.
    replay.restore_changelog(_marks(["old-1", "old-2"], now - 3_000_000), now, group="g")
    assert [replay.seen(event_id) for event_id in ("new-1", "new-2", "old-2")] == [True] * 3
    assert not replay.seen("old-1")
    replay.expire(now - 3_000_000 + 3_600_001)
    assert [replay.seen(event_id) for event_id in ("new-1", "new-2", "old-2")] == \
        [True, True, False]


def test_own_marks_read_back_at_the_next_assignment_are_not_held_twice() -> None:
    # Review 45: each own id got a repeat entry and a second place in a batch.
    now = 10_000_000
    replay = ReplayFilter(window_ms=3_600_000, max_ids=1_000_000)
    ids = [str(uuid.UUID(int=n)) for n in range(1000)]
    for event_id in ids:
        replay.add_pending(event_id, now)
    replay.commit(now)
    replay.restore_changelog([*_marks(ids, now), *_marks(["other"], now + 5)], now + 10,
                             group="g")
    assert len(replay) == 1001 and replay.seen("other")
    assert replay._repeats == {}
    assert sum(len(keys) for _, keys in replay._batches) == 1001


@pytest.mark.parametrize("restarted", [False, True])
def test_a_dlq_replay_mark_keeps_its_id_for_a_window_from_then(restarted: bool) -> None:
    # Review 45-2: the skip of own marks read back also dropped the `replayed:` mark of a
    # dead-lettered id at the next rebalance, which forgot the id a window after its letter.
    start = 10_000_000
    replay = ReplayFilter(window_ms=3_600_000, max_ids=1_000_000)
    replay.add_pending("x", start, dead_lettered=True)
    replay.commit(start)
    replay.add_pending("y", start + 500_000)
    replay.commit(start + 500_000)
    if restarted:
        replay = ReplayFilter(window_ms=3_600_000, max_ids=1_000_000)
    marks = [(mark.key, mark.value) for mark in [
        *changelog_records(["x"], start, DEAD_LETTERED_KEY_PREFIX, group="g"),
        *changelog_records(["x"], start + 300_000, REPLAYED_KEY_PREFIX, group="g"),
        *changelog_records(["y"], start + 500_000, group="g")]]
    assert replay.restore_changelog(marks, start + 600_000, group="g") == 3  # skipped too
    replay.expire(start + 3_600_000 + 100_000)  # past the letter's window, not the replay's
    assert replay.seen("x")


def test_a_read_forgets_the_own_commits_whose_marks_it_lacks_and_keeps_the_rest() -> None:
    # Chaos 58 (CI rehearsal, chaos-short seed 15): Kafka 4.3, kill -9'd right after it
    # acknowledged a commit, completed that transaction without its markers, and a later
    # abort took it. The router held the batch's 283 ids from its commit; read again from the
    # old offset, its records were dropped as replays: lost. A read of the changelog, which
    # returns the marks committed since the last (kafka/reader.py), confirms this instance's
    # commits: the ids it lacks are forgotten, and only those (review 59-r F-1: forgetting
    # every id held kept only the marks since the last read).
    replay = ReplayFilter(window_ms=60_000, max_ids=1_000)
    replay.restore_changelog(_marks(["old-1", "old-2"], 1_000), 1_000, group="g")
    for event_id in ("kept-1", "kept-2"):
        replay.add_pending(event_id, 2_000)
    replay.commit(2_000)  # committed, and its marks are in the next read
    for event_id in ("lost-1", "lost-2"):
        replay.add_pending(event_id, 3_000)
    replay.commit(3_000)  # its commit returned; Kafka lost it later
    replay.add_pending("dead-1", 3_500, dead_lettered=True)
    replay.commit(3_500)  # a dead letter's mark, confirmed by the read too
    dead = changelog_records(["dead-1"], 3_500, DEAD_LETTERED_KEY_PREFIX, group="g")
    since = [*_marks(["kept-1", "kept-2"], 2_000), *((r.key, r.value) for r in dead)]
    assert replay.restore_changelog(since, 4_000, group="g") == 3
    assert all(replay.seen(i) for i in ("old-1", "old-2", "kept-1", "kept-2", "dead-1"))
    assert replay.dead_lettered("dead-1")
    assert not replay.seen("lost-1") and not replay.seen("lost-2") and len(replay) == 5
    # Read, the own commits are confirmed: a later read that returns nothing forgets none.
    replay.restore_changelog([], 5_000, group="g")
    assert len(replay) == 5
    # A lost id delivered again is held again, and expires with its new batch only.
    replay.add_pending("lost-1", 6_000)
    replay.commit(6_000)
    replay.expire(3_000 + 60_001)
    assert replay.seen("lost-1")


def test_a_read_that_fails_part_way_keeps_what_it_did_not_confirm() -> None:
    replay = ReplayFilter(window_ms=60_000, max_ids=1_000)
    for event_id in ("a", "b"):
        replay.add_pending(event_id, 1_000)
    replay.commit(1_000)

    def broken() -> Iterator[tuple[bytes | None, bytes | None]]:
        yield from _marks(["a"], 1_000)
        yield from [(r.key, r.value) for r in changelog_records(["other"], 900, group="g")]
        raise ReadTimedOut("the changelog was not read to its end")

    with pytest.raises(ReadTimedOut):
        replay.restore_changelog(broken(), 2_000, group="g")
    assert replay.seen("a") and replay.seen("b")
    assert replay.seen("other")  # review 59-r2 F-1: the marks read before the failure count
    replay.restore_changelog([], 3_000, group="g")  # the read goes on after "a"'s mark
    assert replay.seen("a") and not replay.seen("b") and replay.seen("other")


def test_a_lost_batch_bigger_than_max_ids_is_forgotten_whole() -> None:
    # Review 59-r2 F-2: the own ids were trimmed by whole batches beyond max_ids, and the
    # filter's max_ids newest of a lost batch stayed: dropped as replays when read again.
    replay = ReplayFilter(window_ms=60_000, max_ids=3)
    for n in range(5):
        replay.add_pending(f"a{n}", 1_000)
    replay.commit(1_000)
    assert len(replay) == 3
    replay.restore_changelog([], 2_000, group="g")
    assert len(replay) == 0


def test_a_lost_commit_after_the_clock_stepped_back_is_forgotten_from_every_batch() -> None:
    # Review 59-r2 F-3: the search stopped at the first batch older than the oldest own one.
    replay = ReplayFilter(window_ms=60_000, max_ids=1_000)
    replay.add_pending("lost-1", 5_000)
    replay.commit(5_000)
    replay.add_pending("lost-2", 4_000)  # the clock stepped back
    replay.commit(4_000)
    replay.restore_changelog([], 6_000, group="g")  # both commits lost
    assert not replay.seen("lost-1") and not replay.seen("lost-2")
    replay.add_pending("lost-2", 7_000)  # delivered again: held until its new batch expires
    replay.commit(7_000)
    replay.expire(5_000 + 60_001)
    assert replay.seen("lost-2")


def test_an_assignment_forgets_an_own_commit_the_changelog_lacks(
        caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import time

    from confluent_kafka import TopicPartition

    from cdc_router.config.model import RouterConfig
    from cdc_router.router.assignment import restore_assigned
    from cdc_router.router.clients import Timeouts
    from cdc_router.router.lost_commits import CommitLedger

    config = RouterConfig.model_validate({"source": {"topics": ["raw"], "group_id": "g"},
                                          "routes": [{"topic": "o"}]})
    now_ms = int(time.time() * 1000)
    kept = changelog_records(["kept"], now_ms - 1_000, group="g")

    class Consumer:
        def committed(self, partitions: list[TopicPartition], timeout: float
                      ) -> list[TopicPartition]:
            return [TopicPartition("raw", 0, 1446)]

        def get_watermark_offsets(self, partition: TopicPartition, **_: object
                                  ) -> tuple[int, int]:
            return 0, 2_000

    class Changelog(FakeChangelog):
        def __init__(self) -> None:
            pass

        def catch_up(self, *, since_ms: int | None = None,
                     ) -> list[tuple[bytes | None, bytes | None]]:
            return [(r.key, r.value) for r in kept]

    replay = ReplayFilter(window_ms=7 * 24 * 3600 * 1000, max_ids=1_000)
    replay.add_pending("lost", now_ms)
    replay.commit(now_ms)  # a commit Kafka lost later
    ledger = CommitLedger()
    ledger.committed({("raw", 0): 1_731})  # the lost commit's offsets
    with caplog.at_level(logging.INFO, logger="cdc_router.router"):
        restore_assigned(Consumer(), [TopicPartition("raw", 0)], config=config, replay=replay,
                         changelog=Changelog(), timeouts=Timeouts(60_000), clock=lambda: 0.0,
                         ledger=ledger)
    assert replay.seen("kept") and not replay.seen("lost")
    # The loss first, then what the read forgot (review 59-r2 F-6), once.
    said = caplog.text
    assert "event=commit_lost partitions=['raw[0] committed 1446, this instance 1731']" in said
    assert said.index("event=commit_lost") < said.index("event=lost_commit_ids_forgotten ids=1")
    assert ledger.behind([TopicPartition("raw", 0, 1446)]) == []


def test_a_lost_batch_max_ids_shortened_is_still_forgotten_after_a_later_commit() -> None:
    # Reread 59 F-1: max_ids shortens the filter's list of a batch in place, the list
    # OwnBatches shares; its count, still the batch's first length, dropped the lost batch at
    # the next commit, and the ids the filter held of it stayed.
    replay = ReplayFilter(window_ms=10**9, max_ids=5)
    for n in range(8):
        replay.add_pending(f"L{n}", 1_000)
    replay.commit(1_000)  # lost
    for n in range(2):
        replay.add_pending(f"M{n}", 2_000)
    replay.commit(2_000)
    replay.restore_changelog(_marks(["M0", "M1"], 2_000), 3_000, group="g")
    assert [n for n in range(8) if replay.delivered(f"L{n}")] == []
    assert replay.delivered("M0") and replay.delivered("M1")
