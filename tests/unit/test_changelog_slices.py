"""The changelog restore reads newest slices first and stops once no older mark could be kept
(review 66 F-2): it keeps exactly what a read of the whole window kept, reading less."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message, TopicPartition

from cdc_router.config.model import RouterConfig
from cdc_router.kafka import changelog_reader as changelog_module
from cdc_router.kafka import reader as reader_module
from cdc_router.kafka.changelog_reader import ChangelogReader
from cdc_router.relay.start import restore_filter
from cdc_router.router.assignment import restore_assigned
from cdc_router.router.changelog_restore import FIRST_SLICE_MS, _growth, restore_newest
from cdc_router.router.clients import Timeouts
from cdc_router.router.marks import parse_changelog
from cdc_router.router.replay import (
    DEAD_LETTERED_KEY_PREFIX,
    REPLAYED_KEY_PREFIX,
    ReplayFilter,
    changelog_records,
)
from tests.unit.test_changelog_since import Timed

HOUR_MS = 3_600_000
WEEK_MS = 7 * 24 * HOUR_MS
NOW_MS = 1_800_000_000_000
GROUPS = ("g", "other", "third")
Records = dict[int, list[tuple[int, bytes, bytes]]]
# The slices down to the default window's start (and the clock margin) while max_ids is far:
# 5 min, 40, 320, 2,560, then the window's start (10,140).
SLICES = 5


def _changelog(seed: int, *, records: int, partitions: int = 3, span_ms: int = 14 * HOUR_MS,
               tied: bool = False) -> tuple[Records, list[str]]:
    """`records` marks of 1-12 ids over the last `span_ms` (and a few older than the window),
    of three groups (other groups' ids overlap ours), some ids marked again later, some
    dead-lettered or `dlq replay`ed; each partition in offset order as several producers
    write it: record times out of order by up to 3 s, each at or after its mark's time.
    `tied`: mark times on whole seconds, many shared."""
    rng = random.Random(seed)
    marks: list[tuple[int, int, bytes, bytes]] = []  # (partition, record time, key, value)
    ids: list[str] = []
    step = 1000 if tied else 1
    for n in range(records):
        mark_ms = NOW_MS - rng.randrange(0, span_ms // step) * step
        if n % 97 == 0:
            mark_ms = NOW_MS - WEEK_MS - rng.randrange(0, 2 * HOUR_MS)  # past the window
        batch = []
        for _ in range(rng.randint(1, 12)):
            if ids and rng.random() < 0.1:
                batch.append(rng.choice(ids))  # marked again
            else:
                ids.append(f"id-{len(ids)}")
                batch.append(ids[-1])
        group = rng.choice(GROUPS) if rng.random() < 0.4 else "g"
        prefix = rng.choice(["batch:"] * 8 + [DEAD_LETTERED_KEY_PREFIX, REPLAYED_KEY_PREFIX])
        [record] = changelog_records(sorted(set(batch)), mark_ms, prefix, group=group)
        marks.append((rng.randrange(partitions), mark_ms + rng.randrange(0, 3_000),
                      record.key, record.value))
    by_partition: Records = {p: [] for p in range(partitions)}
    # Appended roughly in time order, shuffled within a few seconds.
    for partition, stamp, key, value in sorted(marks, key=lambda m: m[1] + rng.randrange(3_000)):
        by_partition[partition].append((stamp, key, value))
    return by_partition, ids


def _reader(monkeypatch: pytest.MonkeyPatch, records: Records,
            fake: type[Timed] = Timed) -> tuple[ChangelogReader, Any]:
    """A ChangelogReader of `records`; and its consumers (each with its own positions)."""
    made: list[Timed] = []

    def consumer(config: dict[str, Any]) -> Timed:
        made.append(fake(records))
        return made[-1]

    monkeypatch.setattr(reader_module, "Consumer", consumer)
    monkeypatch.setattr(changelog_module, "Consumer", consumer)
    monkeypatch.setattr(reader_module, "log_end_offsets",
                        lambda admin, topic, parts, end: dict.fromkeys(parts, 0))
    return ChangelogReader({"bootstrap.servers": "k:9092"}, "cl"), made


def _held(replay: ReplayFilter, ids: list[str]) -> tuple[set[str], set[str]]:
    return ({i for i in ids if replay.delivered(i)}, {i for i in ids if replay.dead_lettered(i)})


def _marks(records: Records) -> list[tuple[str, int, bytes]]:
    """(id, mark time, key) of every mark of group g."""
    return [(event_id, mark_ms, key) for stored in records.values() for _, key, value in stored
            for event_id, mark_ms in parse_changelog(key, value, group="g")]


def _oldest_held(records: Records, held: set[str]) -> int:
    newest: dict[str, int] = {}
    for event_id, mark_ms, _ in _marks(records):
        newest[event_id] = max(newest.get(event_id, 0), mark_ms)
    return min(newest[event_id] for event_id in held)


def _dead_marks(records: Records, event_id: str) -> int:
    """The newest time `event_id` was marked dead-lettered."""
    return max(mark_ms for marked, mark_ms, key in _marks(records)
               if marked == event_id and key.startswith(DEAD_LETTERED_KEY_PREFIX.encode()))


def _forward(monkeypatch: pytest.MonkeyPatch, records: Records, max_ids: int,
             ) -> tuple[ReplayFilter, int]:
    replay = ReplayFilter(window_ms=WEEK_MS, max_ids=max_ids)
    reader, _ = _reader(monkeypatch, records)
    restored = replay.restore_changelog(
        reader.catch_up(since_ms=replay.changelog_since_ms(NOW_MS)), NOW_MS, group="g")
    return replay, restored


def _sliced(monkeypatch: pytest.MonkeyPatch, records: Records, max_ids: int,
            ) -> tuple[ReplayFilter, int, int, ChangelogReader]:
    replay = ReplayFilter(window_ms=WEEK_MS, max_ids=max_ids)
    reader, _ = _reader(monkeypatch, records)
    restored, slices = restore_newest(replay, reader, NOW_MS, group="g")
    return replay, restored, slices, reader


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("max_ids", [300, 2_000, 1_000_000])
def test_the_sliced_restore_keeps_every_id_the_whole_windows_read_kept(
        monkeypatch: pytest.MonkeyPatch, seed: int, max_ids: int) -> None:
    records, ids = _changelog(seed, records=3_000)
    forward, forward_read = _forward(monkeypatch, records, max_ids)
    sliced, sliced_read, slices, _ = _sliced(monkeypatch, records, max_ids)
    (delivered, dead), (delivered_before, dead_before) = _held(sliced, ids), _held(forward, ids)
    assert delivered | dead == delivered_before | dead_before  # the same ids held
    assert len(sliced) == len(forward)
    # An id's dead-letter mark counts while the id is held (review 32-2), so the read in
    # order says "dead" of an id whose dead mark it read before max_ids crowded that mark out
    # and a later delivery's mark came: a mark older than every id held, which the sliced
    # read never reads. Only such ids differ (a delivery after a dead letter the filter
    # still held would have dropped as a replay: no such mark is written).
    cut = _oldest_held(records, delivered | dead)
    assert dead <= dead_before and all(
        _dead_marks(records, event_id) < cut for event_id in dead_before - dead)
    if max_ids == 1_000_000:
        # max_ids does not bite: every slice down to the window's start, the same marks.
        assert (delivered, dead) == (delivered_before, dead_before)
        assert sliced_read == forward_read and slices == SLICES
        assert sliced.full_since_ms is None
    else:  # it bites: fewer marks read (about 3 in 4 are ours, about 6.5 ids a record)
        assert len(forward) == max_ids and sliced_read < forward_read
        assert slices < SLICES and sliced.full_since_ms is not None


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_marks_of_one_second_shared_across_slices_differ_at_most_at_the_cut(
        monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    # Marks that share the millisecond where max_ids cuts are kept in the order read, by
    # either read (partitions come interleaved in any order): only those may differ.
    records, ids = _changelog(seed, records=3_000, tied=True)
    forward, _ = _forward(monkeypatch, records, 1_000)
    sliced, _, _, _ = _sliced(monkeypatch, records, 1_000)
    newest: dict[str, int] = {}
    for event_id, mark_ms, _ in _marks(records):
        newest[event_id] = max(newest.get(event_id, 0), mark_ms)
    cut = _oldest_held(records, {i for i in ids if forward.seen(i)})
    kept_forward = {i for i in ids if forward.seen(i) and newest[i] > cut}
    kept_sliced = {i for i in ids if sliced.seen(i) and newest[i] > cut}
    assert kept_sliced == kept_forward and len(sliced) == len(forward) == 1_000


def test_slices_grow_from_the_newest_minutes_down_to_the_windows_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    records, _ = _changelog(11, records=200, partitions=1)
    reader, made = _reader(monkeypatch, records)
    asked: list[int] = []
    original = reader.older

    def older(since_ms: int, timeout_s: float | None = None) -> Any:
        asked.append(since_ms)
        return original(since_ms, timeout_s)

    monkeypatch.setattr(reader, "older", older)
    replay = ReplayFilter(window_ms=WEEK_MS, max_ids=1_000_000)
    restored, slices = restore_newest(replay, reader, NOW_MS, group="g")
    since = replay.changelog_since_ms(NOW_MS)
    assert since is not None
    assert asked == [max(NOW_MS - FIRST_SLICE_MS * 8 ** k, since) for k in range(1, SLICES)]
    assert asked[-1] == since and slices == SLICES and restored == _forward(
        monkeypatch, records, 1_000_000)[1]
    # One consumer for the reads to the end, one a slice below it, each closed after.
    assert len(made) == SLICES and all(consumer.closed.is_set() for consumer in made[1:])
    # A later read goes on from the ends: one slice, nothing older.
    assert restore_newest(replay, reader, NOW_MS, group="g") == (0, 1)


def test_the_assigned_line_says_the_marks_and_slices_read(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # The bound: 20,000 marks of 10 ids a second over the last 2,000 s, max_ids 1,000: the
    # newest 100 s hold them, and the restore reads the first slices (5 and 10 min) only.
    records: Records = {0: []}
    for n in range(2_000):
        [record] = changelog_records([f"{n}-{k}" for k in range(10)], NOW_MS - n * 1000,
                                     group="g")
        records[0].insert(0, (NOW_MS - n * 1000 + 5, record.key, record.value))
    reader, _ = _reader(monkeypatch, records)
    config = RouterConfig.model_validate({"source": {"topics": ["raw"], "group_id": "g"},
                                          "routes": [{"topic": "o"}],
                                          "dedup": {"max_ids": 1_000}})

    class Consumer:
        def committed(self, partitions: list[TopicPartition],
                      timeout: float) -> list[TopicPartition]:
            return [TopicPartition("raw", 0, 5)]

        def get_watermark_offsets(self, partition: TopicPartition,
                                  **_: object) -> tuple[int, int]:
            return 0, 10

    monkeypatch.setattr("time.time", lambda: NOW_MS / 1000)
    replay = ReplayFilter(window_ms=WEEK_MS, max_ids=1_000)
    with caplog.at_level(logging.INFO, logger="cdc_router.router"):
        restore_assigned(Consumer(), [TopicPartition("raw", 0)], config=config, replay=replay,
                         changelog=reader, timeouts=Timeouts(60_000), clock=lambda: 0.0)
    [line] = [r.getMessage() for r in caplog.records if "event=assigned" in r.getMessage()]
    # 5 minutes: 301 records, 3,010 marks, the filter full of the newest 1,000 at once.
    assert "dedup_ids=1000 restored=3010 slices=1 " in line, line
    assert all(replay.seen(f"{n}-{k}") for n in range(100) for k in range(10))
    assert not replay.seen("100-0")
    assert "event=dedup_max_ids_reached max_ids=1000 forgotten=2010 older_unread=true" \
        in caplog.text


def test_the_relays_restore_reads_newest_slices_first_and_holds_the_newest_max_ids(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 67 L-2: the relay went the sliced way only when its `records` was topic_records
    # (an identity test), so its unit tests ran the read from the window's start. Through its
    # changelog seam, with the default reader on fake consumers: 20,000 marks of 10 ids a
    # second over the last 2,000 s, max_ids 1,000; the newest 5 minutes hold them.
    records: Records = {0: []}
    for n in range(2_000):
        [record] = changelog_records([f"{n}-{k}" for k in range(10)], NOW_MS - n * 1000,
                                     group="g")
        records[0].insert(0, (NOW_MS - n * 1000 + 5, record.key, record.value))
    _reader(monkeypatch, records)  # ChangelogReader's consumers: Timed
    config = RouterConfig.model_validate({"source": {"topics": ["raw"], "group_id": "g"},
                                          "routes": [{"topic": "o"}],
                                          "dedup": {"max_ids": 1_000}})
    made: list[tuple[str, str, float]] = []

    def changelogs(kafka: dict[str, Any], topic: str, *, group_id: str,
                   timeout_s: float) -> ChangelogReader:
        made.append((topic, group_id, timeout_s))
        return ChangelogReader(kafka, topic, group_id=group_id, timeout_s=timeout_s)

    monkeypatch.setattr("time.time", lambda: NOW_MS / 1000)
    replay = ReplayFilter(window_ms=WEEK_MS, max_ids=1_000)
    restored = restore_filter(config, replay, changelogs, {"client.id": "shop"})
    assert made == [(config.dedup.changelog_topic, "shop-relay-reader", 300.0)]
    # 5 minutes: 301 records, 3,010 marks of the 20,000; the newest 1,000 ids held.
    assert restored == 3_010 and len(replay) == 1_000
    assert all(replay.seen(f"{n}-{k}") for n in range(100) for k in range(10))
    assert not replay.seen("100-0")


def test_an_older_slice_that_reads_nothing_goes_on_with_a_new_consumer(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Review 67 L-3: an older slice's consumer was not renewable; one left without a leader
    # by a broker's restart read nothing until the read's deadline (300 s), then exit 75,
    # where the first read renews its consumer after _STALLED_S (30 s).
    records, _ = _changelog(13, records=200, partitions=2)
    made: list[Timed] = []

    def consumer(config: dict[str, Any]) -> Timed:
        made.append(Timed(records))
        made[-1].frozen = len(made) == 2  # the first older slice's: fetches nothing
        return made[-1]

    monkeypatch.setattr(reader_module, "Consumer", consumer)
    monkeypatch.setattr(changelog_module, "Consumer", consumer)
    monkeypatch.setattr(reader_module, "log_end_offsets",
                        lambda admin, topic, parts, end: dict.fromkeys(parts, 0))
    monkeypatch.setattr(reader_module, "_STALLED_S", 0.3)
    reader = ChangelogReader({"bootstrap.servers": "k:9092"}, "cl", timeout_s=3)
    replay = ReplayFilter(window_ms=WEEK_MS, max_ids=1_000_000)
    restored, slices = restore_newest(replay, reader, NOW_MS, group="g")
    assert "event=reader_renewed topic=cl" in caplog.text and made[1].closed.wait(5)
    # Nothing lost, nothing read twice: the marks and slices of an undisturbed restore.
    assert (restored, slices) == (_forward(monkeypatch, records, 1_000_000)[1], SLICES)


@pytest.mark.parametrize(("held", "growth"), [
    (0, 8), (1, 8), (100_000, 8), (200_000, 7), (500_000, 3), (625_000, 2), (999_999, 2)])
def test_the_next_span_grows_by_what_the_ids_held_so_far_say_fills_max_ids(
        held: int, growth: int) -> None:
    assert _growth(held, 1_000_000) == growth


class BrokerStamped(Timed):
    """Timed, its records stamped by the broker (LogAppendTime), as the records say."""

    def message(self, partition: int, offset: int) -> Message:
        stamp, key, value = self.records[partition][offset]
        return Message(topic="cl", partition=partition, offset=offset, key=key, value=value,
                       timestamp=(TIMESTAMP_LOG_APPEND_TIME, stamp))


def test_broker_stamped_records_whose_clocks_lag_apart_lose_no_mark_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A LogAppendTime changelog whose partitions' leaders lag the routers' clock by 0 and
    # 30 minutes: below a slice's start, the lagging partition may hold marks up to 30
    # minutes newer than it, newer than ids the other partition gave. The stop allows
    # CHANGELOG_CLOCK_MARGIN_MS for that, as the window's start does.
    minute = 60_000
    [big] = changelog_records([f"big-{n}" for n in range(1_000)], NOW_MS - 35 * minute,
                              group="g")
    [late] = changelog_records([f"late-{n}" for n in range(10)], NOW_MS - 20 * minute,
                               group="g")
    records: Records = {0: [(NOW_MS - 35 * minute, big.key, big.value)],
                        1: [(NOW_MS - 50 * minute, late.key, late.value)]}
    ids = [f"big-{n}" for n in range(1_000)] + [f"late-{n}" for n in range(10)]
    forward = ReplayFilter(window_ms=WEEK_MS, max_ids=1_000)
    reader, _ = _reader(monkeypatch, records, BrokerStamped)
    forward.restore_changelog(reader.catch_up(since_ms=forward.changelog_since_ms(NOW_MS)),
                              NOW_MS, group="g")
    sliced = ReplayFilter(window_ms=WEEK_MS, max_ids=1_000)
    reader, _ = _reader(monkeypatch, records, BrokerStamped)
    restore_newest(sliced, reader, NOW_MS, group="g")
    assert reader.broker_stamped
    assert all(sliced.seen(f"late-{n}") for n in range(10))
    assert _held(sliced, ids) == _held(forward, ids)


def test_every_consumer_of_a_restore_is_answered_at_the_log_end_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 67: a read takes its ends on its consumer's connection once assigned, behind a
    # fetch the broker holds at the log end for fetch.wait.max.ms (librdkafka's 500 ms): the
    # first slice, at the end, took 1.5 s more than a read from the window's start.
    records, _ = _changelog(12, records=200, partitions=3)
    configs: list[dict[str, Any]] = []

    def consumer(config: dict[str, Any]) -> Timed:
        configs.append(dict(config))
        return Timed(records)

    monkeypatch.setattr(reader_module, "Consumer", consumer)
    monkeypatch.setattr(changelog_module, "Consumer", consumer)
    monkeypatch.setattr(reader_module, "log_end_offsets",
                        lambda admin, topic, parts, end: dict.fromkeys(parts, 0))
    reader = ChangelogReader({"bootstrap.servers": "k:9092"}, "cl")
    restore_newest(ReplayFilter(window_ms=WEEK_MS, max_ids=1_000_000), reader, NOW_MS,
                   group="g")
    assert len(configs) == SLICES
    assert all(int(config.get("fetch.wait.max.ms", 500)) <= 50 for config in configs), configs
