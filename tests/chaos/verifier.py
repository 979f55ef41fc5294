"""The independent verifier: the ledger in Postgres against what Kafka holds, read_committed.

It imports nothing from cdc_router (only confluent_kafka and psycopg), so a defect in the
router's code cannot also be a defect in its check. Each topic is read by assignment, from its
beginning to the end offsets it has when the read starts (the last stable offset under
read_committed), never "until nothing came for N seconds".
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition
from confluent_kafka.admin import AdminClient

SAMPLES = 5  # failures listed by id per check, enough to start a diagnosis


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as a signed 32-bit int."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(data[i * 4:i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail, rest = length & ~3, length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(aggregate_id: str, partitions: int) -> int:
    """The partition Kafka's Java default partitioner gives a key: toPositive(murmur2) % n."""
    return (murmur2(aggregate_id.encode()) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True)
class HangingAbort:
    """A transaction Kafka left hanging that the campaign aborted with kafka-transactions:
    the row `find-hanging` listed, and the partition's end offset just after the abort."""

    topic: str
    partition: int
    start_offset: int
    producer_id: int
    producer_epoch: int
    end_offset: int = -1

    def __str__(self) -> str:
        return (f"{self.topic}-{self.partition} from offset {self.start_offset} (producer "
                f"{self.producer_id}, epoch {self.producer_epoch})")


@dataclass(frozen=True)
class Target:
    """What to verify: the stack, the run's tables and topics."""

    bootstrap: str
    dsn: str
    outbox_table: str
    ledger_table: str
    raw_topic: str
    destinations: tuple[str, ...]
    dead_letter_topic: str
    topics_allowed: frozenset[str]  # every topic that may exist after the run
    changelog_topic: str = ""
    changelog_aborts: tuple[HangingAbort, ...] = ()  # those on changelog_topic


@dataclass
class Verdict:
    """Counts of every check (0 is a pass for the failure counts) and samples of failures."""

    ledger_events: int = 0
    expected_deliveries: int = 0
    expected_dead_letters: int = 0
    delivered: int = 0
    lost: int = 0
    duplicates: int = 0
    # Not failures: the ids of the batch whose marks an abort of a hanging transaction took
    # away (marks_aborted), their second copies, and the order violations those made.
    marks_aborted: int = 0
    duplicates_after_abort: int = 0
    order_violations_after_abort: int = 0
    phantoms: int = 0  # ids on a destination topic that the ledger does not know
    wrong_topic: int = 0
    wrong_key: int = 0
    wrong_partition: int = 0
    order_violations: int = 0
    dead_letters: int = 0
    poison_not_dead_lettered: int = 0
    dead_letters_without_reason: int = 0
    dead_letters_wrong_stage: int = 0
    good_rows_dead_lettered: int = 0
    dead_letter_duplicates: int = 0
    raw_records: int = 0
    raw_replays: int = 0  # records on the raw topic whose id came before: Debezium's replays
    new_topics: list[str] = field(default_factory=list)
    leaked_rows: int = 0  # delivered events whose outbox row is still there
    samples: dict[str, list[str]] = field(default_factory=dict)

    FAILURES = ("lost", "duplicates", "phantoms", "wrong_topic", "wrong_key", "wrong_partition",
                "order_violations", "poison_not_dead_lettered", "dead_letters_without_reason",
                "dead_letters_wrong_stage", "good_rows_dead_lettered", "leaked_rows")

    def sample(self, check: str, detail: str) -> None:
        listed = self.samples.setdefault(check, [])
        if len(listed) < SAMPLES:
            listed.append(detail)

    @property
    def passed(self) -> bool:
        return not self.new_topics and all(getattr(self, name) == 0 for name in self.FAILURES)

    def failures(self) -> dict[str, int]:
        found = {name: getattr(self, name) for name in self.FAILURES if getattr(self, name)}
        if self.new_topics:
            found["new_topics"] = len(self.new_topics)
        return found


@dataclass(frozen=True)
class LedgerEntry:
    aggregate_id: str
    seq: int
    expect: str
    topic: str


def read_ledger(dsn: str, ledger_table: str) -> dict[str, LedgerEntry]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT id::text, aggregateid, seq, expect, topic "
                            f"FROM public.{ledger_table}").fetchall()
    return {row[0]: LedgerEntry(row[1], row[2], row[3], row[4]) for row in rows}


def read_to_end(bootstrap: str, topic: str, timeout_s: float = 600) -> list[Message]:
    """Every committed record of `topic` below the end offsets it has now, all partitions."""
    consumer = _reader(bootstrap, "read_committed")
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        ranges: dict[int, tuple[int, int]] = {}
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                       timeout=30)
            if high > low:
                ranges[partition] = (OFFSET_BEGINNING, high)
        return _read(consumer, topic, ranges, timeout_s)
    finally:
        consumer.close()


def read_range(bootstrap: str, topic: str, partition: int, start: int, end: int, *,
               committed: bool, timeout_s: float = 120) -> list[Message]:
    """The records of one partition in [start, end): the committed ones, or all."""
    consumer = _reader(bootstrap, "read_committed" if committed else "read_uncommitted")
    try:
        return _read(consumer, topic, {partition: (start, end)} if end > start else {},
                     timeout_s)
    finally:
        consumer.close()


def _reader(bootstrap: str, isolation: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap,
                     "group.id": f"chaos-verifier-{uuid.uuid4()}",
                     "enable.auto.commit": False, "isolation.level": isolation,
                     "enable.partition.eof": True, "allow.auto.create.topics": False})


def _read(consumer: Consumer, topic: str, ranges: dict[int, tuple[int, int]],
          timeout_s: float) -> list[Message]:
    """Read each partition of `ranges` from its start (an offset or OFFSET_BEGINNING) to
    below its end offset."""
    deadline = time.monotonic() + timeout_s
    records: list[Message] = []
    ends = {partition: end for partition, (_, end) in ranges.items()}
    consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in ranges.items()])
    while ends:
        if time.monotonic() > deadline:
            raise RuntimeError(f"verifier: {topic} not read to its end offsets {ends} "
                               f"in {timeout_s}s; is the broker up?")
        for message in consumer.consume(num_messages=1000, timeout=0.5):
            (partition, offset), error = _where(message), message.error()
            if partition not in ends:
                continue
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                if error.fatal():
                    raise RuntimeError(f"verifier: reading {topic}: {error}")
                continue
            if error is None and offset < ends[partition]:
                records.append(message)
            if (offset if error is not None else offset + 1) >= ends[partition]:
                del ends[partition]
    return records


def end_offset(bootstrap: str, topic: str, partition: int) -> int:
    """The partition's end offset (high watermark) now."""
    consumer = _reader(bootstrap, "read_uncommitted")
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                  timeout=30)[1])
    finally:
        consumer.close()


def marks_aborted(bootstrap: str, changelog_topic: str,
                  aborts: tuple[HangingAbort, ...]) -> set[str]:
    """The ids of the dedup marks of each hanging transaction the campaign aborted on the
    router's changelog (README's remedy for it): the mark at the transaction's start offset
    and the marks after it of the same batch (same "ts": its halves), absent under
    read_committed.

    CI, stop 48, after a kill -9 of Kafka: the group's offsets hung for 2 minutes, the abort
    came, and one batch of 134 ids was delivered twice, without a replay dropped. Attributed
    to a transaction Kafka committed on the destinations and left hanging on the changelog and
    the offsets, whose abort took the batch's marks and offsets: the next owner delivered it
    again. Second copies of these ids are counted apart; a third copy, and any other
    duplicate, still fails the campaign."""
    unmarked: set[str] = set()
    for abort in aborts:
        every = read_range(bootstrap, changelog_topic, abort.partition, abort.start_offset,
                           abort.end_offset, committed=False)
        committed = {int(m.offset() or 0) for m in read_range(
            bootstrap, changelog_topic, abort.partition, abort.start_offset, abort.end_offset,
            committed=True)}
        marks = [(m, _mark(m)) for m in every if int(m.offset() or 0) not in committed]
        if not marks or int(marks[0][0].offset() or 0) != abort.start_offset:
            continue  # the hanging transaction's first record is not a mark left aborted
        batch_ts = marks[0][1][0]
        unmarked.update(i for _, (ts, ids) in marks if ts == batch_ts for i in ids)
    return unmarked


def _mark(message: Message) -> tuple[object, list[str]]:
    """("ts", ids) of a changelog mark's JSON value ({"ts": ..., "ids": [...]}); the router's
    own parser is not used here, so that a defect in it cannot hide in its check."""
    try:
        document = json.loads(message.value() or b"null")
    except ValueError:
        return None, []
    if not isinstance(document, dict) or not isinstance(document.get("ids"), list):
        return None, []
    return document.get("ts"), [i for i in document["ids"] if isinstance(i, str)]


def _where(message: Message) -> tuple[int, int]:
    """(partition, offset) of a record or of a partition-end event."""
    return int(message.partition() or 0), int(message.offset() or 0)


def _headers(message: Message) -> dict[str, str]:
    raw = message.headers() or []
    pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
    return {k: v.decode(errors="replace") if isinstance(v, bytes) else str(v or "")
            for k, v in pairs}


def _key_and_id(message: Message) -> tuple[str, str]:
    """A destination record's key, and its event id: its `id` header, else its key."""
    key = (message.key() or b"").decode(errors="replace")
    return key, _headers(message).get("id", key)


def _raw_id(message: Message) -> str | None:
    """The event id of a Debezium change record, from its JSON key {"id": ...}."""
    try:
        key = json.loads(message.key() or b"null")
    except ValueError:
        return None
    if isinstance(key, dict) and isinstance(key.get("id"), str):
        return str(key["id"])
    if isinstance(key, dict) and isinstance(key.get("payload"), dict):
        return str(key["payload"].get("id"))
    return None


def check_destinations(verdict: Verdict, ledger: dict[str, LedgerEntry],
                       topics: dict[str, list[Message]], partitions: dict[str, int],
                       unmarked: frozenset[str] = frozenset()) -> set[str]:
    """Lost, duplicates, key, partition, topic, order; returns the ids delivered. The second
    copy of an id in `unmarked` (marks_aborted), and the order it breaks, count apart when it
    is the last: a third copy is a duplicate like any other."""
    copies = Counter(_key_and_id(m)[1] for records in topics.values() for m in records)
    excused = {i for i in unmarked if copies[i] == 2}
    seen: Counter[str] = Counter()
    for topic, records in topics.items():
        last_seq: dict[tuple[int, str], int] = defaultdict(lambda: -1)
        for message in sorted(records, key=_where):
            partition, offset = _where(message)
            key, event_id = _key_and_id(message)
            seen[event_id] += 1
            entry = ledger.get(event_id)
            if entry is None:
                verdict.phantoms += 1
                verdict.sample("phantoms", f"{topic}/{partition}@{offset}")
                continue
            if key != event_id:
                verdict.wrong_key += 1
                verdict.sample("wrong_key", f"{event_id} key={key}")
            if entry.topic != topic:
                verdict.wrong_topic += 1
                verdict.sample("wrong_topic", f"{event_id} on {topic}, expected {entry.topic}")
            expected = java_partition(entry.aggregate_id, partitions[topic])
            if partition != expected:
                verdict.wrong_partition += 1
                verdict.sample("wrong_partition", f"{event_id} p{partition} != p{expected}")
            slot = (partition, entry.aggregate_id)
            if entry.seq <= last_seq[slot] and event_id in excused and seen[event_id] == 2:
                verdict.order_violations_after_abort += 1
            elif entry.seq <= last_seq[slot]:
                verdict.order_violations += 1
                verdict.sample("order_violations", f"{entry.aggregate_id} seq {entry.seq} after "
                               f"{last_seq[slot]} on {topic}/{partition}")
            last_seq[slot] = max(last_seq[slot], entry.seq)
    verdict.delivered = len(seen)
    for event_id, count in seen.items():
        if event_id in excused:
            verdict.duplicates_after_abort += count - 1
        elif count > 1:
            verdict.duplicates += count - 1
            verdict.sample("duplicates", f"{event_id} x{count}")
    return set(seen)


def check_dead_letters(verdict: Verdict, ledger: dict[str, LedgerEntry],
                       records: list[Message]) -> set[str]:
    """Every poison row dead-lettered once with its stage and reason; no good row there."""
    seen: Counter[str] = Counter()
    for message in records:
        headers = _headers(message)
        event_id = headers.get("dlq.event.id") or _raw_id(message) or ""
        seen[event_id] += 1
        entry = ledger.get(event_id)
        if not headers.get("dlq.error.message") or not headers.get("dlq.stage"):
            verdict.dead_letters_without_reason += 1
            verdict.sample("dead_letters_without_reason", event_id)
        if entry is None or entry.expect == "deliver":
            verdict.good_rows_dead_lettered += 1
            verdict.sample("good_rows_dead_lettered",
                           f"{event_id} stage={headers.get('dlq.stage')} "
                           f"reason={headers.get('dlq.error.message', '')[:200]}")
        elif headers.get("dlq.stage") != entry.expect:
            verdict.dead_letters_wrong_stage += 1
            verdict.sample("dead_letters_wrong_stage", f"{event_id} stage="
                           f"{headers.get('dlq.stage')} expected {entry.expect}")
    verdict.dead_letters = len(records)
    verdict.dead_letter_duplicates = sum(count - 1 for count in seen.values())
    return set(seen)


def leaked_rows(dsn: str, outbox_table: str, ledger_table: str) -> tuple[int, list[str]]:
    """Outbox rows of events that were to be delivered: the cleanup should have deleted them."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT o.id::text FROM public.{outbox_table} o JOIN "
                            f"public.{ledger_table} l USING (id) WHERE l.expect = 'deliver'"
                            ).fetchall()
    return len(rows), [row[0] for row in rows[:SAMPLES]]


def verify(target: Target) -> Verdict:
    """Run every check; the verdict says what failed and how often."""
    verdict = Verdict()
    ledger = read_ledger(target.dsn, target.ledger_table)
    verdict.ledger_events = len(ledger)
    verdict.expected_deliveries = sum(1 for e in ledger.values() if e.expect == "deliver")
    verdict.expected_dead_letters = len(ledger) - verdict.expected_deliveries
    admin = AdminClient({"bootstrap.servers": target.bootstrap})
    metadata = admin.list_topics(timeout=30).topics
    partitions = {t: len(metadata[t].partitions) for t in target.destinations}
    topics = {t: read_to_end(target.bootstrap, t) for t in target.destinations}
    unmarked = frozenset(marks_aborted(target.bootstrap, target.changelog_topic,
                                       target.changelog_aborts))
    verdict.marks_aborted = len(unmarked)
    delivered = check_destinations(verdict, ledger, topics, partitions, unmarked)
    dead = check_dead_letters(verdict, ledger, read_to_end(target.bootstrap,
                                                           target.dead_letter_topic))
    for event_id, entry in ledger.items():
        if entry.expect == "deliver" and event_id not in delivered and event_id not in dead:
            verdict.lost += 1
            verdict.sample("lost", event_id)
        if entry.expect != "deliver" and event_id not in dead:
            verdict.poison_not_dead_lettered += 1
            verdict.sample("poison_not_dead_lettered", f"{event_id} ({entry.expect})")
    raw_ids = Counter(_raw_id(m) for m in read_to_end(target.bootstrap, target.raw_topic))
    verdict.raw_records = sum(raw_ids.values())
    verdict.raw_replays = sum(count - 1 for count in raw_ids.values())
    verdict.new_topics = sorted(set(metadata) - target.topics_allowed)
    verdict.leaked_rows, samples = leaked_rows(target.dsn, target.outbox_table,
                                               target.ledger_table)
    for sample in samples:
        verdict.sample("leaked_rows", sample)
    return verdict


def as_dict(verdict: Verdict) -> dict[str, Any]:
    fields = {k: v for k, v in vars(verdict).items()}
    fields["passed"] = verdict.passed
    return fields
