"""Serializers: an OutboxEvent's payload -> the destination record's value, per route format.

Each format has one Serializer; `serializer_for(rule, config)` builds it once, when the config is
compiled (config/compiled.py). JSON passes payloads through (serde/json.py); Avro validates and
encodes them (serde/avro.py), for a schema registry's wire format or Avro's single-object
encoding.

    avro_schema.py       .avsc files loaded once per route; the single-object header
    avro_diagnostics.py  why a payload does not fit, naming the field; the extra-field check
    avro.py              the Avro serializer: validate, encode, frame
    registry.py          confluent-kafka's registry client, serializers and subject names
    decode.py            the consumer's side: any route format back to a value
    compatibility.py     `schemas check`: can the new schema read the old data
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from cdc_router.errors import ConfigError

if TYPE_CHECKING:
    from cdc_router.config.model import RouterConfig
    from cdc_router.config.routes import RouteRule
    from cdc_router.router.debezium import OutboxEvent


class Serializer(Protocol):
    """Encodes one event for one destination topic."""

    def serialize(self, event: OutboxEvent, rule: RouteRule, topic: str) -> bytes:
        """The record value; raises SerializeError when the payload cannot be encoded."""
        ...


def serializer_for(rule: RouteRule, config: RouterConfig | None = None) -> Serializer:
    """The serializer for `rule.format`, serving every route of `config` in that format.

    Makes no network call. Raises ConfigError (naming the route's field) for a schema that
    cannot be read or used, or a format without a serializer.
    """
    if rule.format == "json":
        from cdc_router.serde.json import JsonSerializer

        return JsonSerializer()
    if rule.format == "avro":
        from cdc_router.serde.avro import AvroSerializer

        if config is None:
            return AvroSerializer([rule])
        return AvroSerializer(config.routes, config.schema_registry)
    raise ConfigError(f"format {rule.format} has no serializer", hint="use json or avro")
