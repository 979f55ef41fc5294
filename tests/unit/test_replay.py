"""The replay filter: ids count once committed, both memory bounds, the changelog format."""

from __future__ import annotations

import json

from cdc_router.router.replay import (
    MARK_MAX_BYTES,
    ReplayFilter,
    changelog_records,
    parse_changelog,
)


def test_pending_ids_count_within_the_batch_and_only_survive_a_commit():
    replay = ReplayFilter(window_ms=60_000, max_ids=10)
    replay.add_pending("a", 1_000)
    assert replay.seen("a")
    replay.abort()
    assert not replay.seen("a")
    replay.add_pending("b", 1_000)
    replay.commit(1_000)
    assert replay.seen("b") and len(replay) == 1


def test_ids_older_than_the_window_are_forgotten():
    replay = ReplayFilter(window_ms=1_000, max_ids=10)
    replay.restore([("old", 0), ("new", 5_000)], now_ms=5_500)
    assert not replay.seen("old")
    assert replay.seen("new")


def test_beyond_max_ids_the_oldest_go_first():
    replay = ReplayFilter(window_ms=10**9, max_ids=3)
    replay.restore([(f"id{i}", i) for i in range(5)], now_ms=10)
    assert [replay.seen(f"id{i}") for i in range(5)] == [False, False, True, True, True]


def test_a_batch_of_ids_is_one_changelog_record_that_round_trips():
    ids = [f"6f1c-{i}" for i in range(1000)] + ["crème ✓"]
    [record] = changelog_records(ids, 1234)
    assert record.key == b"batch:6f1c-0"
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
