"""Avro: a JSON payload validated against its route's schema and encoded with fastavro.

Two framings, as the route's config says:
- with `schema_registry`: Confluent's wire format, magic byte 0, the 4-byte big-endian schema id,
  then the Avro binary body; ids come from the registry (serde/registry.py).
- without: Avro's single-object encoding, 0xC3 0x01, the schema's 8-byte CRC-64-AVRO
  fingerprint (little-endian), then the body. Readers find the schema by its fingerprint.

A payload that is already bytes (bytea column) is passed through unchanged once its framing
is checked. A payload that does not fit its schema raises SerializeError naming the field.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import avro.errors
import avro.schema
import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form
from fastavro.validation import ValidationError, validate
from fastavro.validation import _validate as validate_parsed  # takes the named types we hold

from cdc_router.errors import ConfigError, SerializeError, show
from cdc_router.serde.json import json_problem, lone_surrogate, parse_json, surrogate_message
from cdc_router.serde.registry import SchemaIds, subject_name
from cdc_router.topic_names import parse_topic_template

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from cdc_router.debezium import OutboxEvent
    from cdc_router.settings import RouteRule, SchemaRegistrySettings

SINGLE_OBJECT_MAGIC = b"\xc3\x01"  # Avro specification, "Single-object encoding"
SINGLE_OBJECT_HEADER = len(SINGLE_OBJECT_MAGIC) + 8
CONFLUENT_MAGIC = b"\x00"  # Confluent wire format: magic byte, then a 4-byte schema id
CONFLUENT_HEADER = len(CONFLUENT_MAGIC) + 4
ANY_TYPE = "*"  # in a schema mapping: the schema for event types not listed
_NAMED = ("record", "enum", "fixed", "error")
_VALIDATE_OPTIONS = {"strict": False, "disable_tuple_notation": False}  # validate()'s defaults


@dataclass(frozen=True, eq=False)
class AvroSchema:
    """One .avsc file, parsed once: what encoding, registering and checking it need."""

    path: str
    text: str  # the file as written: what a registry is given
    parsed: Any  # fastavro's parsed schema
    named: Mapping[str, Any]  # every named type it defines, by full name (fastavro's form)
    canonical: str  # Avro's Parsing Canonical Form
    fingerprint: bytes  # CRC-64-AVRO of the canonical form, little-endian, as in the header
    name: str | None  # full name of a named top-level schema: record subjects need it
    # Per record (by id of its parsed dict): field names, and the fields that can hold records.
    shapes: dict[int, Any] = dataclasses.field(default_factory=dict, repr=False)

    def frame_single_object(self, body: bytes) -> bytes:
        """`body` behind Avro's single-object header for this schema."""
        return SINGLE_OBJECT_MAGIC + self.fingerprint + body


def load_schema(path: str | Path, field: str | None = None) -> AvroSchema:
    """Read and parse an .avsc file; ConfigError naming `field` and the file when it can't."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"Avro schema {path}: file not found", field=field,
                          hint="a relative path is relative to the config file's folder") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"Avro schema {path}: cannot read the file: {error}",
                          field=field) from None
    return parse_schema_text(text, str(path), field)


def parse_schema_text(text: str, where: str, field: str | None = None) -> AvroSchema:
    """Parse an Avro schema's JSON text; ConfigError naming `where` (and `field`) when invalid."""
    text = text.strip()
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"Avro schema {where}: invalid JSON at line {error.lineno}, column "
                          f"{error.colno}: {error.msg}", field=field) from None
    named: dict[str, Any] = {}
    try:
        parsed = fastavro.parse_schema(document, named_schemas=named)
        # Apache Avro's parser is as strict as the Java one that registries and most
        # consumers run: it also refuses defaults that do not match their field's type.
        avro.schema.parse(text)
        canonical = to_parsing_canonical_form(document)
    except (avro.errors.AvroException, fastavro.schema.SchemaParseException,
            fastavro.schema.UnknownType, ValueError, TypeError, KeyError) as error:
        raise ConfigError(f"Avro schema {where}: not a valid Avro schema: {error}",
                          field=field) from None
    kind = document.get("type") if isinstance(document, dict) else None
    name = parsed.get("name") if isinstance(parsed, dict) and kind in _NAMED else None
    return AvroSchema(path=where, text=text, parsed=parsed, named=named, canonical=canonical,
                      fingerprint=bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")),
                      name=name)


class RouteSchemas:
    """The schema, or schemas by event type, of one Avro route."""

    def __init__(self, rule: RouteRule, field: str) -> None:
        spec = rule.schema_path
        if spec is None:
            raise ConfigError("format avro needs a schema file", field=field)
        files = {ANY_TYPE: spec} if isinstance(spec, str) else dict(spec)
        self.by_type = {event_type: load_schema(path, f"{field}[{event_type!r}]"
                                                if isinstance(spec, dict) else field)
                        for event_type, path in files.items()}

    def for_type(self, event_type: str) -> AvroSchema | None:
        """The schema for events of `event_type`, or None when the route has none for it."""
        return self.by_type.get(event_type) or self.by_type.get(ANY_TYPE)


def _route_key(rule: RouteRule) -> Any:
    spec = rule.schema_path
    return tuple(sorted(spec.items())) if isinstance(spec, dict) else spec


@dataclass(frozen=True)
class PlannedSubject:
    """One (route, event type, schema) and, when known before any event, its topic and subject.

    The topic is known when the route's topic template is a plain name, or uses only {type}
    and the schema is mapped to an event type; the subject also needs no topic under the
    record strategy. None: it depends on the event.
    """

    route: int
    event_type: str | None  # None: the route's one schema, for any type
    schema: AvroSchema
    topic: str | None
    subject: str | None


class AvroSerializer:
    """Validates JSON payloads against their route's Avro schema and frames the Avro binary."""

    def __init__(self, routes: Sequence[RouteRule],
                 registry: SchemaRegistrySettings | None = None, *,
                 registry_client: SchemaRegistryClient | None = None) -> None:
        """Parse every Avro route's schemas now (ConfigError naming the route); no network."""
        self._routes: dict[Any, RouteSchemas] = {}
        self._ids = SchemaIds(registry, registry_client) if registry is not None else None
        self._compiled: list[tuple[int, RouteRule, RouteSchemas]] = []
        for index, rule in enumerate(routes):
            if rule.format != "avro":
                continue
            compiled = self._compile(rule, f"routes[{index}].schema")
            self._compiled.append((index, rule, compiled))
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
        compiled = self._routes.get(_route_key(rule))
        return compiled if compiled is not None else self._compile(rule, "schema")

    def _compile(self, rule: RouteRule, field: str) -> RouteSchemas:
        key = _route_key(rule)
        if key not in self._routes:
            self._routes[key] = RouteSchemas(rule, field)
        return self._routes[key]

    def planned_subjects(self) -> list[PlannedSubject]:
        """Every schema of every Avro route, with its topic and subject where known."""
        planned = []
        for index, rule, compiled in self._compiled:
            pieces = parse_topic_template(rule.topic)
            fields = {field for _, field in pieces if field is not None}
            for event_type, schema in compiled.by_type.items():
                known_type = None if event_type == ANY_TYPE else event_type
                topic = None
                if not fields or (fields == {"type"} and known_type is not None):
                    topic = "".join(literal + (known_type or "") if field else literal
                                    for literal, field in pieces)
                subject = None
                if self._ids is not None and (topic is not None or self._ids.strategy == "record"):
                    subject = subject_name(self._ids.strategy, topic or "", schema.name)
                planned.append(PlannedSubject(index, known_type, schema, topic, subject))
        return planned

    def serialize(self, event: OutboxEvent, rule: RouteRule, topic: str) -> bytes:
        """The framed Avro record value of `event` for `topic`.

        Raises SerializeError (the event is dead-lettered) when the payload is not JSON, fits
        no schema of the route, or already-encoded bytes lack the framing; RegistryError
        (the router stops) when the registry lacks the schema or cannot be asked.
        """
        if not event.payload_is_json:
            return self._pass_through(event, topic)
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
                                 f"{json_problem(error)}") from None
        where = lone_surrogate(event.payload, datum)  # fastavro's UTF-8 encoding would fail
        if where is not None:
            raise SerializeError(surrogate_message(event, topic, where))
        problem = payload_problem(datum, schema, rule.extra_fields)
        if problem is not None:
            raise SerializeError(f"event {show(event.event_id)}: payload does not fit Avro "
                                 f"schema {schema.name or schema.path} for {topic!r}: {problem}")
        body = encode(datum, schema)
        if self._ids is None:
            return schema.frame_single_object(body)
        subject = subject_name(self._ids.strategy, topic, schema.name)
        schema_id = self._ids.id_for(subject, schema)
        return CONFLUENT_MAGIC + schema_id.to_bytes(4, "big") + body

    def preflight(self) -> None:
        """Resolve the ids of the subjects known before any event; RegistryError if one is
        missing (auto_register off) or the registry cannot be asked. Nothing to do without
        a registry."""
        if self._ids is None:
            return
        for planned in self.planned_subjects():
            if planned.subject is not None:
                self._ids.id_for(planned.subject, planned.schema)

    def _pass_through(self, event: OutboxEvent, topic: str) -> bytes:
        value = event.payload
        if self._ids is None:
            ok, framing = (value[:2] == SINGLE_OBJECT_MAGIC and len(value) > SINGLE_OBJECT_HEADER,
                           "Avro single-object encoding (0xC3 0x01 + fingerprint)")
        else:
            ok, framing = (value[:1] == CONFLUENT_MAGIC and len(value) > CONFLUENT_HEADER,
                           "the registry's wire format (byte 0 + schema id)")
        if not ok:
            raise SerializeError(f"event {show(event.event_id)}: the binary payload for "
                                 f"{topic!r} is not framed in {framing}; already-encoded "
                                 f"payloads pass through unchanged, so they must be framed "
                                 f"(starts with {value[:4].hex() or 'nothing'})")
        return value


def encode(datum: Any, schema: AvroSchema) -> bytes:
    """The Avro binary body of a datum that fits `schema` (see payload_problem)."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema.parsed, datum)
    return out.getvalue()


def payload_problem(datum: Any, schema: AvroSchema, extra_fields: str = "reject") -> str | None:
    """Why `datum` does not fit `schema`, naming the field; None when it does.

    Types and missing fields are fastavro's validation (a field is named as
    `namespace.Record.field`); keys the schema has no field for count only when
    extra_fields is 'reject' (fastavro's writer would silently leave them out).
    """
    # Raising validation builds an exception for every union branch it rules out, even for
    # a valid payload; ask the cheap way first and again only to say why.
    if not validate_parsed(datum, schema.parsed, schema.named, "", False, _VALIDATE_OPTIONS):
        try:
            validate(datum, schema.parsed, raise_errors=True)
        except ValidationError as error:
            return _describe(error)
    if extra_fields == "reject":
        extra = first_extra_field(datum, schema)
        if extra is not None:
            path, record = extra
            name = path.rsplit(".", 1)[-1].rsplit("[", 1)[0] if "." in path else path
            return (f"field '{record}.{_plain(name)}' is not in the schema (payload key "
                    f"{_plain(path)}; extra_fields: reject)")
    return None


def _plain(text: str, limit: int = 60) -> str:
    """A payload key as is, or escaped and cut when it would break the one-line reason."""
    return text if text.isprintable() and len(text) <= limit else show(text, limit)


def _describe(error: ValidationError) -> str:
    found = list(getattr(error, "errors", None) or ())
    if not found:
        return str(error)
    # Validation stops at the first field that fails; a union there reports one error per
    # branch, a record branch its nested field after its own. The last field reported is the
    # deepest: name it, with every type the union's branches would take there.
    deepest = found[-1]
    expected = " | ".join(dict.fromkeys(_type_name(entry.schema) for entry in found
                                        if entry.field == deepest.field))
    field = deepest.field or "(the payload)"
    if deepest.datum is None:
        return f"field {field!r} is missing or null, expected {expected}"
    return (f"field {field!r} is {type(deepest.datum).__name__} {show(deepest.datum, 60)}, "
            f"expected {expected}")


def _type_name(schema: Any) -> str:
    if isinstance(schema, list):
        return " | ".join(_type_name(branch) for branch in schema)
    if isinstance(schema, dict):
        kind = schema.get("type")
        if isinstance(kind, str) and kind in _NAMED and "name" in schema:
            return f"{kind} {schema['name']}"
        if schema.get("logicalType"):
            return f"{kind} ({schema['logicalType']})"
        if kind == "array":
            return f"array of {_type_name(schema.get('items'))}"
        if kind == "map":
            return f"map of {_type_name(schema.get('values'))}"
        return _type_name(kind)
    return str(schema)


def first_extra_field(datum: Any, schema: AvroSchema) -> tuple[str, str] | None:
    """(path, record name) of the first payload key no record field takes, or None.

    Walks the datum the way fastavro's writer does: a union branch is the first one the
    value validates against.
    """
    return _first_extra(datum, schema.parsed, schema, "")


def _first_extra(datum: Any, node: Any, schema: AvroSchema, path: str) -> tuple[str, str] | None:
    named = schema.named
    if isinstance(node, str):
        node = named.get(node, node)
    if isinstance(node, list):
        for branch in node:
            resolved = named.get(branch, branch) if isinstance(branch, str) else branch
            if isinstance(resolved, dict) and validate_parsed(datum, resolved, named, "", False,
                                                              _VALIDATE_OPTIONS):
                return _first_extra(datum, resolved, schema, path)
        return None
    if not isinstance(node, dict):
        return None
    kind = node.get("type")
    if kind in ("record", "error") and isinstance(datum, dict):
        names, nested = _record_shape(node, schema)
        if not names.issuperset(datum):
            for key in datum:
                if key not in names and key != "-type":  # -type: fastavro's union branch hint
                    return (f"{path}.{key}" if path else str(key)), str(node.get("name"))
        for name, field_type in nested:
            if name in datum:
                found = _first_extra(datum[name], field_type, schema,
                                     f"{path}.{name}" if path else name)
                if found is not None:
                    return found
    elif kind == "array" and isinstance(datum, list):
        for index, item in enumerate(datum):
            found = _first_extra(item, node["items"], schema, f"{path}[{index}]")
            if found is not None:
                return found
    elif kind == "map" and isinstance(datum, dict):
        for key, value in datum.items():
            found = _first_extra(value, node["values"], schema, f"{path}[{key!r}]")
            if found is not None:
                return found
    return None


def _record_shape(record: dict[str, Any],
                  schema: AvroSchema) -> tuple[frozenset[str], tuple[tuple[str, Any], ...]]:
    """A record's field names, and the fields whose values can hold records (walked)."""
    shape = schema.shapes.get(id(record))
    if shape is None:
        names = frozenset(field["name"] for field in record["fields"])
        nested = tuple((field["name"], field["type"]) for field in record["fields"]
                       if _can_hold_record(field["type"], schema.named, set()))
        shape = schema.shapes[id(record)] = (names, nested)
    return shape


def _can_hold_record(node: Any, named: Mapping[str, Any], seen: set[str]) -> bool:
    if isinstance(node, str):
        if node in seen or node not in named:
            return node in seen  # a recursive reference is a record's
        seen.add(node)
        node = named[node]
    if isinstance(node, list):
        return any(_can_hold_record(branch, named, seen) for branch in node)
    if not isinstance(node, dict):
        return False
    kind = node.get("type")
    if kind in ("record", "error"):
        return True
    if kind == "array":
        return _can_hold_record(node["items"], named, seen)
    if kind == "map":
        return _can_hold_record(node["values"], named, seen)
    return False
