"""The pure per-record step: decode -> replay check -> route -> serialize, one result per record.

It takes a raw record's values and returns a frozen result: Routed, Skipped, Duplicate or
DeadLettered. Any exception one record raises while it is decoded, routed or serialized (our
DecodeError, RouteError and SerializeError, but as well a library's own exception that no check
foresaw) is that record's dead letter, at the stage it failed, with its class and message: no
single row can stop the router.
Only failures that are no record's fault escape (PROCESS_LEVEL): configuration, the schema
registry, the Kafka cluster, memory.

Its two lookups are handed in, so that the router (cluster metadata, the replay filter) and
`cdc-router rules check --explain` (the config's topics) share every decision.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException

from cdc_router.dead_letter import Stage, batch_size, batch_size_bound, marks_delivery
from cdc_router.errors import (
    ConfigError,
    DecodeError,
    DeliveryError,
    FatalKafkaError,
    MissingColumn,
    RegistryError,
    RouteError,
    SerializeError,
    printable,
    show,
)
from cdc_router.router import debezium
from cdc_router.router.debezium import OutboxEvent
from cdc_router.router.destinations import missing_topic
from cdc_router.router.missing_columns import MissingColumns, MissingKeyColumn, MissingKeyColumns
from cdc_router.router.routing import OutboundRecord, Router
from cdc_router.router.timestamps import TopicLimits, compresses
from cdc_router.router.values import quick_init

if TYPE_CHECKING:
    from cdc_router.config.compiled import CompiledConfig
    from cdc_router.config.routes import RouteRule
    from cdc_router.serde import Serializer

# The ids of events that took longer than a transaction may live, kept (oldest out) to
# dead-letter them when their batch is read again: a handful in any real stream.
_SLOW_IDS = 1024
log = logging.getLogger("cdc_router.router")

# Failures that are not one record's: they stop the router (configuration, the registry, a
# fenced producer, memory) or fail the batch (the cluster), never dead-letter a record.
PROCESS_LEVEL: tuple[type[BaseException], ...] = (
    ConfigError, RegistryError, FatalKafkaError, DeliveryError, KafkaException, MemoryError)


@quick_init
@dataclass(frozen=True)
class Routed:
    """The record to produce for an event."""

    record: OutboundRecord
    event: OutboxEvent


@dataclass(frozen=True)
class Skipped:
    """A record with no event to deliver (tombstone, heartbeat, unmatched and 'skip', ...)."""

    reason: str
    detail: str = ""
    event: OutboxEvent | None = None


@dataclass(frozen=True)
class Duplicate:
    """An event whose id was already delivered: a replay, dropped."""

    event_id: str


@dataclass(frozen=True)
class DeadLettered:
    """A record that failed at `stage`; `error` is what it raised."""

    stage: Stage
    error: BaseException
    event_id: str | None = None
    event: OutboxEvent | None = None

    @property
    def shown_id(self) -> str:
        """The event id for a log line: unprintable characters escaped (errors.printable)."""
        return printable(str(self.event_id))

    @property
    def marked_id(self) -> str | None:
        """The id to mark delivered with the letter (dead_letter.marks_delivery), or None."""
        return self.event_id if marks_delivery(self.stage) else None


StepResult = Routed | Skipped | Duplicate | DeadLettered


def decode_letter(error: Exception) -> DeadLettered:
    """The dead letter of a record that failed to decode, with its event id when it was read."""
    return DeadLettered("decode", error, error.event_id if isinstance(error, DecodeError) else None)


class _SerializeFailed(Exception):
    """Carries a serializer's exception out of Router.route, to name the stage."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _Staged:
    """A serializer whose record-level failures are told apart from the routing's."""

    def __init__(self, inner: Serializer) -> None:
        self._inner = inner

    def serialize(self, event: OutboxEvent, rule: RouteRule, topic: str) -> bytes:
        try:
            return self._inner.serialize(event, rule, topic)
        except PROCESS_LEVEL:
            raise
        except Exception as error:
            raise _SerializeFailed(error) from error

    def preflight(self) -> None:
        check = getattr(self._inner, "preflight", None)
        if check is not None:
            check()


def _never(event_id: str) -> bool:
    return False


class _SlowDecodes:
    """Raw records that took longer than a transaction to decode: how often, how long, their
    event id. Found again by length, then by a digest of topic, key and value, so that no
    other record pays for the digest."""

    def __init__(self) -> None:
        self.lengths: set[int] = set()  # of the values found: only those are digested
        self._found: OrderedDict[bytes, tuple[int, float, str, int]] = OrderedDict()

    def get(self, topic: str, key: bytes | None,
            value: bytes | None) -> tuple[int, float, str] | None:
        if len(value or b"") not in self.lengths:
            return None
        found = self._found.get(_digest(topic, key, value))
        return None if found is None else found[:3]

    def add(self, topic: str, key: bytes | None, value: bytes | None, took_s: float,
            event_id: str) -> tuple[int, float, str]:
        """One more slow decode of the record: (times, this one's seconds, its event id)."""
        digest = _digest(topic, key, value)
        times = self._found.pop(digest, (0, 0.0, "", 0))[0] + 1
        log.warning("event=slow_record id=%s decode_s=%.1f times=%d", show(event_id), took_s,
                    times)
        length = len(value or b"")
        self._found[digest] = (times, took_s, event_id, length)
        self.lengths.add(length)
        if len(self._found) > _SLOW_IDS:  # the oldest out, and its length unless shared
            self._found.popitem(last=False)
            self.lengths = {found[3] for found in self._found.values()}
        return times, took_s, event_id


def _digest(topic: str, key: bytes | None, value: bytes | None) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    for part in (topic.encode(), key or b"", value or b""):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.digest()


class RecordStep:
    """One compiled config's per-record decisions.

    `partitions_for(topic)` is a destination's partition count, None when it does not exist (a
    dead letter at stage route, with `missing(topic)` as the reason); `seen(event_id)` says
    whether the replay filter knows the id.
    """

    def __init__(self, compiled: CompiledConfig, partitions_for: Callable[[str], int | None],
                 *, seen: Callable[[str], bool] = _never,
                 missing: Callable[[str], str] = missing_topic,
                 timestamp_limits: Callable[[str], TopicLimits | None] | None = None,
                 clock: Callable[[], float] = time.time,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        """Reuses what compile_config() built; only wraps its serializers to name the stage.
        `timestamp_limits` (router/timestamps.py) dead-letters a created_at, or a record's size,
        the destination topic would refuse, before it is produced; `timer` times each event's
        route()."""
        config = compiled.config
        self._timer = timer
        # Only a transaction expires (exactly once); at least once has none to outlast.
        self._slow_s = config.delivery.transaction_timeout_ms / 1000 \
            if config.delivery.guarantee == "exactly_once" else float("inf")
        self._slow: OrderedDict[str, tuple[int, float]] = OrderedDict()  # id -> (times, s)
        self._slow_decodes = _SlowDecodes()
        self._missing_columns = MissingColumns(config.source.outbox)
        self._key_columns = MissingKeyColumns()  # a route's key column no event has
        staged: dict[str, Serializer] = {name: _Staged(serializer) for name, serializer in
                                         compiled.serializers.items()}
        self._router = Router(compiled, staged)
        self._source = config.source
        self._partitions_for = partitions_for
        self._seen = seen
        self._missing = missing
        self._created_at = config.delivery.record_timestamp == "created_at"
        self._limits = timestamp_limits
        # A compressed batch may fit where the record does not: only the broker can tell.
        self._sized = not compresses(config.kafka.config, config.kafka.producer)
        self._clock = clock

    def preflight(self) -> None:
        """What serializers need from outside (a registry), checked before the first record."""
        self._router.preflight()

    def explain(self, event: OutboxEvent) -> tuple[int, RouteRule] | None:
        """The route that takes `event` (index, rule), or None."""
        return self._router.explain(event)

    def __call__(self, topic: str, key: bytes | None, value: bytes | None) -> StepResult:
        """Decode, check for a replay, route and serialize one raw record. Decoding is timed
        with the rest (route()): a change event that takes longer than a transaction to read
        (review 47-a: 13.5 MB of doubles of big exponents, 23 s) would have its batch expire
        at every read; read twice so, it is dead-lettered unread the next time."""
        slow = self._slow_decodes.get(topic, key, value) if self._slow_decodes.lengths else None
        if slow is not None and slow[0] >= 2:
            return self._slow_decode_letter(*slow[1:])
        started = self._timer()
        try:
            decoded = debezium.decode_change(key, value, topic=topic, settings=self._source)
        except PROCESS_LEVEL:
            raise
        except Exception as error:
            if isinstance(error, MissingColumn):
                self._missing_columns.missing(topic, error)  # ConfigError after a run of them
            return decode_letter(error)
        if isinstance(decoded, debezium.Skipped):
            return Skipped(decoded.reason, decoded.detail)
        if self._missing_columns.runs or topic not in self._missing_columns.decoded:
            self._missing_columns.read(topic)
        decoding_s = self._timer() - started
        if decoding_s > self._slow_s:
            slow = self._slow_decodes.add(topic, key, value, decoding_s, decoded.event_id)
            if slow[0] >= 2:  # as soon as it is known (review 47-f: not route()'s letter)
                return self._slow_decode_letter(*slow[1:])
        return self.event(decoded, started)

    def _slow_decode_letter(self, took_s: float, event_id: str) -> DeadLettered:
        """The letter of a record read twice longer than a transaction may live."""
        error = DecodeError(f"decoding it took {took_s:.1f} s, twice longer than "
                            f"delivery.transaction_timeout_ms ({self._slow_s:g} s): its "
                            "batch's transaction expired, as it would at every retry; make "
                            "the row cheaper to read (fewer or smaller values)")
        error.event_id = event_id
        return decode_letter(error)

    def event(self, event: OutboxEvent, started: float | None = None) -> StepResult:
        """Check one decoded event for a replay, then route and serialize it: the step after
        decoding, shared by the router and the relay (which reads rows, not change events)."""
        if self._seen(event.event_id):
            return Duplicate(event.event_id)
        return self.route(event, started)

    def decoded(self, decode: Callable[[], OutboxEvent]) -> StepResult:
        """The step for an event decoded otherwise than from a change record (a relay's row,
        a relay's dead letter): a failure of `decode` is the record's decode letter."""
        try:
            event = decode()
        except PROCESS_LEVEL:
            raise
        except Exception as error:
            return decode_letter(error)
        return self.event(event)

    def route(self, event: OutboxEvent, started: float | None = None) -> StepResult:
        """Route and serialize one decoded event. One that took longer than its batch's
        transaction may live, twice (once may be a stopped process, a paused VM), is a dead
        letter (review 44-2: an Avro schema recursive through a union took 74 s for one
        165 KB payload; its batch's transaction expired, was aborted and read again, for
        ever). Wall time, not CPU: under a CPU limit the transaction expires all the same."""
        times, took = self._slow.get(event.event_id, (0, 0.0))
        if times < 2:
            started = self._timer() if started is None else started  # or when decoding began
            result = self._route(event)
            elapsed = self._timer() - started
            if elapsed <= self._slow_s:
                return result
            times, took = times + 1, elapsed
            log.warning("event=slow_record id=%s took_s=%.1f times=%d", show(event.event_id),
                        took, times)
            self._slow[event.event_id] = (times, took)
            if len(self._slow) > _SLOW_IDS:
                self._slow.popitem(last=False)
            if times < 2:
                return result
        return DeadLettered("serialize", SerializeError(
            f"event {show(event.event_id)}: decoding, routing and serializing it took "
            f"{took:.1f} s, twice longer than delivery.transaction_timeout_ms "
            f"({self._slow_s:g} s): its batch's transaction expired, as it would at every "
            "retry; make its payload cheaper to encode (an Avro schema recursive through a "
            "union costs its depth times its size), then `cdc-router dlq replay` it"),
            event.event_id, event)

    def _route(self, event: OutboxEvent) -> StepResult:
        if self._key_columns.runs:  # a route's events lacked its key column: does this one?
            found = self._router.explain(event)
            self._key_columns.read(event, found[0] if found is not None else None)
        try:
            routed = self._router.route(event, self._partition_count)
            # A computed partition has asked for the topic already (and found it); a
            # JetStream subject has no partitions to ask for.
            if isinstance(routed, OutboundRecord) and not routed.nats and \
                    routed.partition is None and \
                    self._partitions_for(routed.topic) is None:
                raise RouteError(self._missing(routed.topic))
        except _SerializeFailed as failed:
            return DeadLettered("serialize", failed.error, event.event_id, event)
        except PROCESS_LEVEL:
            raise
        except Exception as error:
            if isinstance(error, MissingKeyColumn):
                self._key_columns.missing(error)  # ConfigError after a run of them
            return DeadLettered("route", error, event.event_id, event)
        if isinstance(routed, debezium.Skipped):
            return Skipped(routed.reason, routed.detail, event)
        if not self._created_at or routed.timestamp_ms == 0:
            # delivery.record_timestamp: now: no explicit timestamp, the producer's clock; a
            # created_at of 1970-01-01 (the relay's: `run` dead-letters it) gets it too, as
            # confluent-kafka reads a timestamp 0 as "now": the limits judge the record's time.
            routed = replace(routed, timestamp_ms=None)
        limits = self._limits(routed.topic) if self._limits and not routed.nats else None
        if limits is None:
            return Routed(routed, event)
        problem = None
        limit = limits.max_message_bytes
        if self._sized and limit is not None and \
                batch_size_bound(routed.key, routed.value, routed.headers) > limit:
            problem = limits.size_problem(routed.topic, batch_size(routed.key, routed.value,
                                                                   routed.headers))
        if not problem and routed.timestamp_ms is not None:
            problem = limits.problem(routed.topic, routed.timestamp_ms,
                                     int(self._clock() * 1000))
        if problem:
            return DeadLettered("produce", DeliveryError(problem), event.event_id, event)
        return Routed(routed, event)

    def _partition_count(self, topic: str) -> int:
        count = self._partitions_for(topic)
        if count is None:
            raise RouteError(self._missing(topic))
        return count
