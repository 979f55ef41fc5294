"""Bounds of the JSON every consumer reads, on JSON text: nesting depth, integers beyond a double.

A pure leaf (it imports nothing of the package): the router's parser (serde/json.py) and
write_event's checks before the INSERT (outbox/event_json.py) apply the same bounds, and the
outbox cannot import serde without a cycle.
"""

from __future__ import annotations

import re
import sys
from itertools import accumulate
from typing import Any

# Deepest nesting of objects and arrays accepted in a payload or headers column. Python's parser
# recurses once per level and stops near 1,000 (sys.getrecursionlimit()) minus the caller's
# stack, and Postgres jsonb accepts thousands; event payloads rarely pass 20 levels, and some
# consumers' parsers stop far earlier (Rust's serde_json at 128).
MAX_JSON_DEPTH = 256
# Measuring depth keeps only what nests: brackets, and the quotes that delimit strings.
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_QUOTED = re.compile(rb'"[^"]*"')
_DEPTH_STEP = [0] * 256
_DEPTH_STEP[ord("[")] = _DEPTH_STEP[ord("{")] = 1
_DEPTH_STEP[ord("]")] = _DEPTH_STEP[ord("}")] = -1

# How a number beyond a double starts its ValueError; json_problem words the reason from it.
BEYOND_DOUBLE = "a number beyond a double"

# An integer beyond a double (10**308 up: jsonb stores 1e400 as 1 and 400 zeros) is refused as
# 1e400 is (QA 45-a). Only a payload with a run of 308 digits may hold one: such a run covers two
# neighbouring bytes of every 154th, a check of a few bytes before any search.
DOUBLE_DIGITS = len(str(int(sys.float_info.max)))  # 309
_STRIDE = (DOUBLE_DIGITS - 1) // 2
_TWO_DIGITS = re.compile("[0-9][0-9]")
_TWO_DIGITS_BYTES = re.compile(b"[0-9][0-9]")
_DIGIT_RUN = re.compile(f"(?<![0-9])[0-9]{{{DOUBLE_DIGITS - 1}}}")  # from a run's start only
_DIGIT_RUN_BYTES = re.compile(_DIGIT_RUN.pattern.encode())
# The least integer a double reader rounds to infinity: the largest double plus half its last
# step (2**971); a smaller one rounds to the largest double, as 1.7976931348623158e308 does.
_ROUNDS_TO_INFINITY = 2**1024 - 2**970


def beyond_double(item: Any) -> bool:
    """Whether `item` is an integer that no double holds (a double reader reads infinity)."""
    return isinstance(item, int) and not isinstance(item, bool) and \
        abs(item) >= _ROUNDS_TO_INFINITY


def _beyond_double(value: Any) -> int | None:
    """The first integer of a parsed tree (or of a tree json.dumps writes: tuples are arrays)
    that no double holds, or None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if beyond_double(value) else None
    children = value.values() if isinstance(value, dict) else value \
        if isinstance(value, list | tuple) else ()
    return next((found for found in map(_beyond_double, children) if found is not None), None)


def refuse_huge_integers(text: str | bytes, parsed: Any) -> None:
    if isinstance(text, bytes):
        suspect = bool(_TWO_DIGITS_BYTES.search(text[::_STRIDE])
                       and _DIGIT_RUN_BYTES.search(text))
    else:
        suspect = bool(_TWO_DIGITS.search(text[::_STRIDE]) and _DIGIT_RUN.search(text))
    if suspect and (huge := _beyond_double(parsed)) is not None:
        raise ValueError(f"{BEYOND_DOUBLE} ({str(huge)[:20] + '...'!r}, an integer "
                         f"of {len(str(abs(huge)))} digits)")


def deeper_than(text: str | bytes, limit: int) -> bool:
    # A text no longer than the limit has no more brackets than that (most headers columns
    # and payloads): nothing to count.
    if len(text) <= limit:
        return False
    # Fewer brackets than the limit cannot nest deeper: two C-speed counts for most values.
    if isinstance(text, str):
        if text.count("[") + text.count("{") <= limit:
            return False
        text = text.encode("utf-8", "surrogatepass")
    elif text.count(b"[") + text.count(b"{") <= limit:
        return False
    # Brackets inside strings do not nest. Escaped backslashes go first, then escaped quotes,
    # so that the quotes left delimit strings; then all but brackets and quotes; then strings.
    skeleton = text.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    brackets = _QUOTED.sub(b"", skeleton)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0) > limit


def beyond_double_reason(error: str) -> str:
    """The reason for a refuse_huge_integers (or 1e400) error, to follow a noun."""
    return (f"holds {error}: valid JSON, but Go's and Rust's JSON readers refuse it and others "
            "read infinity; write it as a string")


def dumped_json_problem(text: str, value: Any) -> str | None:
    """What the router's strict parse would still refuse in `text`, which json.dumps(value,
    allow_nan=False) wrote (so neither malformed nor NaN), to follow a noun; or None. Cheap
    for most texts: write_event's check before the router ever reads it (review 50-d F4)."""
    if deeper_than(text, MAX_JSON_DEPTH):
        return f"is JSON nested deeper than {MAX_JSON_DEPTH} levels (MAX_JSON_DEPTH)"
    if len(text) >= DOUBLE_DIGITS - 1:
        try:
            refuse_huge_integers(text, value)
        except ValueError as error:
            return beyond_double_reason(str(error))
    return None
