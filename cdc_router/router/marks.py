"""The dedup changelog's records: the marks of the ids a batch delivered or dead-lettered.

The changelog holds one record per batch, not per id: a produce() per event was a top cost of the
router (#14). Its value is `{"ts": delivered_ms, "ids": [...], "group": source.group_id}`, at
most MARK_MAX_BYTES of ids (a big batch takes several records), its key `batch:`, the group, the
first id and a random tail. Earlier versions wrote one record per id (key: the id, value
`{"ts": ...}`), then batches without a group; all are read. The topic stays `compact,delete`:
batch keys are unique, so compaction keeps them all, and the time retention (dedup.window_ms)
removes them as it removed the single marks.

Several pipelines may share one changelog (its default name is the same for all): each reads
only the marks of its own source.group_id, since two outboxes may well use the same ids (integer
ids, say). The router and the relay of one outbox share a config, so a group, and its marks.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cdc_router.serde.json import parse_json

log = logging.getLogger("cdc_router.router")

# Ids per changelog record, in bytes of JSON: far below a broker's message.max.bytes (1 MB by
# default), large enough that a batch of commit_max_records (1000) uuids takes one record.
MARK_MAX_BYTES = 64_000
BATCH_KEY_PREFIX = "batch:"
# Marks written by `cdc-router dlq replay` for the dead letters it delivered: read like any
# batch, and told apart from the marks of dead-lettered ids (router/dlq_letters.py).
REPLAYED_KEY_PREFIX = "replayed:"
# Marks of dead-lettered ids: the replay filter reads them like any batch (a replay is not
# dead-lettered twice); the cleanup's sweep never takes them for a delivery
# (router/committed_ids.py). Earlier versions marked them under BATCH_KEY_PREFIX.
DEAD_LETTERED_KEY_PREFIX = "dead:"


@dataclass(frozen=True)
class ChangelogRecord:
    """Delivered ids as the changelog topic stores them."""

    key: bytes
    value: bytes


def changelog_records(event_ids: Sequence[str], delivered_ms: int,
                      key_prefix: str = BATCH_KEY_PREFIX, *,
                      group: str | None = None) -> list[ChangelogRecord]:
    """The records that mark `event_ids` delivered by `group`: one, or halves until each fits
    MARK_MAX_BYTES (a single id is never split); keys are `key_prefix`, the group and the
    first id (two pipelines' batches never share a key, which compaction would merge)."""
    if not event_ids:
        return []
    document: dict[str, Any] = {"ts": delivered_ms, "ids": list(event_ids)}
    if group is not None:
        document["group"] = group
    # ensure_ascii: any id is writable, and the value is plain ASCII.
    value = json.dumps(document, separators=(",", ":"))
    if len(value) > MARK_MAX_BYTES and len(event_ids) > 1:
        half = len(event_ids) // 2
        return [*changelog_records(event_ids[:half], delivered_ms, key_prefix, group=group),
                *changelog_records(event_ids[half:], delivered_ms, key_prefix, group=group)]
    owner = "" if group is None else f"{len(group)}:{group}:"
    # The first id names the batch for people; the random tail makes the key unique, as a
    # later batch may start with the same id (an id delivered again after the window, a second
    # `dlq replay`), and compaction would drop the older batch's other ids.
    key = f"{key_prefix}{owner}{event_ids[0]}#{secrets.token_hex(6)}"
    return [ChangelogRecord(key.encode("utf-8", "surrogatepass"), value.encode())]


def parse_changelog(key: bytes | None, value: bytes | None, *,
                    group: str | None = None) -> list[tuple[str, int]]:
    """(event id, delivered_ms) of every id a changelog record holds, either format; [] for
    one we can't read, and for a mark of another group than `group` (another pipeline's ids
    prove nothing here: its outbox may use the same ids). A mark of no group (written before
    marks named theirs) counts for every group."""
    if key is None or value is None:
        return []
    try:
        document: Any = parse_json(value)
        delivered_ms = int(document["ts"])
        owner = document.get("group")
        if group is not None and owner is not None and owner != group:
            return []
        ids = document.get("ids")
        if ids is None:
            return [(key.decode(), delivered_ms)]  # one record per id (earlier versions)
        return [(event_id, delivered_ms) for event_id in ids if isinstance(event_id, str)]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as error:
        # Not ours (someone wrote to the changelog): its ids, if any, are not remembered.
        log.warning("event=changelog_record_unreadable key=%r error=%r", key[:80], str(error))
        return []


_OWNED_PREFIXES = (BATCH_KEY_PREFIX, REPLAYED_KEY_PREFIX, DEAD_LETTERED_KEY_PREFIX)


def mark_owner(key: bytes | None) -> str | None:
    """The group a changelog record's key names (`batch:<length>:<group>:<id>#<tail>`), or None
    for a key of no group (earlier versions) or not a mark's."""
    text = (key or b"").decode("utf-8", "replace")
    prefix = next((prefix for prefix in _OWNED_PREFIXES if text.startswith(prefix)), None)
    if prefix is None:
        return None
    length, colon, rest = text[len(prefix):].partition(":")
    # isdigit() also takes digits int() refuses ('²'), and a key is anyone's to write.
    if not colon or not (length.isascii() and length.isdigit()) or len(length) > 6:
        return None
    size = int(length)  # 0: no group's (a router never writes an empty source.group_id)
    return rest[:size] if size and rest[size:size + 1] == ":" else None
