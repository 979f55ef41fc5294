"""Serializers: an OutboxEvent's payload -> the destination record's value, per route format.

Each format has one Serializer; `serializer_for(rule)` builds it once per Router. JSON is here;
Avro (issue 6) plugs in at serializer_for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from cdc_router.errors import ConfigError

if TYPE_CHECKING:
    from cdc_router.debezium import OutboxEvent
    from cdc_router.settings import RouteRule


class Serializer(Protocol):
    """Encodes one event for one destination topic."""

    def serialize(self, event: OutboxEvent, rule: RouteRule, topic: str) -> bytes:
        """The record value; raises SerializeError when the payload cannot be encoded."""
        ...


def serializer_for(rule: RouteRule) -> Serializer:
    """The serializer for `rule.format`; ConfigError for a format not supported yet."""
    if rule.format == "json":
        from cdc_router.serde.json import JsonSerializer

        return JsonSerializer()
    raise ConfigError(f"format {rule.format} is not supported yet (it comes with issue 6)",
                      hint="use format: json for now")
