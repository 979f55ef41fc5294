"""Avro schemas as the router holds them: .avsc files read and parsed once, per route.

A schema is parsed twice at load, by fastavro (what encodes and validates) and by Apache Avro
(as strict as the Java parser registries and most consumers run), so a file either side would
refuse is a ConfigError naming the file and the route's field before any event is read.

Also the one home of Avro's single-object encoding (no registry): 0xC3 0x01, the schema's
8-byte CRC-64-AVRO fingerprint (little-endian), then the body; readers find the schema by its
fingerprint.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import json
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import avro.errors
import avro.schema
import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from cdc_router.errors import ConfigError, printable
from cdc_router.serde.avro_bounds import empty_items_problem, varint_problem

if TYPE_CHECKING:
    from cdc_router.config.routes import RouteRule

SINGLE_OBJECT_MAGIC = b"\xc3\x01"  # Avro specification, "Single-object encoding"
SINGLE_OBJECT_HEADER = len(SINGLE_OBJECT_MAGIC) + 8
ANY_TYPE = "*"  # in a schema mapping: the schema for event types not listed
NAMED_TYPES = ("record", "enum", "fixed", "error")
# Avro specification, "Names": Apache Avro's Python parser checks it for type names but not for
# field names, which Java Avro and Confluent's registry (422) refuse.
_AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
    # What diagnostics work out once per part of the schema (by id of its parsed dict).
    memo: dict[Any, Any] = dataclasses.field(default_factory=dict, repr=False)

    def frame_single_object(self, body: bytes) -> bytes:
        """`body` behind Avro's single-object header for this schema."""
        return SINGLE_OBJECT_MAGIC + self.fingerprint + body


def load_schema(path: str | Path, field: str | None = None) -> AvroSchema:
    """Read and parse an .avsc file; ConfigError naming `field` and the file when it can't."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"Avro schema {printable(str(path))}: file not found", field=field,
                          hint="a relative path is relative to the config file's folder") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"Avro schema {printable(str(path))}: cannot read the file: {error}",
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
        apache_parse(text)
        canonical = to_parsing_canonical_form(document)
    except (avro.errors.AvroException, fastavro.schema.SchemaParseException,
            fastavro.schema.UnknownType, ValueError, TypeError, KeyError) as error:
        problem = _unknown_type(document, str(error.name)) \
            if isinstance(error, fastavro.schema.UnknownType) else str(error)
        raise ConfigError(f"Avro schema {where}: not a valid Avro schema: {problem}",
                          field=field) from None
    for path, record_name, field_name, _ in _field_names(document, []):
        if not _AVRO_NAME.fullmatch(field_name):
            raise ConfigError(
                f"Avro schema {where}: field {'.'.join(path)} of record {record_name}: "
                f"{field_name!r} is not a valid Avro name (a letter or _, then letters, digits "
                "or _), which Java Avro and the schema registry refuse", field=field,
                hint=f"rename the field, e.g. to {_valid_name(field_name)!r}")
    kind = document.get("type") if isinstance(document, dict) else None
    name = parsed.get("name") if isinstance(parsed, dict) and kind in NAMED_TYPES else None
    return AvroSchema(path=where, text=text, parsed=parsed, named=named, canonical=canonical,
                      fingerprint=bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")),
                      name=name)


def apache_parse(text: str) -> avro.schema.Schema:
    """Apache Avro's parse of a schema's JSON text, without its warnings for logical types it
    does not know (local-timestamp-millis): the schema is still valid, such a field reads as
    its underlying type, and the warning was two lines of Python on every `rules check` and
    start (review L2). AvroException when the schema is invalid."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", avro.errors.IgnoredLogicalType)
        return avro.schema.parse(text)


def _valid_name(name: str) -> str:
    """`name` made a valid Avro name: what a rename could be."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return name if _AVRO_NAME.fullmatch(name) else f"_{name}"


def _unknown_type(document: Any, name: str) -> str:
    """fastavro's UnknownType `name` (namespace-qualified) said as the field that names it and
    the primitive it may be a typo of (QA 55-c F-9: 'not a valid Avro schema: shop.lon')."""
    bare = name.rsplit(".", 1)[-1]
    uses = [".".join(path) for path, _, _, kind in _field_names(document, [])
            if {bare, name} & _referenced(kind)]
    near = difflib.get_close_matches(bare, _PRIMITIVES, n=1)
    return (f"{f'field {uses[0]!r} has ' if uses else ''}unknown type {bare!r} ("
            + (f"did you mean {near[0]!r}?)" if near else
               "neither a primitive type nor a named type defined before it)"))


def _referenced(kind: Any) -> set[str]:
    """The type names a field's type names directly: itself, a union's, array items', map
    values'."""
    if isinstance(kind, dict):
        kind = [kind.get("items"), kind.get("values")]
    return {name for name in (kind if isinstance(kind, list) else [kind])
            if isinstance(name, str)}


def _field_names(node: Any, path: list[str]) -> Iterator[tuple[list[str], str, str, Any]]:
    """Every field a schema document defines, nested ones included: its path (field names,
    `[]` for array items, `{}` for map values), its record's name, its name and its type."""
    if isinstance(node, list):  # a union
        for branch in node:
            yield from _field_names(branch, path)
        return
    if not isinstance(node, dict):  # a primitive or a reference to a named type
        return
    kind = node.get("type")
    if kind in ("record", "error"):
        for field in node.get("fields", []):
            name = str(field.get("name"))
            yield [*path, name], str(node.get("name")), name, field.get("type")
            yield from _field_names(field.get("type"), [*path, name])
    elif kind == "array":
        yield from _field_names(node.get("items"), [*path, "[]"])
    elif kind == "map":
        yield from _field_names(node.get("values"), [*path, "{}"])
    elif isinstance(kind, dict | list):  # {"type": {...}}: a schema in place of a name
        yield from _field_names(kind, path)


_PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")


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


def route_key(rule: RouteRule) -> Any:
    """What identifies a route's schemas: routes naming the same files share them."""
    spec = rule.schema_path
    return tuple(sorted(spec.items())) if isinstance(spec, dict) else spec


def unreadable(body: bytes, writer: AvroSchema) -> str | None:
    """Why an Avro `body` does not read whole with the writer schema; None if it does."""
    claimed = empty_items_problem(body, writer)  # before fastavro builds them one by one
    if claimed is not None:
        return claimed
    stream = io.BytesIO(body)
    try:
        fastavro.schemaless_reader(stream, writer.parsed, None)
    except Exception as error:  # fastavro's reader raises many types, all the body's fault
        return f"{type(error).__name__}: {str(error)[:200]}"
    left = len(body) - stream.tell()
    if left:
        return f"{left} bytes left over after the record"
    return varint_problem(body, writer)  # what fastavro reads, other readers may not
