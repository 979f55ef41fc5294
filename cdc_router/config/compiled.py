"""A RouterConfig compiled once: what routing needs per event, ready before the first one.

`compile_config()` turns each route into its matcher, parsed topic template, static topic and
key field, builds the name guard and one serializer per format. load_config() calls it, so a
config that loads has compiled; the router and `rules check --explain` reuse the result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdc_router.config.model import RouterConfig
from cdc_router.config.nats import SubjectGuard, parse_subject_template
from cdc_router.config.patterns import compile_pattern
from cdc_router.config.routes import KEY_ALIASES, RouteMatch, RouteRule
from cdc_router.config.topic_names import Template, TopicGuard, parse_topic_template, render_topic
from cdc_router.errors import ConfigError, show
from cdc_router.serde import Serializer, serializer_for

if TYPE_CHECKING:
    from cdc_router.router.debezium import OutboxEvent


class RouteMatcher:
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
        self._header_text = {name: [p] if isinstance(p, str) else list(p) for name, p in
                             ((match.header or {}).items() if match else ())}
        # No condition: every event matches (a catch-all route), known without a call.
        self.takes_all = not (self._aggregate_type or self._type or self._headers)

    def __call__(self, event: OutboxEvent) -> bool:
        if not self._takes_type(event):
            return False
        if self._headers:
            headers = dict(event.headers)
            for name, patterns in self._headers.items():
                if name not in headers or not any(p(headers[name]) for p in patterns):
                    return False
        return True

    def header_miss(self, event: OutboxEvent) -> str | None:
        """Why `event` misses this route on a header alone (its aggregate type and type
        match): the header, its value and the patterns; None when it matches or misses on
        its type (QA 55-a F-3: a dead letter read as if the type were not matched)."""
        if not self._headers or not self._takes_type(event):
            return None
        headers = dict(event.headers)
        for name, patterns in self._headers.items():
            wanted = ", ".join(map(repr, self._header_text[name]))
            if name not in headers:
                return f"the event has no header {show(name)} (the route wants {wanted})"
            if not any(p(headers[name]) for p in patterns):
                return f"header {show(name)} is {show(headers[name])}, not {wanted}"
        return None

    def _takes_type(self, event: OutboxEvent) -> bool:
        if self._aggregate_type and not any(p(event.aggregate_type)
                                            for p in self._aggregate_type):
            return False
        return not self._type or any(p(event.type) for p in self._type)


@dataclass(frozen=True)
class CompiledRoute:
    """One route of the config, ready to match and render."""

    index: int
    rule: RouteRule
    matches: RouteMatcher
    template: Template
    static_topic: str | None  # None: row data fills the template, checked per event
    key_field: str  # an OutboxEvent field (id, aggregate_id, type, aggregate_type) or a column
    nats: bool = False  # the template is a JetStream subject, not a Kafka topic
    key_others: tuple[str, ...] = ()  # the key column's later names over a rename; mostly none


@dataclass(frozen=True)
class CompiledConfig:
    """A RouterConfig and what compiling it gave; built once, by load_config() (or
    compile_config()), and handed to the router."""

    config: RouterConfig
    routes: tuple[CompiledRoute, ...]
    guard: TopicGuard
    serializers: Mapping[str, Serializer]  # one per route format
    subjects: SubjectGuard  # the JetStream routes' subjects


def compile_config(config: RouterConfig,
                   serializers: Mapping[str, Serializer] | None = None) -> CompiledConfig:
    """Compile `config`'s routes, topic guard and serializers (`serializers` given ones first).

    Makes no network call. Raises ConfigError naming the route's field: a key column that
    cannot be one, a format without a usable serializer (an Avro schema that cannot be read).
    """
    columns = config.source.outbox.fields  # column name -> its source.outbox field
    routes = []
    for index, rule in enumerate(config.routes):
        template = parse_subject_template(rule.nats.subject) if rule.nats is not None \
            else parse_topic_template(rule.destination)
        # A static topic was checked at load (config/model.py); a rendered one is, per event.
        keys = _key_fields(rule.key_names, columns, index)
        routes.append(CompiledRoute(index, rule, RouteMatcher(rule.match), template,
                                    render_topic(template, {}), keys[0], rule.nats is not None,
                                    key_others=keys[1:]))
    return CompiledConfig(config, tuple(routes), config.topic_guard(),
                          _serializers(config, serializers), config.subject_guard())


def _serializers(config: RouterConfig, given: Mapping[str, Serializer] | None
                 ) -> dict[str, Serializer]:
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


_EVENT_FIELDS = {"id": "id", "aggregateid": "aggregate_id", "aggregatetype": "aggregate_type",
                 "type": "type"}  # source.outbox field -> the OutboxEvent field it fills


def _key_fields(names: tuple[str, ...], columns: dict[str, str],
                index: int) -> tuple[str, ...]:
    """Resolve a route's `key` to an OutboxEvent field name, or columns of extra_columns: its
    names over a rename, the first with a value in a row (routing.py)."""
    fields = tuple(_key_field(name, columns, index) for name in names)
    if len(names) > 1:
        for name, field in zip(names, fields, strict=True):
            if name in KEY_ALIASES or field != name or name in columns:
                raise ConfigError(
                    "a key's list names one column over a rename (old and new), and this is "
                    "the event's own field or an outbox column, which every row has",
                    field=f"routes[{index}].key", value=name,
                    hint=f"key by {name} alone, or list only the renamed column's names")
    return fields


def _key_field(key: str, columns: dict[str, str], index: int) -> str:
    """Resolve one key name to an OutboxEvent field name, or a column of extra_columns."""
    if key in ("id", "aggregate_id"):
        return key
    field = columns.get(key)
    if field in _EVENT_FIELDS:
        return _EVENT_FIELDS[field]
    if field is not None:
        raise ConfigError("the payload, headers or created_at column cannot be the key",
                          field=f"routes[{index}].key", value=key,
                          hint="use id, aggregate_id or another column of the outbox table")
    return key
