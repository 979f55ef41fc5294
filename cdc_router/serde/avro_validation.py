"""fastavro's validation error, as one line that names the field, the item and the types.

Validation stops at the first field that fails; a union there reports one error per branch, a
record branch its nested field after its own. The error names a field as `namespace.Record.
field`, never an item of an array or map: the item is found in the payload here and named as
the value checks name it (`qa52.A.tags[1]`, `qa52.A.attrs['k']`, QA 52-a F3).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastavro.validation import ValidationError

from cdc_router.errors import show
from cdc_router.serde.avro_schema import NAMED_TYPES, AvroSchema
from cdc_router.serde.avro_union_schema import PLAIN_DATE, fits, plain_dates

_DEEPEST = 300  # deeper than the router's JSON allows (256)


def described(error: ValidationError, payload: Any, schema: AvroSchema) -> str:
    """Why `payload` failed fastavro's validation against `schema`, naming the deepest field,
    and the item in it that failed."""
    found = list(getattr(error, "errors", None) or ())
    if not found:
        return str(error)
    # The last field reported is the deepest: name it, with every type the union's branches
    # would take there (for that value: not those its array or map item was refused by).
    deepest = found[-1]
    expected = " | ".join(dict.fromkeys(type_name(entry.schema) for entry in found
                                        if entry.field == deepest.field
                                        and entry.datum is deepest.datum))
    field = deepest.field or "(the payload)"
    if deepest.field:
        field += _item_path(payload, deepest.field, schema)
    if deepest.datum is None:
        return f"field {field!r} is missing or null, expected {expected}"
    # Review 48-d F1: fastavro would have parsed the text as an ISO date (avro_unions.py).
    text_date = isinstance(deepest.datum, str) and isinstance(deepest.schema, dict) and \
        deepest.schema.get(PLAIN_DATE)
    return (f"field {field!r} is {type(deepest.datum).__name__} {show(deepest.datum, 60)}, "
            f"expected {expected}" + (": a date is written as its number of days since "
                                      "1970-01-01, not as text" if text_date else ""))


def too_deep(payload: Any) -> str:
    """The reason for a payload nested deeper than the checks (recursive, as fastavro's
    validation is) can follow: its depth, and the key it nests through most."""
    deepest: list[str] = []
    stack: list[tuple[Any, list[str]]] = [(payload, [])]
    while stack:  # no recursion here: this payload is too deep for it
        node, path = stack.pop()
        if len(path) > len(deepest):
            deepest = path
        if isinstance(node, dict):
            stack.extend((value, [*path, f"[{key!r}]" if not isinstance(key, str) or
                                  not key.isidentifier() else key])
                         for key, value in node.items())
        elif isinstance(node, list):
            stack.extend((item, [*path, "[]"]) for item in node)
    key = max(deepest, key=deepest.count) if deepest else "(the payload)"
    return (f"field {key!r} nests {len(deepest)} levels deep (payload path "
            f"{show('.'.join(deepest[:3]) + ' ... ' + '.'.join(deepest[-2:]), 80)}), deeper than "
            "the Avro checks follow: expected a value nested less deeply (e.g. a list in "
            "place of a chain of records)")


def _item_path(payload: Any, field: str, schema: AvroSchema) -> str:
    """The steps from the value of `field` (`namespace.Record.name`) to the array or map item
    in it that fails its type (`[1]`, `['k']`, `[0]['a']`); "" when the value itself fails,
    or the field is not found. Its first value in the payload that does not fit is the one
    validation stopped at (it goes in order)."""
    record_name, _, name = field.rpartition(".")
    named = plain_dates(schema)[1]
    record = named.get(record_name)
    if not isinstance(record, dict) or record.get("type") not in ("record", "error"):
        return ""
    types = [entry["type"] for entry in record["fields"] if entry["name"] == name]
    for value in _values_of(payload, name, 0) if types else ():
        if not fits(value, schema, types[0]):
            return "".join(_steps(value, types[0], schema, 0))
    return ""


def _values_of(node: Any, name: str, depth: int) -> Iterator[Any]:
    """The values of key `name` in the payload's dicts, in the order validation meets them."""
    if depth > _DEEPEST:
        return
    if isinstance(node, dict):
        if name in node:
            yield node[name]
        for value in node.values():
            yield from _values_of(value, name, depth + 1)
    elif isinstance(node, list):
        for item in node:
            yield from _values_of(item, name, depth + 1)


def _steps(value: Any, node: Any, schema: AvroSchema, depth: int) -> list[str]:
    """The steps into `value` (which does not fit `node`) to the deepest array or map item
    that does not fit its type; none when `value` is no array or map of `node`."""
    if isinstance(node, str):
        node = schema.named.get(node, node)
    if isinstance(node, list):  # a union: the one branch of the value's shape, if one
        shape = "array" if isinstance(value, list) else "map" if isinstance(value, dict) \
            else None
        branches = [branch for branch in node if isinstance(branch, dict)
                    and branch.get("type") == shape]
        if len(branches) != 1:
            return []
        node = branches[0]
    if not isinstance(node, dict) or depth > _DEEPEST:
        return []
    pairs: Any = ()
    if node.get("type") == "array" and isinstance(value, list):
        pairs = ((f"[{index}]", item, node["items"]) for index, item in enumerate(value))
    elif node.get("type") == "map" and isinstance(value, dict):
        pairs = ((f"[{key!r}]", item, node["values"]) for key, item in value.items())
    for step, item, part in pairs:
        if not fits(item, schema, part):
            return [step, *_steps(item, part, schema, depth + 1)]
    return []


def type_name(schema: Any) -> str:
    if isinstance(schema, list):
        return " | ".join(type_name(branch) for branch in schema)
    if isinstance(schema, dict):
        kind = schema.get("type")
        if isinstance(kind, str) and kind in NAMED_TYPES and "name" in schema:
            return f"{kind} {schema['name']}"
        logical = schema.get("logicalType") or ("date" if schema.get(PLAIN_DATE) else None)
        if logical:
            return f"{kind} ({logical})"
        if kind == "array":
            return f"array of {type_name(schema.get('items'))}"
        if kind == "map":
            return f"map of {type_name(schema.get('values'))}"
        return type_name(kind)
    return str(schema)
