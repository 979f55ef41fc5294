"""Reading to the end: the end-offset lookups survive a topic whose leader is not known yet."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from cdc_router.kafka import reader


class _ListedOffset:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class _Admin:
    """list_offsets fails `failures` times with NOT_LEADER_FOR_PARTITION, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def list_offsets(self, request: dict[TopicPartition, Any], **_: Any) -> dict[Any, Any]:
        self.calls += 1
        answers: dict[TopicPartition, Future[Any]] = {}
        for tp in request:
            future: Future[Any] = Future()
            if self.calls <= self.failures:
                future.set_exception(KafkaException(KafkaError(
                    KafkaError.NOT_LEADER_FOR_PARTITION, "not leader")))
            else:
                future.set_result(_ListedOffset(10 + tp.partition))
            answers[tp] = future
        return answers


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader.time, "sleep", lambda _seconds: None)


def test_log_end_offsets_retries_a_leader_not_known_yet() -> None:
    admin = _Admin(failures=3)
    ends = reader.log_end_offsets(admin, "t", [0, 1])  # type: ignore[arg-type]
    assert ends == {0: 10, 1: 11}
    assert admin.calls == 4


def test_log_end_offsets_raises_once_its_deadline_passed() -> None:
    admin = _Admin(failures=10**9)
    with pytest.raises(KafkaException):
        reader.log_end_offsets(admin, "t", [0], deadline=reader.time.monotonic() - 1)  # type: ignore[arg-type]
    assert admin.calls == 1
