"""Avro: a JSON payload validated against its route's schema, encoded and framed.

Two framings, as the route's config says:
- with `schema_registry`: Confluent's wire format, written by confluent-kafka's AvroSerializer
  (magic byte 0, the 4-byte schema id, the body) under its subject-name strategies
  (serde/registry.py);
- without: Avro's single-object encoding (serde/avro_schema.py), encoded here.

Either way the payload is checked first (serde/avro_diagnostics.py): one that does not fit its
schema raises SerializeError naming the field, and is dead-lettered. What the registry refuses
or cannot answer is a RegistryError, which stops the router: no record is blamed for it; but a
subject missing from the registry that only an event's destination names (a template over its
data) is that event's dead letter.
A payload that is already bytes (bytea column) is passed through unchanged once its framing
is checked, its body reads with the schema it names, and (with a registry) that schema is a
version of the subject its topic takes.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import fastavro
from confluent_kafka.serialization import MessageField, SerializationContext

from cdc_router.config.topic_names import parse_template, render_topic
from cdc_router.errors import (
    ConfigError,
    PayloadDecodeError,
    RegistryError,
    SerializeError,
    show,
)
from cdc_router.serde.avro_diagnostics import json_unfillable, payload_problem
from cdc_router.serde.avro_framing import CONFLUENT_HEADER, CONFLUENT_MAGIC, unframed
from cdc_router.serde.avro_schema import (
    ANY_TYPE,
    SINGLE_OBJECT_HEADER,
    AvroSchema,
    RouteSchemas,
    load_schema,
    parse_schema_text,
    route_key,
    unreadable,
)
from cdc_router.serde.avro_subjects import PlannedSubject, shared_subjects
from cdc_router.serde.avro_union_schema import plain_dates
from cdc_router.serde.avro_unions import UnionWalk, union_walk, writer_datum
from cdc_router.serde.json import json_problem, lone_surrogate, parse_json, surrogate_message
from cdc_router.serde.registry import SchemaIds, subject_name
from cdc_router.serde.registry_answers import SLOW

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer as ValueSerializer

    from cdc_router.config.connections import SchemaRegistrySettings
    from cdc_router.config.routes import RouteRule
    from cdc_router.router.debezium import OutboxEvent

# Names other modules import from here, whose homes are the schema and diagnostics modules.
__all__ = ["CONFLUENT_HEADER", "CONFLUENT_MAGIC", "AvroSchema", "AvroSerializer",
           "PlannedSubject", "encode", "load_schema", "parse_schema_text", "payload_problem"]

log = logging.getLogger("cdc_router.serde")


# A schema registry's ids are Java ints.
_MAX_SCHEMA_ID = 2**31 - 1


class AvroSerializer:
    """Validates JSON payloads against their route's Avro schema and frames the Avro binary."""

    def __init__(self, routes: Sequence[RouteRule],
                 registry: SchemaRegistrySettings | None = None, *,
                 registry_client: SchemaRegistryClient | None = None,
                 looks_only: bool = False) -> None:
        """Parse every Avro route's schemas now (ConfigError naming the route); no network.
        looks_only: a plan's, registering nothing (registry.SchemaIds), framing a record
        whose schema auto_register would register with id 0 (never produced)."""
        self._routes: dict[Any, RouteSchemas] = {}
        self._ids = SchemaIds(registry, registry_client, looks_only=looks_only) \
            if registry is not None else None
        self._compiled: list[tuple[int, RouteRule, RouteSchemas]] = []
        # confluent-kafka's serializer and its context, per (topic, schema): each serializer
        # remembers one schema id, and a context is a topic's.
        self._wire: dict[tuple[str, int], tuple[ValueSerializer, SerializationContext]] = {}
        self._known: set[str] | None = None  # _known_subjects()
        for index, rule in enumerate(routes):
            if rule.format != "avro":
                continue
            compiled = self._compile(rule, f"routes[{index}].schema")
            self._compiled.append((index, rule, compiled))
            for schema in compiled.by_type.values() if self._ids is not None else ():
                # Measured: confluent-kafka 2.16's serializer fails on a bare "string" (an
                # AttributeError for every event), and writes {"type": "string"}.
                if isinstance(schema.parsed, str) and schema.text.startswith('"'):
                    raise ConfigError(
                        f"Avro schema {schema.path} is the bare primitive {schema.text}, which "
                        "the schema registry's serializer (confluent-kafka's) cannot write",
                        field=f"routes[{index}].schema",
                        hint=f'write it as {{"type": {schema.text}}}')
            if self._ids is not None and self._ids.strategy != "topic":
                for schema in compiled.by_type.values():
                    if schema.name is None:
                        raise ConfigError(
                            f"Avro schema {schema.path} has no name, which "
                            f"subject_name_strategy {self._ids.strategy} needs",
                            field=f"routes[{index}].schema",
                            hint="use a record schema, or subject_name_strategy: topic")

    @property
    def registry(self) -> SchemaIds | None:
        """The registry's schema ids, or None for single-object encoding."""
        return self._ids

    def schemas(self, rule: RouteRule) -> RouteSchemas:
        """The parsed schemas of `rule` (parsed on first use for a rule not seen yet)."""
        compiled = self._routes.get(route_key(rule))
        return compiled if compiled is not None else self._compile(rule, "schema")

    def _compile(self, rule: RouteRule, field: str) -> RouteSchemas:
        key = route_key(rule)
        if key not in self._routes:
            self._routes[key] = RouteSchemas(rule, field)
        return self._routes[key]

    def planned_subjects(self) -> list[PlannedSubject]:
        """Every schema of every Avro route, with its topic and subject where known."""
        planned = []
        for index, rule, compiled in self._compiled:
            # Checked at load: a topic, or a JetStream subject (the subject names the schema).
            pieces = parse_template(rule.destination, lambda _: None)
            for event_type, schema in compiled.by_type.items():
                known_type = None if event_type == ANY_TYPE else event_type
                # Known before any event: a static topic, or one over {type} alone.
                topic = render_topic(pieces, {} if known_type is None else {"type": known_type})
                subject = None
                if self._ids is not None and (topic is not None or self._ids.strategy == "record"):
                    subject = subject_name(self._ids.strategy, topic or "", schema.name)
                planned.append(PlannedSubject(index, known_type, schema, topic, subject))
        return planned

    def existing_subjects(self, subjects: Iterable[str]) -> list[PlannedSubject]:
        """Of the registry's `subjects`, those an event's data may name: for each schema whose
        subject is not known before any event, the ones its route's topic template renders
        (topic strategies). What `schemas register` registers a new version under."""
        if self._ids is None or self._ids.strategy == "record":
            return []
        rules = {index: rule for index, rule, _ in self._compiled}
        found = []
        for planned in self.planned_subjects():
            if planned.subject is not None:
                continue
            suffix = subject_name(self._ids.strategy, "", planned.schema.name)
            pattern = re.compile("".join(
                re.escape(literal) + ("" if field is None else re.escape(planned.event_type)
                                      if field == "type" and planned.event_type else r"\S+")
                for literal, field in parse_template(rules[planned.route].destination,
                                                     lambda _: None)) + re.escape(suffix))
            found += [PlannedSubject(planned.route, planned.event_type, planned.schema,
                                     subject.removesuffix(suffix), subject)
                      for subject in subjects if pattern.fullmatch(subject)]
        return found

    def serialize(self, event: OutboxEvent, rule: RouteRule, topic: str) -> bytes:
        """The framed Avro record value of `event` for `topic`.

        Raises SerializeError (the event is dead-lettered) when the payload is not JSON, fits
        no schema of the route, or already-encoded bytes lack the framing; RegistryError
        (the router stops) when the registry lacks the schema or cannot be asked.
        """
        if not event.payload_is_json:
            return self._pass_through(event, rule, topic)
        schema = self.schemas(rule).for_type(event.type)
        if schema is None:
            listed = ", ".join(sorted(self.schemas(rule).by_type))
            raise SerializeError(f"event {show(event.event_id)}: no Avro schema for event type "
                                 f"{show(event.type)} on {topic!r} (the route lists {listed}; "
                                 f"'{ANY_TYPE}' takes any other type)")
        try:
            datum = parse_json(event.payload)
        except (ValueError, UnicodeDecodeError) as error:
            raise SerializeError(f"event {show(event.event_id)}: payload for {topic!r} "
                                 f"{json_problem(error, event.payload)}") from None
        where = lone_surrogate(event.payload, datum)  # fastavro's UTF-8 encoding would fail
        if where is not None:
            raise SerializeError(surrogate_message(event, topic, where))
        walk = union_walk(schema)  # the union branches, found once for checks and encoding
        problem = payload_problem(datum, schema, rule.extra_fields, walk)
        if problem is not None:
            raise SerializeError(f"event {show(event.event_id)}: payload does not fit Avro "
                                 f"schema {schema.name or schema.path} for {topic!r}: {problem}")
        if self._ids is None:
            return schema.frame_single_object(_encode_record(event, datum, schema, topic, walk))
        return self._wire_format(event, datum, schema, topic, self._ids, walk)

    def _wire_format(self, event: OutboxEvent, datum: Any, schema: AvroSchema, topic: str,
                     ids: SchemaIds, walk: UnionWalk | None) -> bytes:
        """The registry's wire format of a datum that fits `schema`, by confluent-kafka."""
        if datum is None:
            # The library writes no value for None: a tombstone, which would delete the
            # event's key from a compacted topic instead of carrying a null payload.
            raise SerializeError(f"event {show(event.event_id)}: the payload for {topic!r} is "
                                 f"JSON null, which the registry's serializer writes as a "
                                 f"tombstone (no value); send a record instead")
        key = (topic, id(schema))  # the schema lives as long as this serializer
        if ids.refused and (refused := ids.refused.recall(key)) is not None:  # QA 55-c F-2
            _encode_record(event, datum, schema, topic, walk)  # its own fault first
            raise SerializeError(f"event {show(event.event_id)}: {refused}")
        wire = self._wire.get(key)
        if wire is None:
            wire = self._wire[key] = (ids.value_serializer(schema),
                                      SerializationContext(topic, MessageField.VALUE))
        serializer, context = wire
        try:
            # Its union branches decided: the library's writer is fastavro's (encode()).
            value = ids.serialized(key, serializer, writer_datum(datum, schema, walk), context,
                                   schema)
        except Exception as error:
            # One call asks the registry (first use of a subject) and encodes: blame the
            # record only if it cannot be encoded on its own.
            body = _encode_record(event, datum, schema, topic, walk)
            subject = subject_name(ids.strategy, topic, schema.name)
            action = "register" if ids.auto_register else "look up"
            failure = ids.failure(f"{action} {schema.path} under subject {subject!r}", error)
            if ids.stands_in(failure, subject, schema):
                return CONFLUENT_MAGIC + bytes(4) + body  # id 0: registered on the apply
            if (failure.missing or failure.incompatible or failure.refused) and \
                    subject not in self._known_subjects():
                # The subject comes from this event's destination (a template over its
                # data), so no start-up check could see it, and a restart would meet the same
                # answer: the event's, or one row would stop the stream for good. Missing,
                # refused as incompatible (another producer's subject, a new version not
                # registered yet), or any other definite 4xx about it (an invalid schema, a
                # per-subject 403; QA, session 29): a dead letter, to replay once the subject
                # is mended. An outage or refused credentials (401) stop the router.
                reason = f"{failure}; then `cdc-router dlq replay` it"
                if failure.missing or failure.incompatible:  # reread 55-r F-6: not a 403
                    ids.refused.remember(key, reason, SLOW.last_s)
                raise SerializeError(f"event {show(event.event_id)}: {reason}") from error
            raise failure from error
        assert value is not None  # None only for a None datum, refused above
        return value

    def _known_subjects(self) -> set[str]:
        """The subjects known before any event (preflight checks them)."""
        if self._known is None:
            self._known = {planned.subject for planned in self.planned_subjects()
                           if planned.subject is not None}
        return self._known

    def warnings(self) -> list[str]:
        """What `rules check` and the router's start warn about: schema fields no JSON payload
        can fill (serde/avro_diagnostics.json_unfillable)."""
        found = []
        for index, rule, compiled in self._compiled:
            for schema in compiled.by_type.values():
                fields = json_unfillable(schema)
                if fields:
                    found.append(
                        f"routes[{index}] ({rule.destination}): Avro schema {schema.path} has "
                        f"fields no JSON payload can fill (bytes, fixed or decimal): "
                        f"{', '.join(fields)}; a JSON payload that reaches one is dead-lettered "
                        "(a bytea payload, already encoded, passes through)")
        return found

    def check_subjects(self, source: str | None = None) -> None:
        """ConfigError when several schemas are planned under one subject (avro_subjects.py):
        `run`, `rules check` and `schemas register` refuse it before asking the registry."""
        if self._ids is not None and (shared := shared_subjects(self.planned_subjects())):
            raise ConfigError(next(iter(shared.values())), source=source,
                              field="schema_registry.subject_name_strategy",
                              value=self._ids.strategy)

    def preflight(self) -> None:
        """Resolve the ids of the subjects known before any event; RegistryError if one is
        missing (auto_register off) or the registry cannot be asked. Nothing to do without
        a registry. Logs warnings() first."""
        for warning in self.warnings():
            log.warning("event=avro_schema_warning detail=%r", warning)
        if self._ids is None:
            return
        # First, that the registry answers as one: a wrong URL was met only at a templated
        # topic's first event, and blamed on it (review 44-2 H1). A refusal in the registry's
        # words is an answer too: a principal with per-subject grants may not list them all.
        try:
            self._ids.subjects()
        except RegistryError as failure:
            if not (failure.refused or failure.missing):
                raise
        self.check_subjects()
        for planned in self.planned_subjects():
            if planned.subject is not None:
                self._ids.id_for(planned.subject, planned.schema)

    def _pass_through(self, event: OutboxEvent, rule: RouteRule, topic: str) -> bytes:
        """An already-encoded payload, unchanged, once its framing names a schema a reader can
        get (one of the route's; an id the registry holds under the topic's subject) and its
        body reads with it whole: a record no consumer can read is a dead letter here, not
        poison downstream."""
        value = event.payload
        self._framed(event, topic)
        where = f"event {show(event.event_id)}: the binary payload for {topic!r}"
        if self._ids is None:
            known = {schema.fingerprint: schema for schema in self.schemas(rule).by_type.values()}
            writer = known.get(value[2:SINGLE_OBJECT_HEADER])
            if writer is None:
                listed = ", ".join(schema.path for schema in known.values())
                raise SerializeError(f"{where} has fingerprint "
                                     f"{value[2:SINGLE_OBJECT_HEADER].hex()}, of none of the "
                                     f"route's schemas ({listed})")
            body = value[SINGLE_OBJECT_HEADER:]
        else:
            schema_id = int.from_bytes(value[1:CONFLUENT_HEADER], "big")
            if schema_id > _MAX_SCHEMA_ID:
                # Review 30: a registry answers such an id with a bare 404 (Java's int does not
                # hold it), which must stop the router for a wrong URL, not for one record.
                raise SerializeError(f"{where} names schema id {schema_id}, which no registry "
                                     f"holds (ids go up to {_MAX_SCHEMA_ID})")
            writer = self._registered_writer(schema_id, topic, where)
            body = value[CONFLUENT_HEADER:]
        problem = unreadable(body, writer)
        if problem is not None:
            raise SerializeError(f"{where} does not read with its schema: {problem}")
        return value

    def _registered_writer(self, schema_id: int, topic: str, where: str) -> AvroSchema:
        """The schema a framed payload's id names, once the registry holds it under
        the subject `topic`'s records take (as Confluent's broker-side schema validation
        asks): a reader that finds the subject's versions, or a broker that checks them,
        expects no other (review 45 M6)."""
        assert self._ids is not None
        subject = None
        try:
            writer = self._ids.writer_schema(schema_id)
            subject = subject_name(self._ids.strategy, topic, writer.name)
            if self._ids.holds(subject, schema_id):
                return writer
        except RegistryError as error:
            # As in _wire_format: a refused subject only this event's data names is its own.
            if subject is not None and error.refused and subject not in self._known_subjects():
                raise SerializeError(f"{where}: {error}; then `cdc-router dlq replay` it") \
                    from error
            if subject is not None or not error.missing:
                raise  # the registry's outage or a refusal of this router (a wrong URL)
            raise SerializeError(f"{where} names schema id {schema_id}, which the "
                                 "registry does not hold") from None
        except (PayloadDecodeError, ValueError) as error:  # not Avro; unnamed for "record"
            raise SerializeError(f"{where} names schema id {schema_id}: {error}") from None
        raise SerializeError(f"{where} names schema id {schema_id}, which is no version of "
                             f"subject {subject!r} ({self._ids.strategy} strategy): write it "
                             f"with one of that subject's versions, or register that schema "
                             f"under it; then `cdc-router dlq replay` it")

    def _framed(self, event: OutboxEvent, topic: str) -> None:
        problem = unframed(event.payload, registry=self._ids is not None)
        if problem is not None:
            raise SerializeError(f"event {show(event.event_id)}: the binary payload for "
                                 f"{topic!r} {problem}")


def _encode_record(event: OutboxEvent, datum: Any, schema: AvroSchema, topic: str,
                   walk: UnionWalk | None = None) -> bytes:
    """encode(), with what fastavro's writer still refuses after validation as the record's
    SerializeError (e.g. a decimal whose scale the schema does not allow)."""
    try:
        return encode(datum, schema, walk)
    except Exception as problem:  # fastavro's writer raises many types, all the datum's fault
        raise SerializeError(f"event {show(event.event_id)}: payload for {topic!r} cannot be "
                             f"encoded with Avro schema {schema.name or schema.path}: "
                             f"{show(str(problem), 200)}") from None


def encode(datum: Any, schema: AvroSchema, walk: UnionWalk | None = None) -> bytes:
    """The Avro binary body of a datum that fits `schema` (see payload_problem): fastavro's,
    given the union branches its writer would choose (serde/avro_unions.py), in time linear
    in the datum's size. `walk`: the datum's, if payload_problem made one."""
    out = io.BytesIO()
    # A date written as the int it is (serde/avro_unions.py): never a str parsed as one.
    fastavro.schemaless_writer(out, plain_dates(schema)[0],
                               writer_datum(datum, schema, walk, dates=False))
    return out.getvalue()
