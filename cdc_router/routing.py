"""Pure routing: config rules + OutboxEvent -> OutboundRecord (topic, key, partition, headers).

Also the rules every destination name obeys (Kafka's, plus never an internal or one of the
router's own topics), topic templates and match patterns, which settings.py checks at load.
"""

from __future__ import annotations

import fnmatch
import re
import string
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from cdc_router.debezium import OutboxEvent, Skipped
from cdc_router.errors import ConfigError, RouteError
from cdc_router.partitioner import java_default_partition

if TYPE_CHECKING:
    from cdc_router.serde import Serializer
    from cdc_router.settings import RouteMatch, RouterConfig, RouteRule

UNMATCHED = "unmatched"  # Skipped.reason when no route matches and unmatched is 'skip'
MAX_TOPIC_LENGTH = 249
TOPIC_TEMPLATE_FIELDS = ("aggregate_type", "aggregate_id", "type", "id")
# Headers the router writes itself; a route must not add a second header of the same name.
CONTRACT_HEADERS = frozenset({"id", "type", "aggregatetype", "aggregateid"})
CLOUDEVENTS_HEADERS = frozenset(
    {"ce_id", "ce_type", "ce_source", "ce_time", "ce_specversion", "content-type"}
)
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
_REGEX_PREFIX = "re:"
_GLOB_CHARS = frozenset("*?[")


def show(value: object, limit: int = 80) -> str:
    """repr() of a value for a one-line message: escapes CR/LF, cuts long values."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def topic_name_problem(name: str, reserved: Collection[str] = (), *,
                       internal_ok: bool = False) -> str | None:
    """Why Kafka would refuse `name` as a destination topic, or None when it is fine.

    Kafka's rules (legal characters, length, `.`/`..`), plus ours: never an internal topic
    (any name starting with `__`, unless internal_ok), never one of `reserved` (the router's
    own topics).
    """
    if not name:
        return "a topic name cannot be empty"
    if len(name) > MAX_TOPIC_LENGTH:
        return f"a topic name has at most {MAX_TOPIC_LENGTH} characters, this one has {len(name)}"
    if name in (".", ".."):
        return f"{name!r} is not a legal topic name"
    if not _LEGAL_TOPIC.fullmatch(name):
        bad = "".join(sorted({ch for ch in name if not _LEGAL_TOPIC.fullmatch(ch)}))
        return (f"illegal characters {show(bad)} in topic {show(name)}; Kafka allows only "
                "ASCII letters, digits, '.', '_' and '-'")
    if name.startswith("__") and not internal_ok:
        return f"{show(name)} starts with '__', which marks Kafka's internal topics"
    if name in reserved:
        return (f"{name!r} is one of the router's own topics "
                "(source, dead-letter or dedup changelog)")
    return None


def parse_topic_template(template: str) -> tuple[tuple[str, str | None], ...]:
    """Split a topic template into (literal, field-or-None) pieces; ValueError when invalid.

    Fields are plain `{name}`s from TOPIC_TEMPLATE_FIELDS: no conversions, format specs, indexes
    or attributes (those would let a template reach into Python objects).
    """
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as error:
        raise ValueError(f"unbalanced braces in topic template: {error}") from None
    pieces: list[tuple[str, str | None]] = []
    for literal, field, spec, conversion in parsed:
        if literal:
            problem = topic_name_problem(literal)
            if problem and not literal.startswith("__") and literal not in (".", ".."):
                raise ValueError(problem)
        if field is None:
            pieces.append((literal, None))
            continue
        if field not in TOPIC_TEMPLATE_FIELDS or spec or conversion:
            allowed = ", ".join("{" + name + "}" for name in TOPIC_TEMPLATE_FIELDS)
            shown = "{" + field + ("!" + conversion if conversion else "")
            shown += (":" + spec if spec else "") + "}"
            raise ValueError(f"unknown template field {shown}; the fields are {allowed}")
        pieces.append((literal, field))
    return tuple(pieces)


def compile_pattern(pattern: str) -> Callable[[str], bool]:
    """A predicate for one match pattern: `re:<regex>` (full match), a glob, or an exact value.

    A pattern containing `*`, `?` or `[` is a glob (fnmatch, case-sensitive); one starting with
    `re:` is a Python regular expression that must match the whole value; anything else must be
    equal. Raises ValueError for a regex that does not compile.
    """
    if pattern.startswith(_REGEX_PREFIX):
        try:
            regex = re.compile(pattern[len(_REGEX_PREFIX):])
        except re.error as error:
            raise ValueError(f"invalid regular expression: {error}") from None
        return lambda value: regex.fullmatch(value) is not None
    if _GLOB_CHARS.intersection(pattern):
        glob = re.compile(fnmatch.translate(pattern))
        return lambda value: glob.match(value) is not None
    return lambda value: value == pattern


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
    """The routing rules of one RouterConfig, compiled once; route() is pure and cheap."""

    def __init__(self, config: RouterConfig,
                 serializers: dict[str, Serializer] | None = None) -> None:
        """Compile the rules; raises ConfigError for a format without a serializer."""
        self._config = config
        self._rules = list(config.routes)
        self._matchers = [_Matcher(rule.match) for rule in self._rules]
        self._templates = [parse_topic_template(rule.topic) for rule in self._rules]
        self._reserved = config.reserved_topics()
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
        """Render route `index`'s topic for `event`; RouteError when Kafka or we refuse it."""
        fields = {"aggregate_type": event.aggregate_type, "aggregate_id": event.aggregate_id,
                  "type": event.type, "id": event.event_id}
        topic = "".join(literal + (fields[field] if field else "")
                        for literal, field in self._templates[index])
        problem = topic_name_problem(topic, self._reserved)
        if problem:
            raise RouteError(f"event {show(event.event_id)}: routes[{index}] topic "
                             f"{show(self._rules[index].topic)} gives a bad name: {problem}")
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
        headers.append((name, value))
    headers.extend(rule.headers.items())
    if rule.cloudevents:
        headers += [("ce_specversion", "1.0"), ("ce_id", event.event_id),
                    ("ce_type", event.type), ("ce_source", rule.ce_source or "")]
        if event.created_at_ms is not None:
            headers.append(("ce_time", rfc3339(event.created_at_ms)))
        content_type = "application/json" if event.payload_is_json else "application/octet-stream"
        headers.append(("content-type", content_type))
    return tuple((name, value.encode()) for name, value in headers)


def rfc3339(epoch_ms: int) -> str:
    """Epoch milliseconds as RFC 3339 UTC with milliseconds: 2024-05-01T10:11:12.123Z."""
    moment = datetime.fromtimestamp(epoch_ms // 1000, tz=UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{epoch_ms % 1000:03d}Z"
