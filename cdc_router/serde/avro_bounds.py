"""A bound on what one Avro body may claim: arrays of items that take no bytes.

fastavro reads an array item by item, as many as each block's count says. An item of a type
that takes no bytes (null, a fixed of size 0, a record of nothing but such) costs nothing to
claim: 20 bytes claimed 2^62 of them, which fastavro appended one by one while the process grew
by 100 MB/s until the kernel killed it, and every restart met the same record again (review
47-a F5). Before fastavro reads a body whose schema has such an array (checked once per
schema), the body is walked here without building a value, those items counted, and a claim of
more than MAX_EMPTY_ITEMS is the body's problem. Other items take a byte at least, so the
body's own length bounds their count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdc_router.serde.avro_schema import AvroSchema

MAX_EMPTY_ITEMS = 1_000_000
_FIXED_SIZES = {"null": 0, "boolean": 1, "float": 4, "double": 8}
_VARINT = ("int", "long", "enum")
_LENGTH_PREFIXED = ("bytes", "string")


class _TooMany(ValueError):
    pass


def empty_items_problem(body: bytes, schema: AvroSchema) -> str | None:
    """Why `body` may not be read with `schema`: it claims more than MAX_EMPTY_ITEMS items
    that take no bytes. None when it does not, or when the body is malformed otherwise
    (fastavro's read then says how, before it reaches such an array)."""
    parsed = schema.parsed
    named = parsed.get("__named_schemas", {}) if isinstance(parsed, dict) else {}
    if "empty_items" not in schema.memo:
        schema.memo["empty_items"] = _has_empty_items(parsed, named, set())
    if not schema.memo["empty_items"]:
        return None
    walk = _Walk(body, named)
    try:
        walk.skip(parsed)
    except _TooMany as too_many:
        return str(too_many)
    except (IndexError, KeyError, ValueError, TypeError, RecursionError):
        return None
    return None


def _resolved(node: Any, named: dict[str, Any]) -> Any:
    """A named type's definition for its name; {"type": X} as X when X is a schema or a
    name (not when it is a primitive's name, as with a logicalType)."""
    while True:
        if isinstance(node, str) and node in named:
            node = named[node]
        elif isinstance(node, dict) and (isinstance(node.get("type"), dict | list)
                                         or node.get("type") in named):
            node = node["type"]
        else:
            return node


def _kind(node: Any) -> Any:
    return node.get("type") if isinstance(node, dict) else node


def _takes_no_bytes(node: Any, named: dict[str, Any], seen: set[str]) -> bool:
    node = _resolved(node, named)
    kind = _kind(node)
    if kind == "null" or (kind == "fixed" and node.get("size") == 0):
        return True
    if kind in ("record", "error"):
        name = node.get("name", "")
        if name in seen:  # recursive: through a union or an array, which take bytes
            return False
        return all(_takes_no_bytes(field["type"], named, seen | {name})
                   for field in node.get("fields", []))
    return False


def _has_empty_items(node: Any, named: dict[str, Any], seen: set[str]) -> bool:
    node = _resolved(node, named)
    if isinstance(node, list):
        return any(_has_empty_items(branch, named, seen) for branch in node)
    kind = _kind(node)
    if kind == "array":
        return _takes_no_bytes(node["items"], named, set()) or \
            _has_empty_items(node["items"], named, seen)
    if kind == "map":
        return _has_empty_items(node["values"], named, seen)
    if kind in ("record", "error") and node.get("name", "") not in seen:
        inner = seen | {node.get("name", "")}
        return any(_has_empty_items(field["type"], named, inner)
                   for field in node.get("fields", []))
    return False


class _Walk:
    """Reads past one value of a schema in the body, building nothing."""

    def __init__(self, body: bytes, named: dict[str, Any]) -> None:
        self._body = body
        self._at = 0
        self._named = named
        self._empty_items = 0

    def _long(self) -> int:
        shift = result = 0
        while True:
            byte = self._body[self._at]  # IndexError past the end: malformed
            self._at += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    def _advance(self, size: int) -> None:
        if size < 0 or self._at + size > len(self._body):
            raise ValueError("past the end")
        self._at += size

    def skip(self, node: Any) -> None:
        node = _resolved(node, self._named)
        if isinstance(node, list):  # a union: its branch's index, then the branch
            index = self._long()
            if not 0 <= index < len(node):
                raise ValueError("no such branch")
            self.skip(node[index])
            return
        kind = _kind(node)  # a primitive's name too, with a logicalType or without
        if kind in _FIXED_SIZES:
            self._advance(_FIXED_SIZES[kind])
        elif kind in _VARINT:
            self._long()
        elif kind in _LENGTH_PREFIXED:
            self._advance(self._long())
        elif kind == "fixed":
            self._advance(int(node["size"]))
        elif kind in ("record", "error"):
            for field in node["fields"]:
                self.skip(field["type"])
        elif kind in ("array", "map"):
            self._blocks(node)
        else:
            raise ValueError(f"unknown type {kind!r}")

    def _blocks(self, node: Any) -> None:
        items = node["items"] if node["type"] == "array" else node["values"]
        empty = node["type"] == "array" and _takes_no_bytes(items, self._named, set())
        while count := self._long():
            if count < 0:  # a block with its size in bytes
                count = -count
                self._long()
            if empty:
                self._empty_items += count
                if self._empty_items > MAX_EMPTY_ITEMS:
                    raise _TooMany(f"it claims {self._empty_items} or more array items that "
                                   f"take no bytes (over {MAX_EMPTY_ITEMS}): reading them "
                                   "would take memory without bound")
                continue
            for _ in range(count):
                if node["type"] == "map":
                    self._advance(self._long())  # the key
                self.skip(items)
