"""Why a payload does not fit its Avro schema, as one line that names the field.

Types and missing fields are fastavro's validation (its public `validate`); a payload it
refuses is walked from its root to the deepest value at fault (serde/avro_blame.py), named by
its path (`shop.Order.lines[2].price`) with the types it may take. Payload keys that no field of
the schema takes are our own check: fastavro's writer (and so confluent-kafka's serializer)
would silently leave them out, which `extra_fields: reject` refuses.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from fastavro.validation import ValidationError, validate

from cdc_router.errors import show
from cdc_router.serde.avro_blame import blame, named_path, shaped_branches, union_reason
from cdc_router.serde.avro_numbers import number_reason
from cdc_router.serde.avro_schema import AvroSchema
from cdc_router.serde.avro_time import TIME_RANGES
from cdc_router.serde.avro_union_schema import fits, has_container_unions, plain_dates
from cdc_router.serde.avro_unions import UnionWalk, writer_branch
from cdc_router.serde.avro_validation import described, too_deep


def payload_problem(datum: Any, schema: AvroSchema, extra_fields: str = "reject",
                    walk: UnionWalk | None = None) -> str | None:
    """Why `datum` does not fit `schema`, naming the field; None when it does.

    Types and missing fields are fastavro's validation (a field is named by its path from
    the root record, `namespace.Root.field.nested[2].name`); keys the schema has no field
    for count only when extra_fields is 'reject' (fastavro's writer would silently leave
    them out). `walk`: one to share with the datum's encoding (serde/avro_unions.union_walk).
    A payload nested deeper than these checks can follow is refused with its depth (QA 54-c
    F-4).
    """
    try:
        return _problem(datum, schema, extra_fields, walk)
    except RecursionError:
        return too_deep(datum)


def _problem(datum: Any, schema: AvroSchema, extra_fields: str,
             walk: UnionWalk | None) -> str | None:
    if not fits(datum, schema):
        reason = blame(datum, schema)  # the path, the nearest union branch (QA 55-c F-6, F-7)
        if reason is not None:
            return reason
        try:
            validate(datum, plain_dates(schema)[0], raise_errors=True)  # a date an int
        except ValidationError as error:
            return described(error, datum, schema)
    if not has_container_unions(schema):  # no union a subtree could take: nothing to walk
        return _walked_problem(datum, schema, extra_fields, None)
    try:
        # The union branches are the writer's, each found once (serde/avro_unions.py) ...
        return _walked_problem(datum, schema, extra_fields, walk or UnionWalk(schema))
    except Exception:  # Unusual, RecursionError, ...: fastavro's validation decides
        return _walked_problem(datum, schema, extra_fields, None)  # ... or as before


def _walked_problem(datum: Any, schema: AvroSchema, extra_fields: str,
                    walk: UnionWalk | None) -> str | None:
    """payload_problem's checks past validation, with `walk` choosing the union branches
    (None: fastavro's validation, at its cost, for what the walk leaves to it)."""
    if _has_checked_values(schema):
        problem = _value_problem(datum, schema.parsed, schema, walk)
        if problem is not None:
            steps, say = problem  # the path is built here, for a payload refused only
            return say(named_path("".join(steps), schema))
    return extra_field_problem(datum, schema, walk) if extra_fields == "reject" else None


def _plain(text: str, limit: int = 60) -> str:
    """A payload key as is, or escaped and cut when it would break the one-line reason."""
    return text if text.isprintable() and len(text) <= limit else show(text, limit)


class _NoBranch:
    """A union value the writer's branch takes but for a key of its own, which no branch of
    the union takes whole: the nearest one is named (QA 55-c F-7)."""

    def __init__(self, datum: Any, union: list[Any], shaped: list[Any]) -> None:
        self.datum, self.union, self.shaped = datum, union, shaped


def extra_field_problem(datum: Any, schema: AvroSchema,
                        walk: UnionWalk | None = None) -> str | None:
    """The reason naming the first payload key no record field takes, or None.

    Walks the datum the way fastavro's writer does, union branches included (writer_branch).
    """
    found = _first_extra(datum, schema.parsed, schema, walk)
    return None if found is None else _extra_reason(found, "", schema, walk)


def _extra_reason(found: tuple[list[str], str | _NoBranch], above: str, schema: AvroSchema,
                  walk: UnionWalk | None) -> str | None:
    steps, record = found
    path = above + "".join(reversed(steps))  # ".c", "[1]", ".lines" -> .lines[1].c
    if isinstance(record, _NoBranch):
        miss = record

        def refusal(branch: Any) -> str | None:
            below = _first_extra(miss.datum, branch, schema, walk)
            return None if below is None else _extra_reason(below, path, schema, walk)
        return union_reason(miss.datum, miss.union, miss.shaped, schema, path, refusal)
    path = path.removeprefix(".")
    name = path.rsplit(".", 1)[-1].rsplit("[", 1)[0] if "." in path else path
    return (f"field '{record}.{_plain(name)}' is not in the schema (payload key "
            f"{_plain(path)}; extra_fields: reject)")


def _first_extra(datum: Any, node: Any, schema: AvroSchema,
                 walk: UnionWalk | None) -> tuple[list[str], str | _NoBranch] | None:
    """The steps to the first extra key (deepest first) and its record's name, or None.

    The path is only built when a key is found: this runs for every valid payload.
    """
    if isinstance(node, str):
        node = schema.named.get(node, node)
    if isinstance(node, list):
        if not isinstance(datum, (dict, list)):
            return None  # a scalar holds no keys
        branch = writer_branch(datum, node, schema, walk)
        found = None if branch is None else _first_extra(datum, branch, schema, walk)
        if found is not None and len(found[0]) == 1 and isinstance(found[1], str):
            shaped = shaped_branches(datum, node, schema)  # a key of the branch's own
            if len(shaped) > 1:
                return [], _NoBranch(datum, node, shaped)
        return found
    if not isinstance(node, dict):
        return None
    kind = node.get("type")
    found = None
    if kind in ("record", "error") and isinstance(datum, dict):
        names, nested = _record_shape(node, schema)
        if not names.issuperset(datum):
            for key in datum:
                if key not in names and key != "-type":  # -type: fastavro's union branch hint
                    return [f".{key}"], str(node.get("name"))
        for name, field_type in nested:
            if name in datum:
                found = _first_extra(datum[name], field_type, schema, walk)
                if found is not None:
                    found[0].append(f".{name}")
                    return found
    elif kind == "array" and isinstance(datum, list):
        for index, item in enumerate(datum):
            found = _first_extra(item, node["items"], schema, walk)
            if found is not None:
                found[0].append(f"[{index}]")
                return found
    elif kind == "map" and isinstance(datum, dict):
        for key, value in datum.items():
            found = _first_extra(value, node["values"], schema, walk)
            if found is not None:
                found[0].append(f"[{key!r}]")
                return found
    return None


def _record_shape(record: dict[str, Any],
                  schema: AvroSchema) -> tuple[frozenset[str], tuple[tuple[str, Any], ...]]:
    """A record's field names, and the fields whose values can hold records (walked)."""
    shape = schema.memo.get(id(record))
    if shape is None:
        names = frozenset(field["name"] for field in record["fields"])
        nested = tuple((field["name"], field["type"]) for field in record["fields"]
                       if _can_hold_record(field["type"], schema.named, set()))
        shape = schema.memo[id(record)] = (names, nested)
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


def json_unfillable(schema: AvroSchema) -> list[str]:
    """The fields of `schema` no JSON payload can fill, as dotted paths: bytes, fixed and
    decimal ones (JSON has no bytes; fastavro refuses a string there, even a schema default),
    unless a union offers another type. A payload that reaches one is dead-lettered."""
    found: list[str] = []
    if not _holds_json(schema.parsed, schema.named):
        return ["(the whole payload)"]
    _unfillable_below(schema.parsed, schema.named, [], found, set())
    return found


def _holds_json(node: Any, named: Mapping[str, Any]) -> bool:
    if isinstance(node, list):
        return any(_holds_json(branch, named) for branch in node)
    if isinstance(node, str):
        target = named.get(node)
        return node not in ("bytes", "fixed") if target is None else _holds_json(target, named)
    return node.get("type") not in ("bytes", "fixed")


def _unfillable_below(node: Any, named: Mapping[str, Any], path: list[str], found: list[str],
                      seen: set[str]) -> None:
    if isinstance(node, list):
        for branch in node:
            _unfillable_below(branch, named, path, found, seen)
        return
    if isinstance(node, str):
        if node in named and node not in seen:  # a named type: walked once (it may recurse)
            seen.add(node)
            _unfillable_below(named[node], named, path, found, seen)
        return
    kind = node.get("type")
    parts: list[tuple[list[str], Any]] = []
    if kind in ("record", "error"):
        seen.add(node.get("name", ""))
        parts = [([*path, field["name"]], field["type"]) for field in node["fields"]]
    elif kind == "array":
        parts = [([*path, "[]"], node["items"])]
    elif kind == "map":
        parts = [([*path, "{}"], node["values"])]
    for where, part in parts:
        if _holds_json(part, named):
            _unfillable_below(part, named, where, found, seen)
        else:
            found.append(".".join(where))


# What fastavro's validation takes and its writer then alters or its reader refuses: a float
# beyond float's range (written as infinity), NaN or infinity from a JSON number beyond a
# double, any text in a `uuid` string (readers with logical types refuse it), a date, time or
# timestamp number outside TIME_RANGES.
# The form both Python's reader and Java's UUID.fromString (Avro Java's) take: Python's
# uuid.UUID also takes 32 bare digits, braces and urn:uuid:, Java refuses them (review 48-d F2).
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


def _has_checked_values(schema: AvroSchema) -> bool:
    found = schema.memo.get("checked_values")
    if found is None:
        found = schema.memo["checked_values"] = any(  # the file's text: logicalType too
            word in schema.text for word in ('"float"', '"double"', '"uuid"', '"date"',
                                             '"time-', '"timestamp-', '"local-timestamp-'))
    return bool(found)


# A value's problem: the steps from the root to it, and its reason given the path they make.
_Problem = tuple[tuple[str, ...], Callable[[str], str]]


def _value_problem(datum: Any, node: Any, schema: AvroSchema,
                   walk: UnionWalk | None) -> _Problem | None:
    """The first value of a valid `datum` that the writer would alter or readers refuse.

    With `walk`, each (value, schema part) is looked at once: below a union whose branches
    the value all fits (records alike), each level would try each branch again. The path is
    built on the way back, for a problem only: this runs for every valid payload.
    """
    if walk is None or (type(datum) is not dict and type(datum) is not list):
        return _value_problem_below(datum, node, schema, walk)
    key = (id(datum), id(node))
    if key not in walk.problems:
        walk.problems[key] = _value_problem_below(datum, node, schema, walk)
    found: _Problem | None = walk.problems[key]
    return found


def _value_problem_below(datum: Any, node: Any, schema: AvroSchema,
                         walk: UnionWalk | None) -> _Problem | None:
    if isinstance(node, str):
        if node in ("float", "double"):
            reason = number_reason(datum, node)
            return None if reason is None else ((), reason)
        node = schema.named.get(node, node)
        if isinstance(node, str):
            return None
    if isinstance(node, list):
        # The branch fastavro's writer takes (a double after a float: 1e39 in ["float",
        # "double"] is written as the double), not any it fits: 86400000 in [date, "long"]
        # was written as a date no reader reads, the long having no problem (review 48-d F3).
        branch = writer_branch(datum, node, schema, walk)
        return None if branch is None else _value_problem(datum, branch, schema, walk)
    kind = node.get("type")
    if node.get("logicalType") == "uuid" and isinstance(datum, str):
        if _UUID.fullmatch(datum) is None:
            return (), lambda where: (
                f"field {where!r} is str {show(datum, 60)}, expected string (uuid): not a "
                "UUID as 8-4-4-4-12 hex digits")
        return None
    if kind in ("float", "double"):
        reason = number_reason(datum, kind)
        return None if reason is None else ((), reason)
    if node.get("logicalType") in TIME_RANGES and type(datum) is int:
        low, high, meaning = TIME_RANGES[node["logicalType"]]
        if not low <= datum <= high:
            return (), lambda where: (
                f"field {where!r} is {datum}, outside what readers with logical types take "
                f"as {kind} ({node['logicalType']}): {low} to {high} ({meaning}); check the "
                "value's unit")
        return None
    found = None
    if kind in ("record", "error") and isinstance(datum, dict):
        for field in node["fields"]:
            name = field["name"]
            if name in datum:
                found = _value_problem(datum[name], field["type"], schema, walk)
                if found is not None:
                    return (f".{name}", *found[0]), found[1]
    elif kind == "array" and isinstance(datum, list):
        for index, item in enumerate(datum):
            found = _value_problem(item, node["items"], schema, walk)
            if found is not None:
                return (f"[{index}]", *found[0]), found[1]
    elif kind == "map" and isinstance(datum, dict):
        for key, value in datum.items():
            found = _value_problem(value, node["values"], schema, walk)
            if found is not None:
                return (f"[{key!r}]", *found[0]), found[1]
    return None
