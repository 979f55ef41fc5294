"""The watch of a consumer left out of its group (kafka/membership.py, QA 39-c F1)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from cdc_router.config.model import RouterConfig
from cdc_router.errors import EXIT_RESTART, MemberFenced
from cdc_router.kafka import membership
from cdc_router.kafka.membership import (
    CHECK_EVERY_S,
    MembershipWatch,
    in_thread,
    out_for_s,
    subscribed,
)
from cdc_router.kafka.watchdog import blocked_calls
from cdc_router.router.clients import membership_watch, static_member_id
from tests.unit.consumer_fakes import FakeClock as Clock


class Consumer:
    def __init__(self, *partitions: int) -> None:
        self.partitions = [TopicPartition("raw", p) for p in partitions]

    def assignment(self) -> list[TopicPartition]:
        return self.partitions


class Group:
    """listed(name, timeout_s): `name` in `listed`, or no topic (`topics` False); or raising
    the next of `failures`."""

    def __init__(self, *listed: str) -> None:
        self.listed = set(listed)
        self.topics = True  # a subscribed topic exists
        self.failures: list[BaseException] = []
        self.asked = 0

    def __call__(self, name: str | None, timeout_s: float) -> bool:
        self.asked += 1
        if self.failures:
            raise self.failures.pop(0)
        return name in self.listed or not self.topics


def watch(group: Group, clock: Clock, out_for: float = 30) -> MembershipWatch:
    return MembershipWatch(group, group="g", identity=lambda consumer: "i-1", out_for_s=out_for,
                           clock=clock)


def checks(watched: MembershipWatch, consumer: Any, clock: Clock, count: int) -> None:
    """check() `count` times, CHECK_EVERY_S apart; the first of a consumer only starts its
    watch, so a stranded one is seen missing from the second on."""
    for _ in range(count):
        clock.now += CHECK_EVERY_S
        watched.check(consumer)


def test_a_consumer_missing_from_its_group_is_renewed_after_three_sessions() -> None:
    clock, group, stranded = Clock(), Group("other"), Consumer()
    watched = watch(group, clock)
    checks(watched, stranded, clock, 4)  # missing at the 2nd, then for 10 and 20 s
    with pytest.raises(MemberFenced, match="did not list member i-1 for 30 s") as raised:
        checks(watched, stranded, clock, 1)
    assert raised.value.exit_code == EXIT_RESTART
    assert group.asked == 4


def test_the_group_is_asked_every_check_interval_not_at_every_poll() -> None:
    clock, group, stranded = Clock(), Group("i-1"), Consumer()
    watched = watch(group, clock)
    for _ in range(100):
        clock.now += 0.5
        watched.check(stranded)
    assert group.asked == 100 * 0.5 // CHECK_EVERY_S - 1


def test_a_consumer_with_partitions_never_asks_the_group() -> None:
    clock, group = Clock(), Group()
    checks(watch(group, clock), Consumer(0), clock, 30)
    assert group.asked == 0


def test_a_member_without_partitions_is_left_alone() -> None:
    # More instances than partitions: the group lists an instance that holds none.
    clock, group = Clock(), Group("i-1", "i-2")
    checks(watch(group, clock), Consumer(), clock, 30)
    assert group.asked == 29


@pytest.mark.parametrize("failure", [
    KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure")),
    TimeoutError()])
def test_a_failed_lookup_starts_the_watch_over(failure: BaseException) -> None:
    # An outage: librdkafka rejoins once the coordinator answers, so only answers that span
    # out_for_s without a failure between them count.
    clock, group, stranded = Clock(), Group(), Consumer()
    watched = watch(group, clock)
    checks(watched, stranded, clock, 4)  # missing for 20 s
    group.failures.append(failure)
    checks(watched, stranded, clock, 4)  # failed, then missing again for 20 s
    with pytest.raises(MemberFenced, match="for 30 s"):
        checks(watched, stranded, clock, 1)


def test_listed_again_starts_the_watch_over() -> None:
    clock, group, stranded = Clock(), Group(), Consumer()
    watched = watch(group, clock)
    checks(watched, stranded, clock, 3)
    group.listed.add("i-1")  # it rejoined...
    checks(watched, stranded, clock, 1)
    group.listed.clear()  # ... and its session timed out again
    checks(watched, stranded, clock, 3)
    with pytest.raises(MemberFenced, match="for 30 s"):
        checks(watched, stranded, clock, 1)


def test_a_new_consumer_is_watched_from_its_start() -> None:
    clock, group = Clock(), Group()
    watched = watch(group, clock)
    checks(watched, Consumer(), clock, 4)
    renewed = Consumer()  # its join takes a rebalance
    checks(watched, renewed, clock, 4)
    with pytest.raises(MemberFenced, match="for 30 s"):
        checks(watched, renewed, clock, 1)


class Held(Group):
    """Lookups on the watch's own thread (in_thread), each answered only when the test says."""

    def __init__(self, *listed: str) -> None:
        super().__init__(*listed)
        self.release = threading.Semaphore(0)
        self.started: list[Future[bool]] = []

    def __call__(self, name: str | None, timeout_s: float) -> bool:
        assert threading.current_thread() is not threading.main_thread()
        assert self.release.acquire(timeout=10), "never answered"
        return super().__call__(name, timeout_s)

    def start(self, lookup: Callable[[], bool]) -> Future[bool]:
        self.started.append(in_thread(lookup))
        return self.started[-1]

    def answer(self) -> None:
        """The lookup under way answers; back once its answer is there for check()."""
        self.release.release()
        wait(self.started[-1:], timeout=10)
        assert self.started[-1].done()


def threaded(group: Held, clock: Clock) -> MembershipWatch:
    return MembershipWatch(group, group="g", identity=lambda consumer: "i-1", out_for_s=30,
                           clock=clock, start=group.start)


def test_a_lookup_the_cluster_does_not_answer_holds_no_check() -> None:
    # Review 40-1 F4: in an outage each lookup held the loop (and a stop) for its 5 s timeout.
    clock, group, stranded = Clock(), Held(), Consumer()
    watched = threaded(group, clock)
    checks(watched, stranded, clock, 2)  # the 2nd asks (+20 s); no answer yet
    checks(watched, stranded, clock, 1)  # returns at once, asks nothing more
    assert len(group.started) == 1 and not group.started[0].done()
    group.answer()
    checks(watched, stranded, clock, 1)  # missing since +20 s, when it was asked; asks again
    assert len(group.started) == 2
    group.answer()
    checks(watched, stranded, clock, 1)  # the answer asked at +40 s; asks at +50 s
    group.answer()
    with pytest.raises(MemberFenced, match="for 30 s"):
        checks(watched, stranded, clock, 1)


def test_an_answer_about_a_replaced_consumer_is_dropped() -> None:
    clock, group = Clock(), Held()
    watched = threaded(group, clock)
    checks(watched, Consumer(), clock, 2)  # asked about the first consumer
    renewed = Consumer()
    checks(watched, renewed, clock, 1)  # a new watch; the first lookup still runs
    assert len(group.started) == 1, "one lookup at a time"
    group.answer()
    checks(watched, renewed, clock, 1)  # its answer dropped; asks about the new one (+40 s)
    assert len(group.started) == 2
    for _ in range(3):  # missing since +40 s: at +50, +60, +70
        group.answer()
        checks(watched, renewed, clock, 1)
    group.answer()
    with pytest.raises(MemberFenced, match="for 30 s"):
        checks(watched, renewed, clock, 1)


def test_a_lookup_that_never_returns_is_given_up_and_another_asked(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 41-1 F1: one lookup at a time, so a hung one (a client destroyed on its thread)
    # stopped the watch for good, silently.
    clock, group, stranded = Clock(), Held(), Consumer()
    watched = threaded(group, clock)
    caplog.set_level(logging.INFO, logger="cdc_router")
    blocked = blocked_calls()  # process-wide: other tests' calls may still be counted
    checks(watched, stranded, clock, 2)  # asks at +20 s
    checks(watched, stranded, clock, 1)
    assert len(group.started) == 1
    checks(watched, stranded, clock, 1)  # +40 s: given up after 15 s, asked again
    assert len(group.started) == 2 and "did not return in 15 s" in caplog.text
    for _ in range(4):  # the second and third hang too: then nothing more is asked
        checks(watched, stranded, clock, 1)
    assert len(group.started) == 3 and not any(f.done() for f in group.started)
    assert caplog.text.count("event=member_lookups_hung") == 1
    assert blocked_calls() == blocked + 3, "counted with the blocked calls"
    for _ in range(3):  # they return: the group is asked again
        group.release.release()
    assert not wait(group.started, timeout=10).not_done
    assert blocked_calls() == blocked
    checks(watched, stranded, clock, 1)
    assert len(group.started) == 4
    group.answer()


def test_a_lookup_failed_on_its_thread_is_an_outage(caplog: pytest.LogCaptureFixture) -> None:
    clock, group, stranded = Clock(), Held(), Consumer()
    group.failures.append(KafkaException(KafkaError(KafkaError._TRANSPORT, "down")))
    watched = threaded(group, clock)
    caplog.set_level(logging.INFO, logger="cdc_router")
    checks(watched, stranded, clock, 2)
    group.answer()
    checks(watched, stranded, clock, 1)  # takes the failure, asks again
    group.answer()
    checks(watched, stranded, clock, 1)
    assert "event=member_lookup_failed" in caplog.text
    assert caplog.text.index("event=member_missing") > caplog.text.index("member_lookup_failed")


@pytest.mark.parametrize(("config", "topics", "waited_s"), [
    ({"session.timeout.ms": 10_000}, ["raw"], 30), ({}, ["raw"], 135),
    ({"session.timeout.ms": "6000"}, ["raw"], 30),
    # Review 40-2 N2: a regex subscription finds a topic created since at librdkafka's next
    # metadata refresh (300 s by default; the router's consumer: 5 s).
    ({"session.timeout.ms": 10_000}, ["^raw.*"], 320),
    ({"session.timeout.ms": 10_000, "topic.metadata.refresh.interval.ms": 5000}, ["^raw.*"], 30),
    ({"topic.metadata.refresh.interval.ms": "600000"}, ["a", "^b"], 620)])
def test_how_long_a_consumer_may_be_missing(config: dict[str, Any], topics: list[str],
                                           waited_s: float) -> None:
    assert out_for_s(config, topics) == waited_s


def test_the_watch_takes_the_session_timeout_the_consumer_is_given() -> None:
    config = RouterConfig.model_validate({
        "source": {"topics": ["raw"], "group_id": "g"}, "routes": [{"topic": "orders"}],
        "kafka": {"consumer": {"session.timeout.ms": "45000"}}})
    clock, group, stranded = Clock(), Group(), Consumer()
    watched = membership_watch(config, "i-1", lambda conf, name, topics: group, clock)
    checks(watched, stranded, clock, 15)
    with pytest.raises(MemberFenced,
                       match=r"group g did not list member i-1\.[0-9a-f]{8} for 140 s"):
        checks(watched, stranded, clock, 1)


class Dynamic(Consumer):
    """A consumer without group.instance.id: the group lists its member id."""

    def __init__(self, member_id: str | None) -> None:
        super().__init__()
        self.member_id = member_id

    def memberid(self) -> str | None:
        return self.member_id


def for_consumer(group: Group, clock: Clock, **config: Any) -> MembershipWatch:
    return MembershipWatch.for_consumer({"group.id": "g", **config}, {}, ["raw"],
                                        lambda conf, name, topics: group, clock)


def test_a_dynamic_member_is_looked_up_by_its_member_id() -> None:
    clock, group = Clock(), Group("rdkafka-1234")
    watched = for_consumer(group, clock, **{"session.timeout.ms": "10000"})
    checks(watched, Dynamic("rdkafka-1234"), clock, 30)
    rejoining = Dynamic(None)  # no member id: not joined, once the group answers
    checks(watched, rejoining, clock, 4)
    with pytest.raises(MemberFenced, match=r"member \(no member id\) for 30 s"):
        checks(watched, rejoining, clock, 1)


def test_a_consumer_without_member_id_in_an_outage_is_left_to_librdkafka() -> None:
    # Review 40-1 (on 7f3015d): it was counted missing without asking, so renewed mid-outage.
    clock, group, rejoining = Clock(), Group(), Dynamic(None)
    watched = for_consumer(group, clock, **{"session.timeout.ms": "10000"})
    group.failures = [KafkaException(KafkaError(KafkaError._TRANSPORT, "down"))] * 20
    checks(watched, rejoining, clock, 20)
    assert group.asked == 19


def test_a_static_member_is_looked_up_by_its_instance_id() -> None:
    clock, group = Clock(), Group("i-1")
    watched = for_consumer(group, clock, **{"group.instance.id": "i-1"})
    checks(watched, Dynamic("an-old-member-id"), clock, 30)  # listed by its instance id
    assert group.asked == 29


@pytest.mark.parametrize(("configured", "waited_s"), [
    (None, 140), ("10000", 30), (6000, 30), ("45000.0", 140), ("not a number", 140)])
def test_the_session_timeout_as_librdkafka_reads_it(configured: Any, waited_s: int) -> None:
    # librdkafka's default 45 s when none is set (or it cannot be read as ours): 3 of them.
    clock, group, stranded = Clock(), Group(), Dynamic("m-1")
    config = {} if configured is None else {"session.timeout.ms": configured}
    watched = for_consumer(group, clock, **config)
    checks(watched, stranded, clock, waited_s // 10 + 1)
    with pytest.raises(MemberFenced, match=f"for {waited_s} s"):
        checks(watched, stranded, clock, 1)


def test_a_group_without_any_of_its_topics_yet_is_no_stranded_consumer() -> None:
    # Review 40-1 F1: librdkafka joins no group while the subscription matches no topic (the
    # raw topic comes with Debezium's first event): the router waited, and must go on waiting.
    clock, stranded, nothing = Clock(), Consumer(), Group()
    nothing.topics = False
    checks(watch(nothing, clock), stranded, clock, 100)
    assert nothing.asked == 99


def test_a_check_after_a_gap_starts_the_watch_over() -> None:
    # Review 40-1 F2: the loop backs off up to 30 s (or the process was stopped): two answers
    # around such a gap are no evidence of 30 s out of the group.
    clock, group, stranded = Clock(), Group(), Consumer()
    watched = watch(group, clock)
    checks(watched, stranded, clock, 2)  # missing once
    clock.now += 30  # a backoff: no check
    checks(watched, stranded, clock, 3)  # the watch starts over: missing for 20 s
    with pytest.raises(MemberFenced, match="for 30 s"):
        checks(watched, stranded, clock, 1)


def test_failing_lookups_are_said_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock, group, stranded = Clock(), Group(), Consumer()
    group.failures = [TimeoutError()] * 5
    checks(watch(group, clock), stranded, clock, 7)
    assert caplog.text.count("event=member_lookup_failed") == 1
    assert "error='TimeoutError'" in caplog.text  # QA 41-a F-6: it said error=''
    assert caplog.text.count("event=member_missing") == 1  # answered again, without it


@pytest.mark.parametrize(("topics", "name", "matched"), [
    (["raw"], "raw", True), (["raw"], "raw2", False), (["^outbox\\..*"], "outbox.orders", True),
    (["^outbox\\..*"], "inbox.orders", False), (["a", "^b.*"], "bee", True)])
def test_a_subscription_matches_topics_as_librdkafka_does(topics: list[str], name: str,
                                                         matched: bool) -> None:
    assert subscribed(topics, name) is matched


def test_a_subscription_librdkafka_would_read_otherwise_is_no_verdict() -> None:
    with pytest.raises(ValueError, match="source topic"):
        subscribed([r"^orders\.v\d+"], "orders.v1")  # \d: not POSIX


class Admin:
    """An AdminConnection over a group of dynamic members and the cluster's topics."""

    def __init__(self, members: list[str], topics: dict[str, KafkaError | None]) -> None:
        self.members, self.topics = members, topics

    def answer(self, request: Any, timeout_s: float) -> Any:
        return SimpleNamespace(members=[SimpleNamespace(member_id=m, group_instance_id=None)
                                        for m in self.members])

    def client(self) -> Any:
        return SimpleNamespace(list_topics=lambda timeout: SimpleNamespace(topics={
            name: SimpleNamespace(error=error) for name, error in self.topics.items()}))

    def reset(self) -> None:
        pass


@pytest.mark.parametrize(("name", "topics", "subscription", "listed"), [
    ("m-1", {"raw": None}, ["raw"], True),
    ("m-2", {"raw": None}, ["raw"], False),
    # No member id (not joined): missing, though dynamic members have no instance id either.
    (None, {"raw": None}, ["raw"], False),
    (None, {"other": None}, ["raw"], True),  # no subscribed topic: librdkafka joins no group
    (None, {"raw": KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)}, ["raw"], True),
    (None, {"raw.v1": None}, ["^raw\\.v[0-9]+"], False),
    (None, {"orders.v1": None}, ["^orders\\.v\\d+"], True)])  # read otherwise: no verdict
def test_what_the_admin_lookup_answers(monkeypatch: pytest.MonkeyPatch, name: str | None,
                                       topics: dict[str, KafkaError | None],
                                       subscription: list[str], listed: bool) -> None:
    monkeypatch.setattr(membership, "AdminConnection",
                        lambda config: Admin(["m-1"], topics))
    assert membership.admin_listed({}, "g", subscription)(name, 5.0) is listed


def test_a_changed_subscription_joins_under_another_static_member_id() -> None:
    # QA 44-a: a static member rejoining within its session timeout got its old assignment,
    # whatever it subscribed to now: a source topic added, the router restarted at once, and
    # the new topic was never assigned. Same topics (any order): the same id.
    one = static_member_id("vm", ["outbox.public.outbox"])
    assert one.startswith("vm.") and one == static_member_id("vm", ["outbox.public.outbox"])
    both = static_member_id("vm", ["outbox.public.outbox", "qatext.public.outbox_text"])
    assert both != one
    assert both == static_member_id("vm", ["qatext.public.outbox_text", "outbox.public.outbox"])
