"""The router's own topics in `status`: dead letters (count, the newest) and the changelog size.

Dead letters are counted by reading them (read_committed): the topic is written in
transactions, so its offsets also count commit markers. Only the newest SCAN_LIMIT offsets of
each partition are read; on a larger topic `count_exact` is false.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from cdc_router.dead_letter import dead_letter_origin, of_pipeline
from cdc_router.kafka.consumer import record_headers
from cdc_router.ops.offsets import LOOKUP_TIMEOUT_S, Scanned, age_s, offsets, scan, timestamp_ms
from cdc_router.ops.report import ChangelogState, DeadLetterInfo, DeadLetterState

SCAN_LIMIT = 100_000


def _partitions(admin: AdminClient, topic: str) -> list[TopicPartition] | None:
    found = admin.list_topics(topic, timeout=LOOKUP_TIMEOUT_S).topics.get(topic)
    if found is None or found.error is not None:
        return None
    return [TopicPartition(topic, p) for p in sorted(found.partitions)]


def _missing(topic: str) -> str:
    return f"topic {topic} does not exist: run `cdc-router topics apply -c <config>`"


def dead_letter_state(admin: AdminClient, kafka: Mapping[str, str], topic: str, now_ms: int,
                      ours: Callable[[str, str | None], bool]) -> DeadLetterState:
    """This pipeline's letters (`ours`, as `dlq replay` tells them), and how many of others
    share the topic (QA 35-c: a shared topic's letters all counted against each pipeline)."""
    partitions = _partitions(admin, topic)
    if partitions is None:
        return DeadLetterState(topic=topic, error=_missing(topic))
    starts = offsets(admin, partitions, "earliest")
    ends = offsets(admin, partitions, "latest")
    windows = {p: (max(starts[(t, p)], ends[(t, p)] - SCAN_LIMIT), ends[(t, p)])
               for t, p in ends}
    seen = scan(kafka, topic, windows,
                keep=lambda message: of_pipeline(record_headers(message), ours))
    exact = all(windows[p][0] == starts[(topic, p)] and seen[p].complete for p in windows)
    return DeadLetterState(topic=topic, count=sum(s.count for s in seen.values()),
                           others=sum(s.others for s in seen.values()),
                           count_exact=exact, newest=_newest(seen, now_ms))


def _newest(seen: Mapping[int, Scanned], now_ms: int) -> DeadLetterInfo | None:
    lasts = [s.last for s in seen.values() if s.last is not None]
    if not lasts:
        return None
    last = max(lasts, key=lambda m: (timestamp_ms(m) or 0, m.partition() or 0, m.offset() or 0))
    origin = dead_letter_origin(record_headers(last))
    return DeadLetterInfo(last.partition() or 0, last.offset() or 0,
                          age_s(timestamp_ms(last), now_ms), origin["stage"],
                          origin["source"] or "", origin["event_id"], origin["error"],
                          origin["reason"])


def changelog_state(admin: AdminClient, topic: str, enabled: bool) -> ChangelogState:
    if not enabled:
        return ChangelogState(topic=topic, enabled=False)
    partitions = _partitions(admin, topic)
    if partitions is None:
        return ChangelogState(topic=topic, error=_missing(topic))
    starts = offsets(admin, partitions, "earliest")
    ends = offsets(admin, partitions, "latest", committed_only=False)
    return ChangelogState(topic=topic, partitions=len(partitions),
                          retained_offsets=sum(ends[key] - starts[key] for key in ends))
