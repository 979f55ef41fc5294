"""The router's consumer left out of its group while the cluster answers: renewed.

QA 39-c: after a broker outage of 60-75 s during which the other instance left, 2 times in 6
the remaining instance's consumer timed out its session (librdkafka's last line: SESSTMOUT
"... from the group coordinator (broker -1) ...: revoking assignment and rejoining group"),
gave its partitions up and never joined again. It polled on with no partition: the group stayed
empty, nothing was logged, nothing delivered, the process never ended; a restart recovered at
once. librdkafka tells nothing of it, so the router asks the group itself: while its consumer
holds no partition, every CHECK_EVERY_S it describes its group (an instance left without a
partition, when there are more instances than partitions, is a member too). When this
instance's group.instance.id is missing from every answer over out_for_s, and no lookup failed
in between (an outage is librdkafka's to wait out: it rejoins once the coordinator answers),
the consumer is replaced as a fenced static member is (MemberFenced: router/renewal.py's budget,
then exit 75 for the supervisor).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaException

from cdc_router.config.model import RouterConfig
from cdc_router.errors import EXIT_RESTART, MemberFenced
from cdc_router.kafka.lookups import AdminConnection
from cdc_router.router import clients

log = logging.getLogger("cdc_router.router")

# How often a consumer without partitions asks for its group's members, and the longest one
# such lookup holds the loop (it has no record to route meanwhile).
CHECK_EVERY_S = 10.0
LOOKUP_TIMEOUT_S = 5.0
# Missing from the group this many session timeouts in a row: a rejoin takes one heartbeat and a
# rebalance, and librdkafka asks for the coordinator every second while it has none.
SESSIONS_OUT = 3

Members = Callable[[float], set[str]]  # members(timeout_s): the group's group.instance.ids
MembersFactory = Callable[[Mapping[str, Any], str], Members]


def admin_members(admin_config: Mapping[str, Any], group: str) -> Members:
    """members(timeout_s) of `group` by DescribeGroups, an AdminClient made on first use and
    anew after a failed lookup (a long-lived one can keep stale metadata: kafka/lookups.py)."""
    admin = AdminConnection(admin_config)

    def members(timeout_s: float) -> set[str]:
        described = admin.answer(lambda client: client.describe_consumer_groups(
            [group], request_timeout=timeout_s)[group], timeout_s)
        return {m.group_instance_id for m in described.members if m.group_instance_id}

    return members


def membership_watch(config: RouterConfig, instance_id: str, factory: MembersFactory,
                     clock: Callable[[], float]) -> MembershipWatch:
    """The watch of the router's consumer, as clients.consumer_config builds it."""
    session_ms = int(clients.consumer_config(config, instance_id)["session.timeout.ms"])
    return MembershipWatch(factory(clients.common_config(config), config.source.group_id),
                           group=config.source.group_id, instance_id=instance_id,
                           session_timeout_ms=session_ms, clock=clock)


class MembershipWatch:
    """check(consumer) raises MemberFenced once `consumer` has been out of its group for
    out_for_s while the cluster answered; a new consumer starts the watch over."""

    def __init__(self, members: Members, *, group: str, instance_id: str, session_timeout_ms: int,
                 clock: Callable[[], float]) -> None:
        self._members = members
        self._group, self._instance_id = group, instance_id
        self._out_for_s = max(3 * CHECK_EVERY_S, SESSIONS_OUT * session_timeout_ms / 1000)
        self._clock = clock
        self._consumer: Any = None
        self._next_check = 0.0
        self._out_since: float | None = None

    def check(self, consumer: Any) -> None:
        now = self._clock()
        if consumer is not self._consumer:
            self._consumer, self._out_since = consumer, None
            self._next_check = now + CHECK_EVERY_S
        if now < self._next_check:
            return
        self._next_check = now + CHECK_EVERY_S
        if consumer.assignment() or self._member():
            self._out_since = None
            return
        if self._out_since is None:
            self._out_since = now
            log.warning("event=member_missing group=%s instance=%s: this consumer holds no "
                        "partition and the group does not list it; renewed if it stays out "
                        "%.0f s", self._group, self._instance_id, self._out_for_s)
        elif now - self._out_since >= self._out_for_s:
            detail = (f"the consumer held no partition and group {self._group} did not list "
                      f"instance {self._instance_id} for {now - self._out_since:.0f} s while "
                      "the cluster answered: librdkafka did not rejoin the group")
            raise MemberFenced(f"{detail}; exiting with {EXIT_RESTART} for the supervisor to "
                               "restart this router", detail=detail)

    def _member(self) -> bool:
        """Whether the group lists this instance; True when the lookup fails (no evidence)."""
        try:
            return self._instance_id in self._members(LOOKUP_TIMEOUT_S)
        except (KafkaException, TimeoutError) as failure:
            if self._out_since is not None:
                log.info("event=member_lookup_failed group=%s error=%r; the watch starts over",
                         self._group, str(failure))
            return True
