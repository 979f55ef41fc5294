"""The router group against its raw topics: lag per partition, the last commit, the members.

The lag counts committed records, not offsets: Debezium writes the raw topic in transactions
(exactly.once.support), and the router's committed offset may sit on a commit marker, which
would read as a lag of 1 forever. Up to SCAN_LIMIT records behind, the waiting records are read
and counted; beyond, the lag is the offset difference (`lag_exact` false).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from cdc_router.kafka.commit_stamp import committed_ms
from cdc_router.ops.offsets import LOOKUP_TIMEOUT_S, age_s, offsets, scan, timestamp_ms
from cdc_router.ops.report import Member, PartitionLag, RouterState

SCAN_LIMIT = 10_000


def source_partitions(admin: AdminClient, sources: list[str]) -> list[TopicPartition]:
    """Every partition of the source topics (a `^regex` source: of each topic it matches)."""
    topics = admin.list_topics(timeout=LOOKUP_TIMEOUT_S).topics
    names = sorted({name for name in topics for source in sources
                    if name == source or (source.startswith("^") and re.match(source, name))})
    return [TopicPartition(name, p) for name in names for p in sorted(topics[name].partitions)]


def router_state(admin: AdminClient, kafka: Mapping[str, str], group: str,
                 sources: list[str], now_ms: int) -> RouterState:
    partitions = source_partitions(admin, sources)
    if not partitions:
        return RouterState(group=group, error=f"no source topic exists ({', '.join(sources)}): "
                           "the connector creates it with its first event; if rows wait in "
                           "the outbox, see the connector's lines above and Connect's log")
    request = [ConsumerGroupTopicPartitions(group, partitions)]
    answer = admin.list_consumer_group_offsets(request, request_timeout=LOOKUP_TIMEOUT_S)
    committed = {(tp.topic, tp.partition): tp for tp in answer[group].result().topic_partitions}
    starts = offsets(admin, partitions, "earliest")
    ends = offsets(admin, partitions, "latest")
    lags = _open_transactions(kafka, [
        _partition_lag(kafka, key, committed.get(key), starts[key], ends[key], now_ms)
        for key in sorted(ends)], _high_watermarks(admin, partitions), now_ms)
    description = admin.describe_consumer_groups(
        [group], request_timeout=LOOKUP_TIMEOUT_S)[group].result()
    members = tuple(sorted((Member(m.group_instance_id, m.client_id, m.host, tuple(
        f"{tp.topic}[{tp.partition}]" for tp in m.assignment.topic_partitions))
        for m in description.members), key=lambda m: (m.instance_id or "", m.client_id)))
    # Whenever records wait, members or not (review 52-j F6: a router restarted by its
    # supervisor is a static member while its start waits for the transaction): one request.
    held = _in_transaction(admin, group, partitions) if any(lag.lag for lag in lags) else ()
    commit_ages = [lag.last_commit_age_s for lag in lags if lag.last_commit_age_s is not None]
    pending = [lag.oldest_pending_age_s for lag in lags if lag.oldest_pending_age_s is not None]
    state = description.state
    return RouterState(group=group, group_state=getattr(state, "name", str(state)).lower(),
                       lag=sum(lag.lag for lag in lags),
                       last_commit_age_s=min(commit_ages) if commit_ages else None,
                       oldest_pending_age_s=max(pending) if pending else None,
                       partitions=tuple(lags), members=members, offsets_in_transaction=held)


def _high_watermarks(admin: AdminClient,
                     partitions: list[TopicPartition]) -> dict[tuple[str, int], int]:
    """The log ends, open transactions included; {} when the ask fails (an extra question:
    its failure must not lose the lag asked before it)."""
    try:
        return offsets(admin, partitions, "latest", committed_only=False)
    except KafkaException:
        return {}


def _open_transactions(kafka: Mapping[str, str], lags: list[PartitionLag],
                       highs: Mapping[tuple[str, int], int],
                       now_ms: int) -> list[PartitionLag]:
    """Each partition with its high watermark and, where an open transaction holds its last
    stable offset below it, that transaction's age (its first record's timestamp, read
    uncommitted): QA 54-b F-1, a transaction left open stopped the router for minutes while
    the lag, measured to the last stable offset, said 0."""
    found = []
    for lag in lags:
        high = highs.get((lag.topic, lag.partition))
        age = None
        if high is not None and high > lag.end:
            try:
                first = scan(kafka, lag.topic, {lag.partition: (lag.end, lag.end + 1)},
                             timeout_s=LOOKUP_TIMEOUT_S, committed_only=False)[lag.partition].first
            except KafkaException:
                first = None
            age = age_s(timestamp_ms(first), now_ms) if first is not None else None
        found.append(replace(lag, high_watermark=high, open_transaction_age_s=age))
    return found


def _in_transaction(admin: AdminClient, group: str,
                    partitions: list[TopicPartition]) -> tuple[str, ...]:
    """The partitions whose committed offset an open transaction holds: what a consumer
    asking for stable offsets (require_stable, as the router's start does) waits for."""
    request = [ConsumerGroupTopicPartitions(group, partitions)]
    try:
        answer = admin.list_consumer_group_offsets(request, require_stable=True,
                                                   request_timeout=LOOKUP_TIMEOUT_S)
        stable = answer[group].result().topic_partitions
    except KafkaException:
        # Review 52-j F3: an extra question; its failure must not lose the lag, the members
        # and the stall lines asked before it (the section's error replaced them all).
        return ()
    return tuple(f"{tp.topic}[{tp.partition}]" for tp in stable
                 if tp.error is not None and tp.error.code() == KafkaError.UNSTABLE_OFFSET_COMMIT)


def _partition_lag(kafka: Mapping[str, str], key: tuple[str, int],
                   committed: TopicPartition | None, start: int, end: int,
                   now_ms: int) -> PartitionLag:
    topic, partition = key
    offset = committed.offset if committed is not None and committed.offset >= 0 else None
    stamp = committed_ms(committed.metadata) if committed is not None else None
    # Below the log start, the records were deleted by retention: they wait no longer.
    first = start if offset is None else max(offset, start)
    stop = min(end, first + SCAN_LIMIT)
    seen = scan(kafka, topic, {partition: (first, stop)})[partition]
    exact = stop == end and seen.complete
    lag = seen.count if exact else end - first
    oldest = age_s(timestamp_ms(seen.first), now_ms) if seen.first is not None else None
    return PartitionLag(topic, partition, offset, end, lag, exact, age_s(stamp, now_ms), oldest)
