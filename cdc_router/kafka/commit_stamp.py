"""When the router committed: a stamp in its offset commit metadata, read back by `status`.

Kafka keeps a committed offset's metadata string with it (offset.metadata.max.bytes, 4096 by
default) but not when it was committed; the router writes its wall clock there, so anyone who
can read the group's offsets can tell the age of its last commit.
"""

from __future__ import annotations

import re

_PREFIX = "cdc-router committed_ms="
_STAMP = re.compile(re.escape(_PREFIX) + r"(\d{1,16})$")


def commit_metadata(now_ms: int) -> str:
    """The metadata to commit offsets with at `now_ms` (Unix epoch milliseconds)."""
    return f"{_PREFIX}{now_ms}"


def committed_ms(metadata: str | None) -> int | None:
    """The commit time a committed offset's metadata holds; None when another client (or a
    router before this stamp existed) committed it."""
    match = _STAMP.match(metadata or "")
    return int(match.group(1)) if match else None
