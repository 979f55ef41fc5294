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
    monkeypatch.setattr(group, "offsets", lambda admin, partitions, spec: {
        ("raw", 0): 0 if spec == "earliest" else 3})
    monkeypatch.setattr(group, "scan", lambda kafka, topic, windows: {0: Scanned(count=2)})
    state = group.router_state(_Admin(how), {}, "g", ["raw"], now_ms=0)  # type: ignore[arg-type]
    assert state.error is None
    assert (state.lag, state.members, state.offsets_in_transaction) == (2, (), ())
