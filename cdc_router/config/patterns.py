"""The pattern language of router.yaml: an exact value, a glob, or a `re:` regular expression.

Route matches (aggregate_type, type, headers), protected_topics and allowed_topics use it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable

_REGEX_PREFIX = "re:"
_GLOB_CHARS = frozenset("*?[")


def compile_pattern(pattern: str) -> Callable[[str], bool]:
    """A predicate for one match pattern: `re:<regex>` (full match), a glob, or an exact value.

    A pattern containing `*`, `?` or `[` is a glob (fnmatch, case-sensitive); one starting with
    `re:` is a Python regular expression that must match the whole value; anything else must be
    equal. Raises ValueError for a regex that does not compile.
    """
    if pattern.startswith(_REGEX_PREFIX):
        try:
            regex = re.compile(pattern[len(_REGEX_PREFIX):])
        except re.error as error:
            raise ValueError(f"invalid regular expression: {error}") from None
        return lambda value: regex.fullmatch(value) is not None
    if _GLOB_CHARS.intersection(pattern):
        glob = re.compile(fnmatch.translate(pattern))
        return lambda value: glob.match(value) is not None
    return lambda value: value == pattern
