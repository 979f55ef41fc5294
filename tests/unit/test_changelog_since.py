"""The changelog restore reads only the records within the replay filter's window (QA 65-b F-5),
and the changelog reader lets librdkafka fetch nothing between reads (QA 65-b F-4)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from cdc_router.config.model import RouterConfig
from cdc_router.kafka import read_positions
from cdc_router.kafka import reader as reader_module
from cdc_router.kafka.changelog_reader import ChangelogReader
from cdc_router.relay.start import restore_filter
from cdc_router.router.assignment import restore_assigned
from cdc_router.router.clients import Timeouts
from cdc_router.router.replay import CHANGELOG_CLOCK_MARGIN_MS, ReplayFilter, changelog_records
from tests.unit.router_fakes import FakeChangelog
from tests.unit.test_topic_reader import Faithful

HOUR_MS = 3_600_000
NOW_MS = 1_800_000_000_000


class Timed(Faithful):
    """Faithful, its records carrying `records[partition][offset]` = (timestamp, key, value),
    answering ListOffsets by time as Kafka does."""

    def __init__(self, records: dict[int, list[tuple[int, bytes, bytes]]]) -> None:
        super().__init__({p: len(rs) for p, rs in records.items()})
        self.records = records
        self.asked: list[str] = []  # the lookups, in order
        self.failing: set[int] = set()  # partitions whose time lookup fails

    def list_topics(self, topic: str, timeout: float) -> Any:
        return SimpleNamespace(topics={topic: SimpleNamespace(
            error=None, partitions=dict.fromkeys(self.records))})

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float,
                              cached: bool) -> tuple[int, int]:
        self.asked.append(f"end {tp.partition}")
        return super().get_watermark_offsets(tp, timeout, cached)

    def offsets_for_times(self, partitions: list[TopicPartition],
                          timeout: float) -> list[TopicPartition]:
        found: list[Any] = []
        for tp in partitions:
            self.asked.append(f"time {tp.partition}")
            if tp.partition in self.failing:
                found.append(SimpleNamespace(  # TopicPartition's error is read-only
                    topic=tp.topic, partition=tp.partition, offset=-1,
                    error=KafkaError(KafkaError.LEADER_NOT_AVAILABLE)))
                continue
            stamps = [stamp for stamp, _, _ in self.records[tp.partition]]
            first = next((o for o, stamp in enumerate(stamps) if stamp >= tp.offset), OFFSET_END)
            found.append(TopicPartition(tp.topic, tp.partition, first))
        return found

    def message(self, partition: int, offset: int) -> Message:
        _, key, value = self.records[partition][offset]
        return Message(topic="cl", partition=partition, offset=offset, key=key, value=value)

    def add(self, partition: int, record: tuple[int, bytes, bytes]) -> None:
        self.records[partition].append(record)
        self.counts[partition] += 1


def _mark(event_id: str, mark_ms: int, stamp_ms: int | None = None) -> tuple[int, bytes, bytes]:
    """A changelog record of one id marked at `mark_ms`, timestamped `stamp_ms` (by default
    as the router's producer does: the same clock, a moment later)."""
    [record] = changelog_records([event_id], mark_ms, group="g")
    return (mark_ms + 50 if stamp_ms is None else stamp_ms), record.key, record.value


def _reader(monkeypatch: pytest.MonkeyPatch, consumer: Timed) -> ChangelogReader:
    monkeypatch.setattr(reader_module, "Consumer", lambda config: consumer)
    monkeypatch.setattr(reader_module, "log_end_offsets",
                        lambda admin, topic, parts, end: dict.fromkeys(parts, 0))
    return ChangelogReader({"bootstrap.servers": "k:9092"}, "cl")


def test_a_restore_reads_the_changelog_from_the_first_record_within_the_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    window_ms = 24 * HOUR_MS
    old, edge, recent = NOW_MS - 3 * window_ms, NOW_MS - window_ms + 1_000, NOW_MS - 1_000
    consumer = Timed({
        0: [_mark("old-0", old), _mark("old-1", old + 1), _mark("edge", edge),
            _mark("recent-0", recent)],
        # Broker-stamped (LogAppendTime), its clock 30 min behind the router's: the record's
        # time precedes the mark's, within CHANGELOG_CLOCK_MARGIN_MS.
        1: [_mark("old-2", old), _mark("lagging", edge, stamp_ms=edge - HOUR_MS // 2)],
        2: [_mark("old-3", old)],  # nothing recent: read from its end
    })
    replay = ReplayFilter(window_ms=window_ms, max_ids=1_000)
    changelog = _reader(monkeypatch, consumer)
    restored = replay.restore_changelog(
        changelog.catch_up(since_ms=replay.changelog_since_ms(NOW_MS)), NOW_MS, group="g")
    assert sorted(consumer.assigned) == [(0, 2), (1, 1), (2, 1)]
    assert restored == 3  # not the old ones: the records before the window were never read
    assert all(replay.seen(event_id) for event_id in ("edge", "recent-0", "lagging"))
    assert not any(replay.seen(f"old-{n}") for n in range(4))
    # Later reads go on from where the first stopped, whatever the time of a record.
    consumer.add(2, _mark("late-stamped", recent, stamp_ms=old))
    restored = replay.restore_changelog(
        changelog.catch_up(since_ms=replay.changelog_since_ms(NOW_MS)), NOW_MS, group="g")
    assert restored == 1 and replay.seen("late-stamped")


def test_the_end_is_looked_up_before_the_time_and_a_failed_lookup_reads_from_the_beginning(
        caplog: pytest.LogCaptureFixture) -> None:
    # A record committed between the two lookups lies at or past the end looked up first; the
    # other order could start a partition of no recent record past it.
    consumer = Timed({0: [_mark("a", 1_000)], 1: [_mark("b", 1_000)]})
    consumer.failing = {1}
    partitions, starts = read_positions.assign_since(consumer, "cl", "dedup changelog", 5_000)  # type: ignore[arg-type]
    assert consumer.asked == ["end 0", "end 1", "time 0", "time 1"]
    assert partitions == [0, 1] and starts == {0: 1}
    assert consumer.assigned == [(0, 1), (1, OFFSET_BEGINNING)]
    assert "event=read_start_lookup_failed topic=cl partition=1 since_ms=5000" in caplog.text

    class Unreachable(Timed):
        def offsets_for_times(self, partitions: list[TopicPartition],
                              timeout: float) -> list[TopicPartition]:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "ListOffsets timed out"))

    unreachable = Unreachable({0: [_mark("a", 1_000)]})
    assert read_positions.assign_since(unreachable, "cl", "c", 5_000) == ([0], {})  # type: ignore[arg-type]
    assert unreachable.assigned == [(0, OFFSET_BEGINNING)]


def test_the_time_a_restore_reads_from_is_the_window_and_the_clock_margin_before_now() -> None:
    replay = ReplayFilter(window_ms=7 * 24 * HOUR_MS, max_ids=10)
    assert replay.changelog_since_ms(NOW_MS) == \
        NOW_MS - 7 * 24 * HOUR_MS - CHANGELOG_CLOCK_MARGIN_MS
    # A window longer than the epoch: from the beginning, never a negative time (Kafka's -1 is
    # "latest", -2 "earliest").
    assert ReplayFilter(window_ms=100 * 366 * 24 * HOUR_MS, max_ids=10).changelog_since_ms(
        NOW_MS) is None


def test_the_router_and_the_relay_restore_newest_slices_first_down_to_the_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 66 F-2: from the window's start they read every mark, most crowded out by
    # max_ids; now the newest FIRST_SLICE_MS first, then longer slices, down to it.
    config = RouterConfig.model_validate({"source": {"topics": ["raw"], "group_id": "g"},
                                          "routes": [{"topic": "o"}],
                                          "dedup": {"window_ms": HOUR_MS}})
    asked: list[tuple[str, int | None]] = []

    class Changelog(FakeChangelog):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def catch_up(self, *, since_ms: int | None = None) -> Any:
            asked.append(("catch_up", since_ms))
            return []

        def older(self, since_ms: int) -> Any:
            asked.append(("older", since_ms))
            return []

        def older_left(self) -> bool:
            return True

    class Consumer:
        def committed(self, partitions: list[TopicPartition],
                      timeout: float) -> list[TopicPartition]:
            return [TopicPartition("raw", 0, -1001)]

        def get_watermark_offsets(self, partition: TopicPartition,
                                  **_: object) -> tuple[int, int]:
            return 0, 0

    monkeypatch.setattr("time.time", lambda: NOW_MS / 1000)
    restore_assigned(Consumer(), [TopicPartition("raw", 0)], config=config,
                     replay=ReplayFilter(window_ms=HOUR_MS, max_ids=10), changelog=Changelog(),
                     timeouts=Timeouts(60_000), clock=lambda: 0.0)
    since = NOW_MS - HOUR_MS - CHANGELOG_CLOCK_MARGIN_MS
    minute = 60_000
    assert asked == [("catch_up", NOW_MS - 5 * minute), ("older", NOW_MS - 40 * minute),
                     ("older", since)]
    router, asked[:] = list(asked), []
    restore_filter(config, ReplayFilter(window_ms=HOUR_MS, max_ids=10), Changelog, {})
    assert asked == router


def test_the_changelog_reader_fetches_nothing_between_reads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 65-b F-4: left assigned after a restore, librdkafka fetched every mark written since
    # into its queue (a router's RSS +0.74 MB a minute). Paused, it fetches nothing; resumed,
    # the next read goes on from where the last stopped.
    consumer = Timed({0: [_mark("a", NOW_MS)], 1: []})
    changelog = _reader(monkeypatch, consumer)
    assert len(list(changelog.catch_up())) == 1
    assert consumer.paused == {0, 1}
    consumer.add(1, _mark("b", NOW_MS))
    assert consumer.consume(100, 0) == []  # what librdkafka would fetch meanwhile: nothing
    assert [key for key, _ in changelog.catch_up()] == [consumer.records[1][0][1]]
    assert consumer.paused == {0, 1}
