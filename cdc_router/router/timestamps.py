"""Destination topics' timestamp limits, so that a row's created_at the broker would refuse is
dead-lettered before it is produced.

With `delivery.record_timestamp: created_at` a record carries its row's time, and a topic with
`message.timestamp.type=CreateTime` refuses a record whose timestamp lies further from the
broker's clock than `message.timestamp.before.max.ms` / `message.timestamp.after.max.ms`
(Kafka 4: one hour ahead by default). That refusal is survivable (router/poison.py isolates the
record), but in a transaction it costs two aborted batches and an epoch bump, during which the
stream stalled for about a minute (measured in the chaos campaign, seed 16). Checking the
documented rule first turns such a row into an ordinary dead letter on the spot.

Retention too: a topic that deletes by time (cleanup.policy delete) drops a record whose
timestamp is older than its retention.ms within minutes of its write (the broker rolls and
deletes a segment of such records at its next retention check, measured: 4 minutes). A row
whose created_at is that old, or within RETENTION_HEADROOM_MS of it, would be delivered and
then lost: it is dead-lettered instead, with the fix in its reason.

The limits come from the topic's configuration (DescribeConfigs), cached per topic and read
again after LIMITS_TTL_S. A topic whose configuration cannot be read gets no check: the
broker's refusal, isolated as before, is still the safety net. The check keeps MARGIN_MS inside
each limit, because the broker compares with its own clock when the batch arrives, up to a
commit interval later, and clocks drift: a row within a minute of a limit is dead-lettered too.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import ConfigResource, ResourceType

from cdc_router.config.fields import list_config_items
from cdc_router.kafka.lookups import AdminConnection
from cdc_router.router.destinations import MAX_TOPICS, Describe, config_unreadable

# The check stays this far inside a limit, but never more than a tenth of it: a topic that
# accepts 30 s ahead must not lose the rows of the current second.
MARGIN_MS = 60_000
# A topic's limits are read again after this long: an operator may change them while the router
# runs, and a stale limit only costs the broker's refusal path (isolated, slower), never a loss.
LIMITS_TTL_S = 300.0
# One DescribeConfigs, on the poll loop (a new destination topic, then every LIMITS_TTL_S): short
# enough against max.poll.interval.ms and the transaction's timeout, and a timeout only means
# no check for that topic until the next read.
DESCRIBE_TIMEOUT_S = 5.0
# Before Kafka 3.6 one symmetric limit; without it (and without the newer keys) there is none.
_LEGACY_LIMIT = "message.timestamp.difference.max.ms"
_UNLIMITED = 2**63 - 1
# A record must stay this long on its topic at least (never more than a tenth of the retention,
# so that a backlog on a short-retention topic still flows): time for consumers to read it.
RETENTION_HEADROOM_MS = 3_600_000
RETENTION_HINT = ("; set delivery.record_timestamp: now to deliver old rows with the router's "
                  "clock, or raise the topic's retention.ms")

# describe(topic, timeout_s): a topic's configuration; its factory takes the admin config.
DescribeFactory = Callable[[Mapping[str, Any]], Describe]
TIMESTAMP_HINT = ("; the row's created_at is outside what the broker accepts "
                  "(message.timestamp.before.max.ms / message.timestamp.after.max.ms): set "
                  "delivery.record_timestamp: now to deliver such rows with the router's clock")


@dataclass(frozen=True)
class TimestampLimits:
    """How far a record's timestamp may lie before and after the broker's clock (ms)."""

    before_ms: int
    after_ms: int
    retention_ms: int | None = None  # None: the topic does not delete by time

    def problem(self, topic: str, timestamp_ms: int, now_ms: int) -> str | None:
        """Why the broker would refuse `timestamp_ms` on `topic` now, or delete it within
        minutes; None when neither."""
        retention = self.retention_ms
        if retention is not None:
            headroom = min(RETENTION_HEADROOM_MS, retention // 10)
            if timestamp_ms < now_ms - retention + headroom:
                return (f"its timestamp {_iso(timestamp_ms)} is "
                        f"{(now_ms - timestamp_ms) / 86_400_000:.2f} days old, within "
                        f"{headroom // 1000} s of the retention.ms of {topic} ({retention}) or "
                        "beyond: Kafka would delete the record within minutes of writing it; "
                        f"dead-lettered before producing{RETENTION_HINT}")
        if now_ms - self.before_ms + MARGIN_MS < timestamp_ms < now_ms + self.after_ms - MARGIN_MS:
            # Inside both limits by more than any margin (_margin never exceeds MARGIN_MS):
            # the common case, and no refusal below could apply.
            return None
        if timestamp_ms > now_ms + self.after_ms - _margin(self.after_ms):
            side, limit, name = "ahead of", self.after_ms, "after"
        elif timestamp_ms < now_ms - self.before_ms + _margin(self.before_ms):
            side, limit, name = "behind", self.before_ms, "before"
        else:
            return None
        return (f"Kafka would refuse the record for {topic} (INVALID_TIMESTAMP): its timestamp "
                f"{_iso(timestamp_ms)} is {abs(timestamp_ms - now_ms) / 1000:.1f} s {side} the "
                f"clock, over the topic's message.timestamp.{name}.max.ms ({limit}) less a "
                f"{_margin(limit) / 1000:g} s margin; dead-lettered before producing"
                f"{_zone_hint(timestamp_ms - now_ms)}{TIMESTAMP_HINT}")


def _zone_hint(offset_ms: int) -> str:
    """A skew of whole hours (or half hours) is a time zone's (QA 31-a: a created_at written
    in Asia/Tokyo's local time was 9 h ahead, and the hint named only record_timestamp)."""
    hours = round(offset_ms / 1_800_000) / 2
    if 0 < abs(hours) <= 14 and abs(offset_ms - hours * 3_600_000) < 300_000:
        return (f"; {abs(hours):g} h {'ahead' if hours > 0 else 'behind'}, a time zone's "
                "offset: is created_at written in local time, not UTC (DEFAULT (now() AT "
                "TIME ZONE 'utc'), connectors/README.md)?")
    return ""


def _margin(limit_ms: int) -> int:
    return min(MARGIN_MS, limit_ms // 10)


def limits_from_config(entries: Mapping[str, str]) -> TimestampLimits | None:
    """The limits a topic's configuration sets; None when the broker stamps its own time."""
    if entries.get("message.timestamp.type", "CreateTime") != "CreateTime":
        return None
    legacy = int(entries.get(_LEGACY_LIMIT, _UNLIMITED))
    retention = int(entries.get("retention.ms", -1))
    deletes = "delete" in list_config_items(entries.get("cleanup.policy", "delete"))
    return TimestampLimits(int(entries.get("message.timestamp.before.max.ms", legacy)),
                           int(entries.get("message.timestamp.after.max.ms", legacy)),
                           retention if deletes and retention >= 0 else None)


class TopicTimestampLimits:
    """limits(topic): the topic's TimestampLimits or None; cached, bounded, refreshed."""

    def __init__(self, describe: Describe, *,
                 max_topics: int = MAX_TOPICS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._describe = describe
        self._max_topics = max_topics
        self._clock = clock
        self._topics: OrderedDict[str, tuple[TimestampLimits | None, float]] = OrderedDict()

    def __call__(self, topic: str) -> TimestampLimits | None:
        now = self._clock()
        cached = self._topics.get(topic)
        if cached is not None and now - cached[1] < LIMITS_TTL_S:
            return cached[0]
        try:
            limits = limits_from_config(self._describe(topic, DESCRIBE_TIMEOUT_S))
        except (KafkaException, TimeoutError, ValueError) as error:
            # No check for a while; the broker's own refusal still isolates a bad row.
            config_unreadable(topic, error, "its timestamp limits; the broker's own refusal "
                              "still isolates a bad record")
            limits = None
        self._topics[topic] = (limits, now)
        self._topics.move_to_end(topic)
        while len(self._topics) > self._max_topics:
            self._topics.popitem(last=False)
        return limits


def admin_describe(admin_config: Mapping[str, Any]) -> Describe:
    """describe(topic, timeout_s): the topic's configuration, by an AdminClient made on first
    use (a router whose records never carry their own timestamp never makes it)."""
    admin = AdminConnection(admin_config)

    def describe(topic: str, timeout_s: float) -> dict[str, str]:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        found = admin.answer(lambda client: client.describe_configs(
            [resource], request_timeout=timeout_s)[resource], timeout_s)
        return {name: entry.value for name, entry in found.items() if entry.value is not None}

    return describe


def _iso(timestamp_ms: int) -> str:
    try:
        return datetime.fromtimestamp(timestamp_ms / 1000, UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return f"{timestamp_ms} ms"
