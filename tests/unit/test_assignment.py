"""The committed offsets a router looks up for partitions just assigned (router/assignment.py)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from cdc_router.errors import RestoreFailed
from cdc_router.router import assignment


class _Group:
    """committed() answers `failures` in turn, then the offsets."""

    def __init__(self, *failures: KafkaError) -> None:
        self.failures, self.timeouts = list(failures), list[float]()

    def committed(self, partitions: list[TopicPartition], timeout: float) -> Any:
        self.timeouts.append(timeout)
        if self.failures:
            raise KafkaException(self.failures.pop(0))
        return [TopicPartition(tp.topic, tp.partition, 7) for tp in partitions]


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assignment.time, "sleep", lambda _seconds: None)


def test_the_committed_offsets_are_asked_again_while_the_group_coordinator_moves(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 39-b: NOT_COORDINATOR, 7 s after the broker came back, ended a router (exit 75).
    group = _Group(KafkaError(KafkaError.NOT_COORDINATOR, "Not coordinator"),
                   KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "loading"))
    [offset] = assignment.committed_offsets(group, [TopicPartition("raw", 0)], 180)
    assert offset.offset == 7 and len(group.timeouts) == 3
    assert all(0 < timeout <= 180 for timeout in group.timeouts)
    assert caplog.text.count("event=committed_lookup_failed") == 1  # once, not twice a second


@pytest.mark.parametrize("error", [
    KafkaError(KafkaError.FENCED_INSTANCE_ID, "fenced", fatal=True),
    KafkaError(KafkaError._TIMED_OUT, "timed out")])
def test_other_failures_of_the_committed_offsets_are_raised_at_once(error: KafkaError) -> None:
    group = _Group(error)
    with pytest.raises(KafkaException):
        assignment.committed_offsets(group, [TopicPartition("raw", 0)], 180)
    assert len(group.timeouts) == 1


def test_a_coordinator_that_keeps_moving_is_raised_by_the_deadline() -> None:
    group = _Group(*[KafkaError(KafkaError.NOT_COORDINATOR, "Not coordinator")] * 10**6)
    with pytest.raises(KafkaException, match="NOT_COORDINATOR"):
        assignment.committed_offsets(group, [TopicPartition("raw", 0)], 0.2)


def test_a_restore_failing_at_the_committed_offsets_names_them_not_the_changelog() -> None:
    failed = RestoreFailed("the group's committed offsets", "NOT_COORDINATOR")
    assert str(failed).startswith("could not read the group's committed offsets for the "
                                  "partitions just assigned (NOT_COORDINATOR); exiting with 75")


def test_committed_offsets_that_time_out_say_what_they_waited_for_and_the_remedy() -> None:
    # CI, stop 48: after a kill -9 of the broker, Kafka left a transaction hanging on the
    # group's offsets; every restart ended here, exit 75, until the operator aborted it.
    timed_out = KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                          "Failed to get committed offsets: Local: Timed out"))
    hint = assignment._unstable_hint(timed_out, 40)
    assert "at most 40 s (twice delivery.transaction_timeout_ms)" in hint
    assert "a transaction may hang on the group's offsets" in hint
    assert "`kafka-transactions find-hanging`" in hint
    failed = RestoreFailed("the group's committed offsets", timed_out, hint)
    assert str(failed).endswith(hint) and "exiting with 75" in str(failed)
    other = KafkaException(KafkaError(KafkaError.FENCED_INSTANCE_ID, "fenced", fatal=True))
    assert assignment._unstable_hint(other, 40) == ""
