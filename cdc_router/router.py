"""The consume -> decode -> route -> produce loop, one Kafka transaction per batch.

Exactly-once (KIP-98 transactions with KIP-447 group metadata): each batch's destination records,
its dead letters, the replay changelog marks and the consumed offsets commit in one transaction,
so a crash anywhere leaves either all of a batch visible to read_committed readers, or none of it
and the offsets where they were. At-least-once: an idempotent producer, and the offsets are
committed only once every record of the batch is delivered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from cdc_router.dead_letter import VALUE_DROPPED as DEAD_LETTER_VALUE_DROPPED
from cdc_router.dead_letter import DeadLetter, Stage, dead_letter, dead_letter_max_bytes
from cdc_router.debezium import OutboxEvent, Skipped, decode
from cdc_router.errors import (
    DecodeError,
    DeliveryError,
    FatalKafkaError,
    RouteError,
    SerializeError,
)
from cdc_router.kafka.consumer import ChangelogReader, record_headers, rewind_to_committed
from cdc_router.kafka.errors import RECORD_REFUSED, Action, classify, describe, kafka_error_of
from cdc_router.kafka.producer import LatchingProducer, Source
from cdc_router.metrics import RouterMetrics
from cdc_router.replay import ReplayFilter, changelog_record, parse_changelog
from cdc_router.routing import OutboundRecord, Router
from cdc_router.settings import RouterConfig

log = logging.getLogger("cdc_router.router")

# The transaction's deadline on the broker. A crashed instance that does not come back leaves
# its open transaction (and read_committed readers) blocked this long; every batch commits in a
# fraction of it (commit_interval_ms).
TRANSACTION_TIMEOUT_MS = 30_000
# Waits on the broker for transactional calls: as long as the broker may take to complete them.
_TXN_CALL_TIMEOUT_S = TRANSACTION_TIMEOUT_MS / 1000
# init_transactions may first wait for the coordinator to abort a previous incarnation's
# transaction, which takes up to transaction.timeout.ms.
_INIT_TIMEOUT_S = 2 * _TXN_CALL_TIMEOUT_S
_RETRY_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)
# A topic missing from metadata is asked for again after this long (it may have been created).
_MISSING_TOPIC_RECHECK_S = 10.0


@dataclass(frozen=True)
class Delivered:
    """An event whose record is committed on its destination topic."""

    event_id: str
    topic: str
    created_at_ms: int | None


@dataclass
class _Batch:
    """What the open transaction holds."""

    started: float = 0.0
    records: int = 0
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    delivered: list[Delivered] = field(default_factory=list)
    # Input records whose refusal this batch settled (dead-lettered, or found innocent).
    settled: list[Source] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return bool(self.offsets)


class _Rewind(Exception):
    """The batch was aborted; the records after it in this poll must not be processed."""


class OutboxRouter:
    """Routes the raw change topic's outbox events until stop() is called."""

    def __init__(self, config: RouterConfig, *, instance_id: str,
                 metrics: RouterMetrics | None = None,
                 on_delivered: Callable[[Sequence[Delivered]], None] | None = None) -> None:
        self._config = config
        self._exactly_once = config.delivery.guarantee == "exactly_once"
        self._router = Router(config)
        self._metrics = metrics or RouterMetrics()
        self._on_delivered = on_delivered
        self._stop = threading.Event()
        self._batch = _Batch()
        self._replay = ReplayFilter(window_ms=config.dedup.window_ms,
                                    max_ids=config.dedup.max_ids) if config.dedup.enabled else None
        # Input records whose output the broker refused. A refusal can name a whole produce
        # request, so they are suspects, produced alone when met again; one refused alone is
        # confirmed, and dead-lettered when met again. Both are forgotten once that commits.
        self._suspects: dict[Source, str] = {}
        self._refused: dict[Source, str] = {}
        self._isolated: Source | None = None
        self._dead_letter_max_bytes = dead_letter_max_bytes(config.kafka.producer.get(
            "message.max.bytes", config.kafka.config.get("message.max.bytes")))
        self._topics: dict[str, tuple[int | None, float]] = {}
        # librdkafka's own log lines go through logging, not straight to stderr.
        common: dict[str, Any] = {**config.kafka.librdkafka(),
                                  "logger": logging.getLogger("cdc_router.librdkafka")}
        self._instance_id = instance_id
        # The user's client properties first: those the guarantee depends on come after, and win.
        producer_config: dict[str, Any] = {"linger.ms": 5, **common, **config.kafka.producer,
                                           "enable.idempotence": True, "acks": "all"}
        if self._exactly_once:
            transactional_id = f"{config.delivery.transactional_id}-{instance_id}"
            producer_config["transactional.id"] = transactional_id
            producer_config["transaction.timeout.ms"] = TRANSACTION_TIMEOUT_MS
        self._producer = LatchingProducer(producer_config)
        self._consumer_config: dict[str, Any] = {
            # A raw topic Debezium creates after we subscribed is noticed within this time.
            "topic.metadata.refresh.interval.ms": 5000,
            # A static member that stops (or dies and stays away) keeps its partitions until
            # this passes: 10 s bounds that stall, well above the 3 s heartbeat interval.
            "session.timeout.ms": 10_000,
            **common,
            **config.kafka.consumer,
            "group.id": config.source.group_id,
            # Static membership: a restarted instance takes its partitions back at once
            # instead of waiting session.timeout.ms for the group to notice it died.
            "group.instance.id": instance_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # Debezium's exactly-once source tasks write in transactions: never read aborted ones.
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            # An eager assignor: every member commits or aborts before any partition moves.
            "partition.assignment.strategy": "range,roundrobin",
        }
        self._consumer: Consumer | None = None
        self._changelog = ChangelogReader(common, config.dedup.changelog_topic) \
            if config.dedup.enabled else None
        self.last_poll = time.monotonic()
        self._waiting_for_source = False

    # Lifecycle ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish its batch, commit and return; safe from a signal handler."""
        self._stop.set()

    def run(self) -> None:
        """Consume until stop(); raises FatalKafkaError when it cannot go on.

        Also raises, before consuming anything, a CdcRouterError from a serializer's preflight
        (an Avro schema missing from the schema registry is configuration, not a poison event).
        """
        self._router.preflight()
        if self._exactly_once:
            # One try: its timeout already covers waiting out a predecessor's transaction.
            self._call(lambda: self._producer.init_transactions(_INIT_TIMEOUT_S), "init",
                       backoffs=())
        consumer = Consumer(self._consumer_config)
        self._consumer = consumer
        consumer.subscribe(list(self._config.source.topics), on_assign=self._on_assign,
                           on_revoke=self._on_revoke, on_lost=self._on_lost)
        log.info("event=started instance=%s guarantee=%s topics=%s", self._instance_id,
                 self._config.delivery.guarantee, ",".join(self._config.source.topics))
        try:
            while not self._stop.is_set():
                messages = consumer.consume(num_messages=500, timeout=0.1)
                self.last_poll = time.monotonic()
                try:
                    for message in messages:
                        self._handle(message)
                except _Rewind:
                    continue
                except (KafkaException, DeliveryError) as failure:
                    self._abort_and_rewind(failure, raise_rewind=False)
                    continue
                if self._batch.open and self._due():
                    self._commit()
            if self._batch.open:
                self._commit()
        except BaseException:
            # The batch's offsets may already cover a record that was not produced: closing
            # the consumer must not commit them (its revoke callback would).
            self._discard_batch()
            raise
        finally:
            self._close()

    def _discard_batch(self) -> None:
        """Forget the open batch after an unexpected failure; abort its transaction."""
        if not self._batch.open:
            return
        self._batch = _Batch()
        if self._replay is not None:
            self._replay.abort()
        if self._exactly_once:
            try:
                self._producer.abort_transaction(_TXN_CALL_TIMEOUT_S)
            except KafkaException as failure:
                log.warning("event=abort_failed error=%r", str(failure))

    def _close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._changelog is not None:
            self._changelog.close()
        log.info("event=stopped instance=%s", self._instance_id)

    # One record ----------------------------------------------------------------------------

    def _handle(self, message: Message) -> None:
        error = message.error()
        if error is not None:
            self._consumer_error(error)
            return
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        assert topic is not None and partition is not None and offset is not None
        self._begin()
        self._batch.offsets[(topic, partition)] = offset + 1
        refused = self._refused.get((topic, partition, offset))
        if refused is not None:
            self._batch.settled.append((topic, partition, offset))
            self._dead_letter(message, "produce", DeliveryError(refused),
                              self._event_id_of(message))
            return
        try:
            decoded = decode(message.key(), message.value(), topic=topic,
                             settings=self._config.source)
        except DecodeError as failure:
            self._dead_letter(message, "decode", failure)
            return
        if isinstance(decoded, Skipped):
            self._metrics.skipped.labels(decoded.reason).inc()
            return
        if self._replay is not None and self._replay.seen(decoded.event_id):
            self._metrics.duplicates.inc()
            return
        try:
            routed = self._router.route(decoded, self._partitions_for)
            if isinstance(routed, OutboundRecord) and self._partition_count(routed.topic) is None:
                raise RouteError(self._missing_topic(routed.topic))
        except RouteError as failure:
            self._dead_letter(message, "route", failure, decoded.event_id)
            return
        except SerializeError as failure:
            self._dead_letter(message, "serialize", failure, decoded.event_id)
            return
        if isinstance(routed, Skipped):
            self._metrics.skipped.labels(routed.reason).inc()
            return
        self._produce(message, decoded, routed)

    def _event_id_of(self, message: Message) -> str | None:
        try:
            decoded = decode(message.key(), message.value(), topic=message.topic() or "",
                             settings=self._config.source)
        except DecodeError:
            return None
        return decoded.event_id if isinstance(decoded, OutboxEvent) else None

    def _produce(self, message: Message, event: OutboxEvent, record: OutboundRecord) -> None:
        source = (message.topic() or "", message.partition() or 0, message.offset() or 0)
        suspect = source in self._suspects
        if suspect:
            # Alone in its produce request: deliver what came before, then only this record.
            self._producer.flush(_TXN_CALL_TIMEOUT_S)
            self._isolated = source
        try:
            self._producer.produce(record.topic, key=record.key, value=record.value,
                                   headers=list(record.headers), partition=record.partition,
                                   timestamp_ms=record.timestamp_ms, source=source)
            if suspect:
                self._producer.flush(_TXN_CALL_TIMEOUT_S)
                self._isolated = None
                self._batch.settled.append(source)  # delivered alone: it was innocent
        except KafkaException as failure:
            kafka_error = kafka_error_of(failure)
            if kafka_error is not None and kafka_error.code() in RECORD_REFUSED:
                # Refused before it left (too big for librdkafka): certainly this record.
                self._isolated = None
                self._dead_letter(message, "produce", failure, event.event_id)
                return
            self._abort_and_rewind(failure)
        self._remember(event.event_id)
        self._batch.delivered.append(Delivered(event.event_id, record.topic, event.created_at_ms))
        self._batch.records += 1

    def _dead_letter(self, message: Message, stage: Stage, error: BaseException,
                     event_id: str | None = None) -> None:
        headers = record_headers(message)
        value = message.value()
        size = len(message.key() or b"") + len(value or b"") + sum(
            len(name) + len(header) for name, header in headers)
        if size > self._dead_letter_max_bytes:
            # A dead letter the broker refused would block the stream: keep its coordinates
            # and reason, drop the value (the raw topic still holds it).
            headers.append((DEAD_LETTER_VALUE_DROPPED, str(len(value or b"")).encode()))
            value = None
        letter: DeadLetter = dead_letter(
            topic=message.topic() or "", partition=message.partition() or 0,
            offset=message.offset() or 0, key=message.key(), value=value,
            original_headers=headers, stage=stage, error=error, event_id=event_id)
        self._producer.produce(self._config.dead_letter.topic, key=letter.key,
                               value=letter.value, headers=list(letter.headers))
        if event_id is not None:
            self._remember(event_id)
        self._batch.records += 1
        self._metrics.dead_letters.labels(stage).inc()
        log.warning("event=dead_letter stage=%s topic=%s partition=%s offset=%s id=%s reason=%r",
                    stage, message.topic(), message.partition(), message.offset(), event_id,
                    letter.reason)

    def _remember(self, event_id: str) -> None:
        """Mark the id delivered, in this transaction, so a replay of it is dropped."""
        if self._replay is None:
            return
        now_ms = int(time.time() * 1000)
        self._replay.add_pending(event_id, now_ms)
        mark = changelog_record(event_id, now_ms)
        self._producer.produce(self._config.dedup.changelog_topic, key=mark.key, value=mark.value,
                               headers=[])

    # Destination metadata ------------------------------------------------------------------

    def _partition_count(self, topic: str) -> int | None:
        cached = self._topics.get(topic)
        now = time.monotonic()
        if cached is not None and (cached[0] is not None or
                                   now - cached[1] < _MISSING_TOPIC_RECHECK_S):
            return cached[0]
        count = self._producer.partitions_for(topic, timeout_s=10)
        self._topics[topic] = (count, now)
        return count

    def _partitions_for(self, topic: str) -> int:
        count = self._partition_count(topic)
        if count is None:
            raise RouteError(self._missing_topic(topic))
        return count

    @staticmethod
    def _missing_topic(topic: str) -> str:
        return (f"destination topic {topic} does not exist (the router never creates topics): "
                "declare it under `topics:` and run `cdc-router topics apply`")

    # Transactions --------------------------------------------------------------------------

    def _begin(self) -> None:
        if self._batch.open:
            return
        if self._exactly_once:
            self._call(self._producer.begin_transaction, "begin")
        self._batch = _Batch(started=time.monotonic())

    def _due(self) -> bool:
        delivery = self._config.delivery
        return (self._batch.records >= delivery.commit_max_records or
                (time.monotonic() - self._batch.started) * 1000 >= delivery.commit_interval_ms)

    def _commit(self) -> None:
        """Commit the open batch; on failure abort it and rewind (or raise if fatal)."""
        batch, consumer = self._batch, self._consumer
        assert consumer is not None
        offsets = [TopicPartition(t, p, o) for (t, p), o in batch.offsets.items()]
        try:
            # 1. Deliver every record of the batch; a failed delivery aborts the whole batch.
            self._producer.flush(_TXN_CALL_TIMEOUT_S)
            if self._exactly_once:
                # 2. Add the consumed offsets to the transaction, with the group's generation
                #    (KIP-447), so that a zombie of an older generation can't commit them.
                self._call(lambda: self._producer.send_offsets_to_transaction(
                    offsets, consumer.consumer_group_metadata(), _TXN_CALL_TIMEOUT_S), "offsets")
                # 3. Records, dead letters, changelog marks and offsets become visible together.
                self._call(lambda: self._producer.commit_transaction(_TXN_CALL_TIMEOUT_S),
                           "commit")
            else:
                # At least once: offsets only after every record of the batch is delivered.
                consumer.commit(offsets=offsets, asynchronous=False)
        except (DeliveryError, KafkaException) as failure:
            self._abort_and_rewind(failure, raise_rewind=False)
            return
        # 4. Only now do the ids count as delivered, and may their outbox rows go.
        now_ms = int(time.time() * 1000)
        if self._replay is not None:
            self._replay.commit(now_ms)
        for source in batch.settled:
            self._suspects.pop(source, None)
            self._refused.pop(source, None)
        self._batch = _Batch()
        self._metrics.committed(batch.delivered, now_ms)
        if self._on_delivered is not None and batch.delivered:
            self._on_delivered(batch.delivered)

    def _abort_and_rewind(self, failure: BaseException, *, raise_rewind: bool = True) -> None:
        """Abort the open batch and seek back to the committed offsets; FatalKafkaError if fatal."""
        kafka_error = getattr(failure, "kafka_error", None) or kafka_error_of(failure)
        if isinstance(kafka_error, KafkaError) and classify(kafka_error) is Action.FATAL:
            raise FatalKafkaError(f"Kafka refused this router for good ({describe(kafka_error)}); "
                                  "another instance may use the same instance id") from failure
        self._collect_refusals()
        log.warning("event=batch_aborted records=%d reason=%r", self._batch.records, str(failure))
        if self._exactly_once:
            self._call(lambda: self._producer.abort_transaction(_TXN_CALL_TIMEOUT_S), "abort")
        self._collect_refusals()
        self._isolated = None
        self._producer.clear_latched()
        if self._replay is not None:
            self._replay.abort()
        self._batch = _Batch()
        self._metrics.aborted.inc()
        if self._consumer is not None:
            rewind_to_committed(self._consumer, _TXN_CALL_TIMEOUT_S)
        if raise_rewind:
            raise _Rewind

    def _collect_refusals(self) -> None:
        """Learn which input records' output the broker refused, from the delivery reports."""
        refused, own = self._producer.take_refused()
        if own is not None:
            raise FatalKafkaError(f"{own}; the dead-letter or dedup changelog topic must accept "
                                  "the router's records (size limits, ACLs)")
        for source, reason in refused.items():
            if source == self._isolated:
                self._refused[source] = reason  # refused alone: certainly this record
            else:
                self._suspects[source] = reason

    def _call(self, step: Callable[[], None], name: str,
              backoffs: tuple[float, ...] = _RETRY_BACKOFF_S) -> None:
        """Run a transactional call, retrying retriable errors; abortable ones propagate."""
        for attempt, backoff in enumerate((*backoffs, None)):
            try:
                step()
                return
            except KafkaException as failure:
                kafka_error = kafka_error_of(failure)
                if kafka_error is None:
                    raise
                action = classify(kafka_error)
                if action is Action.FATAL:
                    raise FatalKafkaError(f"Kafka transaction step {name!r} failed for good: "
                                          f"{describe(kafka_error)}") from failure
                if action is Action.ABORT:
                    raise
                if backoff is None:
                    raise DeliveryError(
                        f"Kafka transaction step {name!r} still fails after {attempt + 1} "
                        f"tries: {describe(kafka_error)}; is the cluster at "
                        f"{self._config.kafka.bootstrap_servers} reachable?",
                        kafka_error=kafka_error) from failure
                log.info("event=retry step=%s attempt=%d error=%s", name, attempt + 1,
                         describe(kafka_error))
                time.sleep(backoff)

    # Consumer events -----------------------------------------------------------------------

    def _consumer_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            # Debezium creates the raw topic with its first event: not an error, a wait.
            if not self._waiting_for_source:
                log.info("event=source_topic_missing detail=%r", error.str())
                self._waiting_for_source = True
            return
        if classify(error) is Action.FATAL:
            raise FatalKafkaError(f"the consumer failed for good: {describe(error)}")
        log.warning("event=consumer_error error=%s", describe(error))

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Before reading new partitions, learn every id delivered so far (any instance)."""
        if self._changelog is None or self._replay is None:
            return
        # A previous owner may still hold an open transaction with offsets (and dedup marks)
        # for these partitions; fetching the committed offsets waits until it is resolved
        # (require_stable), so that the changelog read below sees its marks.
        consumer.committed(partitions, timeout=_INIT_TIMEOUT_S)
        now_ms = int(time.time() * 1000)
        started, restored = time.monotonic(), 0
        for key, value in self._changelog.catch_up():
            parsed = parse_changelog(key, value)
            if parsed is not None:
                self._replay.restore([parsed], now_ms)
                restored += 1
        log.info("event=assigned partitions=%s dedup_ids=%d restored=%d seconds=%.1f",
                 ",".join(f"{tp.topic}[{tp.partition}]" for tp in partitions), len(self._replay),
                 restored, time.monotonic() - started)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Commit what the batch holds while the group's generation still owns it."""
        if self._batch.open:
            self._commit()

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Our generation is gone: the batch's offsets can't commit, so it must abort."""
        if self._batch.open:
            self._abort_and_rewind(DeliveryError("partitions lost"), raise_rewind=False)
