"""Pure routing: config rules + OutboxEvent -> OutboundRecord (topic, key, partition, headers).

Which names a rendered topic may take is topic_names.py's (TopicGuard); match patterns are
patterns.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from cdc_router.debezium import OutboxEvent, Skipped
from cdc_router.errors import ConfigError, RouteError, show
from cdc_router.partitioner import java_default_partition
from cdc_router.patterns import compile_pattern
from cdc_router.serde.json import LONE_SURROGATE, utf8_encodable
from cdc_router.topic_names import TopicGuard, parse_topic_template, static_topic

if TYPE_CHECKING:
    from cdc_router.serde import Serializer
    from cdc_router.settings import RouteMatch, RouterConfig, RouteRule

UNMATCHED = "unmatched"  # Skipped.reason when no route matches and unmatched is 'skip'
# Headers the router writes itself; a route must not add a second header of the same name.
CONTRACT_HEADERS = frozenset({"id", "type", "aggregatetype", "aggregateid"})
CLOUDEVENTS_HEADERS = frozenset(
    {"ce_id", "ce_type", "ce_source", "ce_time", "ce_specversion", "content-type"}
)
# 0001-01-01T00:00:00Z and 10000-01-01T00:00:00Z, the ends of what RFC 3339 can write.
_RFC3339_START_MS = -62_135_596_800_000
_RFC3339_END_MS = 253_402_300_800_000


@dataclass(frozen=True)
class OutboundRecord:
    """What to produce for one event; partition None lets the producer choose."""

    topic: str
    key: bytes | None
    value: bytes
    partition: int | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int | None
    event_id: str
    route_index: int
    format: str


class _Matcher:
    """One RouteMatch compiled: every given condition must hold (any pattern of a list)."""

    def __init__(self, match: RouteMatch | None) -> None:
        def compiled(patterns: str | list[str] | None) -> list[Callable[[str], bool]] | None:
            if patterns is None:
                return None
            return [compile_pattern(p) for p in ([patterns] if isinstance(patterns, str)
                                                 else patterns)]

        self._aggregate_type = compiled(match.aggregate_type) if match else None
        self._type = compiled(match.type) if match else None
        self._headers = {name: compiled(p) or [] for name, p in
                         ((match.header or {}).items() if match else ())}

    def __call__(self, event: OutboxEvent) -> bool:
        if self._aggregate_type and not any(p(event.aggregate_type)
                                            for p in self._aggregate_type):
            return False
        if self._type and not any(p(event.type) for p in self._type):
            return False
        if self._headers:
            headers = dict(event.headers)
            for name, patterns in self._headers.items():
                if name not in headers or not any(p(headers[name]) for p in patterns):
                    return False
        return True


class Router:
    """The routing rules of one RouterConfig, compiled once; route() may do I/O: the Avro
    serializer asks the schema registry, partitions_for may ask the broker."""

    def __init__(self, config: RouterConfig,
                 serializers: dict[str, Serializer] | None = None) -> None:
        """Compile the rules; raises ConfigError for a format without a serializer."""
        self._config = config
        self._rules = list(config.routes)
        self._matchers = [_Matcher(rule.match) for rule in self._rules]
        self._templates = [parse_topic_template(rule.topic) for rule in self._rules]
        # A static topic was checked at load (settings.py); a rendered one is, per event.
        self._static = [static_topic(pieces) for pieces in self._templates]
        self._guard = TopicGuard.for_config(config)
        self._max_bytes = config.delivery.max_payload_bytes
        columns = config.source.outbox
        self._key_fields = [_key_field(rule.key, columns.model_dump(), index)
                            for index, rule in enumerate(self._rules)]
        self._serializers = build_serializers(config, serializers)

    def preflight(self) -> None:
        """Check, before the first event, what serializers need from outside (a registry).

        Raises a CdcRouterError that should stop the router: a schema missing from the
        registry is configuration, not a poison event.
        """
        for serializer in self._serializers.values():
            check = getattr(serializer, "preflight", None)
            if check is not None:
                check()

    def explain(self, event: OutboxEvent) -> tuple[int, RouteRule] | None:
        """The first route whose match takes `event` (index, rule), or None when none does."""
        for index, matcher in enumerate(self._matchers):
            if matcher(event):
                return index, self._rules[index]
        return None

    def route(self, event: OutboxEvent,
              partitions_for: Callable[[str], int]) -> OutboundRecord | Skipped:
        """The record to produce for `event`, or Skipped('unmatched') when configured so.

        `partitions_for(topic)` gives the destination's partition count (called only when the
        route computes the partition). Raises RouteError (no route and unmatched is
        'dead_letter', an illegal or reserved topic, a missing key column, a payload over
        delivery.max_payload_bytes) and SerializeError from the route's serializer.
        """
        found = self.explain(event)
        if found is None:
            if self._config.unmatched == "skip":
                return Skipped(UNMATCHED)
            raise RouteError(f"event {show(event.event_id)}: no route matches aggregate_type "
                             f"{show(event.aggregate_type)} type {show(event.type)}")
        index, rule = found
        topic = self.topic_for(event, index)
        key = self._key(event, index)
        value = self._serializers[rule.format].serialize(event, rule, topic)
        if len(value) > self._max_bytes:
            raise RouteError(f"event {show(event.event_id)}: payload of {len(value)} bytes is "
                             f"over delivery.max_payload_bytes ({self._max_bytes})")
        partition: int | None = None
        if rule.partition != "kafka_default":
            hashed = event.aggregate_id.encode() if rule.partition == "aggregate_id" else key
            partition = java_default_partition(hashed or b"", _partition_count(
                partitions_for, topic, event))
        if event.created_at_ms is not None and event.created_at_ms < 0:
            raise RouteError(f"event {show(event.event_id)}: created_at is before 1970, which "
                             "Kafka cannot store as a record timestamp")
        return OutboundRecord(topic=topic, key=key, value=value, partition=partition,
                              headers=_headers(event, rule), timestamp_ms=event.created_at_ms,
                              event_id=event.event_id, route_index=index, format=rule.format)

    def topic_for(self, event: OutboxEvent, index: int) -> str:
        """Render route `index`'s topic for `event`; RouteError when Kafka or TopicGuard
        refuses the name."""
        static = self._static[index]
        if static is not None:
            return static
        fields = {"aggregate_type": event.aggregate_type, "aggregate_id": event.aggregate_id,
                  "type": event.type, "id": event.event_id}
        topic = "".join(literal + (fields[field] if field else "")
                        for literal, field in self._templates[index])
        problem = self._guard.problem(topic)
        if problem:
            raise RouteError(f"event {show(event.event_id)}: routes[{index}] topic "
                             f"{show(self._rules[index].topic)} gives a name it may not "
                             f"write to: {problem}")
        return topic

    def _key(self, event: OutboxEvent, index: int) -> bytes:
        field = self._key_fields[index]
        if field == "id":
            return event.event_id.encode()
        if field == "aggregate_id":
            return event.aggregate_id.encode()
        if field in ("type", "aggregate_type"):
            return str(getattr(event, field)).encode()
        try:
            value = event.column(field)
        except KeyError:
            value = None
        if value is None:
            raise RouteError(f"event {show(event.event_id)}: key column {field!r} of "
                             f"routes[{index}] is missing or null in the row")
        if not utf8_encodable(value):
            raise RouteError(f"event {show(event.event_id)}: key column {field!r} of "
                             f"routes[{index}] holds {LONE_SURROGATE}")
        return value.encode()


def build_serializers(config: RouterConfig, given: dict[str, Serializer] | None = None
                      ) -> dict[str, Serializer]:
    """One serializer per route format of `config`, `given` ones first.

    Raises ConfigError naming the route whose format has no usable serializer.
    """
    from cdc_router.serde import serializer_for

    serializers = dict(given or {})
    for index, rule in enumerate(config.routes):
        if rule.format not in serializers:
            try:
                serializers[rule.format] = serializer_for(rule, config)
            except ConfigError as error:
                if error.field:  # already names the route's field at fault
                    raise
                raise ConfigError(str(error), field=f"routes[{index}].format") from None
    return serializers


def _key_field(key: str, columns: dict[str, str | None], index: int) -> str:
    """Resolve a route's `key` to an OutboxEvent field name, or a column of extra_columns."""
    if key in ("id", "aggregate_id"):
        return key
    by_column = {columns["id"]: "id", columns["aggregateid"]: "aggregate_id",
                 columns["aggregatetype"]: "aggregate_type", columns["type"]: "type"}
    if key in by_column:
        return by_column[key]
    if key in (columns["payload"], columns["headers"], columns["created_at"]):
        raise ConfigError("the payload, headers or created_at column cannot be the key",
                          field=f"routes[{index}].key", value=key,
                          hint="use id, aggregate_id or another column of the outbox table")
    return key


def _partition_count(partitions_for: Callable[[str], int], topic: str,
                     event: OutboxEvent) -> int:
    count = partitions_for(topic)
    if count < 1:
        raise RouteError(f"event {show(event.event_id)}: destination topic {topic!r} has no "
                         "partitions (does it exist?)")
    return count


def _headers(event: OutboxEvent, rule: RouteRule) -> tuple[tuple[str, bytes], ...]:
    """The contract headers, the row's own, the route's static ones, and CloudEvents."""
    headers = [("id", event.event_id), ("type", event.type),
               ("aggregatetype", event.aggregate_type), ("aggregateid", event.aggregate_id)]
    reserved = CONTRACT_HEADERS | (CLOUDEVENTS_HEADERS if rule.cloudevents else frozenset())
    for name, value in event.headers:
        if name in reserved:
            raise RouteError(f"event {show(event.event_id)}: row header {name!r} would shadow "
                             "a header the router writes; rename it in the headers column")
        if not name.isascii() and not utf8_encodable(name):
            raise RouteError(f"event {show(event.event_id)}: a header name in the headers "
                             f"column, {show(name)}, holds {LONE_SURROGATE}")
        headers.append((name, value))
    headers.extend(rule.headers.items())
    if rule.cloudevents:
        headers += [("ce_specversion", "1.0"), ("ce_id", event.event_id),
                    ("ce_type", event.type), ("ce_source", rule.ce_source or "")]
        if event.created_at_ms is not None:
            headers.append(("ce_time", _ce_time(event, event.created_at_ms)))
        content_type = "application/json" if event.payload_is_json else "application/octet-stream"
        headers.append(("content-type", content_type))
    try:
        return tuple((name, value.encode()) for name, value in headers)
    except UnicodeEncodeError:  # a row header's value: the others are checked text
        name = next(name for name, value in headers if not utf8_encodable(value))
        raise RouteError(f"event {show(event.event_id)}: header {show(name)} holds "
                         f"{LONE_SURROGATE}; fix the row's headers column") from None


def _ce_time(event: OutboxEvent, created_at_ms: int) -> str:
    try:
        return rfc3339(created_at_ms)
    except ValueError as error:
        raise RouteError(f"event {show(event.event_id)}: created_at cannot be CloudEvents' "
                         f"ce_time: {error}") from None


def rfc3339(epoch_ms: int) -> str:
    """Epoch milliseconds as RFC 3339 UTC with milliseconds: 2024-05-01T10:11:12.123Z.

    ValueError outside the years 1 to 9999: RFC 3339 writes a year with 4 digits.
    """
    if epoch_ms >= _RFC3339_END_MS:
        raise ValueError(f"{epoch_ms} ms since 1970 is after year 9999, and RFC 3339 "
                         "writes 4-digit years")
    if epoch_ms < _RFC3339_START_MS:
        raise ValueError(f"{epoch_ms} ms since 1970 is before year 1")
    moment = datetime.fromtimestamp(epoch_ms // 1000, tz=UTC)
    return f"{moment.year:04d}-{moment:%m-%dT%H:%M:%S}.{epoch_ms % 1000:03d}Z"
