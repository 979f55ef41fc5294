"""The router's replay filter: the event ids it delivered recently, so Debezium's replays drop.

After a crash Debezium re-emits the events since its last flushed offset. Each id the router
delivers is remembered here and written, in the same Kafka transaction as the delivery, to a
changelog topic (key: the event id), from which a restarted or newly assigned router restores it.

Memory is bounded twice: ids older than `window_ms` are forgotten, and beyond `max_ids` the oldest
go first. Each id costs about 250 bytes of Python objects (measured: a 36-character str key, an
int and the ordered dict's entry), so the default million ids take about 250 MB. A replay of an
id forgotten by either bound is delivered again: size the window to cover Debezium's replays
(minutes after a Connect crash) and the raw topic's retention.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ChangelogRecord:
    """One delivered id as the changelog topic stores it."""

    key: bytes
    value: bytes


def changelog_record(event_id: str, delivered_ms: int) -> ChangelogRecord:
    # json.dumps({"ts": delivered_ms}) byte for byte, without its cost on every event.
    return ChangelogRecord(event_id.encode(), b'{"ts": %d}' % delivered_ms)


def parse_changelog(key: bytes | None, value: bytes | None) -> tuple[str, int] | None:
    """(event id, delivered_ms) from a changelog record; None for one we can't read."""
    if key is None or value is None:
        return None
    try:
        return key.decode(), int(json.loads(value)["ts"])
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None


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
