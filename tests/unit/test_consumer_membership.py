"""The idempotent consumer replaces a consumer its group no longer lists (kafka/membership.py,
QA 39-c F1: after a broker's outage librdkafka's consumer can stay out of its group)."""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import pytest

from cdc_router.consumer import ConsumedEvent, ConsumerSettings, IdempotentConsumer
from cdc_router.consumer.dedup import MemoryDedupStore
from cdc_router.errors import EXIT_RESTART, MemberFenced
from tests.unit.consumer_fakes import DLQ, TOPIC, FakeClock, FakeConsumer, FakeProducer, Record


def rec(key: str) -> Record:
    return key.encode(), json.dumps({"id": key}).encode(), []


class Stranded(FakeConsumer):
    """Subscribed, but never given a partition and without a member id, as librdkafka's
    consumer after its session timed out in an outage and it never rejoined."""

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        self.polls += 1
        assert self.polls < 10_000, "never replaced"
        self.clock.now += timeout
        return []

    def memberid(self) -> str | None:
        return None


class Joined(FakeConsumer):
    def memberid(self) -> str | None:
        return "rdkafka-joined"


def test_a_stranded_consumer_is_replaced_and_every_record_is_handled(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    logs = {0: [rec("a"), rec("b")], 1: [rec("c")]}
    effects: list[ConsumedEvent] = []
    built: list[FakeConsumer] = []
    lookups: list[float] = []

    def consumers(config: dict[str, str]) -> FakeConsumer:
        made = (Joined if built else Stranded)(logs, clock, loop.stop)
        built.append(made)
        return made

    def members(admin_config: Any, group: str, topics: Any) -> Any:
        assert group == "fulfillment" and admin_config["bootstrap.servers"] == "fake:9092"
        assert topics == (TOPIC,)
        return lambda name, timeout_s: lookups.append(clock()) or name == "rdkafka-joined"

    settings = ConsumerSettings(bootstrap_servers="fake:9092", group_id="fulfillment",
                                topics=(TOPIC,), dead_letter_topic=DLQ,
                                consumer_config={"session.timeout.ms": "10000"})
    loop: IdempotentConsumer[Any] = IdempotentConsumer(
        settings, MemoryDedupStore(), lambda event, context: effects.append(event),
        consumer_factory=consumers, producer_factory=lambda config: FakeProducer(),
        rng=random.Random(1), clock=clock, members_factory=members)
    caplog.set_level(logging.WARNING)
    loop.run()
    assert sorted(e.event_id for e in effects) == ["a", "b", "c"]
    assert [type(c) for c in built] == [Stranded, Joined] and built[0].closed
    assert len(lookups) == 4  # missing from the 2nd check on, for 30 s
    assert built[1].committed == {0: 2, 1: 1}
    renewed = [r.getMessage() for r in caplog.records if "consumer_renewed" in r.getMessage()]
    assert len(renewed) == 1 and "group fulfillment did not list member (no member id)" in \
        renewed[0]


def test_a_consumer_that_never_rejoins_ends_run_after_three_renewals() -> None:
    # Review 40-2 N3: a group that never takes it (every new consumer stranded too).
    clock = FakeClock()
    built: list[FakeConsumer] = []

    def consumers(config: dict[str, str]) -> FakeConsumer:
        built.append(Stranded({0: [rec("a")]}, clock, lambda: None))
        return built[-1]

    settings = ConsumerSettings(bootstrap_servers="fake:9092", group_id="fulfillment",
                                topics=(TOPIC,), dead_letter_topic=DLQ,
                                consumer_config={"session.timeout.ms": "10000"})
    loop: IdempotentConsumer[Any] = IdempotentConsumer(
        settings, MemoryDedupStore(), lambda event, context: None,
        consumer_factory=consumers, producer_factory=lambda config: FakeProducer(),
        rng=random.Random(1), clock=clock,
        members_factory=lambda admin, group, topics: lambda name, timeout_s: False)
    with pytest.raises(MemberFenced, match="did not list member") as raised:
        loop.run()
    assert raised.value.exit_code == EXIT_RESTART
    assert len(built) == 4 and all(c.closed for c in built)
