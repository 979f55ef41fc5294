"""The idempotent consumer replaces a consumer its group no longer lists (kafka/membership.py,
QA 39-c F1: after a broker's outage librdkafka's consumer can stay out of its group)."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from typing import Any

import pytest

from cdc_router.consumer import ConsumedEvent, ConsumerSettings, IdempotentConsumer
from cdc_router.consumer.dedup import MemoryDedupStore
from cdc_router.errors import EXIT_RESTART, MemberFenced
from cdc_router.kafka import budget, closing
from cdc_router.kafka.budget import MAX_RENEWALS
from cdc_router.kafka.watchdog import blocked_calls
from tests.unit.consumer_fakes import (
    DLQ,
    TOPIC,
    FakeClock,
    FakeConsumer,
    FakeProducer,
    Record,
    closed_within,
)


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


def consumer_loop(consumers: Any, effects: list[ConsumedEvent], clock: FakeClock,
                  members: Any) -> IdempotentConsumer[Any]:
    """A consumer of fulfillment (session timeout 10 s) over `consumers`, its handler's
    events in `effects`, its group's members looked up by `members`."""
    settings = ConsumerSettings(bootstrap_servers="fake:9092", group_id="fulfillment",
                                topics=(TOPIC,), dead_letter_topic=DLQ,
                                consumer_config={"session.timeout.ms": "10000"})
    return IdempotentConsumer(
        settings, MemoryDedupStore(), lambda event, context: effects.append(event),
        consumer_factory=consumers, producer_factory=lambda config: FakeProducer(),
        rng=random.Random(1), clock=clock, members_factory=members)


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

    loop = consumer_loop(consumers, effects, clock, members)
    caplog.set_level(logging.WARNING)
    loop.run()
    assert sorted(e.event_id for e in effects) == ["a", "b", "c"]
    assert [type(c) for c in built] == [Stranded, Joined] and closed_within(built[0])
    assert len(lookups) == 4  # missing from the 2nd check on, for 30 s
    assert built[1].committed == {0: 2, 1: 1}
    renewed = [r.getMessage() for r in caplog.records if "consumer_renewed" in r.getMessage()]
    assert len(renewed) == 1 and "group fulfillment did not list member (no member id)" in \
        renewed[0]


@pytest.mark.parametrize(("blocked", "consumers_built"), [(0, 4), (MAX_RENEWALS + 1, 1)])
def test_a_consumer_that_never_rejoins_ends_run_after_its_renewals(
        monkeypatch: pytest.MonkeyPatch, blocked: int, consumers_built: int) -> None:
    # Review 40-2 N3: a group that never takes it (every new consumer stranded too): three
    # renewals. Review 41-2 N5: none while more than three given-up calls still block (each
    # holds a client's threads; a restart frees them).
    monkeypatch.setattr(budget, "blocked_calls", lambda: blocked)
    clock = FakeClock()
    built: list[FakeConsumer] = []

    def consumers(config: dict[str, str]) -> FakeConsumer:
        built.append(Stranded({0: [rec("a")]}, clock, lambda: None))
        return built[-1]

    loop = consumer_loop(consumers, [], clock,
                         lambda admin, group, topics: lambda name, timeout_s: False)
    with pytest.raises(MemberFenced, match="did not list member") as raised:
        loop.run()
    assert raised.value.exit_code == EXIT_RESTART
    assert len(built) == consumers_built and all(closed_within(c) for c in built)


def test_a_stranded_consumer_slow_to_close_is_given_up_and_counted(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Review 40-1 F5: its close ran on the loop with no bound. Review 41-1 F2: one given up
    # must be counted, as a hung producer call is (renewals stop past 3, the exit skips
    # finalizers).
    monkeypatch.setattr(closing, "CLOSE_WAIT_S", 0.2)
    caplog.set_level(logging.INFO, logger="cdc_router")
    clock = FakeClock()
    logs = {0: [rec("a")]}
    effects: list[ConsumedEvent] = []
    built: list[FakeConsumer] = []
    release = threading.Event()

    class SlowToClose(Stranded):
        def close(self) -> None:
            assert release.wait(10)
            super().close()

    def consumers(config: dict[str, str]) -> FakeConsumer:
        built.append((Joined if built else SlowToClose)(logs, clock, loop.stop))
        return built[-1]

    loop = consumer_loop(consumers, effects, clock,
                         lambda admin, group, topics: lambda name, timeout_s: name is not None)
    blocked = blocked_calls()  # process-wide: other tests' calls may still be counted
    loop.run()  # the new consumer handled the record and stopped: the stale one still closing
    assert [e.event_id for e in effects] == ["a"] and not built[0].closed
    assert blocked_calls() == blocked + 1 and "event=close_given_up client=consumer" in caplog.text
    renewed = caplog.text.index("event=consumer_renewed")
    assert "event=partitions_assigned" in caplog.text[renewed:], "the new one's callbacks run"
    release.set()
    assert closed_within(built[0])
    deadline = time.monotonic() + 5
    while blocked_calls() > blocked and time.monotonic() < deadline:
        time.sleep(0.01)
    assert blocked_calls() == blocked


def test_the_stale_consumer_is_closed_before_its_successor_joins() -> None:
    # Review 41-1 F3: with a group.instance.id, a request the old one still sends could fence
    # the new one; a close that returns within CLOSE_WAIT_S ends before the new one subscribes.
    clock = FakeClock()
    order: list[str] = []
    built: list[FakeConsumer] = []

    class ClosesSlowly(Stranded):
        def close(self) -> None:
            time.sleep(0.1)
            order.append("stale closed")
            super().close()

    class Subscribes(Joined):
        def subscribe(self, topics: list[str], **callbacks: Any) -> None:
            order.append("new subscribed")
            super().subscribe(topics, **callbacks)

    def consumers(config: dict[str, str]) -> FakeConsumer:
        built.append((Subscribes if built else ClosesSlowly)({0: [rec("a")]}, clock, loop.stop))
        return built[-1]

    loop = consumer_loop(consumers, [], clock,
                         lambda admin, group, topics: lambda name, timeout_s: name is not None)
    loop.run()
    assert order == ["stale closed", "new subscribed"]
