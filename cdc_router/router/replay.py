"""The router's replay filter: the event ids it delivered recently, so Debezium's replays drop.

After a crash Debezium re-emits the events since its last flushed offset. Each id the router
delivers is remembered here and written, in the same Kafka transaction as the delivery, to a
changelog topic, from which a restarted or newly assigned router restores it.

The changelog holds one record per batch, not per id: a produce() per event was a top cost of the
router (#14). Its value is `{"ts": delivered_ms, "ids": [...]}`, at most MARK_MAX_BYTES of ids
(a big batch takes several records), its key `batch:` and the first id. Earlier versions wrote
one record per id (key: the id, value `{"ts": delivered_ms}`); both are read. The topic stays
`compact,delete`: batch keys are unique, so compaction keeps them all, and the time retention
(dedup.window_ms) removes them as it removed the single marks.

Memory is bounded twice: ids older than `window_ms` are forgotten, and beyond `max_ids` the oldest
go first. Each id costs about 250 bytes of Python objects (measured: a 36-character str key, an
int and the ordered dict's entry), so the default million ids take about 250 MB. A replay of an
id forgotten by either bound is delivered again: size the window to cover Debezium's replays
(minutes after a Connect crash) and the raw topic's retention.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
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


@dataclass(frozen=True)
class ChangelogRecord:
    """Delivered ids as the changelog topic stores them."""

    key: bytes
    value: bytes


def changelog_records(event_ids: Sequence[str], delivered_ms: int,
                      key_prefix: str = BATCH_KEY_PREFIX) -> list[ChangelogRecord]:
    """The records that mark `event_ids` delivered: one, or halves until each fits
    MARK_MAX_BYTES (a single id is never split); keys are `key_prefix` and the first id."""
    if not event_ids:
        return []
    # ensure_ascii: any id is writable, and the value is plain ASCII.
    value = json.dumps({"ts": delivered_ms, "ids": list(event_ids)}, separators=(",", ":"))
    if len(value) > MARK_MAX_BYTES and len(event_ids) > 1:
        half = len(event_ids) // 2
        return [*changelog_records(event_ids[:half], delivered_ms, key_prefix),
                *changelog_records(event_ids[half:], delivered_ms, key_prefix)]
    key = f"{key_prefix}{event_ids[0]}".encode("utf-8", "surrogatepass")
    return [ChangelogRecord(key, value.encode())]


def parse_changelog(key: bytes | None, value: bytes | None) -> list[tuple[str, int]]:
    """(event id, delivered_ms) of every id a changelog record holds, either format; [] for
    one we can't read."""
    if key is None or value is None:
        return []
    try:
        document: Any = parse_json(value)
        delivered_ms = int(document["ts"])
        ids = document.get("ids")
        if ids is None:
            return [(key.decode(), delivered_ms)]  # one record per id (earlier versions)
        return [(event_id, delivered_ms) for event_id in ids if isinstance(event_id, str)]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as error:
        # Not ours (someone wrote to the changelog): its ids, if any, are not remembered.
        log.warning("event=changelog_record_unreadable key=%r error=%r", key[:80], str(error))
        return []


class ReplayFilter:
    """Ids delivered within the window; a batch's ids count only once its transaction commits."""

    def __init__(self, *, window_ms: int, max_ids: int) -> None:
        self._window_ms = window_ms
        self._max_ids = max_ids
        self._delivered: OrderedDict[str, int] = OrderedDict()
        self._pending: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._delivered)

    def seen(self, event_id: str) -> bool:
        """True if the id was delivered, or is being delivered in the open batch."""
        return event_id in self._pending or event_id in self._delivered

    def add_pending(self, event_id: str, now_ms: int) -> None:
        self._pending[event_id] = now_ms

    def commit(self, now_ms: int) -> None:
        """The batch's transaction committed: its ids are now delivered."""
        self.restore(self._pending.items(), now_ms)
        self._pending.clear()

    def abort(self) -> None:
        """The batch's transaction aborted: its records never became visible."""
        self._pending.clear()

    def restore(self, entries: Iterable[tuple[str, int]], now_ms: int) -> None:
        """Remember delivered ids (from the changelog or a commit), then apply both bounds."""
        for event_id, delivered_ms in entries:
            self._delivered[event_id] = delivered_ms
            self._delivered.move_to_end(event_id)
        self.expire(now_ms)

    def expire(self, now_ms: int) -> None:
        horizon = now_ms - self._window_ms
        delivered = self._delivered
        while delivered:
            oldest_id, oldest_ms = next(iter(delivered.items()))
            if oldest_ms >= horizon and len(delivered) <= self._max_ids:
                break
            del delivered[oldest_id]
