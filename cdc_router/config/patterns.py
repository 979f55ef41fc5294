"""The pattern language of router.yaml: an exact value, a glob, or a `re:` regular expression.

Route matches (aggregate_type, type, headers), protected_topics and allowed_topics use it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable

REGEX_PREFIX = "re:"
GLOB_CHARS = frozenset("*?[")


def compile_pattern(pattern: str) -> Callable[[str], bool]:
    """A predicate for one match pattern: `re:<regex>` (full match), a glob, or an exact value.

    A pattern containing `*`, `?` or `[` is a glob (fnmatch, case-sensitive); one starting with
    `re:` is a Python regular expression that must match the whole value; anything else must be
    equal. Raises ValueError for a regex that does not compile.
    """
    if pattern.startswith(REGEX_PREFIX):
        try:
            regex = re.compile(pattern[len(REGEX_PREFIX):])
        except (re.error, OverflowError) as error:  # OverflowError: a{99999999999} (QA 33-b)
            raise ValueError(f"invalid regular expression: {error}") from None
        return lambda value: regex.fullmatch(value) is not None
    if GLOB_CHARS.intersection(pattern):
        glob = re.compile(fnmatch.translate(pattern))
        return lambda value: glob.match(value) is not None
    return lambda value: value == pattern


def slow_pattern(pattern: str) -> bool:
    """Whether a `re:` pattern repeats a group that itself holds an unbounded repeat, as in
    `(Order|[A-Za-z]+)+Paid`: one value can then take exponential time to match (measured
    in review session 27: 2.75 s at 25 characters, doubling with each one). A reading of the
    pattern's text (escapes and character classes skipped), so it may flag a harmless one."""
    if not pattern.startswith(REGEX_PREFIX):
        return False
    text = pattern[len(REGEX_PREFIX):]
    opened: list[bool] = []  # per open group: whether it holds an unbounded repeat so far
    index, in_class = 0, False
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            index += 1 if text[index + 1:index + 2] != "]" else 2  # []...] holds a ]
            continue
        elif char == "(":
            opened.append(False)
        elif char == ")" and opened:
            repeating = opened.pop()
            if _unbounded(text, index + 1):
                if repeating:
                    return True
                if opened:
                    opened[-1] = True
            elif repeating and opened:
                opened[-1] = True
        elif _unbounded(text, index) and opened and char in "+*{" and index > 0:
            opened[-1] = True
        index += 1
    return False


def _unbounded(text: str, index: int) -> bool:
    """Whether a quantifier that repeats without bound starts at `index`: + * {n,}."""
    if text[index:index + 1] in ("+", "*"):
        return True
    return re.match(r"\{\d*,\}", text[index:]) is not None
