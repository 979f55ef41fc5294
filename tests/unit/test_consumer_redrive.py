"""redrive's pure parts (QA 67-b F-4): which letters are this group's, where their record was,
when the run ends, and one letter's outcomes on a memory store."""

from __future__ import annotations

import re
import threading
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from cdc_router.consumer import ConsumerSettings, RetryPolicy
from cdc_router.consumer.dedup import DedupKey, MemoryDedupStore
from cdc_router.consumer.redrive import (
    _redrive_one,
    letter_group,
    original_place,
    redrive,
    start_at,
    unfinished,
)
from cdc_router.errors import FatalKafkaError
from tests.unit.consumer_fakes import DLQ, TOPIC, FakeMessage, FakeProducer

SETTINGS = ConsumerSettings(bootstrap_servers="127.0.0.1:9092", group_id="billing",
                            topics=(TOPIC,), dead_letter_topic=DLQ,
                            retry=RetryPolicy(max_attempts=3))


def letter(event_id: str, group: str | None = "billing", offset: int = 4) -> FakeMessage:
    headers: list[tuple[str, bytes | None]] = [
        ("id", event_id.encode()), ("dlq.source.topic", TOPIC.encode()),
        ("dlq.source.partition", b"1"), ("dlq.source.offset", b"17"),
        ("dlq.event.id", event_id.encode())]
    if group is not None:
        headers.append(("dlq.consumer.group", group.encode()))
    return FakeMessage(DLQ, 0, offset, (b"k", b"{}", headers))


class Letters:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, message: Any, **how: Any) -> None:
        self.sent.append(how)


def one(message: FakeMessage, store: MemoryDedupStore, handler: Any) -> tuple[Counter[str],
                                                                             Letters]:
    counts: Counter[str] = Counter()
    letters = Letters()
    _redrive_one(message, SETTINGS, store, handler, None, letters,  # type: ignore[arg-type]
                 None, lambda _s: None, counts)  # type: ignore[arg-type]
    return counts, letters


def test_a_letter_is_the_group_s_of_its_last_consumer_group_header() -> None:
    assert letter_group([("dlq.consumer.group", b"a"), ("dlq.consumer.group", b"billing")]) \
        == "billing"
    assert letter_group([("dlq.source.group", b"billing")]) is None  # the router's header


def test_the_original_place_is_the_first_source_headers() -> None:
    headers = [("dlq.source.topic", b"t"), ("dlq.source.partition", b"2"),
               ("dlq.source.offset", b"9"), ("dlq.source.topic", b"dlq"),
               ("dlq.source.partition", b"0"), ("dlq.source.offset", b"3")]
    assert original_place(headers) == ("t", 2, 9)
    assert original_place([("dlq.source.topic", b"t")]) is None


def test_the_run_ends_when_every_partition_reached_its_end_at_the_start() -> None:
    assert unfinished({0: 5, 1: 3}, {0: 5, 1: 2}) == {1: 3}
    assert unfinished({0: 5}, {0: -1001}) == {0: 5}  # not fetched yet
    assert unfinished({0: 5, 1: 3}, {0: 7, 1: 3}) == {}  # past: transaction markers


def test_this_group_s_letter_runs_as_its_event_where_it_was_first_consumed() -> None:
    seen: list[Any] = []
    counts, letters = one(letter("e1"), MemoryDedupStore(), lambda e, _c: seen.append(e))
    assert counts == Counter(redriven=1) and not letters.sent
    assert (seen[0].event_id, seen[0].topic, seen[0].partition, seen[0].offset) == \
        ("e1", TOPIC, 1, 17)


def test_an_id_done_since_is_skipped_and_another_group_s_letter_is_not_run() -> None:
    store = MemoryDedupStore()
    store.run_once(DedupKey("billing", "e1"), lambda _c: None)
    seen: list[Any] = []
    for message in (letter("e1"), letter("e2", group="shipping"), letter("e3", group=None)):
        counts, _ = one(message, store, lambda e, _c: seen.append(e))
        assert counts in (Counter(duplicates=1), Counter(other_groups=1),
                          Counter(unlabelled=1))
    assert seen == []


@pytest.mark.parametrize(("unlabelled", "expected", "run"),
                         [(False, Counter(unlabelled=1, other_groups=1), []),
                          (True, Counter(redriven=1, other_groups=1), ["e3"])])
def test_a_letter_naming_no_group_runs_only_when_unlabelled_letters_are_ours(
        unlabelled: bool, expected: Counter[str], run: list[str]) -> None:
    # Review 67-b: a letter written before dlq.consumer.group was counted as another group's,
    # and the position went past it: no run could take it. Now counted apart, and run on ask;
    # the router's letters (dlq.source.group) never.
    router = letter("e4", group=None)
    router._headers.append(("dlq.source.group", b"pipeline"))
    seen: list[Any] = []
    counts: Counter[str] = Counter()
    for message in (letter("e3", group=None), router):
        _redrive_one(message, SETTINGS, MemoryDedupStore(), lambda e, _c: seen.append(e),
                     None, Letters(), None, lambda _s: None,  # type: ignore[arg-type]
                     counts, unlabelled=unlabelled)
    assert counts == expected
    assert [event.event_id for event in seen] == run


def test_a_letter_that_fails_again_is_lettered_again_after_max_attempts() -> None:
    calls: list[int] = []

    def failing(event: Any, _c: Any) -> None:
        calls.append(event.attempt)
        raise LookupError("still unknown")

    store = MemoryDedupStore()
    counts, letters = one(letter("e7"), store, failing)
    assert counts == Counter(dead_lettered=1) and calls == [1, 2, 3]
    assert [(sent["stage"], sent["attempts"], sent["event_id"]) for sent in letters.sent] == \
        [("handle", 3, "e7")]
    assert not store.is_done(DedupKey("billing", "e7"))


def test_a_letter_without_its_value_is_not_run() -> None:
    message = letter("e8")
    message._headers.append(("dlq.value.dropped.bytes", b"2000000"))
    seen: list[Any] = []
    counts, letters = one(message, MemoryDedupStore(), lambda e, _c: seen.append(e))
    assert counts == Counter(incomplete=1) and seen == [] and not letters.sent


@pytest.mark.parametrize("part", ["dlq.key.dropped.bytes", "dlq.headers.dropped"])
def test_a_letter_without_its_key_or_own_headers_is_not_run(part: str) -> None:
    # Review 67-b: a letter over the size limit by its key or its record's own headers keeps
    # its value; the handler would have run on a record without them and marked its id done.
    message = letter("e9")
    message._headers.append((part, b"3"))
    seen: list[Any] = []
    counts, letters = one(message, MemoryDedupStore(), lambda e, _c: seen.append(e))
    assert counts == Counter(incomplete=1) and seen == [] and not letters.sent


class DeadLetterTopic:
    """A one-partition dead-letter topic of `letters` for redrive's consumer: what it asks."""

    def __init__(self, letters: list[FakeMessage]) -> None:
        self.letters, self.committed_to, self.at = letters, OFFSET_INVALID, 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions={0: None}, error=None)})

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return 0, len(self.letters)

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.committed_to) for tp in tps]

    def assign(self, tps: list[TopicPartition]) -> None:
        self.at = tps[0].offset if tps else len(self.letters)  # none: nothing to read

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        batch = self.letters[self.at:self.at + num_messages]
        self.at += len(batch)
        return batch

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.at) for tp in tps]

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self.committed_to = offsets[0].offset

    def close(self) -> None:
        pass


def test_a_stop_ends_the_run_after_the_letter_in_hand_its_position_committed() -> None:
    # Review 67-b: a redrive beside the service had no way to stop on its SIGTERM but a kill;
    # STYLE: signals set a stop flag, the loop finishes what is in hand, commits, closes.
    topic = DeadLetterTopic([letter(f"e{n}", offset=n) for n in range(3)])
    stop, seen = threading.Event(), []

    def handler(event: Any, _c: Any) -> None:
        seen.append(event.event_id)
        stop.set()

    counts = redrive(SETTINGS, MemoryDedupStore(), handler, stop=stop,
                     consumer_factory=lambda _config: topic,
                     producer_factory=lambda _config: FakeProducer())
    assert (counts, seen, topic.committed_to) == (Counter(redriven=1), ["e0"], 1)
    stop.clear()  # the next run resumes at the first letter not done
    assert redrive(SETTINGS, MemoryDedupStore(), lambda e, _c: seen.append(e.event_id),
                   consumer_factory=lambda _config: topic,
                   producer_factory=lambda _config: FakeProducer()) == Counter(redriven=2)
    assert seen == ["e0", "e1", "e2"] and topic.committed_to == 3


def test_a_stop_while_a_letter_fails_leaves_it_for_the_next_run() -> None:
    stop = threading.Event()

    def failing(_event: Any, _c: Any) -> None:
        stop.set()
        raise LookupError("still unknown")

    counts: Counter[str] = Counter()
    letters = Letters()
    done = _redrive_one(letter("e7"), SETTINGS, MemoryDedupStore(), failing, None,
                        letters, None, lambda _s: None,  # type: ignore[arg-type]
                        counts, stop=stop)
    assert (done, counts, letters.sent) == (False, Counter(), [])


def test_a_position_past_the_end_reads_from_the_start() -> None:
    # Review 67-b: the dead-letter topic deleted and created again kept the group's old
    # position, past the new topic's end: its letters were passed for ever, counts all 0.
    assert (start_at(-1001, 0, 3), start_at(1, 2, 5), start_at(4, 2, 5), start_at(9, 0, 3)) \
        == (0, 2, 4, 0)
    topic = DeadLetterTopic([letter(f"e{n}", offset=n) for n in range(3)])
    topic.committed_to = 10
    assert redrive(SETTINGS, MemoryDedupStore(), lambda _e, _c: None,
                   consumer_factory=lambda _config: topic,
                   producer_factory=lambda _config: FakeProducer()) == Counter(redriven=3)


def test_passed_unlabelled_letters_are_named_with_the_way_to_run_them(
        caplog: pytest.LogCaptureFixture) -> None:
    topic = DeadLetterTopic([letter("e0", group=None, offset=0)])
    assert redrive(SETTINGS, MemoryDedupStore(), lambda _e, _c: None,
                   consumer_factory=lambda _config: topic,
                   producer_factory=lambda _config: FakeProducer()) == Counter(unlabelled=1)
    assert "--group billing.redrive --topic fulfillment.dlq --reset-offsets --to-earliest " \
           "--execute) and call redrive(..., unlabelled=True)" in caplog.text


class Refused(DeadLetterTopic):
    def __init__(self, letters: list[FakeMessage], code: int, *, at_commit: bool) -> None:
        super().__init__(letters)
        self.code, self.at_commit = code, at_commit

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        if not self.at_commit:
            raise KafkaException(KafkaError(self.code))
        return super().committed(tps, timeout)

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        raise KafkaException(KafkaError(self.code))


@pytest.mark.parametrize("at_commit", [False, True])
def test_a_refused_group_names_the_acl_to_grant_in_one_line(at_commit: bool) -> None:
    # Review 67-b: <group_id>.redrive is a group the cluster's ACLs never heard of; the start
    # said "check bootstrap_servers", and a refused commit was a KafkaException's traceback.
    topic = Refused([letter("e0", offset=0)], KafkaError.GROUP_AUTHORIZATION_FAILED,
                    at_commit=at_commit)
    with pytest.raises(FatalKafkaError, match=re.escape(
            "grant this client's principal Read on the group 'billing.redrive' and the topic "
            "'fulfillment.dlq'")) as raised:
        redrive(SETTINGS, MemoryDedupStore(), lambda _e, _c: None,
                consumer_factory=lambda _config: topic,
                producer_factory=lambda _config: FakeProducer())
    assert raised.value.code == KafkaError.GROUP_AUTHORIZATION_FAILED
    assert "bootstrap_servers" not in str(raised.value)
