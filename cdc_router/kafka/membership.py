"""A group consumer left out of its group while the cluster answers: told, to be renewed.

QA 39-c: after a broker outage of 60-75 s during which the other instance left, 2 times in 6
the remaining instance's consumer timed out its session (librdkafka's last line: SESSTMOUT
"... from the group coordinator (broker -1) ...: revoking assignment and rejoining group"),
gave its partitions up and never joined again. It polled on with no partition: the group stayed
empty, nothing was logged, nothing delivered, the process never ended; a restart recovered at
once. librdkafka tells nothing of it, so the group is asked: while the consumer holds no
partition, every CHECK_EVERY_S its group is described (a member left without a partition, when
there are more members than partitions, is listed too). When the consumer's identity (its
group.instance.id, else its member id) is missing from every answer over out_for_s, and no
lookup failed in between (an outage is librdkafka's to wait out: it rejoins once the coordinator
answers), check() raises MemberFenced: the router replaces the consumer as a fenced static
member, the idempotent consumer replaces it too (each: 3 times in 10 minutes at most, then exit
75 for the supervisor). A consumer is not missing while no subscribed topic exists (librdkafka
joins no group for it), and a `^regex` subscription is given librdkafka's metadata refresh
interval to notice a topic created since. QA 40-a: the state came back once in 12 outages and
was renewed 41 s after the broker's return.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException

from cdc_router.config.topic_names import source_regex
from cdc_router.errors import EXIT_RESTART, MemberFenced
from cdc_router.kafka.lookups import AdminConnection
from cdc_router.kafka.watchdog import count_blocked

log = logging.getLogger("cdc_router.kafka")

# How often a consumer without partitions asks for its group's members (on a thread of its
# own), and each lookup's timeout. One that has not returned in GIVE_UP_S (three timeouts: a
# client hung past its own, e.g. in its destroy after a failure) counts as failed, is left to
# its thread and counted with the blocked calls (kafka/watchdog.py: renewals stop past 3, the
# program exits without finalizers); while MAX_HUNG (the renewals' cap) still run, none is asked.
CHECK_EVERY_S = 10.0
LOOKUP_TIMEOUT_S = 5.0
GIVE_UP_S = 3 * LOOKUP_TIMEOUT_S
MAX_HUNG = 3
# Answers to lookups asked this far apart start the watch over (the loop backed off, or the
# process was stopped): only answers at most two checks apart are evidence.
GAP_S = 20.0
# Missing from the group this many session timeouts in a row: a rejoin takes one heartbeat and a
# rebalance, and librdkafka asks for the coordinator every second while it has none.
SESSIONS_OUT = 3
# librdkafka's defaults, for a config that sets none
DEFAULT_SESSION_TIMEOUT_MS = 45_000
DEFAULT_METADATA_REFRESH_MS = 300_000

# listed(name, timeout_s): whether the group lists member `name` (its member id or
# group.instance.id; None: it has none), or cannot list it yet because no subscribed topic
# exists (librdkafka joins no group for a subscription that matches nothing)
Listed = Callable[[str | None, float], bool]
ListedFactory = Callable[[Mapping[str, Any], str, Sequence[str]], Listed]
# start(lookup): the future of lookup(), run elsewhere or at once
Starter = Callable[[Callable[[], bool]], "Future[bool]"]


def in_thread(lookup: Callable[[], bool]) -> Future[bool]:
    """lookup() on a daemon thread of its own: neither the loop nor the process's exit waits
    for it (it should end within its own timeout; see GIVE_UP_S for one that does not)."""
    answer: Future[bool] = Future()

    def run() -> None:
        try:
            answer.set_result(lookup())
        except BaseException as failure:  # handed over to check(), which reads it
            answer.set_exception(failure)

    threading.Thread(target=run, name="cdc-router-membership", daemon=True).start()
    return answer


@dataclass
class _Asked:
    """A lookup under way, since `at`; a stale one's answer is of a watch started over."""
    answer: Future[bool]
    at: float
    stale: bool = False


def subscribed(topics: Sequence[str], name: str) -> bool:
    """Whether a subscription to `topics` matches topic `name` as librdkafka reads it (a `^`
    one is a regex, searched); ValueError for a regex it would not read as Python does."""
    return any(name == topic or (topic.startswith("^") and
                                 source_regex(topic).search(name) is not None)
               for topic in topics)


def admin_listed(admin_config: Mapping[str, Any], group: str, topics: Sequence[str]) -> Listed:
    """listed(name, timeout_s) of `group` by DescribeGroups, and when `name` is missing, by the
    cluster's topics (all of them: asking for one may create it), within one timeout; an
    AdminClient made on first use and anew after a failed lookup (a long-lived one can keep
    stale metadata: kafka/lookups.py)."""
    admin = AdminConnection(admin_config)

    def listed(name: str | None, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        described = admin.answer(lambda client: client.describe_consumer_groups(
            [group], request_timeout=timeout_s)[group], timeout_s)
        if name is not None and name in {n for m in described.members
                                         for n in (m.member_id, m.group_instance_id)}:
            return True
        try:
            found = admin.client().list_topics(timeout=max(0.5, deadline - time.monotonic()))
        except KafkaException:
            admin.reset()
            raise
        try:
            return not any(subscribed(topics, topic) for topic, metadata in found.topics.items()
                           if metadata.error is None)
        except ValueError:  # a pattern read otherwise than librdkafka reads it: no evidence
            return True

    return listed


def identity(consumer_config: Mapping[str, Any]) -> Callable[[Any], str | None]:
    """How the group lists a consumer built with `consumer_config`: its group.instance.id
    (static membership), else its member id (none before its first join)."""
    instance = consumer_config.get("group.instance.id")
    if instance:
        return lambda consumer: str(instance)
    return lambda consumer: consumer.memberid() or None


def _ms(consumer_config: Mapping[str, Any], key: str, default: int) -> int:
    """A config's milliseconds; librdkafka's default for what does not read as a number
    (librdkafka itself refuses a value it cannot parse)."""
    try:
        return int(float(consumer_config.get(key, default)))
    except (TypeError, ValueError):
        return default


def out_for_s(consumer_config: Mapping[str, Any], topics: Sequence[str]) -> float:
    """How long a consumer is missing before it is renewed: SESSIONS_OUT session timeouts, at
    least 3 checks; with a `^regex` subscription also librdkafka's metadata refresh interval
    and 2 checks (it finds a topic created since only then)."""
    waited = max(3 * CHECK_EVERY_S,
                 SESSIONS_OUT * _ms(consumer_config, "session.timeout.ms",
                                    DEFAULT_SESSION_TIMEOUT_MS) / 1000)
    if any(topic.startswith("^") for topic in topics):
        refresh_ms = _ms(consumer_config, "topic.metadata.refresh.interval.ms",
                         DEFAULT_METADATA_REFRESH_MS)
        waited = max(waited, refresh_ms / 1000 + 2 * CHECK_EVERY_S)
    return waited


class MembershipWatch:
    """check(consumer) raises MemberFenced once `consumer` has been out of its group for
    `out_for_s` while the cluster answered; a new consumer starts the watch over, and so does an
    answer to a lookup asked long after the previous one (GAP_S).

    The group is asked on a thread of its own (`start`): a lookup the cluster does not answer
    (an outage) holds neither the loop nor a stop for its LOOKUP_TIMEOUT_S (review 40-1 F4); its
    answer is taken by the first check() after it came, and only for the consumer it was about.
    Built from the consumer's config (`for_consumer`): its group, identity, timeouts.
    """

    def __init__(self, listed: Listed, *, group: str, identity: Callable[[Any], str | None],
                 out_for_s: float, clock: Callable[[], float],
                 start: Starter | None = None) -> None:
        self._listed_by_group = listed
        self._group, self._identity = group, identity
        self._out_for_s = out_for_s
        self._clock = clock
        self._start = start or in_thread
        self._consumer: Any = None
        self._next_check = 0.0
        self._out_since: float | None = None
        self._failing = False  # the last lookup failed (said once)
        self._asked: _Asked | None = None  # the lookup under way, if any
        self._hung: list[Future[bool]] = []  # lookups given up, still running
        self._said_hung = False
        self._answered_at = float("-inf")  # when the last lookup answered was asked

    def check(self, consumer: Any) -> None:
        now = self._clock()
        if consumer is not self._consumer:
            self._consumer, self._out_since = consumer, None
            self._next_check = now + CHECK_EVERY_S
            if self._asked is not None:  # kept until it ends (one lookup at a time), its
                self._asked.stale = True  # answer then read as nothing: another consumer's
        if self._asked is not None:
            if not self._asked.answer.done():
                if now - self._asked.at < GIVE_UP_S:
                    return
                self._give_up(self._asked)
            else:
                self._take_answer(consumer)
        if now < self._next_check or self._hung_too_many():
            return
        self._next_check = now + CHECK_EVERY_S
        try:
            if consumer.assignment():
                self._out_since = None
                return
            name = self._identity(consumer)
        except KafkaException as failure:
            self._lookup_failed(failure)
            return
        self._asked = _Asked(self._start(lambda: self._listed_by_group(name, LOOKUP_TIMEOUT_S)),
                             at=now)
        if self._asked.answer.done():  # a lookup run at once
            self._take_answer(consumer)

    def _take_answer(self, consumer: Any) -> None:
        asked = self._asked
        assert asked is not None and asked.answer.done()
        self._asked = None
        if asked.stale:
            return
        previous, self._answered_at = self._answered_at, asked.at
        if asked.at - previous > GAP_S:  # the loop backed off, or the process was stopped
            self._out_since = None
        try:
            listed = asked.answer.result() or bool(consumer.assignment())
        except (KafkaException, TimeoutError) as failure:
            self._lookup_failed(failure)
            return
        self._failing = False
        if listed:
            self._out_since = None
            return
        self._missing(consumer, asked.at)

    def _missing(self, consumer: Any, at: float) -> None:
        name = self._identity(consumer) or "(no member id)"
        if self._out_since is None:
            self._out_since = at
            # INFO: a rejoin after an outage looks the same for a few seconds (QA 40-a).
            log.info("event=member_missing group=%s member=%s: this consumer holds no "
                     "partition and the group does not list it; renewed if it stays out "
                     "%.0f s", self._group, name, self._out_for_s)
        elif at - self._out_since >= self._out_for_s:
            detail = (f"the consumer held no partition and group {self._group} did not list "
                      f"member {name} for {at - self._out_since:.0f} s while the cluster "
                      "answered: librdkafka did not rejoin the group")
            raise MemberFenced(f"{detail}; exiting with {EXIT_RESTART} for the supervisor to "
                               "restart the process", detail=detail)

    def _give_up(self, asked: _Asked) -> None:
        self._asked = None
        self._hung.append(asked.answer)
        count_blocked(asked.answer)
        self._lookup_failed(TimeoutError(f"the lookup did not return in {GIVE_UP_S:.0f} s"))

    def _hung_too_many(self) -> bool:
        """Whether MAX_HUNG lookups given up still run: the group is not asked meanwhile."""
        self._hung = [answer for answer in self._hung if not answer.done()]
        too_many = len(self._hung) >= MAX_HUNG
        if too_many and not self._said_hung:
            log.warning("event=member_lookups_hung group=%s hung=%d: the group is not asked "
                        "again until one of them returns", self._group, len(self._hung))
        self._said_hung = too_many
        return too_many

    def _lookup_failed(self, failure: Exception) -> None:
        """An outage is librdkafka's to wait out: the consumer counts as listed."""
        if not self._failing:
            log.info("event=member_lookup_failed group=%s error=%r; the group's members "
                     "are asked again in %.0f s", self._group,
                     str(failure) or type(failure).__name__, CHECK_EVERY_S)
        self._failing = True
        self._out_since = None

    @classmethod
    def for_consumer(cls, consumer_config: Mapping[str, Any], admin_config: Mapping[str, Any],
                     topics: Sequence[str], factory: ListedFactory,
                     clock: Callable[[], float]) -> MembershipWatch:
        """The watch of a consumer built with `consumer_config` and subscribed to `topics`;
        `factory` makes the lookup of its group's members over `admin_config` (the same
        cluster and credentials)."""
        group = str(consumer_config["group.id"])
        return cls(factory(admin_config, group, topics), group=group,
                   identity=identity(consumer_config),
                   out_for_s=out_for_s(consumer_config, topics), clock=clock)
