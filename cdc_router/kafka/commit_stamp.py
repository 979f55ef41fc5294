"""When the router committed: a stamp in its offset commit metadata, read back by `status`.

Kafka keeps a committed offset's metadata string with it (offset.metadata.max.bytes, 4096 by
default) but not when it was committed; the router writes its wall clock there, so anyone who
can read the group's offsets can tell the age of its last commit.

`dlq replay` adds, at the end of a complete run, how many of the pipeline's letters before the
committed offset are still not delivered (`undelivered_before=`), so that `status` counts the
letters not delivered without reading the changelog (QA 52-b M1).
"""

from __future__ import annotations

import re

_PREFIX = "cdc-router committed_ms="
_UNDELIVERED = " undelivered_before="
_STAMP = re.compile(re.escape(_PREFIX) + r"(\d{1,16})(?:" + _UNDELIVERED + r"(\d{1,16}))?$")


def commit_metadata(now_ms: int, undelivered: int | None = None) -> str:
    """The metadata to commit offsets with at `now_ms` (Unix epoch milliseconds); with
    `undelivered`, the letters before the offset not delivered (a complete `dlq replay`)."""
    return f"{_PREFIX}{now_ms}" + ("" if undelivered is None else f"{_UNDELIVERED}{undelivered}")


def undelivered_before(metadata: str | None) -> int | None:
    """The undelivered letters before the offset a complete `dlq replay` committed with
    `metadata`; None when no complete replay committed it."""
    match = _STAMP.match(metadata or "")
    return int(match.group(2)) if match and match.group(2) is not None else None


def committed_ms(metadata: str | None) -> int | None:
    """The commit time a committed offset's metadata holds; None when another client (or a
    router before this stamp existed) committed it."""
    match = _STAMP.match(metadata or "")
    return int(match.group(1)) if match else None
