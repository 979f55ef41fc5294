"""Where a read of a whole topic starts and stands (kafka/reader.py, router/committed_ids.py).

A reader assigns every partition without a group: from its beginning, or from the first record
timestamped at or after a time (the dedup changelog's restore: marks older than the replay
filter's window are never held, QA 65-b F-5). It follows its own positions, never committed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    TopicPartition,
)

from cdc_router.errors import DeliveryError
from cdc_router.kafka.lookups import LOOKUP_TIMEOUT_S

log = logging.getLogger("cdc_router.kafka")

# The low watermark's lookup of a partition not read yet, asked at each turn of a read.
LOW_LOOKUP_S = 10.0


def _partitions_of(consumer: Consumer, topic: str, what: str, timeout_s: float) -> list[int]:
    found = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if found is None or found.error is not None:
        raise DeliveryError(f"the {what} topic {topic} does not exist: run "
                            "`cdc-router topics apply -c <config>` first")
    return sorted(found.partitions)


def assign_from_beginning(consumer: Consumer, topic: str, what: str,
                          timeout_s: float = LOOKUP_TIMEOUT_S) -> list[int]:
    """Assign every partition of `topic` from its first offset; DeliveryError if it is missing,
    KafkaException if it cannot be looked up within `timeout_s`.

    Never creates the topic by looking it up (the consumer's allow.auto.create.topics is off):
    `topics apply` creates it.
    """
    partitions = _partitions_of(consumer, topic, what, timeout_s)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    return partitions


def assign_since(consumer: Consumer, topic: str, what: str, since_ms: int,
                 timeout_s: float = LOOKUP_TIMEOUT_S) -> tuple[list[int], dict[int, int]]:
    """Assign every partition of `topic` from its first record timestamped `since_ms` or later
    (first_offsets_since()); the partitions, and those assigned at an offset (the others from
    their beginning). Raises as assign_from_beginning()."""
    partitions = _partitions_of(consumer, topic, what, timeout_s)
    starts = first_offsets_since(consumer, topic, partitions, since_ms, timeout_s)
    consumer.assign([TopicPartition(topic, p, starts.get(p, OFFSET_BEGINNING))
                     for p in partitions])
    return partitions, starts


def first_offsets_since(consumer: Consumer, topic: str, partitions: list[int], since_ms: int,
                        timeout_s: float = LOOKUP_TIMEOUT_S) -> dict[int, int]:
    """partition → the first offset of a record timestamped `since_ms` or later (Kafka's
    ListOffsets by time: every record below it is older), or, where none is, the end the
    consumer reads to (a read_committed consumer's: the last stable offset). A partition whose
    lookup failed is left out: read from its beginning, as before, slower but whole."""
    try:
        # The ends first: a record committed after this lookup lies at or past the end it
        # gives, whatever the time lookup after it finds (review of QA 65-b F-5).
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s,
                                                  cached=False)[1] for p in partitions}
        found = consumer.offsets_for_times(
            [TopicPartition(topic, p, since_ms) for p in partitions], timeout=timeout_s)
    except KafkaException as failure:
        log.warning("event=read_start_lookup_failed topic=%s since_ms=%d error=%r; reading "
                    "from the beginning", topic, since_ms, str(failure))
        return {}
    starts: dict[int, int] = {}
    for tp in found:
        if tp.error is not None:
            log.warning("event=read_start_lookup_failed topic=%s partition=%d since_ms=%d "
                        "error=%r; reading it from the beginning", topic, tp.partition,
                        since_ms, str(tp.error))
        elif tp.offset >= 0:
            starts[tp.partition] = tp.offset
        elif ends.get(tp.partition, -1) >= 0:  # no record so recent: nothing before the end
            starts[tp.partition] = ends[tp.partition]
    return starts


def assign_added(consumer: Consumer, topic: str, partitions: list[int], what: str,
                 timeout_s: float = LOOKUP_TIMEOUT_S) -> list[int]:
    """Assign, from their beginning, the partitions added to `topic` (kafka-topics --alter)
    since `partitions` were; every partition now assigned. QA, session 30: a router listed the
    changelog's partitions once, never read the marks other instances wrote to the added ones,
    and delivered their replays again."""
    found = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    added = sorted(set(found.partitions) - set(partitions)) \
        if found is not None and found.error is None else []
    if added:
        log.warning("event=partitions_added topic=%s partitions=%s what=%r", topic,
                    ",".join(map(str, added)), what)
        consumer.incremental_assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in added])
    return sorted([*partitions, *added])


def positions(consumer: Consumer, topic: str, partitions: Iterable[int],
              assigned_at: Mapping[int, int] | None = None) -> dict[int, int]:
    """partition → where the next record is read, negative if nothing was read of it since it
    was assigned from its beginning. librdkafka's position() answers OFFSET_INVALID until the
    consumer has returned a record of the partition, even of one assigned at an offset
    (review 39): `assigned_at`, where partitions were assigned at an offset, stands for it."""
    return {tp.partition: tp.offset if tp.offset >= 0 else
            (assigned_at or {}).get(tp.partition, tp.offset)
            for tp in consumer.position([TopicPartition(topic, p) for p in partitions])}


def reached(consumer: Consumer, topic: str, ends: Mapping[int, int],
            assigned_at: Mapping[int, int] | None = None) -> bool:
    """Whether every partition's position (see positions()) is at its end, or it holds nothing
    below it."""
    for partition, offset in positions(consumer, topic, list(ends), assigned_at).items():
        end = ends[partition]
        if end <= 0 or offset >= end:
            continue
        if offset < 0:
            # Nothing consumed yet: reached only if retention left nothing below the end. A
            # lookup that fails is no answer: read on (a read that stalls is renewed, review
            # 39-2: a leader's death mid-read raised out of the restore).
            try:
                low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                        timeout=LOW_LOOKUP_S, cached=False)
            except KafkaException:
                return False
            if low >= end:
                continue
        return False
    return True


def shown(offsets: Mapping[int, int]) -> str:
    return ",".join(f"{partition}:{offset}" for partition, offset in sorted(offsets.items()))
