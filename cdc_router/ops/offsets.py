"""Kafka lookups `status` shares: offsets through the admin client, and bounded scans.

A scan reads a window [start, stop) of each partition with read_committed and no group
(assigned, nothing committed), and stops at the window's end, so it is deterministic and
bounded by the window, not by "nothing came for N seconds".
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from cdc_router.kafka.errors import REFUSED_CREDENTIALS, refused_config

# One answer from the cluster: milliseconds when it is there; past this, say it is not.
LOOKUP_TIMEOUT_S = 10.0


def admin_client(kafka: Mapping[str, str]) -> AdminClient:
    config: dict[str, Any] = {key: value for key, value in kafka.items()
                              if key != "allow.auto.create.topics"}  # not an admin property
    return AdminClient(config)


def client_config_problem(kafka: Mapping[str, str]) -> str | None:
    """Why librdkafka refuses to build a client with `kafka`, or None: a bad config, not a
    cluster to report unreachable (QA 32-d: `status` exited 1, "warning")."""
    try:
        admin_client(kafka)
    except KafkaException as error:
        return refused_config(error, kafka, "kafka.config")
    return None


def offsets(admin: AdminClient, partitions: list[TopicPartition], spec: str,
            committed_only: bool = True) -> dict[tuple[str, int], int]:
    """(topic, partition) → its earliest or latest offset (`spec`); latest is the last stable
    offset with `committed_only`, the log end otherwise."""
    if not partitions:
        return {}
    which = OffsetSpec.earliest() if spec == "earliest" else OffsetSpec.latest()  # type: ignore[no-untyped-call]
    isolation = IsolationLevel.READ_COMMITTED if committed_only else \
        IsolationLevel.READ_UNCOMMITTED
    futures = admin.list_offsets({TopicPartition(tp.topic, tp.partition): which
                                  for tp in partitions}, isolation_level=isolation,
                                 request_timeout=LOOKUP_TIMEOUT_S)
    found = {(tp.topic, tp.partition): future.result().offset for tp, future in futures.items()}
    unknown = sorted(key for key, offset in found.items() if offset < 0)
    if unknown:  # -1001 with no error, for a while after a leader was killed (QA 37-a)
        raise KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE,
                                        f"no {spec} offset known for {unknown}"))
    return found


@dataclass
class Scanned:
    """What a scan saw of one partition's window."""

    count: int = 0
    others: int = 0  # records `keep` left out
    first: Message | None = None
    last: Message | None = None
    complete: bool = True


@dataclass
class _Window:
    start: int
    stop: int
    seen: Scanned = field(default_factory=Scanned)


def scan(kafka: Mapping[str, str], topic: str, windows: Mapping[int, tuple[int, int]],
         timeout_s: float = 30.0, keep: Callable[[Message], bool] | None = None,
         committed_only: bool = True) -> dict[int, Scanned]:
    """partition → the committed records at offsets [start, stop) of `windows`; with `keep`,
    only those it accepts (the others are only counted); without `committed_only`, the records
    of open transactions too (read_uncommitted).

    A window not read to its end within `timeout_s` is marked incomplete.
    """
    todo = {p: _Window(start, stop) for p, (start, stop) in windows.items() if stop > start}
    if not todo:
        return {p: Scanned() for p in windows}
    consumer = Consumer(_scan_config(kafka, committed_only))
    try:
        consumer.assign([TopicPartition(topic, p, w.start) for p, w in todo.items()])
        deadline = time.monotonic() + timeout_s
        while not _done(consumer, topic, todo):
            if time.monotonic() > deadline:
                for window in todo.values():
                    window.seen.complete = False
                break
            for message in consumer.consume(num_messages=5000, timeout=0.2):
                error = message.error()
                if error is not None and error.code() in REFUSED_CREDENTIALS:
                    # QA 31-c: a dead-letter topic the principal may not read counted "at
                    # least 0" letters, and status said ok: it is a check that cannot be done.
                    raise KafkaException(error)
                found = todo.get(message.partition() or 0)
                offset = message.offset()
                if message.error() is not None or found is None or offset is None or \
                        offset >= found.stop:
                    continue
                if keep is not None and not keep(message):
                    found.seen.others += 1
                    continue
                found.seen.count += 1
                found.seen.first = found.seen.first or message
                found.seen.last = message
    finally:
        consumer.close()
    return {p: todo[p].seen if p in todo else Scanned() for p in windows}


def _done(consumer: Consumer, topic: str, todo: Mapping[int, _Window]) -> bool:
    positions = consumer.position([TopicPartition(topic, p) for p in todo])
    return all(position.offset >= todo[position.partition].stop for position in positions)


def _scan_config(kafka: Mapping[str, str], committed_only: bool = True) -> dict[str, Any]:
    return {**kafka,
            # Needed by librdkafka, never joined: partitions are assigned, nothing committed.
            "group.id": f"cdc-router-status-{uuid.uuid4()}", "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed_only else "read_uncommitted",
            "allow.auto.create.topics": False, "enable.partition.eof": False}


def timestamp_ms(message: Message) -> int | None:
    kind, value = message.timestamp()
    return value if kind and value >= 0 else None


def age_s(then_ms: int | None, now_ms: int) -> float | None:
    return None if then_ms is None else max(0.0, (now_ms - then_ms) / 1000)
