"""Where a payload that fails its Avro schema fails: the path from the event's root, and at a
union of records, the branch the value comes nearest to.

fastavro's validation names a bad field by its record's type (`shop.Line.price`: which of the
order's lines? which of 100 nested `Node`s?), and at a union of records it reports every
branch's complaint, of which the reason took the last (QA 55-c F-6, F-7). Here the payload is
walked down from its root, each value that does not fit its type (fastavro's validation,
fits) followed to the deepest one, which is named by its path: the root record's name, then
fields, items and map keys (`shop.Order.lines[2].price`). At a union with more than one
branch of the value's shape (records, a map), the nearest branch is followed and named: the
one the value's `-type` hint names, else the one with most of its keys as fields, then the
fewest required fields missing, then the fewest keys it has no field for, then the first.

Only a payload that has failed (payload_problem) is walked here: nothing costs a valid one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cdc_router.errors import show
from cdc_router.serde.avro_schema import AvroSchema
from cdc_router.serde.avro_union_schema import PLAIN_DATE, RECORDS, fits, kind_of
from cdc_router.serde.avro_validation import type_name

# Why a value that fits a union branch by its types is still refused there (keys the record
# has no field for, with extra_fields: reject), given the branch.
Refusal = Callable[[Any], "str | None"]


def named_path(path: str, schema: AvroSchema) -> str:
    """A value named by its `path` from the payload's root (".lines[2].price"): after the
    root record's name, if the root is one; the root itself is "(the payload)"."""
    if not path:
        return "(the payload)"
    root = schema.parsed
    name = root["name"] if isinstance(root, dict) and root.get("type") in RECORDS else ""
    return f"{name}{path}".removeprefix(".")


def blame(datum: Any, schema: AvroSchema) -> str | None:
    """Why `datum`, which fails validation against `schema`, fails, naming the path to the
    deepest value that does not fit; None when no value below the root is at fault (a
    `-type` hint that names no branch, ...): fastavro's own reason then."""
    return _blame(datum, schema.parsed, schema, "")


def _blame(datum: Any, node: Any, schema: AvroSchema, path: str) -> str | None:
    node = _resolved(node, schema)
    if isinstance(node, list):
        shaped = shaped_branches(datum, node, schema)
        if not shaped:
            return leaf(datum, node, schema, path)
        if len(shaped) == 1:
            return _blame(datum, shaped[0], schema, path)
        return union_reason(datum, node, shaped, schema, path, None)
    kind = node.get("type") if isinstance(node, dict) else node
    steps: Any = ()
    if kind in RECORDS and type(datum) is dict:
        steps = ((f".{field['name']}", datum.get(field["name"], field.get("default")),
                  field["type"]) for field in node["fields"])
    elif kind == "array" and type(datum) is list:
        steps = ((f"[{index}]", item, node["items"]) for index, item in enumerate(datum))
    elif kind == "map" and type(datum) is dict:
        steps = ((f"[{key!r}]", value, node["values"]) for key, value in datum.items())
    else:
        return leaf(datum, node, schema, path)
    for step, value, part in steps:
        if not fits(value, schema, part):  # in the order fastavro's validation goes
            return _blame(value, part, schema, path + step)
    return None


def union_reason(datum: Any, union: list[Any], shaped: list[Any], schema: AvroSchema,
                 path: str, refusal: Refusal | None) -> str | None:
    """Why `datum` at `path` fits no branch of `union`: the nearest of the `shaped` ones
    (module doc), and why it does not fit there (its types, else `refusal`)."""
    nearest = max(shaped, key=lambda branch: _nearness(datum, branch, schema))
    if not fits(datum, schema, nearest):
        why = _blame(datum, nearest, schema, path)
    else:
        why = None if refusal is None else refusal(_resolved(nearest, schema))
    if why is None:
        return None
    return (f"field {named_path(path, schema)!r} fits no branch of {_named_types(union, schema)};"
            f" nearest {type_name(_resolved(nearest, schema))}: {why}")


def shaped_branches(datum: Any, union: list[Any], schema: AvroSchema) -> list[Any]:
    """The branches of `union` that take a value of `datum`'s shape (a dict: records and
    maps; a list: arrays)."""
    return [branch for branch in union if _shaped(datum, branch, schema)]


def leaf(datum: Any, node: Any, schema: AvroSchema, path: str) -> str:
    """The reason for a value that is not of `node`'s shape (or range) at all."""
    named, expected = named_path(path, schema), _named_types(node, schema)
    if datum is None:
        return f"field {named!r} is missing or null, expected {expected}"
    # Review 48-d F1: fastavro would have parsed the text as an ISO date (avro_unions.py).
    text_date = isinstance(datum, str) and isinstance(node, dict) and (
        node.get("logicalType") == "date" or bool(node.get(PLAIN_DATE)))
    return (f"field {named!r} is {type(datum).__name__} {show(datum, 60)}, expected "
            f"{expected}" + (": a date is written as its number of days since 1970-01-01, "
                             "not as text" if text_date else ""))


def _named_types(node: Any, schema: AvroSchema) -> str:
    if isinstance(node, list):
        return " | ".join(dict.fromkeys(type_name(_resolved(branch, schema))
                                        for branch in node))
    return type_name(_resolved(node, schema))


def _resolved(node: Any, schema: AvroSchema) -> Any:
    while isinstance(node, str) and node in schema.named:
        node = schema.named[node]
    while isinstance(node, dict) and isinstance(node.get("type"), str) and \
            node["type"] in schema.named:  # {"type": "Name"}
        node = schema.named[node["type"]]
    return node


def _shaped(datum: Any, branch: Any, schema: AvroSchema) -> bool:
    kind = kind_of(branch, schema)
    if type(datum) is dict:
        return kind in RECORDS or kind == "map"
    return type(datum) is list and kind == "array"


def _nearness(datum: Any, branch: Any, schema: AvroSchema) -> tuple[bool, int, int, int]:
    node = _resolved(branch, schema)
    if type(datum) is not dict or not isinstance(node, dict) or node.get("type") not in RECORDS:
        return False, -1, 0, 0  # a map, an array: no field names to compare
    names = {field["name"] for field in node["fields"]}
    required = {field["name"] for field in node["fields"] if "default" not in field}
    keys = set(datum) - {"-type"}
    return (datum.get("-type") == node.get("name"), len(keys & names),
            -len(required - keys), -len(keys - names))
