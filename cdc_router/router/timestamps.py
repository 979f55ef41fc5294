"""Destination topics' timestamp and size limits, so that a row's created_at, or a record's
size, the broker would refuse is dead-lettered before it is produced.

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

Size too (QA 53-b F2): a topic refuses a record batch over its max.message.bytes (the broker's
message.max.bytes unless the topic sets its own; DescribeConfigs reports the one in force) with
MSG_SIZE_TOO_LARGE. Refused, a record costs its batch and the re-reads poison.py describes, and
with several instances writing to the topic at once that took minutes: a record that alone, in
a batch of its own, is over the limit (dead_letter.batch_size, uncompressed) is dead-lettered
instead, with the fix in its reason. Only when the producer does not compress (the router's
default): a compressed record over the limit may fit, and only the broker can tell.

The limits come from the topic's configuration (DescribeConfigs), cached per topic and read
again after LIMITS_TTL_S. A topic whose configuration cannot be read gets no check: the
broker's refusal, isolated as before, is still the safety net. The check keeps MARGIN_MS inside
each limit, because the broker compares with its own clock when the batch arrives, up to a
commit interval later, and clocks drift: a row within a minute of a limit is dead-lettered too.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import ConfigResource, ResourceType

from cdc_router.config.fields import list_config_items
from cdc_router.kafka.lookups import AdminConnection
from cdc_router.router.destinations import MAX_TOPICS, Describe, config_unreadable

log = logging.getLogger("cdc_router.router")

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

# librdkafka's default batch.size; a batch.size a topic's max.message.bytes takes keeps this
# much below it, for the batch's framing librdkafka counts and the broker too.
DEFAULT_BATCH_BYTES = 1_000_000
BATCH_SIZE_MARGIN = 100
# describe(topic, timeout_s): a topic's configuration; its factory takes the admin config.
DescribeFactory = Callable[[Mapping[str, Any]], Describe]
TIMESTAMP_HINT = ("; the row's created_at is outside what the broker accepts "
                  "(message.timestamp.before.max.ms / message.timestamp.after.max.ms): set "
                  "delivery.record_timestamp: now to deliver such rows with the router's clock")


def size_advice(size: int | None, limit: int | None, *, done: str = "") -> str:
    """The record's size against its topic's max.message.bytes, and what to do: the one
    wording of the check before producing (TopicLimits.size_problem) and of the broker's
    refusal (poison.refusal_reason). `size`: the uncompressed record's as the broker counts it
    (None: not known; with kafka.producer compression.type set the broker counts the
    compressed batch, which may be smaller); `limit`: None when not read; `done`: what the
    router did about it, said before the fix."""
    over = f"the record is {size} bytes as the broker counts it (key, value, headers and " \
        "the record batch's framing)" if size is not None else "the record is too large"
    over += f", over the topic's max.message.bytes ({limit})" if limit is not None else \
        ", over the topic's max.message.bytes (not readable here: see the topic's config)"
    return (f"{over}{f'; {done}' if done else ''}; raise the topic's max.message.bytes (and "
            "kafka.producer.message.max.bytes if the record is over it too) or make the event "
            "smaller, then `cdc-router dlq replay` it")


@dataclass(frozen=True)
class TopicLimits:
    """How far a record's timestamp may lie before and after the broker's clock (ms), and how
    large a record batch the topic takes."""

    before_ms: int
    after_ms: int
    retention_ms: int | None = None  # None: the topic does not delete by time
    max_message_bytes: int | None = None  # None: unknown, no check

    def size_problem(self, topic: str, size: int) -> str | None:
        """Why the broker would refuse a record of `size` bytes (dead_letter.batch_size) on
        `topic`; None when it fits."""
        limit = self.max_message_bytes
        if limit is None or size <= limit:
            return None
        return (f"Kafka would refuse the record for {topic} (MSG_SIZE_TOO_LARGE): "
                + size_advice(size, limit, done="dead-lettered before producing"))

    def problem(self, topic: str, timestamp_ms: int, now_ms: int) -> str | None:
        """Why the broker would refuse `timestamp_ms` on `topic` now, or delete it within
        minutes; None when neither."""
        retention = self.retention_ms
        if retention is not None:
            headroom = min(RETENTION_HEADROOM_MS, retention // 10)
            if timestamp_ms < now_ms - retention + headroom:
                return (f"its timestamp {_iso(timestamp_ms)} is "
                        f"{_age(now_ms - timestamp_ms)} old, within "
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


def _age(age_ms: int) -> str:
    """An age in the unit that reads best (QA 57-a F-5: a 90 s old row read "0.00 days")."""
    if age_ms < 120_000:
        return f"{age_ms // 1000} s"
    if age_ms < 7_200_000:
        return f"{age_ms // 60_000} min"
    if age_ms < 2 * 86_400_000:
        return f"{age_ms / 3_600_000:.1f} h"
    return f"{age_ms / 86_400_000:.2f} days"


def _margin(limit_ms: int) -> int:
    return min(MARGIN_MS, limit_ms // 10)


def producer_setting(configs: Sequence[Mapping[str, Any]], names: tuple[str, ...],
                     default: Any) -> Any:
    """What a producer of these librdkafka settings (a later mapping wins) has for the
    property `names` spells (its name, then its aliases: the first a mapping sets), else
    `default`."""
    value = default
    for config in configs:
        value = next((config[name] for name in names if name in config), value)
    return value


def compresses(*configs: Mapping[str, Any]) -> bool:
    """Whether a producer of these librdkafka settings (a later mapping wins) compresses its
    batches: compression.type, or its alias compression.codec, other than none."""
    return str(producer_setting(configs, ("compression.type", "compression.codec"),
                                "none")) != "none"


def batch_bytes(*configs: Mapping[str, Any]) -> int:
    """The batch.size of a producer of these librdkafka settings (a later mapping wins)."""
    return int(producer_setting(configs, ("batch.size",), DEFAULT_BATCH_BYTES))


class SmallTopics:
    """Warns once a topic whose max.message.bytes is below the producer's batch.size.

    The broker compares the limit with a whole batch, and librdkafka, which knows only its own
    batch.size, neither keeps a batch within a topic's limit nor splits a refused one (the Java
    producer does): checked on the stack, 40 records of 200 bytes produced at once to a topic
    of max.message.bytes 3000 were refused together, and delivered with batch.size 2900. Each
    such refusal is survivable (poison.py) but costs aborted batches (QA 53-b F2: requests of
    17 to 37 records refused, batch after batch, while a backlog was read)."""

    def __init__(self, *configs: Mapping[str, Any]) -> None:
        self._batch_bytes = batch_bytes(*configs)
        self._warned: set[str] = set()

    def __call__(self, topic: str, limits: TopicLimits) -> None:
        limit = limits.max_message_bytes
        if limit is None or limit >= self._batch_bytes or topic in self._warned:
            return
        self._warned.add(topic)
        log.warning("event=batch_over_topic_limit topic=%s max_message_bytes=%d batch_size=%d "
                    "hint='the broker refuses a batch of small records over the limit as a "
                    "whole, which aborts its transaction: set kafka.producer.batch.size below "
                    "%d, or raise the topic's max.message.bytes'", topic, limit,
                    self._batch_bytes, limit - BATCH_SIZE_MARGIN)


def limits_from_config(entries: Mapping[str, str]) -> TopicLimits | None:
    """The limits a topic's configuration sets; None when there is none to check (the broker
    stamps its own time and the size limit is unknown)."""
    size = entries.get("max.message.bytes")
    max_bytes = int(size) if size else None
    if entries.get("message.timestamp.type", "CreateTime") != "CreateTime":
        # The broker's own time: no timestamp to refuse, nor one older than the retention.
        return None if max_bytes is None else \
            TopicLimits(_UNLIMITED, _UNLIMITED, max_message_bytes=max_bytes)
    legacy = int(entries.get(_LEGACY_LIMIT, _UNLIMITED))
    retention = int(entries.get("retention.ms", -1))
    deletes = "delete" in list_config_items(entries.get("cleanup.policy", "delete"))
    return TopicLimits(int(entries.get("message.timestamp.before.max.ms", legacy)),
                           int(entries.get("message.timestamp.after.max.ms", legacy)),
                           retention if deletes and retention >= 0 else None, max_bytes)


# A forgotten entry's time: older than any TTL, so that it is read again.
_FORGOTTEN = float("-inf")


class TopicLimitsCache:
    """limits(topic): the topic's TopicLimits or None; cached, bounded, refreshed; `on_read`
    sees each topic's limits once a read (SmallTopics: not on every record's path)."""

    def __init__(self, describe: Describe, *,
                 max_topics: int = MAX_TOPICS,
                 clock: Callable[[], float] = time.monotonic,
                 on_read: Callable[[str, TopicLimits], None] | None = None) -> None:
        self._describe = describe
        self._on_read = on_read
        self._max_topics = max_topics
        self._clock = clock
        self._topics: OrderedDict[str, tuple[TopicLimits | None, float]] = OrderedDict()

    def __call__(self, topic: str) -> TopicLimits | None:
        now = self._clock()
        cached = self._topics.get(topic)
        if cached is not None and now - cached[1] < LIMITS_TTL_S:
            return cached[0]
        try:
            limits = limits_from_config(self._describe(topic, DESCRIBE_TIMEOUT_S))
        except (KafkaException, TimeoutError, ValueError) as error:
            # No check for a while; the broker's own refusal still isolates a bad row.
            config_unreadable(topic, error, "its timestamp and size limits; the broker's own "
                              "refusal still isolates a bad record")
            # A forgotten entry's limits are kept (reread 57-a F-3: a read failing after a
            # refusal turned the topic's size pre-check off for LIMITS_TTL_S).
            limits = cached[0] if cached is not None and cached[1] == _FORGOTTEN else None
        if limits is not None and self._on_read is not None:
            self._on_read(topic, limits)
        self._topics[topic] = (limits, now)
        self._topics.move_to_end(topic)
        while len(self._topics) > self._max_topics:
            self._topics.popitem(last=False)
        return limits

    def forget(self, topic: str) -> None:
        """Read `topic`'s limits again at its next look-up (the broker refused a record by a
        limit the cache does not have); a read that fails then keeps the limits known."""
        cached = self._topics.get(topic)
        if cached is not None:
            self._topics[topic] = (cached[0], _FORGOTTEN)


def admin_describe(admin_config: Mapping[str, Any]) -> Describe:
    """describe(topic, timeout_s): the topic's configuration, by an AdminClient made on first
    use (by the first destination topic's limits)."""
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
