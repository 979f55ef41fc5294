"""The router's own topics in `status`: dead letters (count, the newest) and the changelog size.

Dead letters are counted by reading them (read_committed): the topic is written in
transactions, so its offsets also count commit markers. Only the newest SCAN_LIMIT offsets of
each partition are read; on a larger topic `count_exact` is false.

Those not delivered since: a complete `dlq replay` commits, with its group's offset on each
partition, how many of the pipeline's letters before it it left undelivered
(kafka/commit_stamp.py); status adds the letters after that offset, without reading the
changelog (QA 52-b M1: every replayed letter counted, the alarm could not clear).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from cdc_router.dead_letter import dead_letter_origin, of_pipeline
from cdc_router.kafka.commit_stamp import undelivered_before
from cdc_router.kafka.consumer import record_headers
from cdc_router.ops.offsets import LOOKUP_TIMEOUT_S, Scanned, age_s, offsets, scan, timestamp_ms
from cdc_router.ops.report import ChangelogState, DeadLetterInfo, DeadLetterState
from cdc_router.router.marks import mark_owner

SCAN_LIMIT = 100_000
# The changelog records read a partition to name the groups sharing it: each holds up to
# MARK_MAX_BYTES (64 kB) of ids, so at most ~6 MB; a pipeline sharing it while it commits
# batches is among them, one idle since is not (the line says "among its newest").
OWNER_SAMPLE = 100
# Far more than 100 records take; past it, the groups read so far are named.
OWNER_SCAN_TIMEOUT_S = 10.0


def _partitions(admin: AdminClient, topic: str) -> list[TopicPartition] | None:
    found = admin.list_topics(topic, timeout=LOOKUP_TIMEOUT_S).topics.get(topic)
    if found is None or found.error is not None:
        return None
    return [TopicPartition(topic, p) for p in sorted(found.partitions)]


def _missing(topic: str) -> str:
    return f"topic {topic} does not exist: run `cdc-router topics apply -c <config>`"


def dead_letter_state(admin: AdminClient, kafka: Mapping[str, str], topic: str, now_ms: int,
                      ours: Callable[[str, str | None], bool],
                      replay_group: str | None = None) -> DeadLetterState:
    """This pipeline's letters (`ours`, as `dlq replay` tells them), and how many of others
    share the topic (QA 35-c: a shared topic's letters all counted against each pipeline);
    with `replay_group`, how many are not delivered since (see the module doc)."""
    partitions = _partitions(admin, topic)
    if partitions is None:
        return DeadLetterState(topic=topic, error=_missing(topic))
    starts = offsets(admin, partitions, "earliest")
    ends = offsets(admin, partitions, "latest")
    windows = {p: (max(starts[(t, p)], ends[(t, p)] - SCAN_LIMIT), ends[(t, p)])
               for t, p in ends}
    replayed = replayed_positions(admin, replay_group, partitions)
    positions = replayed or {}
    before: dict[int, int] = {}  # partition -> our letters before the replay's offset

    def keep(message: Message) -> bool:
        if not of_pipeline(record_headers(message), ours):
            return False
        partition = message.partition() or 0
        if (message.offset() or 0) < positions.get(partition, (-1, None))[0]:
            before[partition] = before.get(partition, 0) + 1
        return True
    seen = scan(kafka, topic, windows, keep=keep)
    exact = all(windows[p][0] == starts[(topic, p)] and seen[p].complete for p in windows)
    count = sum(s.count for s in seen.values())
    # Below the offset, the replay's count (no more than are there: retention); on a topic
    # read in part, every letter read counts.
    undelivered = None if replayed is None else count - sum(
        max(0, before.get(p, 0) - left) for p, (_, left) in replayed.items()
        if left is not None and exact)
    return DeadLetterState(topic=topic, count=count,
                           others=sum(s.others for s in seen.values()),
                           count_exact=exact, newest=_newest(seen, now_ms),
                           undelivered=undelivered)


def replayed_positions(admin: AdminClient, group: str | None, partitions: list[TopicPartition]
                       ) -> dict[int, tuple[int, int | None]] | None:
    """Partition -> the replay group's committed offset and the letters it left undelivered
    before it (None: no complete replay said); None when the group cannot be read."""
    if group is None:
        return None
    request = [ConsumerGroupTopicPartitions(group, partitions)]
    try:
        answer = admin.list_consumer_group_offsets(request, request_timeout=LOOKUP_TIMEOUT_S)
        found = answer[group].result().topic_partitions
    except KafkaException:  # no Describe on the group, say: not known, the count alone
        return None
    return {tp.partition: (tp.offset, undelivered_before(tp.metadata)) for tp in found
            if tp.offset >= 0}


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


def changelog_state(admin: AdminClient, kafka: Mapping[str, str], topic: str, enabled: bool,
                    group: str) -> ChangelogState:
    """The changelog's size, every pipeline's that writes marks there, and which other groups
    do, as the newest OWNER_SAMPLE records of each partition name them (QA 63-b L-2: a
    shared changelog's count was said as this pipeline's)."""
    if not enabled:
        return ChangelogState(topic=topic, enabled=False)
    partitions = _partitions(admin, topic)
    if partitions is None:
        return ChangelogState(topic=topic, error=_missing(topic))
    starts = offsets(admin, partitions, "earliest")
    ends = offsets(admin, partitions, "latest", committed_only=False)
    return ChangelogState(topic=topic, partitions=len(partitions),
                          retained_offsets=sum(ends[key] - starts[key] for key in ends),
                          other_groups=_other_owners(admin, kafka, topic, partitions, starts,
                                                     group))


def _other_owners(admin: AdminClient, kafka: Mapping[str, str], topic: str,
                  partitions: list[TopicPartition], starts: Mapping[tuple[str, int], int],
                  group: str) -> tuple[str, ...] | None:
    """The groups other than `group` whose marks are among the newest OWNER_SAMPLE committed
    records of each partition; None when they cannot be read (no Read on the topic: the
    size alone is said, as before)."""
    owners: set[str] = set()

    def note(message: Message) -> bool:
        owners.add(mark_owner(message.key()) or group)  # a mark of no group: anyone's
        return False

    try:
        ends = offsets(admin, partitions, "latest")
        scan(kafka, topic, {p: (max(starts[(t, p)], ends[(t, p)] - OWNER_SAMPLE), ends[(t, p)])
                            for t, p in ends}, timeout_s=OWNER_SCAN_TIMEOUT_S, keep=note)
    except KafkaException:
        return None
    return tuple(sorted(owners - {group}))
