"""Reading to the end: the end-offset lookups survive a topic whose leader is not known yet."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from cdc_router.errors import DeliveryError
from cdc_router.kafka import lookups
from cdc_router.kafka.consumer import readable_headers, record_headers


class _ListedOffset:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class _Admin:
    """list_offsets fails with FENCED_LEADER_EPOCH `failures` times in all, then answers."""

    def __init__(self, failures: list[int]) -> None:
        self.failures = failures  # shared by the clients of one test: [left]
        self.calls = 0

    deleted = False  # describe_topics answers that the topic does not exist

    def describe_topics(self, topics: Any, **_: Any) -> dict[str, Future[Any]]:
        future: Future[Any] = Future()
        if self.deleted:
            future.set_exception(KafkaException(KafkaError(
                KafkaError.UNKNOWN_TOPIC_OR_PART, "Broker: Unknown topic or partition")))
        else:
            future.set_result(None)
        return {name: future for name in topics.topic_names}

    def list_offsets(self, request: dict[TopicPartition, Any], **_: Any) -> dict[Any, Any]:
        self.calls += 1
        answers: dict[TopicPartition, Future[Any]] = {}
        failing = self.failures[0] > 0
        self.failures[0] -= 1
        for tp in request:
            future: Future[Any] = Future()
            if failing:
                future.set_exception(KafkaException(KafkaError(
                    KafkaError.FENCED_LEADER_EPOCH, "Leader epoch is older than broker epoch")))
            else:
                future.set_result(_ListedOffset(10 + tp.partition))
            answers[tp] = future
        return answers


class _StaleAfterRestart(_Admin):
    """A client made before a broker restart: it never recovers (librdkafka's stale leader
    epoch, measured on Kafka 4.3); only a new client answers."""

    def list_offsets(self, request: dict[TopicPartition, Any], **kwargs: Any) -> dict[Any, Any]:
        self.failures[0] = max(self.failures[0], 1)
        return super().list_offsets(request, **kwargs)


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lookups.time, "sleep", lambda _seconds: None)


def test_log_end_offsets_retries_with_a_new_client_after_a_broker_restart() -> None:
    made: list[_Admin] = []

    def factory(config: dict[str, Any]) -> Any:
        made.append(_StaleAfterRestart([1]) if not made else _Admin([0]))
        return made[-1]

    ends = lookups.log_end_offsets(lookups.AdminConnection({}, factory), "t", [0, 1])
    assert ends == {0: 10, 1: 11}
    assert len(made) == 2 and made[0].calls == 1 and made[1].calls == 1


def test_log_end_offsets_retries_a_leader_not_known_yet() -> None:
    left = [3]
    ends = lookups.log_end_offsets(lookups.AdminConnection({}, lambda _c: _Admin(left)),
                                  "t", [0, 1])
    assert ends == {0: 10, 1: 11}
    assert left == [-1]


def test_log_end_offsets_raises_once_its_deadline_passed() -> None:
    admin = _Admin([10**9])
    with pytest.raises(KafkaException):
        lookups.log_end_offsets(lookups.AdminConnection({}, lambda _c: admin), "t", [0],
                               deadline=lookups.time.monotonic() - 1)
    assert admin.calls == 1


def test_log_end_offsets_of_a_deleted_topic_is_one_error_after_three_answers() -> None:
    # QA, session 25: with the dedup changelog deleted under a running group, a router logged
    # offsets_lookup_failed twice a second for the whole deadline, naming no cause.
    admin = _Admin([10**6])
    admin.deleted = True
    with pytest.raises(DeliveryError, match=r"topic t does not exist any more.*topics apply"):
        lookups.log_end_offsets(lookups.AdminConnection({}, lambda config: admin), "t", [0])
    assert admin.calls == 3  # three answers in a row: a broker just restarted may say it once


def test_one_answer_that_the_topic_is_gone_is_not_believed() -> None:
    class Flickering(_Admin):
        answers = 0

        def describe_topics(self, topics: Any, **kwargs: Any) -> dict[str, Future[Any]]:
            self.answers += 1
            self.deleted = self.answers == 1
            return super().describe_topics(topics, **kwargs)

    admin = Flickering([2])
    ends = lookups.log_end_offsets(lookups.AdminConnection({}, lambda config: admin), "t", [0])
    assert ends == {0: 10} and admin.calls == 3


def test_each_retried_lookup_waits_longer_up_to_30_s_and_never_past_its_deadline() -> None:
    # QA 38-a O1 / 39-a: after a leader's kill a 30 s lookup answered only at its timeout,
    # where the next one answered at once: 10 s first, then longer for a loaded host.
    class Timed(_Admin):
        def __init__(self, failures: list[int]) -> None:
            super().__init__(failures)
            self.timeouts: list[float] = []

        def list_offsets(self, request: dict[TopicPartition, Any], **kwargs: Any) -> Any:
            self.timeouts.append(kwargs["request_timeout"])
            return super().list_offsets(request, **kwargs)

    admin = Timed([3])
    lookups.log_end_offsets(lookups.AdminConnection({}, lambda config: admin), "t", [0],
                            deadline=lookups.time.monotonic() + 300)
    assert admin.timeouts == [10, 20, 30, 30]

    class Watermarks:
        def __init__(self, failures: int) -> None:
            self.failures, self.timeouts = failures, list[float]()

        def get_watermark_offsets(self, tp: TopicPartition, timeout: float,
                                  cached: bool) -> tuple[int, int]:
            self.timeouts.append(timeout)
            self.failures -= 1
            if self.failures >= 0:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out"))
            return 0, 7

    consumer = Watermarks(2)
    deadline = lookups.time.monotonic() + 300
    ends = lookups.stable_offsets(consumer, "t", [0], deadline)  # type: ignore[arg-type]
    assert ends == {0: 7} and consumer.timeouts == [10, 20, 30]
    consumer = Watermarks(1)
    lookups.stable_offsets(consumer, "t", [0], lookups.time.monotonic() + 4)  # type: ignore[arg-type]
    assert all(3 < timeout <= 4 for timeout in consumer.timeouts)  # never past the deadline


class _UndecodableHeaders(Message):
    """As confluent-kafka's Message for a header name that is not UTF-8 (its first call)."""

    def headers(self) -> Any:
        raise SystemError("<method 'headers' of 'confluent_kafka.cimpl.Message' objects> "
                          "returned a result with an exception set")


def test_record_headers_of_none_pairs_and_an_undecodable_name() -> None:
    # Review, session 30: a record whose header name is not UTF-8 stopped the router.
    # (The other face of it, a list holding a NULL name, needs a real broker's record:
    # tests/integration, test_router.py and test_idempotent_consumer.py.)
    assert record_headers(Message(headers=None)) == [] and readable_headers(Message()) == []
    assert record_headers(Message(headers=[("a", b"1"), ("b", None)])) == [("a", b"1"),
                                                                           ("b", b"")]
    assert readable_headers(_UndecodableHeaders()) is None
    assert record_headers(_UndecodableHeaders()) == [
        ("dlq.headers.dropped", b"a header name is not UTF-8")]
