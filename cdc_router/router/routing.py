"""Routing: a compiled config + OutboxEvent -> OutboundRecord (topic, key, partition, headers).

The rules are the config's: config/compiled.py compiles the routes once (matchers, templates,
key fields, serializers), config/topic_names.py says which names a rendered topic may take
(TopicGuard) and config/headers.py which headers the router reserves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from cdc_router.config.headers import (
    CLOUDEVENTS_CONTENT_TYPE,
    CLOUDEVENTS_PREFIX,
    CONTRACT_HEADERS,
    RESERVED_HEADERS,
    header_name_problem,
)
from cdc_router.config.nats import (
    JETSTREAM_MAX_HEADER_BYTES,
    msg_id_problem,
    nats_header_problem,
    nats_message_size,
)
from cdc_router.config.topic_names import render_topic
from cdc_router.config.utf8 import LONE_SURROGATE, utf8_encodable
from cdc_router.errors import RouteError, show
from cdc_router.router.debezium import OutboxEvent, Skipped
from cdc_router.router.missing_columns import MissingKeyColumn
from cdc_router.router.partitioner import java_default_partition
from cdc_router.router.values import quick_init

if TYPE_CHECKING:
    from cdc_router.config.compiled import CompiledConfig, CompiledRoute
    from cdc_router.config.routes import RouteRule
    from cdc_router.serde import Serializer

UNMATCHED = "unmatched"  # Skipped.reason when no route matches and unmatched is 'skip'
# 0001-01-01T00:00:00Z and 10000-01-01T00:00:00Z, the ends of what RFC 3339 can write.
_RFC3339_START_MS = -62_135_596_800_000
_RFC3339_END_MS = 253_402_300_800_000


@quick_init
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
    nats: bool = False  # `topic` is a JetStream subject: published, not produced


class Router:
    """The routes of one CompiledConfig applied to events.

    route() has no side effect of its own, but is not free: the route's serializer may ask the
    schema registry (first use of a subject), and partitions_for may ask the broker.
    """

    def __init__(self, compiled: CompiledConfig,
                 serializers: Mapping[str, Serializer] | None = None) -> None:
        """Route by `compiled`; `serializers` stand in for its own (the router's step wraps
        them). Costs nothing: compile_config() did the work."""
        self._config = compiled.config
        self._routes = compiled.routes
        self._guard = compiled.guard
        self._subjects = compiled.subjects
        self._nats_max_bytes = (compiled.config.nats.max_payload_bytes
                                if compiled.config.nats is not None else 0)
        self._max_bytes = compiled.config.delivery.max_payload_bytes
        # record_timestamp: now: the records carry the producer's clock, not created_at.
        self._created_at_stamps = compiled.config.delivery.record_timestamp == "created_at"
        self._serializers = compiled.serializers if serializers is None else serializers
        # Each route's static headers, encoded once (None: one is not UTF-8, and _headers
        # names it per event, as it always did).
        self._static_headers = tuple(_encoded(route.rule.headers) for route in self._routes)

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
        for route in self._routes:
            if route.matches.takes_all or route.matches(event):
                return route.index, route.rule
        return None

    def route(self, event: OutboxEvent,
              partitions_for: Callable[[str], int]) -> OutboundRecord | Skipped:
        """The record to produce for `event`, or Skipped('unmatched') when configured so.

        `partitions_for(topic)` gives the destination's partition count (called when the route
        computes the partition, and before an Avro serializer meets the topic). Raises
        RouteError (no route and unmatched is 'dead_letter', an illegal or reserved topic, a
        missing key column or topic, a Kafka payload over delivery.max_payload_bytes,
        a JetStream message over nats.max_payload_bytes) and
        SerializeError from the route's serializer.
        """
        found = self.explain(event)
        if found is None:
            if self._config.unmatched == "skip":
                return Skipped(UNMATCHED)
            misses = [f"routes[{route.index}] takes its types but {miss}"
                      for route in self._routes
                      if (miss := route.matches.header_miss(event)) is not None]
            raise RouteError(f"event {show(event.event_id)}: no route matches aggregate_type "
                             f"{show(event.aggregate_type)} type {show(event.type)}" +
                             "".join(f"; {miss}" for miss in misses))
        index, rule = found
        topic = self.topic_for(event, index)
        key = self._key(event, index)
        count: int | None = None
        if rule.format == "avro" and rule.nats is None:
            # Fuzz 32-c: an Avro serializer registers and caches a subject per topic; a topic
            # that does not exist must not reach it (nor blame its schema).
            count = _partition_count(partitions_for, topic, event)
        value = self._serializers[rule.format].serialize(event, rule, topic)
        if rule.nats is None and len(value) > self._max_bytes:  # JetStream: nats.max_payload_bytes
            raise RouteError(f"event {show(event.event_id)}: payload of {len(value)} bytes is "
                             f"over delivery.max_payload_bytes ({self._max_bytes}): raise it, "
                             "kafka.producer.message.max.bytes and the max.message.bytes of "
                             f"{topic} above the payload, or shrink it; then `cdc-router dlq "
                             "replay` it")
        headers = _headers(event, rule, self._static_headers[index])
        if rule.nats is not None:
            # JetStream: no partitions, and the headers travel as NATS header lines; its own
            # limit, nats.max_payload_bytes, not the Kafka producer's (QA 51-e F1).
            _check_nats_message(event, headers, value, self._nats_max_bytes)
            return OutboundRecord(topic=topic, key=key, value=value, partition=None,
                                  headers=headers, timestamp_ms=event.created_at_ms,
                                  event_id=event.event_id, route_index=index,
                                  format=rule.format, nats=True)
        partition: int | None = None
        if rule.partition != "kafka_default":
            hashed = event.aggregate_id.encode() if rule.partition == "aggregate_id" else key
            partition = java_default_partition(hashed or b"", count or _partition_count(
                partitions_for, topic, event))
        if self._created_at_stamps and event.created_at_ms is not None and \
                event.created_at_ms < 0:
            raise RouteError(f"event {show(event.event_id)}: created_at is before 1970, which "
                             "Kafka cannot store as a record timestamp; set "  # QA 48-a F-low-5
                             "delivery.record_timestamp: now to deliver such rows with the "
                             "router's clock, or write the event's time")
        return OutboundRecord(topic=topic, key=key, value=value, partition=partition,
                              headers=headers, timestamp_ms=event.created_at_ms,
                              event_id=event.event_id, route_index=index, format=rule.format)

    def topic_for(self, event: OutboxEvent, index: int) -> str:
        """Render route `index`'s topic for `event`; RouteError when Kafka or TopicGuard
        refuses the name."""
        route = self._routes[index]
        if route.static_topic is not None:
            return route.static_topic
        fields = {"aggregate_type": event.aggregate_type, "aggregate_id": event.aggregate_id,
                  "type": event.type, "id": event.event_id}
        topic = render_topic(route.template, fields) or ""  # every field is given
        problem = self._subjects.problem(topic) if route.nats else self._guard.problem(topic)
        if problem:
            what = "nats.subject" if route.nats else "topic"
            raise RouteError(f"event {show(event.event_id)}: routes[{index}] {what} "
                             f"{show(route.rule.destination)} gives a name it may not "
                             f"write to: {problem}")
        return topic

    def _key(self, event: OutboxEvent, index: int) -> bytes:
        route = self._routes[index]
        field = route.key_field
        if field == "id":
            return event.event_id.encode()
        if field == "aggregate_id":
            return event.aggregate_id.encode()
        if field in ("type", "aggregate_type"):
            return str(getattr(event, field)).encode()
        try:
            value = event.column(field)
        except KeyError:  # not NULL: no such column (QA 60-c F-2), the config's fault
            field, value = self._other_key(event, route, None)
        else:
            if value is None and route.key_others:  # an expand/contract's old column, null
                field, value = self._other_key(event, route, field)
        if value is None:
            raise RouteError(f"event {show(event.event_id)}: key column {field!r} of "
                             f"routes[{index}] is null in the row: the route needs a value "
                             "there in every row it takes (or another key; then `cdc-router "
                             "dlq replay` delivers this one)")
        if not utf8_encodable(value):
            raise RouteError(f"event {show(event.event_id)}: key column {field!r} of "
                             f"routes[{index}] holds {LONE_SURROGATE}")
        return value.encode()

    @staticmethod
    def _other_key(event: OutboxEvent, route: CompiledRoute,
                   null: str | None) -> tuple[str, str | None]:
        """A key column renamed (QA 63-a F-7): the first of its later names with a value in the
        row, else `null` (the first name, null there) or the first later one the row has."""
        for name in route.key_others:
            try:
                value = event.column(name)
            except KeyError:
                continue
            if value is not None:
                return name, value
            null = null or name
        if null is None:
            raise MissingKeyColumn(event, (route.key_field, *route.key_others), route.index)
        return null, None



def _check_nats_message(event: OutboxEvent, headers: tuple[tuple[str, bytes], ...],
                        value: bytes, max_bytes: int) -> None:
    """RouteError when NATS would refuse or misread the message: a header that cannot be a
    NATS header line, or a message over the server's max_payload (which would close the
    connection, stalling every batch)."""
    if event.event_id != event.event_id.strip():
        # QA 32-a: nats-py strips it from Nats-Msg-Id, and JetStream took ids that differ only
        # so for duplicates of one another: acked, dropped, their rows deleted.
        raise RouteError(f"event {show(event.event_id)}: the event id has whitespace at its "
                         "start or end, which the NATS client strips from Nats-Msg-Id: "
                         "JetStream would drop it as a duplicate of the id without it")
    problem = msg_id_problem(event.event_id)
    if problem:  # 54-m F-9: our JetStream consumer would dead-letter it (stage decode)
        raise RouteError(f"event {show(event.event_id)}: a JetStream consumer refuses this "
                         f"event id: {problem}; write event ids without U+FFFD, or route the "
                         "event to Kafka, which carries the id byte for byte")
    for name, raw in headers:
        problem = nats_header_problem(name, raw.decode())
        if problem:
            raise RouteError(f"event {show(event.event_id)}: {problem}")
    size = nats_message_size(value, event.event_id, headers)
    if size - len(value) >= JETSTREAM_MAX_HEADER_BYTES:  # QA 33-c: refused at publish, 10097
        raise RouteError(f"event {show(event.event_id)}: the NATS headers are "
                         f"{size - len(value)} bytes; JetStream takes fewer than "
                         f"{JETSTREAM_MAX_HEADER_BYTES} (a fixed limit): fewer or shorter "
                         "headers in the headers column")
    if size > max_bytes:
        raise RouteError(f"event {show(event.event_id)}: the NATS message of {size} bytes is "
                         f"over nats.max_payload_bytes ({max_bytes})")


def _partition_count(partitions_for: Callable[[str], int], topic: str,
                     event: OutboxEvent) -> int:
    count = partitions_for(topic)
    if count < 1:
        raise RouteError(f"event {show(event.event_id)}: destination topic {topic!r} has no "
                         "partitions (does it exist?)")
    return count


def _headers(event: OutboxEvent, rule: RouteRule,
             static: tuple[tuple[str, bytes], ...] | None) -> tuple[tuple[str, bytes], ...]:
    """The contract headers, the row's own but those the route sets, the route's static ones
    (`static`, encoded once per route), and CloudEvents."""
    row, cloudevents = event.headers, rule.cloudevents
    for name, _ in row:
        # is_reserved_header(name, cloudevents=cloudevents), tested here without a call (every
        # row header of every event): a new case goes there and here (test_routing_headers).
        if name in CONTRACT_HEADERS or name.startswith(CLOUDEVENTS_PREFIX) or \
                (cloudevents and name == CLOUDEVENTS_CONTENT_TYPE):
            raise RouteError(f"event {show(event.event_id)}: row header {name!r} is reserved "
                             f"for the router ({RESERVED_HEADERS}); rename it in the headers "
                             "column")
        if not name.isascii() and not utf8_encodable(name):
            raise RouteError(f"event {show(event.event_id)}: a header name in the headers "
                             f"column, {show(name)}, holds {LONE_SURROGATE}")
        if "\x00" in name:  # header_name_problem's case, tested here without a call
            raise RouteError(f"event {show(event.event_id)}: row header name {show(name)} "
                             f"{header_name_problem(name)}; fix the headers column")
    attributes = _cloudevents(event, rule) if cloudevents else []
    own = rule.headers
    try:
        # Encoded straight from the event's fields: one list, no intermediate text pairs.
        headers = [("id", event.event_id.encode()), ("type", event.type.encode()),
                   ("aggregatetype", event.aggregate_type.encode()),
                   ("aggregateid", event.aggregate_id.encode())]
        # A route's static header replaces a row header of its name (QA, session 30: both
        # went out, and which one a consumer saw depended on its client).
        if row:
            headers += [(name, value.encode()) for name, value in row
                        if not own or name not in own]
        headers += static if static is not None else _encoded_or_raise(own)
        if attributes:
            headers += [(name, value.encode()) for name, value in attributes]
    except UnicodeEncodeError:  # a row header's value: the others are checked text
        texts = [("id", event.event_id), ("type", event.type),
                 ("aggregatetype", event.aggregate_type), ("aggregateid", event.aggregate_id),
                 *row, *own.items(), *attributes]
        name = next(name for name, value in texts if not utf8_encodable(value))
        raise RouteError(f"event {show(event.event_id)}: header {show(name)} holds "
                         f"{LONE_SURROGATE}; fix the row's headers column") from None
    return tuple(headers)


def _cloudevents(event: OutboxEvent, rule: RouteRule) -> list[tuple[str, str]]:
    """The CloudEvents Kafka binding's headers (binary mode), as text."""
    headers = [("ce_specversion", "1.0"), ("ce_id", event.event_id),
               ("ce_type", event.type), ("ce_source", rule.ce_source or "")]
    if event.created_at_ms is not None:
        headers.append(("ce_time", _ce_time(event, event.created_at_ms)))
    # datacontenttype: what the record's value is (the route's encoding), not the column's.
    content_type = "application/avro" if rule.format == "avro" else \
        "application/json" if event.payload_is_json else "application/octet-stream"
    headers.append(("content-type", content_type))
    return headers


def _encoded_or_raise(headers: Mapping[str, str]) -> list[tuple[str, bytes]]:
    return [(name, value.encode()) for name, value in headers.items()]


def _encoded(headers: Mapping[str, str]) -> tuple[tuple[str, bytes], ...] | None:
    try:
        return tuple(_encoded_or_raise(headers))
    except UnicodeEncodeError:
        return None


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
