"""The replay filter: ids count once committed, both memory bounds, the changelog format."""

from __future__ import annotations

import json

from cdc_router.router.replay import ReplayFilter, changelog_record, parse_changelog


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


def test_changelog_records_round_trip_and_garbage_is_ignored():
    record = changelog_record("6f1c", 1234)
    assert record.value == json.dumps({"ts": 1234}).encode()  # what earlier versions wrote
    assert parse_changelog(record.key, record.value) == ("6f1c", 1234)
    assert parse_changelog(None, record.value) is None
    assert parse_changelog(b"x", None) is None
    assert parse_changelog(b"x", b"{not json") is None
    assert parse_changelog(b"x", b'{"other": 1}') is None
    assert parse_changelog(b"\xff", record.value) is None
