"""What a schema's unions ask of the writer and the checks, found once per schema.

A `date` is made a plain int (plain_dates, see serde/avro_unions.py's module doc), a part of
the schema (a union branch) is parsed on its own with the schema's named types (fits), and
whether a union that a subtree could take is in the schema at all (has_container_unions,
has_decided_unions): without one, nothing is walked. Each is memoised on the AvroSchema.
"""

from __future__ import annotations

import json
from typing import Any

import fastavro
from fastavro.validation import validate

from cdc_router.serde.avro_schema import AvroSchema

RECORDS = ("record", "error", "request")  # what fastavro's validation takes as a record
CONTAINERS = ("record", "error", "array", "map")
PLAIN_DATE = "cdc-router.date"  # what a date's logicalType becomes in plain_dates()


def fits(datum: Any, schema: AvroSchema, part: Any = None) -> bool:
    """Whether `datum` validates against `schema`, or against `part` of it (a union branch),
    by fastavro's own validation."""
    # Raising validation builds an exception for every union branch it rules out, even for
    # a valid payload: ask the cheap way first, and again with errors only to say why.
    return bool(validate(datum, plain_dates(schema)[0] if part is None
                         else _standalone(part, schema), raise_errors=False))


def plain_dates(schema: AvroSchema) -> tuple[Any, dict[str, Any]]:
    """`schema` parsed with each `date` an int (its logicalType kept as PLAIN_DATE), and its
    named types: what fastavro validates and writes a JSON payload with (module doc)."""
    found: tuple[Any, dict[str, Any]] | None = schema.memo.get("plain_dates")
    if found is None:
        named: dict[str, Any] = {}
        found = (fastavro.parse_schema(_plain_dates(json.loads(schema.text)),
                                       named_schemas=named), named) \
            if '"date"' in schema.text else (schema.parsed, dict(schema.named))
        schema.memo["plain_dates"] = found
    return found


def _plain_dates(node: Any) -> Any:
    if isinstance(node, list):
        return [_plain_dates(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "int" and node.get("logicalType") == "date":
        return {**{key: value for key, value in node.items() if key != "logicalType"},
                PLAIN_DATE: True}
    return {key: _plain_dates(value) for key, value in node.items()}


def _standalone(part: Any, schema: AvroSchema) -> Any:
    """`part` of `schema` parsed as a schema of its own (its named types known, its dates
    plain), once."""
    if isinstance(part, str):
        return part if part not in schema.named else _standalone(schema.named[part], schema)
    key = ("standalone", id(part))  # a record's shape is memoised under its plain id
    parsed = schema.memo.get(key)
    if parsed is None and isinstance(part, list):
        # A union: each branch on its own (a named one as its parsed type): validate() parsed
        # a plain list without the named types, and a branch naming its own record (recursive
        # schema) raised UnknownType in place of the dead letter's reason (QA 54-c F-3).
        parsed = schema.memo[key] = [_standalone(branch, schema) for branch in part]
    elif parsed is None:
        named = plain_dates(schema)[1]
        parsed = fastavro.parse_schema(_plain_dates(part), named_schemas=dict(named))
        if isinstance(parsed, dict) and "__named_schemas" not in parsed:
            # fastavro marks only a record parsed with its named types: validate() would parse
            # an array or map of a named type again without them and raise UnknownType (a
            # valid payload dead-lettered for it before session 45).
            parsed = {**parsed, "__fastavro_parsed": True, "__named_schemas": dict(named)}
        schema.memo[key] = parsed
    return parsed


def has_container_unions(schema: AvroSchema) -> bool:
    """Whether a union of `schema` has a record, array or map branch: only there does
    fastavro's writer validate a subtree to choose a branch."""
    found = schema.memo.get("container_unions")
    if found is None:
        found = schema.memo["container_unions"] = reaches(schema.parsed, schema, set(), False)
    return bool(found)


def has_decided_unions(schema: AvroSchema) -> bool:
    """has_container_unions, or a union of `schema` has a date branch (module doc)."""
    found = schema.memo.get("decided_unions")
    if found is None:
        found = schema.memo["decided_unions"] = reaches(schema.parsed, schema, set())
    return bool(found)


def reaches(node: Any, schema: AvroSchema, seen: set[str], dates: bool = True) -> bool:
    """Whether a union with a container (or, with `dates`, a date) branch is in `node` or
    below it."""
    if isinstance(node, str):
        if node not in schema.named or node in seen:
            return False  # a primitive, or a named type being looked at already
        seen.add(node)
        node = schema.named[node]
    if isinstance(node, list):
        return (dates and has_date(node)) or any(
            kind_of(branch, schema) in CONTAINERS or reaches(branch, schema, seen, dates)
            for branch in node)
    if not isinstance(node, dict):
        return False
    kind = node.get("type")
    if kind in RECORDS:
        return any(reaches(field["type"], schema, seen, dates) for field in node["fields"])
    if kind == "array":
        return reaches(node["items"], schema, seen, dates)
    if kind == "map":
        return reaches(node["values"], schema, seen, dates)
    return isinstance(kind, str) and reaches(kind, schema, seen, dates)


def has_date(union: list[Any]) -> bool:
    """Whether `union` has a date branch (a date is no named type: it is written in place)."""
    return any(isinstance(branch, dict) and branch.get("logicalType") == "date"
               for branch in union)


def kind_of(node: Any, schema: AvroSchema) -> Any:
    """The type of a union branch, a named one's looked up (fastavro's extract_record_type)."""
    kind = node["type"] if isinstance(node, dict) else "union" if isinstance(node, list) \
        else node
    return kind_of(schema.named[kind], schema) if kind in schema.named else kind
