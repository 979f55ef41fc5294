"""Why a payload does not fit its Avro schema, as one line that names the field.

Types and missing fields are fastavro's validation (its public `validate`), turned into a
reason that names the deepest field and the types it may take. Payload keys that no field of
the schema takes are our own check: fastavro's writer (and so confluent-kafka's serializer)
would silently leave them out, which `extra_fields: reject` refuses.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from fastavro.const import LONG_MAX_VALUE, LONG_MIN_VALUE
from fastavro.validation import ValidationError, validate

from cdc_router.errors import show
from cdc_router.serde.avro_schema import AvroSchema
from cdc_router.serde.avro_time import TIME_RANGES
from cdc_router.serde.avro_union_schema import fits, has_container_unions, plain_dates
from cdc_router.serde.avro_unions import UnionWalk, writer_branch
from cdc_router.serde.avro_validation import described, too_deep


def payload_problem(datum: Any, schema: AvroSchema, extra_fields: str = "reject",
                    walk: UnionWalk | None = None) -> str | None:
    """Why `datum` does not fit `schema`, naming the field; None when it does.

    Types and missing fields are fastavro's validation (a field is named as
    `namespace.Record.field`); keys the schema has no field for count only when
    extra_fields is 'reject' (fastavro's writer would silently leave them out). `walk`: one
    to share with the datum's encoding (serde/avro_unions.union_walk). A payload nested
    deeper than these checks can follow is refused with its depth (QA 54-c F-4).
    """
    try:
        return _problem(datum, schema, extra_fields, walk)
    except RecursionError:
        return too_deep(datum)


def _problem(datum: Any, schema: AvroSchema, extra_fields: str,
             walk: UnionWalk | None) -> str | None:
    if not fits(datum, schema):
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
        problem = _value_problem(datum, schema.parsed, schema, "", walk)
        if problem is not None:
            return problem
    if extra_fields == "reject":
        extra = first_extra_field(datum, schema, walk)
        if extra is not None:
            path, record = extra
            name = path.rsplit(".", 1)[-1].rsplit("[", 1)[0] if "." in path else path
            return (f"field '{record}.{_plain(name)}' is not in the schema (payload key "
                    f"{_plain(path)}; extra_fields: reject)")
    return None


def _plain(text: str, limit: int = 60) -> str:
    """A payload key as is, or escaped and cut when it would break the one-line reason."""
    return text if text.isprintable() and len(text) <= limit else show(text, limit)


def first_extra_field(datum: Any, schema: AvroSchema,
                      walk: UnionWalk | None = None) -> tuple[str, str] | None:
    """(path, record name) of the first payload key no record field takes, or None.

    Walks the datum the way fastavro's writer does, union branches included (writer_branch).
    """
    found = _first_extra(datum, schema.parsed, schema, walk)
    if found is None:
        return None
    steps, record = found
    path = "".join(reversed(steps))  # ".c", "[1]", ".lines" -> .lines[1].c
    return path.removeprefix("."), record


def _first_extra(datum: Any, node: Any, schema: AvroSchema,
                 walk: UnionWalk | None) -> tuple[list[str], str] | None:
    """The steps to the first extra key (deepest first) and its record's name, or None.

    The path is only built when a key is found: this runs for every valid payload.
    """
    if isinstance(node, str):
        node = schema.named.get(node, node)
    if isinstance(node, list):
        if not isinstance(datum, (dict, list)):
            return None  # a scalar holds no keys
        branch = writer_branch(datum, node, schema, walk)
        return None if branch is None else _first_extra(datum, branch, schema, walk)
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


def _value_problem(datum: Any, node: Any, schema: AvroSchema, path: str,
                   walk: UnionWalk | None) -> str | None:
    """The first value of a valid `datum` that the writer would alter or readers refuse.

    With `walk`, each (value, schema part, path) is looked at once: below a union whose
    branches the value all fits (records alike), each level would try each branch again.
    """
    if walk is None or (type(datum) is not dict and type(datum) is not list):
        return _value_problem_below(datum, node, schema, path, walk)
    key = (id(datum), id(node), path)
    if key not in walk.problems:
        walk.problems[key] = _value_problem_below(datum, node, schema, path, walk)
    return walk.problems[key]


def _value_problem_below(datum: Any, node: Any, schema: AvroSchema, path: str,
                         walk: UnionWalk | None) -> str | None:
    if isinstance(node, str):
        if node in ("float", "double"):
            return _number_problem(datum, node, path)
        node = schema.named.get(node, node)
        if isinstance(node, str):
            return None
    if isinstance(node, list):
        # The branch fastavro's writer takes (a double after a float: 1e39 in ["float",
        # "double"] is written as the double), not any it fits: 86400000 in [date, "long"]
        # was written as a date no reader reads, the long having no problem (review 48-d F3).
        branch = writer_branch(datum, node, schema, walk)
        return None if branch is None else _value_problem(datum, branch, schema, path, walk)
    kind = node.get("type")
    if node.get("logicalType") == "uuid" and isinstance(datum, str):
        if _UUID.fullmatch(datum) is None:
            return (f"field {path.lstrip('.') or '(the payload)'!r} is str {show(datum, 60)}, "
                    "expected string (uuid): not a UUID as 8-4-4-4-12 hex digits")
        return None
    if kind in ("float", "double"):
        return _number_problem(datum, kind, path)
    if node.get("logicalType") in TIME_RANGES and type(datum) is int:
        low, high, meaning = TIME_RANGES[node["logicalType"]]
        if not low <= datum <= high:
            return (f"field {path.lstrip('.') or '(the payload)'!r} is {datum}, outside what "
                    f"readers with logical types take as {kind} ({node['logicalType']}): "
                    f"{low} to {high} ({meaning}); check the value's unit")
        return None
    if kind in ("record", "error") and isinstance(datum, dict):
        for field in node["fields"]:
            if field["name"] in datum:
                found = _value_problem(datum[field["name"]], field["type"], schema,
                                       f"{node.get('name')}.{field['name']}", walk)
                if found is not None:
                    return found
    elif kind == "array" and isinstance(datum, list):
        for index, item in enumerate(datum):
            found = _value_problem(item, node["items"], schema, f"{path}[{index}]", walk)
            if found is not None:
                return found
    elif kind == "map" and isinstance(datum, dict):
        for key, value in datum.items():
            found = _value_problem(value, node["values"], schema, f"{path}[{key!r}]",
                                   walk)
            if found is not None:
                return found
    return None


def _number_problem(datum: Any, kind: str, path: str) -> str | None:
    if type(datum) is int:  # a JSON integer in a float or double field
        where = path.lstrip(".") or "(the payload)"
        held = _held(datum, kind)
        if held is None:
            return f"field {where!r} is {show(str(datum), 60)}, beyond an Avro {kind}"
        # Review 44-2: 9007199254740993 was written as 9007199254740992.0, without a word.
        if _as_written(datum, held, kind):
            return None
        double = _held(datum, "double") if kind == "float" else None
        kinds = [name for name, fits in (
            ("double", double is not None and _as_written(datum, double, "double")),
            ("long", LONG_MIN_VALUE <= datum <= LONG_MAX_VALUE)) if fits]
        fix = f"make the field a {' or a '.join(kinds)}, or send" if kinds else "send"
        return f"field {where!r} is {show(datum, 60)}, which an Avro {kind} holds only " \
            f"as {held!r}: {fix} the number as a string"
    if not isinstance(datum, float):
        return None
    where = path.lstrip(".") or "(the payload)"
    if not math.isfinite(datum):
        return f"field {where!r} is {datum}, which JSON cannot carry: a number beyond a double?"
    if kind == "float" and datum != 0:
        # Review 48-d F4: 16777217.0 was written as 16777216.0 (the integer 16777217 is
        # refused, above) and 1e-46 as 0.0, without a word. A fraction rounded to a float's
        # 24 bits (0.1) is what a float field asks for.
        held = _held(datum, kind)
        if held is None:
            return f"field {where!r} is {datum}, beyond an Avro float (write it as a double)"
        if held == 0 or (datum.is_integer() and not _as_written(datum, held, kind)):
            return f"field {where!r} is {datum!r}, which an Avro float holds only as " \
                f"{held!r}: make the field a double"
    return None


def _held(datum: int | float | Decimal, kind: str) -> float | None:
    """What a `kind` (float or double) field holds for `datum` (rounded to nearest, as the
    writer does), or None when that rounds beyond the type's largest value."""
    try:
        if kind == "double":
            return float(datum)
        return float(struct.unpack("<f", struct.pack("<f", float(datum)))[0])
    except OverflowError:
        return None


def _as_written(datum: int | float, held: float, kind: str) -> bool:
    """Whether `held` reads back as the number written: the same value, or the shortest
    decimal that is `held`, which readers print (QA 52-a F1: jsonb writes a double as its
    shortest decimal with every digit, 1e23 as 100000000000000000000000, held as 1e+23;
    so is 264736620 in a float field, held as 264736624.0, printed 2.6473662E8)."""
    if held == datum:
        return True
    written = Decimal(datum) if type(datum) is int else Decimal(repr(datum))
    return _shortest(held, kind) == written


def _shortest(held: float, kind: str) -> Decimal:
    """The shortest decimal a `kind` field reads as `held`, the nearest of those, of an even
    last digit at a tie (as repr does for a double; a float's has at most 9 digits: at a
    power of two the nearest decimal of d digits may not read back where its neighbour
    does, review 52-j F1)."""
    if kind == "double":
        return Decimal(repr(held))
    exact = Decimal(held)
    for digits in range(1, 10):
        near = Decimal(f"{held:.{digits - 1}e}")
        step = Decimal(1).scaleb(near.adjusted() - digits + 1)
        fits = [c for c in (near - step, near, near + step) if _held(c, kind) == held]
        if fits:
            return min(fits, key=lambda c: (abs(c - exact), c.as_tuple().digits[-1] % 2))
    return exact
