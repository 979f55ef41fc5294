"""Bounds on what one Avro body may claim: arrays of items that take no bytes, and varints
wider than their type.

fastavro reads an array item by item, as many as each block's count says. An item of a type
that takes no bytes (null, a fixed of size 0, a record of nothing but such) costs nothing to
claim: 20 bytes claimed 2^62 of them, which fastavro appended one by one while the process grew
by 100 MB/s until the kernel killed it, and every restart met the same record again (review
47-a F5). Before fastavro reads a body whose schema has such an array (checked once per
schema), the body is walked here without building a value, those items counted, and a claim of
more than MAX_EMPTY_ITEMS is the body's problem. Other items take a byte at least, so the
body's own length bounds their count.

A varint wider than its type (QA 52-a F4): an int takes at most 5 bytes and 32 bits, a long 10
bytes and 64 bits (Avro specification). fastavro reads wider ones without a word, wrapped at 64
bits (a 12-byte long of 2^78 as 16384) or as a Python int beyond the type (an int of 2^40),
where Java's BinaryDecoder refuses them ("Invalid long encoding") or wraps them otherwise: a
body holding one reads as different numbers in different readers. varint_problem walks the
body (building nothing) only when it has 4 bytes with the high bit then a byte of 0x10 or more,
which every such varint has (and a valid one only from 2^31 up): most bodies are one regex.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdc_router.serde.avro_schema import AvroSchema

MAX_EMPTY_ITEMS = 1_000_000
_FIXED_SIZES = {"null": 0, "boolean": 1, "float": 4, "double": 8}
_VARINT = ("int", "long", "enum")
_LENGTH_PREFIXED = ("bytes", "string")
_MAYBE_WIDE = re.compile(rb"[\x80-\xff]{4}[\x10-\xff]")  # see the module's docstring
_WIDTHS = {"int": (5, 32), "long": (10, 64)}  # bytes and bits at most (Java's readInt/readLong)


class _TooMany(ValueError):
    pass


class _TooWide(ValueError):
    pass


def varint_problem(body: bytes, schema: AvroSchema) -> str | None:
    """Why `body` may not pass though it reads with `schema`: a varint wider than its type,
    named by its field (see the module's docstring). None when it has none, or when the body
    is malformed otherwise (fastavro's read says how)."""
    if _MAYBE_WIDE.search(body) is None:
        return None
    return _walked(body, schema, _TooWide, strict=True)


def empty_items_problem(body: bytes, schema: AvroSchema) -> str | None:
    """Why `body` may not be read with `schema`: it claims more than MAX_EMPTY_ITEMS items
    that take no bytes. None when it does not, or when the body is malformed otherwise
    (fastavro's read then says how, before it reaches such an array)."""
    if "empty_items" not in schema.memo:
        schema.memo["empty_items"] = _has_empty_items(schema.parsed, _named(schema), set())
    if not schema.memo["empty_items"]:
        return None
    return _walked(body, schema, _TooMany, strict=False)


def _named(schema: AvroSchema) -> dict[str, Any]:
    parsed = schema.parsed
    return parsed.get("__named_schemas", {}) if isinstance(parsed, dict) else {}


def _walked(body: bytes, schema: AvroSchema, problem: type[ValueError],
            strict: bool) -> str | None:
    """The `problem` a walk of `body` meets, as text; None when none, or when the body is
    malformed otherwise."""
    try:
        _Walk(body, _named(schema), strict).skip(schema.parsed, "")
    except problem as found:
        return str(found)
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
    """Reads past one value of a schema in the body, building nothing; `strict`: a varint
    wider than its type is _TooWide, naming the field at `path` (as avro_diagnostics does)."""

    def __init__(self, body: bytes, named: dict[str, Any], strict: bool = False) -> None:
        self._body = body
        self._at = 0
        self._named = named
        self._empty_items = 0
        self._strict = strict

    def _long(self, path: str = "", what: str = "long") -> int:
        start = self._at
        byte = self._body[start]  # IndexError past the end: malformed
        if byte < 0x80:  # one byte: most varints, never too wide
            self._at += 1
            return (byte >> 1) ^ -(byte & 1)
        shift = result = 0
        while True:
            byte = self._body[self._at]  # IndexError past the end: malformed
            self._at += 1
            if shift < 140:  # 20 bytes: what a wider one holds is not worked out
                result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 63 and not self._strict:
                raise ValueError("varint too long")
        value = (result >> 1) ^ -(result & 1)
        if self._strict:
            self._bounded(value, self._at - start, path, what)
        return value

    def _bounded(self, value: int, size: int, path: str, what: str) -> None:
        """_TooWide unless `value`, read from `size` bytes, is as wide as its type allows."""
        if size < 5:
            return
        kind = "int" if what in ("int", "enum", "union") else "long"
        most, bits = _WIDTHS[kind]
        if size <= most and -2 ** (bits - 1) <= value < 2 ** (bits - 1):
            return
        field = path.lstrip(".") or "(the payload)"
        holds = {"int": "", "long": "", "enum": "the symbol index ",
                 "union": "the union branch index ", "length": "the length ",
                 "count": "the item count "}[what]
        shown = str(value) if size <= 20 else "a number"
        if size > most:
            raise _TooWide(f"field {field!r} has {holds}{shown} in a varint of {size} bytes, "
                           f"wider than an Avro {kind} takes (at most {most}): Java's "
                           f"BinaryDecoder refuses it (Invalid {kind} encoding), other "
                           "readers read another number")
        raise _TooWide(f"field {field!r} has {holds}{shown}, beyond an Avro {kind} ({bits} "
                       "bits): readers refuse it or read another number")

    def _advance(self, size: int) -> None:
        if size < 0 or self._at + size > len(self._body):
            raise ValueError("past the end")
        self._at += size

    def skip(self, node: Any, path: str) -> None:
        if type(node) is str and node in _VARINT:  # the most common, at once
            self._long(path, node)
            return
        node = _resolved(node, self._named)
        if isinstance(node, list):  # a union: its branch's index, then the branch
            index = self._long(path, "union")
            if not 0 <= index < len(node):
                raise ValueError("no such branch")
            self.skip(node[index], path)
            return
        kind = _kind(node)  # a primitive's name too, with a logicalType or without
        if kind in _FIXED_SIZES:
            self._advance(_FIXED_SIZES[kind])
        elif kind in _VARINT:
            self._long(path, kind)
        elif kind in _LENGTH_PREFIXED:
            self._advance(self._long(path, "length"))
        elif kind == "fixed":
            self._advance(int(node["size"]))
        elif kind in ("record", "error"):
            for field in node["fields"]:
                self.skip(field["type"], f"{node.get('name')}.{field['name']}"
                          if self._strict else path)
        elif kind in ("array", "map"):
            self._blocks(node, path)
        else:
            raise ValueError(f"unknown type {kind!r}")

    def _blocks(self, node: Any, path: str) -> None:
        items = node["items"] if node["type"] == "array" else node["values"]
        empty = node["type"] == "array" and _takes_no_bytes(items, self._named, set())
        index = 0
        while count := self._long(path, "count"):
            if count < 0:  # a block with its size in bytes
                count = -count
                self._long(path, "length")
            if empty:
                self._empty_items += count
                if self._empty_items > MAX_EMPTY_ITEMS:
                    raise _TooMany(f"it claims {self._empty_items} or more array items that "
                                   f"take no bytes (over {MAX_EMPTY_ITEMS}): reading them "
                                   "would take memory without bound")
                continue
            for _ in range(count):
                where = path
                if node["type"] == "map":
                    size = self._long(path, "length")  # the key
                    key = self._body[self._at:self._at + size]
                    self._advance(size)
                    if self._strict:
                        where = f"{path}[{key.decode('utf-8', 'replace')!r}]"
                elif self._strict:
                    where = f"{path}[{index}]"
                    index += 1
                self.skip(items, where)
