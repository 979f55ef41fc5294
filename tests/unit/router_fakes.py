"""In-memory fakes of confluent-kafka's Producer and Consumer over one fake cluster.

They behave like librdkafka where the router depends on it (measured on the real stack):
- a broker refusal (a `refuse` rule) fails every record of its produce request, i.e. all
  records sent together to that topic-partition, each with a delivery report carrying the
  error, and puts the transaction in an abortable state: commit_transaction then raises the
  same code with txn_requires_abort;
- produce() refuses on the spot a value over message.max.bytes (MSG_SIZE_TOO_LARGE), and a
  record for a topic its metadata does not know (`unknown_on_produce`: _UNKNOWN_TOPIC);
- transactional records and offsets become visible on commit only; abort discards them;
- list_topics answers UNKNOWN_TOPIC_OR_PART for a topic that does not exist, never creates one.
Records the router consumes are real confluent_kafka.Message objects.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, Message, TopicPartition

from cdc_router.kafka.membership import Listed
from cdc_router.kafka.rival import Holder
from cdc_router.router.destinations import Describe
from cdc_router.router.grants import Operations
from cdc_router.router.replay import parse_changelog

FIXTURES = Path(__file__).parent / "fixtures" / "debezium"
RAW = "outbox.public.outbox"
ORDERS = "orders"
DLQ = "cdc-router.dlq"
CHANGELOG = "cdc-router.dedup"
Refusal = Callable[[str, bytes | None, int | None], int | None]  # topic, value, timestamp


@dataclass
class Stored:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    timestamp: int | None

    def header(self, name: str) -> str:
        return dict(self.headers)[name].decode()


@dataclass
class FakeCluster:
    """Topics (committed records only), the group's offsets, and what goes wrong."""

    partitions: dict[str, int] = field(default_factory=lambda: {
        RAW: 1, ORDERS: 3, DLQ: 1, CHANGELOG: 1})
    raw: dict[int, list[tuple[bytes | None, bytes | None]]] = field(default_factory=dict)
    topics: dict[str, list[Stored]] = field(default_factory=dict)
    group_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    # The metadata each committed offset was committed with (the router's commit stamp).
    offset_metadata: dict[tuple[str, int], str | None] = field(default_factory=dict)
    refuse: Refusal = lambda topic, value, timestamp: None
    max_message_bytes: int = 1_000_000
    commit_failures: list[KafkaError] = field(default_factory=list)  # next commits fail so
    # the next offsets commits (in a transaction, or the consumer's) fail so, as do the aborts
    offsets_failures: list[KafkaError] = field(default_factory=list)
    abort_failures: list[KafkaError] = field(default_factory=list)
    # The next commits Kafka acknowledges, then loses (chaos 58: Kafka 4.3 completed them
    # without markers after a kill -9): nothing of them is visible, and the transaction after
    # each fails (its abort took the lost one's records with it).
    lost_commits: int = 0
    # topic -> how many more produce() calls librdkafka refuses on the spot as _UNKNOWN_TOPIC
    # (its metadata cache lags, or the topic is gone), whatever list_topics answers.
    unknown_on_produce: dict[str, int] = field(default_factory=dict)
    fenced: bool = False  # every producer, a new one too (a rival that keeps fencing)
    # Bumped by fence(), as another init_transactions of the id (or the coordinator aborting a
    # timed-out transaction) bumps the producer epoch: producers initialised before are fenced.
    producer_epoch: int = 0
    # As confluent-kafka's error_cb: a producer fenced raises the fatal error once from its
    # next poll() or flush(), before any transactional call meets it (what CI met, session 29).
    fence_on_serve: bool = False
    listings: int = 0  # whole-cluster metadata requests (list_topics() of every topic)
    producers_initialised: int = 0  # init_transactions calls, of every producer
    producers_purged: int = 0
    init_failures: list[KafkaError] = field(default_factory=list)  # next init_transactions
    journal: list[str] = field(default_factory=list)
    created_topics: list[str] = field(default_factory=list)
    # Topic configurations DescribeConfigs answers (router/timestamps.py); {} for the others.
    topic_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    # Topic -> the operations the principal may do there (router/grants.py).
    granted: dict[str, frozenset[str]] = field(default_factory=dict)
    # Topics whose AddPartitionsToTxn the coordinator refuses (a Write grant revoked while the
    # producer knows the topic, measured in QA 35-e): the transaction turns abortable with
    # TOPIC_AUTHORIZATION_FAILED, nothing of it is sent, and each later produce() says _STATE.
    add_partitions_refused: set[str] = field(default_factory=set)
    # The first this many producers built never get metadata again (QA 37-b, librdkafka #5301:
    # the only broker left out of a metadata answer is dropped): list_topics fails _TRANSPORT.
    metadata_lost_producers: int = 0
    producers_built: int = 0
    # The group.instance.ids the group lists (kafka/membership.py), and how often it was asked.
    group_members: set[str] = field(default_factory=lambda: {"i-1"})
    members_lookups: int = 0
    # (member id, client id, host) another process holds the router's instance id with
    # (kafka/rival.py); None: the group lists the router's own member, or none.
    rival: tuple[str, str, str] | None = None

    def fence(self) -> None:
        self.producer_epoch += 1

    def describe_factory(self, admin_config: Mapping[str, Any]) -> Describe:
        """A describe(topic, timeout_s) over topic_configs, for the clients' factory."""
        return lambda topic, timeout_s: self.topic_configs.get(topic, {})

    def operations_factory(self, admin_config: Mapping[str, Any]) -> Operations:
        """operations(topic, timeout_s) over `granted` (a topic not in it: not said)."""
        return lambda topic, timeout_s: self.granted.get(topic)

    def holder_factory(self, admin_config: Mapping[str, Any]) -> Holder:
        """holder(group, instance id): `rival`, the member another process has under that id
        (kafka/rival.py), else none listed."""
        return lambda group, instance_id: self.rival

    def members_factory(self, admin_config: Mapping[str, Any], group: str,
                        topics: Sequence[str]) -> Listed:
        """listed(name, timeout_s): in group_members (an instance id, without the digest of
        its subscription that clients.static_member_id adds), counted."""
        def listed(name: str | None, timeout_s: float) -> bool:
            self.members_lookups += 1
            return name is not None and name.rsplit(".", 1)[0] in self.group_members
        return listed

    def committed(self, topic: str) -> list[Stored]:
        return self.topics.get(topic, [])

    def publish(self, topic: str, records: list[Stored]) -> None:
        self.topics.setdefault(topic, []).extend(records)


# Producer ---------------------------------------------------------------------------------

class FakeProducer:
    def __init__(self, cluster: FakeCluster, config: dict[str, Any]) -> None:
        self.cluster = cluster
        self.config = config
        self.transactional = "transactional.id" in config
        self.index, cluster.producers_built = cluster.producers_built, cluster.producers_built + 1
        self._epoch: int | None = None  # the cluster's producer_epoch at init_transactions
        self._queue: list[tuple[Stored, Callable[..., None]]] = []
        self._reports: list[tuple[Callable[..., None], KafkaError | None, Message]] = []
        self._pending: list[Stored] = []
        self._pending_offsets: dict[tuple[str, int], int] = {}
        self._pending_metadata: dict[tuple[str, int], str | None] = {}
        self._abortable: KafkaError | None = None
        self._erroneous = False  # AddPartitionsToTxn refused: librdkafka's abortable state
        self._in_txn = False
        self._fence_served = False
        # Refused records leave a gap in their partition's sequence numbers: as librdkafka
        # does, the next request there fails and the abort bumps the epoch (KIP-360).
        self._gaps: set[tuple[str, int]] = set()

    def _fence_check(self, *, local: bool = False) -> None:
        """`local`: a call that sends no request (produce, begin), which learns of a fence only
        once it was served, with fence_on_serve."""
        if local and self.cluster.fence_on_serve and not self._fence_served:
            return
        if self.cluster.fenced or (self._epoch is not None and
                                   self._epoch < self.cluster.producer_epoch):
            raise KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer instance",
                                            fatal=True))

    def produce(self, topic: str, *, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes]], on_delivery: Callable[..., None],
                partition: int = -1, timestamp: int = 0) -> None:
        # confluent-kafka's defaults: partition -1 (librdkafka chooses), timestamp 0 (now).
        self._fence_check(local=True)
        if self.transactional and not self._in_txn:
            raise KafkaException(KafkaError(KafkaError._STATE, "no transaction"))
        if self._erroneous:
            raise KafkaException(KafkaError(KafkaError._STATE, "Unable to produce message: "
                                            "Local: Erroneous state"))
        if self.transactional and topic in self.cluster.add_partitions_refused:
            self._erroneous = True
            self._abortable = KafkaError(
                KafkaError.TOPIC_AUTHORIZATION_FAILED, "Failed to add partition(s) to "
                "transaction on broker TxnCoordinator/1: Broker: Topic authorization failed",
                txn_requires_abort=True)
        if value is not None and len(value) > self.cluster.max_message_bytes:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE,
                                            "Broker: Message size too large"))
        if self.cluster.unknown_on_produce.get(topic, 0) > 0:
            self.cluster.unknown_on_produce[topic] -= 1
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC, "Local: Unknown topic"))
        chosen = partition if partition != -1 else (hash(key) % self.cluster.partitions
                                                    .get(topic, 1))
        self._queue.append((Stored(topic, chosen, key, value, headers, timestamp or None),
                            on_delivery))

    def _send(self) -> None:
        """One produce request per topic-partition, as librdkafka batches them."""
        if self._erroneous:
            return  # no partition was added: nothing is sent, the abort purges the queue
        requests: dict[tuple[str, int], list[tuple[Stored, Callable[..., None]]]] = {}
        for item in self._queue:
            requests.setdefault((item[0].topic, item[0].partition), []).append(item)
        self._queue = []
        for (topic, partition), items in requests.items():
            codes = [self.cluster.refuse(topic, s.value, s.timestamp) for s, _ in items]
            if topic not in self.cluster.partitions:
                codes.append(KafkaError.UNKNOWN_TOPIC_OR_PART)
            code = next((c for c in codes if c is not None), None)
            if code is not None and self.transactional:
                self._gaps.add((topic, partition))
            elif (topic, partition) in self._gaps:
                code = KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
            error = KafkaError(code) if code is not None else None
            for stored, callback in items:
                message = Message(topic=topic, partition=stored.partition, key=stored.key,
                                  value=stored.value)
                self._reports.append((callback, error, message))
                if error is None:
                    self.cluster.journal.append(f"acked {topic}")
                    if self.transactional:
                        self._pending.append(stored)
                    else:
                        self.cluster.publish(topic, [stored])
            if error is not None and self.transactional and self._abortable is None:
                self._abortable = KafkaError(code, f"ProduceRequest for {topic} with "
                                             f"{len(items)} message(s) failed",
                                             txn_requires_abort=True)

    def poll(self, timeout: float = 0) -> int:
        if self.cluster.fence_on_serve and not self._fence_served and self._epoch is not None \
                and self._epoch < self.cluster.producer_epoch:
            self._fence_served = True
            raise KafkaException(KafkaError(KafkaError._FENCED, "Fatal error: Local: This "
                                            "instance has been fenced by a newer instance",
                                            fatal=True))
        self._send()
        reports, self._reports = self._reports, []
        for callback, error, message in reports:
            callback(error, message)
        return len(reports)

    def flush(self, timeout: float = 0) -> int:
        self.cluster.journal.append("flush")
        self.poll(0)
        return 0

    def init_transactions(self, timeout: float) -> None:
        self._fence_check()
        if self.cluster.init_failures:
            raise KafkaException(self.cluster.init_failures.pop(0))
        self.cluster.producers_initialised += 1
        self._epoch = self.cluster.producer_epoch

    def purge(self) -> None:
        self._queue, self._reports = [], []
        self.cluster.producers_purged += 1

    def begin_transaction(self) -> None:
        self._fence_check(local=True)
        if self._in_txn and self._abortable is not None:
            raise KafkaException(self._abortable)  # librdkafka: the transaction's own error
        assert not self._in_txn, "begin_transaction inside an open transaction"
        self._in_txn = True

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], metadata: Any,
                                    timeout: float) -> None:
        self._fence_check()
        assert metadata == "group-metadata"
        if self._abortable is not None:
            raise KafkaException(self._abortable)
        if self.cluster.offsets_failures:
            raise KafkaException(self.cluster.offsets_failures.pop(0))
        self.cluster.journal.append("send_offsets")
        self._pending_offsets.update({(tp.topic, tp.partition): tp.offset for tp in offsets})
        self._pending_metadata.update({(tp.topic, tp.partition): tp.metadata for tp in offsets})

    def commit_transaction(self, timeout: float) -> None:
        self._fence_check()
        self.poll(0)
        if self._abortable is not None:
            raise KafkaException(self._abortable)
        if self.cluster.commit_failures:
            raise KafkaException(self.cluster.commit_failures.pop(0))
        if self.cluster.lost_commits:
            self.cluster.lost_commits -= 1
            self.cluster.commit_failures.append(KafkaError(
                KafkaError._TIMED_OUT, "Transactional API operation (commit_transaction) "
                "timed out", txn_requires_abort=True))
            self.cluster.journal.append("commit lost")
            self._end()
            return
        for stored in self._pending:
            self.cluster.publish(stored.topic, [stored])
        self.cluster.group_offsets.update(self._pending_offsets)
        self.cluster.offset_metadata.update(self._pending_metadata)
        self.cluster.journal.append("commit")
        self._end()

    def abort_transaction(self, timeout: float) -> None:
        self._fence_check()
        if self.cluster.abort_failures:
            raise KafkaException(self.cluster.abort_failures.pop(0))
        for _, callback in self._queue:  # purged, reported as such
            self._reports.append((callback, KafkaError(KafkaError._PURGE_QUEUE), Message()))
        self._queue = []
        self.cluster.journal.append("abort")
        if self._abortable is not None and \
                self._abortable.code() == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER:
            self._gaps.clear()  # the epoch is bumped
        self._end()

    def _end(self) -> None:
        self._pending, self._pending_offsets, self._abortable = [], {}, None
        self._erroneous = False
        self._pending_metadata = {}
        self._in_txn = False

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        """One topic's metadata (an error for a missing one), or every topic's (None)."""
        if self.index < self.cluster.metadata_lost_producers:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: "
                                            "Local: Broker transport failure"))
        self.cluster.listings += topic is None
        names = list(self.cluster.partitions) if topic is None else [topic]
        topics = {}
        for name in names:
            count = self.cluster.partitions.get(name)
            error = None if count else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            topics[name] = SimpleNamespace(error=error,
                                           partitions=dict.fromkeys(range(count or 0)))
        return SimpleNamespace(topics=topics)


# Consumer ---------------------------------------------------------------------------------

class FakeConsumer:
    """Owns every partition of the raw topic; `before_consume` hooks inject events."""

    def __init__(self, cluster: FakeCluster, config: dict[str, Any],
                 on_idle: Callable[[], None]) -> None:
        self.cluster = cluster
        self.config = config
        self.on_idle = on_idle
        self.callbacks: dict[str, Any] = {}
        self.assigned: list[int] = []
        self.positions: dict[int, int] = {}
        self.before_consume: list[Callable[[FakeConsumer], None]] = []
        self.events: list[Message] = []
        self.closed = False
        self.stranded = False  # no partition, never joins again (kafka/membership.py)
        self.member_id = f"rdkafka-{id(self)}"

    def memberid(self) -> str:
        return self.member_id

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        assert topics == [RAW]
        self.callbacks = callbacks

    def _partitions(self) -> list[TopicPartition]:
        return [TopicPartition(RAW, p) for p in self.assigned]

    def assign_all(self) -> None:
        self.assigned = sorted(self.cluster.raw)
        self.positions = {p: self.cluster.group_offsets.get((RAW, p), 0) for p in self.assigned}
        self.callbacks["on_assign"](self, self._partitions())

    def revoke_all(self, lost: bool = False) -> None:
        self.callbacks["on_lost" if lost else "on_revoke"](self, self._partitions())
        self.assigned = []

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        # Hooks run between the router's polls: at a poll's first, waiting consume(), not at
        # the consume(timeout=0) that takes what has already arrived.
        if timeout > 0:
            hooks, self.before_consume = self.before_consume, []
            for hook in hooks:  # a hook that adds hooks defers them to the next poll
                hook(self)
        if not self.assigned and not self.stranded:
            self.assign_all()
        # Consumer events a hook queued (librdkafka hands them over as messages with error()).
        batch, self.events = self.events[:num_messages], self.events[num_messages:]
        for p in self.assigned:
            log = self.cluster.raw[p]
            while self.positions[p] < len(log) and len(batch) < num_messages:
                key, value = log[self.positions[p]]
                batch.append(Message(topic=RAW, partition=p, offset=self.positions[p], key=key,
                                     value=value))
                self.positions[p] += 1
        if not batch:
            time.sleep(min(timeout, 0.01))  # librdkafka waits for records, up to the timeout
            self.on_idle()
        return batch

    def assignment(self) -> list[TopicPartition]:
        return self._partitions()

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.positions[tp.partition])
                for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        return 0, len(self.cluster.raw[tp.partition])

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition,
                               self.cluster.group_offsets.get((tp.topic, tp.partition),
                                                              OFFSET_INVALID),
                               metadata=self.cluster.offset_metadata.get((tp.topic, tp.partition))
                               or "")
                for tp in partitions]

    def seek(self, tp: TopicPartition) -> None:
        self.cluster.journal.append(f"seek {tp.partition}@{tp.offset}")
        self.positions[tp.partition] = max(tp.offset, 0)

    def consumer_group_metadata(self) -> str:
        return "group-metadata"

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        assert asynchronous is False
        if self.cluster.offsets_failures:
            raise KafkaException(self.cluster.offsets_failures.pop(0))
        self.cluster.group_offsets.update({(tp.topic, tp.partition): tp.offset
                                           for tp in offsets})
        self.cluster.offset_metadata.update({(tp.topic, tp.partition): tp.metadata
                                             for tp in offsets})
        self.cluster.journal.append("commit_offsets")

    def close(self) -> None:
        if self.assigned:
            self.revoke_all()
        self.closed = True


class FakeChangelog:
    def __init__(self, cluster: FakeCluster, topic: str) -> None:
        self.cluster = cluster
        self.topic = topic
        self.read = 0
        self.since: list[int | None] = []  # each call's since_ms

    def catch_up(self, *, since_ms: int | None = None,
                 ) -> Iterator[tuple[bytes | None, bytes | None]]:
        """The marks committed since the last call, as kafka/reader.py's reader (review 59-r
        F-7: one that returned all of them every time hid a filter emptied at each read);
        records carry no time here: `since_ms` is only noted."""
        self.since.append(since_ms)
        records = self.cluster.committed(self.topic)[self.read:]
        self.read += len(records)
        for stored in records:
            yield stored.key, stored.value

    broker_stamped = False

    # Nothing older: records carry no time here, the first read is whole.
    def older(self, since_ms: int) -> list[tuple[bytes | None, bytes | None]]:
        return []

    def older_left(self) -> bool:
        return False

    def older_done(self) -> None:
        pass

    def close(self) -> None:
        pass


# Raw records ------------------------------------------------------------------------------

_TEMPLATE = json.loads((FIXTURES / "create_jsonb.noschema.json").read_text("utf-8"))["value"]


def marked_ids(stored: list[Stored]) -> list[str]:
    """The ids the changelog records `stored` mark delivered, in order (either format)."""
    return [event_id for record in stored for event_id, _ in parse_changelog(record.key,
                                                                             record.value)]


def raw_event(event_id: str, *, aggregate_type: str = "Order", aggregate_id: str = "order-1",
              event_type: str = "OrderPaid", payload: str = '{"n": 1}',
              headers: str | None = None, created_at_us: int | None = None) -> bytes:
    """A captured Debezium create event (JsonConverter, no schema) with these columns."""
    envelope = json.loads(json.dumps(_TEMPLATE))
    after = envelope["after"]
    after.update(id=event_id, aggregatetype=aggregate_type, aggregateid=aggregate_id,
                 type=event_type, payload=payload, headers=headers)
    if created_at_us is not None:
        after["created_at"] = created_at_us
    return json.dumps(envelope).encode()
