"""TopicReader.read_to_end against a consumer that hands out errors (no broker)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from cdc_router.errors import FatalKafkaError
from cdc_router.kafka import lookups
from cdc_router.kafka import reader as reader_module
from cdc_router.kafka.changelog_reader import ChangelogReader
from cdc_router.kafka.reader import TopicReader


class ErrorsOnly:
    """A consumer whose every fetch is `error`."""

    def __init__(self, error: KafkaError) -> None:
        self.error = error
        self.fetches = 0

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        self.fetches += 1
        return [Message(topic="dlq", partition=0, error=self.error)]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, OFFSET_INVALID) for tp in partitions]

    def close(self) -> None:
        pass


class Records:
    """A consumer of one partition holding `count` committed records."""

    def __init__(self, count: int) -> None:
        self.count, self.next = count, 0

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        taken = range(self.next, min(self.count, self.next + num_messages))
        self.next = max(self.next, taken.stop)
        return [Message(topic="cl", partition=0, offset=o, value=b"m") for o in taken]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.next or OFFSET_INVALID)
                for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float,
                              cached: bool) -> tuple[int, int]:
        return 0, self.count

    def close(self) -> None:
        pass


def test_a_log_end_below_the_committed_end_is_read_to_the_committed_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 37-a: after the changelog's leader was killed, a restore read none of the marks
    # committed since its last read. The committed end (asked by the consumer) is a floor.
    consumer = Records(7)
    monkeypatch.setattr(reader_module, "Consumer", lambda config: consumer)
    monkeypatch.setattr(reader_module, "assign_from_beginning", lambda c, topic, what, **_: [0])
    monkeypatch.setattr(reader_module, "log_end_offsets", lambda admin, topic, parts, end: {0: 0})
    reader = TopicReader({"bootstrap.servers": "k:9092"}, "cl", group_id="g", what="changelog")
    assert len(list(reader.read_to_end(end="log_end", timeout_s=5))) == 7


def reading(monkeypatch: pytest.MonkeyPatch, error: KafkaError) -> tuple[TopicReader, Any]:
    consumer = ErrorsOnly(error)
    monkeypatch.setattr(reader_module, "Consumer", lambda config: consumer)
    monkeypatch.setattr(reader_module, "assign_from_beginning", lambda c, topic, what, **_: [0])
    monkeypatch.setattr(reader_module, "stable_offsets", lambda c, topic, parts, end: {0: 5})
    monkeypatch.setattr(reader_module, "reached", lambda c, topic, ends, *_: False)
    return TopicReader({"bootstrap.servers": "k:9092"}, "dlq", group_id="g",
                       what="dead-letter"), consumer


def test_a_topic_the_principal_may_not_read_fails_at_once_naming_the_grant(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 31-c: TOPIC_AUTHORIZATION_FAILED was passed over like a transient error for 300 s,
    # then "is a transaction stuck open?" (dlq replay; the router's changelog, exit 75 for ever).
    reader, consumer = reading(monkeypatch, KafkaError(
        KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed"))
    with pytest.raises(FatalKafkaError, match=r"reading the dead-letter topic dlq failed for "
                       r"good: TOPIC_AUTHORIZATION_FAILED.*grant this principal Read"):
        list(reader.read_to_end(timeout_s=30))
    assert consumer.fetches == 1


@pytest.mark.parametrize("code", [KafkaError._TRANSPORT, KafkaError.GROUP_AUTHORIZATION_FAILED])
def test_a_transient_error_is_passed_over_until_the_deadline(
        monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    # QA 31-d: the reader never joins its group; a principal without Describe on it got
    # GROUP_AUTHORIZATION_FAILED from the coordinator lookup, and the first fix stopped on it.
    reader, consumer = reading(monkeypatch, KafkaError(code, "down"))
    with pytest.raises(reader_module.ReadTimedOut):
        list(reader.read_to_end(timeout_s=0.3))
    assert consumer.fetches > 1


def test_the_status_scan_of_a_topic_the_principal_may_not_read_is_a_failed_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 31-c: status counted "at least 0" dead letters on a topic it could not read, and
    # said ok; a KafkaException is its "cannot check" (ops/probe.py).
    from confluent_kafka import KafkaException

    from cdc_router.ops import offsets

    class Refusing(ErrorsOnly):
        def assign(self, partitions: list[Any]) -> None:
            pass

        def position(self, partitions: list[Any]) -> list[Any]:
            return partitions  # offsets -1001: not done

    monkeypatch.setattr(offsets, "Consumer", lambda config: Refusing(KafkaError(
        KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed")))
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        offsets.scan({"bootstrap.servers": "k:9092"}, "dlq", {0: (0, 90)}, timeout_s=30)


def test_the_cleanup_sweep_says_it_may_not_read_the_changelog(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 31-c's reader finding, in the cleanup sweep's own reader: an authorization error was
    # passed over for ever, and no delivered row was deleted by the sweep, unsaid. A
    # KafkaException is the sweep's event=cleanup_sweep_failed (router/cleanup.py).
    import time

    from confluent_kafka import KafkaException

    from cdc_router.router.committed_ids import CommittedIds

    ids = CommittedIds({"bootstrap.servers": "k:9092"}, changelog_topic="dedup", group="g",
                       dead_letter_topic="dlq", window_ms=1000, ours=lambda topic, group: True)
    ids._changelog = ErrorsOnly(KafkaError(  # type: ignore[assignment]
        KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed"))
    ids._listed = time.monotonic()
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        ids.next(10)


def test_the_cleanup_sweep_reads_a_few_records_a_call_with_a_lean_queue() -> None:
    # QA 33-a: 10,000 records a consume() call, and librdkafka's 64 MB read-ahead, held ~100
    # MB in a restarted router (a dead letter may hold a big row); measured in /tmp runs:
    # peak 190 MB -> 70 MB with 100,000 ids and 60 MB of letters.
    import time

    from cdc_router.kafka.reader import LEAN_QUEUE
    from cdc_router.router import committed_ids
    from cdc_router.router.replay import changelog_records

    class Marks:
        def __init__(self) -> None:
            self.asked: list[int] = []
            self.records = [Message(topic="dedup", partition=0, key=record.key,
                                    value=record.value)
                            for n in range(300) for record in changelog_records(
                                [f"e{n}-a", f"e{n}-b"], 1, "batch:", group="g")]

        def consume(self, num_messages: int, timeout: float) -> list[Message]:
            self.asked.append(num_messages)
            taken, self.records = self.records[:num_messages], self.records[num_messages:]
            return taken

    ids = committed_ids.CommittedIds({"bootstrap.servers": "k:9092"}, changelog_topic="dedup",
                                     group="g", dead_letter_topic="dlq", window_ms=1000,
                                     ours=lambda topic, group: True)
    assert all(ids._config[key] == value for key, value in LEAN_QUEUE.items())
    marks = ids._changelog = Marks()  # type: ignore[assignment]
    ids._listed = time.monotonic()
    assert len(ids._read_marks(500)) == 500
    assert max(marks.asked) == committed_ids._RECORDS == 20 and len(marks.asked) == 13
    # Review 33-3: records of no use (another pipeline's) were read to the end in one step.
    ids._unread, marks.records = [], [Message(topic="dedup", partition=0, key=record.key,
                                              value=record.value)
                                      for n in range(300) for record in changelog_records(
                                          [f"x{n}"], 1, "batch:", group="other")]
    assert ids._read_marks(100) == [] and len(marks.records) == 200


def test_a_log_end_lookup_answering_no_offset_is_asked_again_never_taken_for_empty(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 37-a: for ~52 s after the changelog's leader was killed, list_offsets answered -1001
    # (no error); `reached` took the partition for empty and the restore read no mark.
    from concurrent.futures import Future
    from types import SimpleNamespace

    answers = [-1001, -1001, 42]

    class Admin:
        def list_offsets(self, request: Any, **kwargs: Any) -> Any:
            future: Future[Any] = Future()
            future.set_result(SimpleNamespace(offset=answers.pop(0)))
            return {tp: future for tp in request}

        def describe_topics(self, topics: Any, **kwargs: Any) -> Any:
            future: Future[Any] = Future()
            future.set_result(None)
            return {"cl": future}

    connection = SimpleNamespace(client=lambda: Admin(), reset=lambda: None)
    monkeypatch.setattr(lookups, "LEADER_WAIT_S", 0.0)
    assert lookups.log_end_offsets(connection, "cl", [0]) == {0: 42}  # type: ignore[arg-type]
    answers[:] = [-1001] * 1000
    with pytest.raises(KafkaException, match="no log end offset"):
        lookups.log_end_offsets(connection, "cl", [0], deadline=0.0)  # type: ignore[arg-type]


class Faithful:
    """A consumer of partitions 0 and 1 of `cl` holding `counts` committed records each, whose
    position() answers as librdkafka's does: OFFSET_INVALID for a partition until it returned a
    record of it, even one assigned at an offset (review 39), and fetching nothing of a paused
    partition. `stale`: left without metadata (QA 38-a O2), its lookups fail."""

    def __init__(self, counts: dict[int, int], *, stale: bool = False) -> None:
        self.counts, self.stale = counts, stale
        self.fetch = dict.fromkeys(counts, 0)  # where the next fetch starts
        self.returned: dict[int, int] = {}  # the position() librdkafka answers
        self.assigned: list[tuple[int, int]] = []
        self.closed = threading.Event()
        self.lookups: list[float] = []  # list_topics' timeouts
        self.paused: set[int] = set()

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.lookups.append(timeout)
        if self.stale:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: "
                                            "Local: Broker transport failure"))
        return None

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = [(tp.partition, tp.offset) for tp in partitions]
        self.fetch = {tp.partition: max(tp.offset, 0) for tp in partitions}

    frozen = False  # fetches nothing (a consumer without a leader, QA 39-a)

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        if self.frozen:
            return []
        taken = [(p, o) for p, start in self.fetch.items() if p not in self.paused
                 for o in range(start, self.counts[p])][:num_messages]
        for partition, offset in taken:
            self.fetch[partition] = self.returned[partition] = offset + 1
        return [self.message(p, o) for p, o in taken]

    def message(self, partition: int, offset: int) -> Message:
        return Message(topic="cl", partition=partition, offset=offset, value=b"m")

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("cl", partition) for partition, _ in self.assigned]

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in partitions}

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition,
                               self.returned.get(tp.partition, OFFSET_INVALID))
                for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float,
                              cached: bool) -> tuple[int, int]:
        return 0, self.counts[tp.partition]

    def close(self) -> None:
        self.closed.set()


def renewing(monkeypatch: pytest.MonkeyPatch, *consumers: Faithful) -> None:
    made = iter(consumers)

    def first(consumer: Faithful, topic: str, what: str, **_: Any) -> list[int]:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in consumer.counts])
        return sorted(consumer.counts)

    monkeypatch.setattr(reader_module, "Consumer", lambda config: next(made))
    monkeypatch.setattr(reader_module, "assign_from_beginning", first)
    monkeypatch.setattr(reader_module, "assign_added",
                        lambda c, topic, parts, what, timeout_s: c.list_topics(topic, timeout_s)
                        or parts)
    monkeypatch.setattr(reader_module, "stable_offsets",
                        lambda c, topic, parts, end: {p: c.counts[p] for p in parts})
    monkeypatch.setattr(reader_module, "log_end_offsets", lambda admin, topic, parts, end: {
        p: 0 for p in parts})


def _read(reader: ChangelogReader, timeout_s: float = 5) -> list[tuple[int, int]]:
    return [(message.partition(), message.offset())  # type: ignore[misc]
            for message in reader.read_to_end(end="log_end", timeout_s=timeout_s)]


def test_a_changelog_reader_left_without_metadata_reads_on_with_a_new_consumer_where_it_stood(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # QA 38-a O2: after a broker's kill the changelog reader's consumer failed every metadata
    # request for minutes while new clients worked; the router's next restore exited 75.
    stale, fresh, fresher = (Faithful({0: 3, 1: 2}, stale=True), Faithful({0: 5, 1: 2}),
                             Faithful({0: 5, 1: 3}))
    renewing(monkeypatch, stale, fresh, fresher)
    reader = ChangelogReader({"bootstrap.servers": "k:9092"}, "cl")
    assert _read(reader) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    # Nothing read twice, nothing passed over; and partition 1, with nothing new since, is at
    # its end although librdkafka's position() says nothing of it (review 39: the read waited
    # for its deadline, then the restore failed).
    assert _read(reader, timeout_s=300) == [(0, 3), (0, 4)]
    assert stale.closed.wait(5)
    assert fresh.assigned == [(0, 3), (1, 2)]
    assert "event=reader_renewed topic=cl positions=0:3,1:2" in caplog.text
    # QA 39-b: each renewal came after a 30 s lookup; a new consumer answered within 1-5 s.
    assert 9 < stale.lookups[0] <= 10
    fresh.stale = True  # renewed again: partition 1 from where the last renewal assigned it
    assert _read(reader) == [(1, 2)]
    assert fresher.assigned == [(0, 5), (1, 2)]


def test_a_partition_never_read_is_read_from_its_beginning_by_a_renewed_reader(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stale, fresh = Faithful({0: 0, 1: 0}, stale=True), Faithful({0: 1, 1: 0})
    renewing(monkeypatch, stale, fresh)
    reader = ChangelogReader({"bootstrap.servers": "k:9092"}, "cl")
    assert _read(reader) == []
    assert _read(reader) == [(0, 0)]
    assert fresh.assigned == [(0, OFFSET_BEGINNING), (1, OFFSET_BEGINNING)]


def test_a_reader_whose_consumer_was_handed_out_is_not_renewed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # `dlq replay` commits offsets under the reader's consumer: it must stay the same one.
    stale = Faithful({0: 1}, stale=True)
    renewing(monkeypatch, stale)
    reader = TopicReader({"bootstrap.servers": "k:9092"}, "dlq", group_id="g", what="letters")
    assert reader.consumer is stale
    with pytest.raises(KafkaException, match="Failed to get metadata"):
        list(reader.read_to_end(timeout_s=5))
    assert not stale.closed.is_set()


def test_a_changelog_read_that_stalls_says_so_and_reads_on_with_a_new_consumer(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # QA 39-a: a restore read nothing for 26 s after a broker's kill, and said nothing; a
    # consumer that cannot fetch would wait for the deadline (300 s), then exit 75.
    frozen, fresh = Faithful({0: 2, 1: 1}), Faithful({0: 4, 1: 1})
    renewing(monkeypatch, frozen, fresh)
    monkeypatch.setattr(reader_module, "_STALLED_S", 0.3)
    reader = ChangelogReader({"bootstrap.servers": "k:9092"}, "cl")
    assert _read(reader) == [(0, 0), (0, 1), (1, 0)]
    frozen.counts[0], frozen.frozen = 4, True
    assert _read(reader) == [(0, 2), (0, 3)]
    assert "event=read_stalled topic=cl positions=0:2,1:1 ends=0:4,1:1" in caplog.text
    assert "event=reader_renewed topic=cl positions=0:2,1:1 error=nothing read" in caplog.text
    assert fresh.assigned == [(0, 2), (1, 1)]


def _read_held(monkeypatch: pytest.MonkeyPatch, held: Faithful, log_ends: dict[int, int],
               committed: dict[int, int]) -> list[tuple[int, int]]:
    """What a changelog read of `held` reads while a transaction ends `log_ends` past its
    counts, which `committed` (the transaction's end, 1 s in) brings them to."""
    renewing(monkeypatch, held)  # a renewal would find no consumer to make
    monkeypatch.setattr(reader_module, "_STALLED_S", 0.2)
    monkeypatch.setattr(reader_module, "log_end_offsets",
                        lambda admin, topic, parts, end: log_ends)
    reader = ChangelogReader({"bootstrap.servers": "k:9092"}, "cl")
    ended = threading.Timer(1.0, lambda: held.counts.update(committed))
    ended.start()
    try:
        return _read(reader)
    finally:
        ended.cancel()


def test_a_changelog_read_held_by_an_open_transaction_waits_for_it_with_the_same_consumer(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Review 39-2: the log end lies past an open transaction; read_committed stops at the
    # last stable offset until it ends, and a new consumer every 30 s waited the same.
    caplog.set_level(logging.INFO)
    held = Faithful({0: 2, 1: 1})
    assert _read_held(monkeypatch, held, {0: 4, 1: 1}, {0: 4}) == [
        (0, 0), (0, 1), (1, 0), (0, 2), (0, 3)]
    assert "event=read_held topic=cl stable=0:2,1:1" in caplog.text
    assert "reader_renewed" not in caplog.text and not held.closed.is_set()


def test_a_held_read_of_a_partition_retention_emptied_waits_with_the_same_consumer(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Review 40-2: partition 1, never read, starts at 5 (retention deleted 0-4); the open
    # transaction past it held the read, and a position taken for 0 renewed it every 30 s.
    class Retained(Faithful):
        def assign(self, partitions: list[TopicPartition]) -> None:
            super().assign(partitions)
            self.fetch[1] = 5

        def get_watermark_offsets(self, tp: TopicPartition, timeout: float,
                                  cached: bool) -> tuple[int, int]:
            return (5 if tp.partition == 1 else 0), self.counts[tp.partition]

    caplog.set_level(logging.INFO)
    assert _read_held(monkeypatch, Retained({0: 2, 1: 5}), {0: 2, 1: 7}, {1: 7}) == [
        (0, 0), (0, 1), (1, 5), (1, 6)]
    assert "event=read_held topic=cl stable=0:2,1:5" in caplog.text
    assert "reader_renewed" not in caplog.text


def test_a_read_longer_than_its_timeout_goes_on_while_it_moves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 66-b: the deadline was the whole read's; a restore longer than 300 s exited 75 and
    # restarted into the same restore, for good.
    class Slow(Faithful):
        def consume(self, num_messages: int, timeout: float) -> list[Message]:
            time.sleep(0.05)
            return super().consume(1, timeout)

    slow = Slow({0: 8, 1: 8})  # 16 records at one per 0.05 s: 0.8 s in all
    renewing(monkeypatch, slow)
    reader = TopicReader({"bootstrap.servers": "k:9092"}, "cl", group_id="g", what="marks")
    assert len(list(reader.read_to_end(timeout_s=0.3))) == 16


def test_a_stalled_read_of_a_reader_not_renewable_is_said_and_waits_for_its_deadline(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    frozen = Faithful({0: 1})
    frozen.frozen = True
    renewing(monkeypatch, frozen)
    monkeypatch.setattr(reader_module, "_STALLED_S", 0.1)
    reader = TopicReader({"bootstrap.servers": "k:9092"}, "dlq", group_id="g", what="letters")
    with pytest.raises(reader_module.ReadTimedOut):
        list(reader.read_to_end(timeout_s=0.5))
    assert "event=read_stalled topic=dlq" in caplog.text and reader.consumer is frozen


def test_the_cleanup_sweep_reads_on_with_new_consumers_after_a_failed_lookup(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # QA 39-b: after the broker's outage the sweep's changelog consumer failed every metadata
    # request for 8 minutes, until the process ended.
    from cdc_router.router.committed_ids import CommittedIds

    stale, fresh = Faithful({0: 2}, stale=True), Faithful({0: 2})
    stale.assign([TopicPartition("dedup", 0, OFFSET_BEGINNING)])
    stale.consume(10, 0)  # read up to offset 2
    monkeypatch.setattr(reader_module, "Consumer", lambda config: fresh)
    ids = CommittedIds({"bootstrap.servers": "k:9092"}, changelog_topic="dedup", group="g",
                       dead_letter_topic="dlq", window_ms=1000, ours=lambda topic, group: True)
    ids._changelog, ids._changelog_partitions = stale, [0]  # type: ignore[assignment]
    with pytest.raises(KafkaException, match="Failed to get metadata"):
        ids.next(10)  # its partitions listed again (a minute since): the cleaner asks later
    assert ids._changelog is fresh and fresh.assigned == [(0, 2)] and stale.closed.wait(5)
    assert "event=reader_renewed topic=dedup positions=0:2" in caplog.text
    assert "(a read of the sweep failed: each of its readers is renewed)" in caplog.text


def test_a_renewal_whose_new_consumer_cannot_be_made_keeps_the_stale_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 39-2: the stale consumer was closed first; a failed Consumer() (a certificate
    # being rotated, no threads left) left the reader, or the sweep, on a closed consumer.
    stale = Faithful({0: 1}, stale=True)
    renewing(monkeypatch, stale)
    reader = ChangelogReader({"bootstrap.servers": "k:9092"}, "cl")
    assert _read(reader) == [(0, 0)]

    def unmade(config: dict[str, Any]) -> Any:
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "Failed to create consumer"))

    monkeypatch.setattr(reader_module, "Consumer", unmade)
    with pytest.raises(KafkaException, match="Failed to create consumer"):
        _read(reader)
    assert reader.consumer is stale and not stale.closed.is_set()


def test_a_low_watermark_that_cannot_be_looked_up_is_no_end_reached() -> None:
    # Review 39-2: a leader's death mid-read raised out of the restore from this lookup.
    class NoAnswer(Faithful):
        def get_watermark_offsets(self, tp: TopicPartition, timeout: float,
                                  cached: bool) -> tuple[int, int]:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out"))

    consumer = NoAnswer({0: 3})
    assert not reader_module.reached(consumer, "cl", {0: 3})  # type: ignore[arg-type]
    assert reader_module.reached(consumer, "cl", {0: 3}, {0: 3})  # type: ignore[arg-type]


def test_the_cleanup_sweep_renews_its_consumers_at_most_once_a_minute(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Review 39-2: a step fails every 30 s during an outage; each renewal made two consumers.
    from cdc_router.router.committed_ids import CommittedIds

    stale = Faithful({0: 0}, stale=True)
    made: list[Faithful] = []
    monkeypatch.setattr(reader_module, "Consumer",
                        lambda config: made.append(Faithful({0: 0}, stale=True)) or made[-1])
    ids = CommittedIds({"bootstrap.servers": "k:9092"}, changelog_topic="dedup", group="g",
                       dead_letter_topic="dlq", window_ms=1000, ours=lambda topic, group: True)
    ids._changelog, ids._changelog_partitions = stale, [0]  # type: ignore[assignment]
    for _ in range(3):
        ids._listed = 0.0  # its partitions listed again: the stale consumer fails
        with pytest.raises(KafkaException, match="Failed to get metadata"):
            ids.next(10)
    assert len(made) == 1 and caplog.text.count("event=reader_renewed") == 1


def test_a_new_readers_first_lookup_is_bounded_by_the_reads_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 61-a F-1: a relay's stop read its position back with a new reader, whose first
    # metadata lookup waited 30 s (LOOKUP_TIMEOUT_S) with Kafka down, whatever the read's own
    # deadline: the stop took 31 s, past Kubernetes' 30 s grace period.
    down = Faithful({0: 1}, stale=True)
    monkeypatch.setattr(reader_module, "Consumer", lambda config: down)
    reader = TopicReader({"bootstrap.servers": "k:9092"}, "pos", group_id="g", what="position")
    with pytest.raises(KafkaException):
        list(reader.read_to_end(end="log_end", timeout_s=5))
    assert down.lookups and max(down.lookups) <= 5
