"""A raw partition the router reads nothing from while records wait behind its high watermark.

QA 54-b F-1: a transaction left open on the raw topic holds its partition's last stable offset,
so a read_committed consumer gets nothing past it; the router logged nothing for 3 minutes while
19,250 records waited. Watched from the consumer lag's periodic update (metrics.observe_lag, at
most once a second, never per record): a partition whose position has not moved for
source.held_partition_warning_s while its high watermark is past it is logged once, and its
release once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger("cdc_router.router")

RUNBOOK = "README runbook 'a raw partition held by an open transaction'"


@dataclass
class _Mark:
    position: int
    since: float
    said: bool = False


class HeldPartitions:
    """The assigned partitions' positions, and since when each has not moved with records
    behind its high watermark."""

    def __init__(self) -> None:
        self._marks: dict[tuple[str, int], _Mark] = {}

    def observe(self, marks: Mapping[tuple[str, int], tuple[int, int]], now: float,
                bound_s: float) -> None:
        """`marks`: (topic, partition) → (position, high watermark) of each assigned one;
        one held `bound_s` (source.held_partition_warning_s) is logged."""
        for key in self._marks.keys() - marks.keys():
            del self._marks[key]  # revoked
        for key, (position, high) in marks.items():
            mark = self._marks.get(key)
            if high <= position or mark is None or mark.position != position:
                if mark is not None and mark.said:
                    log.info("event=raw_partition_released topic=%s partition=%d position=%d "
                             "held_s=%.0f", key[0], key[1], position, now - mark.since)
                self._marks[key] = _Mark(position, now)
                continue
            if not mark.said and now - mark.since >= bound_s:
                mark.said = True
                log.warning("event=raw_partition_held topic=%s partition=%d position=%d "
                            "high_watermark=%d held_s=%.0f reason=%r", key[0], key[1],
                            position, high, now - mark.since,
                            f"nothing read past offset {position} for {now - mark.since:.0f} s "
                            f"while {high - position} offsets wait up to the high watermark: "
                            "a transaction open on the partition holds its last stable offset "
                            "(or the broker stopped answering fetches); `cdc-router status` "
                            f"names it; {RUNBOOK}")
