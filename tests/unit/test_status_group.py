"""ops/group.py's router_state on a fake admin client: what one failed question leaves."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from cdc_router.ops import group
from cdc_router.ops.offsets import Scanned

_TIMED_OUT = KafkaException(KafkaError(KafkaError._TIMED_OUT, "ListConsumerGroupOffsets timed out"))


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


class _Admin:
    """One raw partition, committed at 1 of 3; the require_stable ask fails as `how` says."""

    def __init__(self, how: str) -> None:
        self.how = how

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(topics={"raw": SimpleNamespace(partitions={0: None})})

    def list_consumer_group_offsets(self, request: Any, require_stable: bool = False,
                                    request_timeout: float = 0) -> dict[str, Future[Any]]:
        if require_stable and self.how == "raises":
            raise _TIMED_OUT
        future: Future[Any] = Future()
        if require_stable:
            future.set_exception(_TIMED_OUT)
        else:
            future.set_result(SimpleNamespace(topic_partitions=[TopicPartition("raw", 0, 1)]))
        return {"g": future}

    def describe_consumer_groups(self, groups: list[str],
                                 request_timeout: float = 0) -> dict[str, Future[Any]]:
        return {"g": _done(SimpleNamespace(members=[], state=SimpleNamespace(name="EMPTY")))}


@pytest.mark.parametrize("how", ["raises", "its answer raises"])
def test_a_failed_require_stable_ask_keeps_the_router_section(
        how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 52-j F3: the error of this extra question replaced the whole section (lag,
    # members, "no running instance; start `cdc-router run`") with "Kafka: _TIMED_OUT".
    monkeypatch.setattr(group, "offsets", lambda admin, partitions, spec, **_: {
        ("raw", 0): 0 if spec == "earliest" else 3})
    monkeypatch.setattr(group, "scan", lambda kafka, topic, windows, **_: {0: Scanned(count=2)})
    state = group.router_state(_Admin(how), {}, "g", ["raw"], now_ms=0)  # type: ignore[arg-type]
    assert state.error is None
    assert (state.lag, state.members, state.offsets_in_transaction) == (2, (), ())


class _Record:
    def __init__(self, timestamp_ms: int) -> None:
        self._timestamp_ms = timestamp_ms

    def timestamp(self) -> tuple[int, int]:
        return 1, self._timestamp_ms


def test_a_partition_held_by_an_open_transaction_has_its_high_watermark_and_age(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 54-b F-1: the end asked was the last stable offset only: a transaction open at
    # offset 3 held 5 records behind it and the partition read "lag 0".
    asked: list[tuple[dict[int, tuple[int, int]], bool]] = []

    def offsets(admin: Any, partitions: Any, spec: str, committed_only: bool = True) -> Any:
        return {("raw", 0): 0 if spec == "earliest" else 3 if committed_only else 8}

    def scan(kafka: Any, topic: str, windows: dict[int, tuple[int, int]],
             committed_only: bool = True, **_: Any) -> Any:
        asked.append((windows, committed_only))
        return {0: Scanned(count=0) if committed_only else Scanned(count=1, first=_Record(
            10_000))}  # type: ignore[arg-type]

    monkeypatch.setattr(group, "offsets", offsets)
    monkeypatch.setattr(group, "scan", scan)
    state = group.router_state(_Admin("raises"), {}, "g", ["raw"], now_ms=100_000)  # type: ignore[arg-type]
    (partition,) = state.partitions
    assert (partition.end, partition.high_watermark, partition.open_transaction_age_s) == \
        (3, 8, 90.0)
    assert ({0: (3, 4)}, False) in asked  # the open transaction's first record, uncommitted

    def refused(admin: Any, partitions: Any, spec: str, committed_only: bool = True) -> Any:
        if not committed_only:
            raise _TIMED_OUT  # an extra question: its failure keeps the rest
        return offsets(admin, partitions, spec)

    monkeypatch.setattr(group, "offsets", refused)
    state = group.router_state(_Admin("raises"), {}, "g", ["raw"], now_ms=100_000)  # type: ignore[arg-type]
    assert state.error is None
    assert (state.partitions[0].high_watermark, state.partitions[0].open_transaction_age_s) \
        == (None, None)
