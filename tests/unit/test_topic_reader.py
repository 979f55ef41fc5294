"""TopicReader.read_to_end against a consumer that hands out errors (no broker)."""

from __future__ import annotations

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
from cdc_router.kafka import reader as reader_module
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
    monkeypatch.setattr(reader_module, "assign_from_beginning", lambda c, topic, what: [0])
    monkeypatch.setattr(reader_module, "log_end_offsets", lambda admin, topic, parts, end: {0: 0})
    reader = TopicReader({"bootstrap.servers": "k:9092"}, "cl", group_id="g", what="changelog")
    assert len(list(reader.read_to_end(end="log_end", timeout_s=5))) == 7


def reading(monkeypatch: pytest.MonkeyPatch, error: KafkaError) -> tuple[TopicReader, Any]:
    consumer = ErrorsOnly(error)
    monkeypatch.setattr(reader_module, "Consumer", lambda config: consumer)
    monkeypatch.setattr(reader_module, "assign_from_beginning", lambda c, topic, what: [0])
    monkeypatch.setattr(reader_module, "stable_offsets", lambda c, topic, parts, end: {0: 5})
    monkeypatch.setattr(reader_module, "reached", lambda c, topic, ends: False)
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
    monkeypatch.setattr(reader_module, "_LEADER_WAIT_S", 0.0)
    assert reader_module.log_end_offsets(connection, "cl", [0]) == {0: 42}  # type: ignore[arg-type]
    answers[:] = [-1001] * 1000
    with pytest.raises(KafkaException, match="no log end offset"):
        reader_module.log_end_offsets(connection, "cl", [0], deadline=0.0)  # type: ignore[arg-type]


class Stale(Records):
    """A consumer of two partitions left without metadata (QA 38-a O2): its lookups fail, its
    positions (its own) are at offset 3 of partition 0, nothing read of partition 1."""

    def __init__(self) -> None:
        super().__init__(0)
        self.closed = False

    def list_topics(self, topic: str, timeout: float) -> Any:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: "
                                        "Local: Broker transport failure"))

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 3 if tp.partition == 0 else OFFSET_INVALID)
                for tp in partitions]

    def close(self) -> None:
        self.closed = True


class Fresh(Records):
    """A new consumer: answers, and holds records from offset 3 of partition 0."""

    def __init__(self) -> None:
        super().__init__(5)
        self.next, self.assigned = 3, list[TopicPartition]()

    def list_topics(self, topic: str, timeout: float) -> Any:
        return None

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = partitions


def stale_reader(monkeypatch: pytest.MonkeyPatch, *, renewable: bool) -> tuple[TopicReader,
                                                                                list[Any]]:
    built: list[Any] = [Stale(), Fresh()]
    made = iter(built)
    monkeypatch.setattr(reader_module, "Consumer", lambda config: next(made))
    monkeypatch.setattr(reader_module, "assign_from_beginning", lambda c, topic, what: [0, 1])
    monkeypatch.setattr(reader_module, "assign_added",
                        lambda c, topic, parts, what: c.list_topics(topic, 30) or parts)
    monkeypatch.setattr(reader_module, "stable_offsets", lambda c, topic, parts, end: {0: 5})
    monkeypatch.setattr(reader_module, "log_end_offsets", lambda admin, topic, parts, end: {0: 5})
    reader = TopicReader({"bootstrap.servers": "k:9092"}, "cl", group_id="g", what="changelog",
                         renewable=renewable)
    assert reader.consumer is built[0]  # built and assigned (the first read of a restore)
    return reader, built


def test_a_renewable_reader_left_without_metadata_reads_on_with_a_new_consumer_where_it_stood(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # QA 38-a O2: after a broker's kill the changelog reader's consumer failed every metadata
    # request for minutes while new clients worked; the router's next restore exited 75.
    reader, (stale, fresh) = stale_reader(monkeypatch, renewable=True)
    offsets = [message.offset() for message in reader.read_to_end(end="log_end", timeout_s=5)]
    assert offsets == [3, 4]  # nothing read again, nothing passed over
    assert stale.closed
    assert [(tp.partition, tp.offset) for tp in fresh.assigned] == [(0, 3), (1, OFFSET_BEGINNING)]
    assert "event=reader_renewed topic=cl" in caplog.text


def test_a_reader_whose_consumer_was_handed_out_is_not_renewed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # `dlq replay` commits offsets under the reader's consumer: it must stay the same one.
    reader, (stale, _) = stale_reader(monkeypatch, renewable=False)
    with pytest.raises(KafkaException, match="Failed to get metadata"):
        list(reader.read_to_end(timeout_s=5))
    assert not stale.closed


def test_the_changelog_reader_is_renewable() -> None:
    assert reader_module.ChangelogReader({"bootstrap.servers": "k:9092"}, "cl")._renewable
