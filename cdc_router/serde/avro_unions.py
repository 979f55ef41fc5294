"""The union branch fastavro's writer takes for each JSON object or array, found once.

fastavro's writer picks a union's branch by validating the value against each branch in turn
(its write_union): a value that holds further unions (a tree, a linked list: a schema
recursive through a union) has its whole subtree validated again at every level, O(depth x
size), 17 s for a 512 KB payload 16 levels deep (QA, session 45). Here each (value, schema
part) is validated once, by the same rules as fastavro's Cython `_validate`, and the writer
gets each decided branch in its tuple notation, `(branch name, value)`, which it writes
without validating (writer_datum). Diagnostics ask the same walk (UnionWalk).

What this walk does not mirror exactly it hands back to fastavro: a record value with a
`-type` key (fastavro's branch hint, whose check depends on the field path), a value of a type
JSON does not give (a tuple, bytes), or an error while validating: then the writer, or fits(),
decides as before, at fastavro's cost.

A `date` is an int here (plain_dates): fastavro's validation and writer parse a str there as
an ISO date (date.fromisoformat), which took "2024-01-05" as a date, raised a bare ValueError
for "Z", and for "hello" in [date, "string"] (review 48-d F1). README: types are not coerced.
So a str in a date field does not fit, and at a union with a date branch it is given to the
writer with its branch decided, as a dict or list is.
"""

from __future__ import annotations

from typing import Any

from fastavro.const import INT_MAX_VALUE, INT_MIN_VALUE, LONG_MAX_VALUE, LONG_MIN_VALUE

from cdc_router.serde.avro_schema import NAMED_TYPES, AvroSchema
from cdc_router.serde.avro_union_schema import (
    CONTAINERS,
    RECORDS,
    fits,
    has_container_unions,
    has_date,
    has_decided_unions,
    kind_of,
    reaches,
)

_JSON_TYPES = frozenset((dict, list, str, int, float, bool, type(None)))


class Unusual(Exception):
    """A value this walk does not judge as fastavro would: fastavro decides instead."""


class UnionWalk:
    """One payload's walk: which union branches its objects and arrays take, each validated
    once per schema part. Lives as long as the payload (its memo is keyed by object ids)."""

    def __init__(self, schema: AvroSchema) -> None:
        self.schema = schema
        self._named = schema.named
        self._valid: dict[tuple[int, int], bool] = {}
        self.problems: dict[tuple[int, int], Any] = {}  # avro_diagnostics's

    def branch(self, datum: Any, union: list[Any]) -> int | None:
        """The index of the branch of `union` that fastavro's writer takes for a dict or list
        `datum`, or None when none validates. Raises Unusual (see the module doc).

        As its write_union does: the first branch the value validates against, except that
        among records it keeps looking for the one with the most of the datum's keys.
        """
        best, most = None, -1
        for index, (candidate, kind, names) in enumerate(self._branches(union)):
            if not self.valid(datum, candidate):
                continue
            if kind != "record":  # "error" too: fastavro takes it at once
                return index  # a float branch never takes a dict or a list
            keys = len(names.intersection(datum))
            if keys > most:
                best, most = index, keys
        return best

    def _branches(self, union: list[Any]) -> tuple[tuple[Any, Any, frozenset[str]], ...]:
        key = ("branches", id(union))
        found: tuple[tuple[Any, Any, frozenset[str]], ...] | None = self.schema.memo.get(key)
        if found is None:
            entries = []
            for candidate in union:
                resolved = self._named.get(candidate, candidate) \
                    if isinstance(candidate, str) else candidate
                kind = kind_of(candidate, self.schema)
                names = frozenset(field["name"] for field in resolved["fields"]) \
                    if kind == "record" else frozenset()
                entries.append((candidate, kind, names))
            found = self.schema.memo[key] = tuple(entries)
        return found

    def valid(self, datum: Any, node: Any) -> bool:
        """fastavro's `_validate(datum, node)` (not raising, not strict), once per pair for
        a dict or list datum. Raises Unusual (see the module doc).

        One frame per level of the datum (a union and a name are looked at in place, loops
        rather than generators): a payload may be as deep as parse_json allows.
        """
        while isinstance(node, str) and node in self._named:
            node = self._named[node]
        if isinstance(node, list):
            for branch in node:  # noqa: SIM110 (a generator is one more frame per level)
                if self.valid(datum, branch):
                    return True  # the first branch that fits, as fastavro's
            return False
        held = type(datum)
        if held is dict or held is list:
            key = (id(datum), id(node))
            found = self._valid.get(key)
            if found is not None:
                return found
        elif held not in _JSON_TYPES:
            raise Unusual(held.__name__)
        # A logical type's own writer (fastavro's prepare) leaves a JSON value as it is, but
        # for a str in a date: an int here (module doc).
        kind = node if isinstance(node, str) else node["type"]
        if kind == "null":
            return datum is None
        if kind == "boolean":
            return isinstance(datum, bool)
        if kind == "string":
            return isinstance(datum, str)
        if kind == "int" or kind == "long":
            low, high = (INT_MIN_VALUE, INT_MAX_VALUE) if kind == "int" else \
                (LONG_MIN_VALUE, LONG_MAX_VALUE)
            return isinstance(datum, int) and not isinstance(datum, bool) and \
                low <= datum <= high
        if kind == "float" or kind == "double":
            return isinstance(datum, int | float) and not isinstance(datum, bool)
        if kind == "bytes" or kind == "fixed":
            return False  # JSON gives no bytes
        if kind == "enum":
            return datum in node["symbols"]
        if kind != "array" and kind != "map" and kind not in RECORDS:
            if kind in self._named:  # {"type": "Name"}
                return self.valid(datum, self._named[kind])
            raise Unusual(str(kind))  # fastavro raises UnknownType
        if held is not dict and held is not list:
            return False  # what is left takes a dict or a list
        found = True
        if kind == "array":
            found = held is list
            items = node["items"]
            for item in datum if found else ():
                if not self.valid(item, items):
                    found = False
                    break
        elif kind == "map":
            found = held is dict
            values = node["values"]
            for value in datum.values() if found else ():  # keys: JSON's are str
                if not self.valid(value, values):
                    found = False
                    break
        else:
            found = held is dict
            if found and "-type" in datum:
                raise Unusual("-type")  # its check depends on the field path: fastavro's
            for field in node["fields"] if found else ():
                if not self.valid(datum.get(field["name"], field.get("default")),
                                  field["type"]):
                    found = False
                    break
        self._valid[key] = found
        return found

    def decided(self, datum: Any, node: Any) -> Any:
        """`datum` for fastavro's writer with `node`: each dict or list at a union given as
        `(branch name, value)`, a new container only where something below changed."""
        if not self._reaches(node):
            return datum
        while isinstance(node, str):
            node = self._named[node]
        name = None
        if isinstance(node, list):
            if type(datum) is not dict and type(datum) is not list:
                if type(datum) is not str or not has_date(node):
                    return datum  # a scalar: fastavro's own choice is cheap
                found = writer_branch(datum, node, self.schema)  # not the date's
                return datum if found is None else (_tuple_name(found), datum)
            index = self.branch(datum, node)
            if index is None:
                return datum  # no branch takes it: fastavro's writer says why
            name = _tuple_name(node[index])
            node = node[index]
            while isinstance(node, str):
                node = self._named[node]
        written = self._decided_below(datum, node)
        return written if name is None else (name, written)

    def _decided_below(self, datum: Any, node: dict[str, Any]) -> Any:
        kind = node["type"]
        if kind in RECORDS and type(datum) is dict:
            changed = None
            for field in node["fields"]:
                name = field["name"]
                if name in datum:
                    value = datum[name]
                    written = self.decided(value, field["type"])
                    if written is not value:
                        changed = dict(datum) if changed is None else changed
                        changed[name] = written
            return datum if changed is None else changed
        if kind == "array" and type(datum) is list:
            items = node["items"]
            listed = [self.decided(item, items) for item in datum]
            return datum if all(a is b for a, b in zip(listed, datum, strict=True)) else listed
        if kind == "map" and type(datum) is dict:
            values = node["values"]
            mapped = {key: self.decided(value, values) for key, value in datum.items()}
            return datum if all(mapped[key] is value for key, value in datum.items()) \
                else mapped
        return datum

    def _reaches(self, node: Any) -> bool:
        key = ("reaches", id(node))
        found = self.schema.memo.get(key)
        if found is None:
            found = self.schema.memo[key] = reaches(node, self.schema, set())
        return bool(found)


def _tuple_name(candidate: Any) -> str:
    """The name fastavro's write_union matches a `(name, value)` datum to `candidate` by."""
    if isinstance(candidate, dict):
        kind = candidate["type"]
        return str(candidate["name"] if kind in NAMED_TYPES else kind)
    return str(candidate)


def writer_branch(datum: Any, union: list[Any], schema: AvroSchema,
                  walk: UnionWalk | None = None) -> Any:
    """The branch of `union` (named types resolved) fastavro's writer takes for `datum`, or
    None when none validates. Raises Unusual (see the module doc) only with `walk`.

    As its write_union does: the first branch the value validates against, except that a
    later double wins over a float, and among records the one with the most of the datum's
    keys. A dict or list with `walk`: as it finds it (each value validated once); else by
    fastavro's validation.
    """
    if walk is not None and (type(datum) is dict or type(datum) is list):
        index = walk.branch(datum, union)
        return None if index is None else _resolved(union[index], schema)
    kinds = schema.memo.get(("kinds", id(union)))
    if kinds is None:
        kinds = schema.memo[("kinds", id(union))] = [kind_of(branch, schema)
                                                       for branch in union]
    chosen, most, could_be_float = None, -1, False
    container = isinstance(datum, dict | list)
    for branch, kind in zip(union, kinds, strict=True):
        if could_be_float:  # nothing but a double is worth considering
            if kind == "double":
                return _resolved(branch, schema)
            continue
        if kind == "null":  # only None takes it, and nothing else takes None
            if datum is None:
                return "null"
            continue
        if (container and kind not in CONTAINERS) or not fits(datum, schema, branch):
            continue  # only those take a dict or a list: the others are not validated
        resolved = _resolved(branch, schema)
        if kind == "float":
            chosen, could_be_float = resolved, True
        elif kind != "record":  # "error" too: fastavro takes it at once
            return resolved
        elif isinstance(datum, dict):
            keys = len(datum.keys() & {field["name"] for field in resolved["fields"]})
            if keys > most:
                chosen, most = resolved, keys
    return chosen


def _resolved(branch: Any, schema: AvroSchema) -> Any:
    return schema.named.get(branch, branch) if isinstance(branch, str) else branch


def union_walk(schema: AvroSchema) -> UnionWalk | None:
    """A walk for one payload of `schema`, to share between its checks and its encoding;
    None when the schema has no union a subtree could take (nothing to walk)."""
    return UnionWalk(schema) if has_decided_unions(schema) else None


def writer_datum(datum: Any, schema: AvroSchema, walk: UnionWalk | None = None, *,
                 dates: bool = True) -> Any:
    """`datum` with the union branches fastavro's writer would take decided in its tuple
    notation, so that writing it validates nothing again: the same bytes in time linear in
    its size. `datum` itself when the schema has no union a subtree could take, or when
    fastavro must decide (module doc). `walk`: this datum's, if the checks made one.
    dates=False: for a writer given plain_dates(), which needs no date union decided."""
    if not (has_decided_unions(schema) if dates else has_container_unions(schema)):
        return datum
    try:
        return (walk or UnionWalk(schema)).decided(datum, schema.parsed)
    except Exception:  # Unusual, RecursionError, a logical type's conversion: fastavro's
        return datum  # writer meets it again and reports it as before
