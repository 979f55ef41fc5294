"""`cdc-router dlq replay`: dead letters back through the routing step, exactly once.

The procedure:
1. Register the transactional id `<prefix>-dlq-replay` (init_transactions; the prefix is
   delivery.transactional_id, by default source.group_id): a replay still running elsewhere
   is fenced, and its open transaction ends first.
2. Read the dedup changelog to its log end (open transactions waited for) and the whole
   dead-letter topic to its last stable offset, from the beginning, with the consumer group
   `<source.group_id>.dlq-replay` (its partitions are assigned, the group is never joined).
3. Work out the ids already delivered (router/dlq_delivered.py) and plan each selected letter with
   the router's RecordStep and replay filter: deliver, dead-letter again, skip. A letter whose
   value was left out for size is planned with its raw record, read again (router/dlq_raw.py).
4. Apply in the router's Transaction: destination records, the new dead letters, the
   `replayed:` changelog marks and the dead-letter group's offsets commit together (a fixed
   route to a JetStream subject publishes at commit and waits for the acks first), by
   delivery.commit_max_records / commit_interval_ms; the last transaction moves the group's
   offsets to the end read in 2, with the letters left undelivered (kafka/commit_stamp.py).

Every replay reads the topic from its beginning, so letters left out by --stage, --id or
--since are never consumed-and-lost; the group's offsets only say how far the last replay
read. A second replay of the same letters finds their `replayed:` marks and skips them. A
crash or a failed batch leaves every committed batch delivered and marked: run it again. A
batch whose commit Kafka acknowledged and then lost (router/lost_commits.py), found when a
later batch fails (the group's offsets read back are behind this run's), stops the replay
(exit 75): going on after it would count it delivered; the next run plans its letters again.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import KafkaException, Producer, TopicPartition

from cdc_router.config.compiled import CompiledConfig
from cdc_router.config.model import RouterConfig
from cdc_router.dead_letter import DeadLetter
from cdc_router.errors import (
    EXIT_RESTART,
    BatchFailed,
    ConfigError,
    DeliveryError,
    FatalKafkaError,
)
from cdc_router.kafka.changelog_reader import ChangelogReader
from cdc_router.kafka.closing import close_all
from cdc_router.kafka.commit_stamp import undelivered_before
from cdc_router.kafka.consumer import record_headers
from cdc_router.kafka.producer import LatchingProducer
from cdc_router.kafka.reader import TopicReader
from cdc_router.kafka.start import init_failure
from cdc_router.relay.letters import letter_event
from cdc_router.router import clients
from cdc_router.router.dlq_delivered import delivered_ids, undelivered
from cdc_router.router.dlq_letters import (
    Letter,
    Planned,
    Selection,
    dead_letter_again,
    fails_as_before,
    of_this_pipeline,
    plan_replay,
    read_letter,
    sources_of,
    superseded_letters,
)
from cdc_router.router.dlq_raw import RawRecords, refilled
from cdc_router.router.grants import OperationsFactory, admin_operations
from cdc_router.router.lost_commits import CommitLedger, lost_batch
from cdc_router.router.poison import PoisonIsolation, abort_batch, produce_isolated, record_refusals
from cdc_router.router.renewal import producer_lost
from cdc_router.router.replay import REPLAYED_KEY_PREFIX, ReplayFilter
from cdc_router.router.step import DeadLettered, RecordStep, Routed, StepResult
from cdc_router.router.timestamps import DescribeFactory, admin_describe
from cdc_router.router.transaction import Transaction
from cdc_router.serde import Serializer

log = logging.getLogger("cdc_router.router")

INSTANCE = "dlq-replay"
# Reading the dead-letter topic (or the changelog) to its end: seconds on a cluster that
# answers; the bound only says so rather than hang.
READ_TIMEOUT_S = 300.0
# A batch that fails for no refused record is tried again this many times, after 0.5, 1, 2 s;
# after each, the group's offsets are read back within _READ_BACK_S (a lost commit).
_RETRIES, _BACKOFF_S, _READ_BACK_S = 3, 0.5, 10.0


def replay_group(config: RouterConfig) -> str:
    """The consumer group whose offsets the replay commits."""
    return f"{config.source.group_id}.dlq-replay"


@dataclass(frozen=True)
class ReplayPlan:
    """The selected letters and what happens to each; `read` letters were read in all;
    `others` and `consumers` the selection left out (of_this_pipeline): other pipelines'
    and idempotent consumers' letters."""

    planned: list[Planned]
    read: int
    ends: dict[int, int]  # dead-letter partition -> the offset after the last letter read
    others: int = 0
    consumers: int = 0

    def counts(self) -> dict[str, int]:
        return dict(Counter(item.action for item in self.planned))


@dataclass
class ReplayResult:
    committed: dict[str, int] = field(default_factory=dict)  # action -> letters committed


def _check(config: RouterConfig) -> None:
    if config.delivery.guarantee != "exactly_once" or not config.dedup.enabled:
        raise ConfigError("dlq replay needs delivery.guarantee exactly_once and dedup "
                          "enabled: only committed changelog marks tell which ids were "
                          "delivered", field="delivery.guarantee / dedup.enabled")


def _looking_up(serializer: Serializer, config: RouterConfig) -> Serializer:
    """`serializer` for a plan: an Avro one with a registry registers nothing in it."""
    # Here, not at the top: `run` imports this module, and the registry client's import
    # (authlib, httpx) costs every router start half a second it has no use for.
    from cdc_router.serde.avro import AvroSerializer

    if not isinstance(serializer, AvroSerializer) or serializer.registry is None:
        return serializer
    return AvroSerializer(config.routes, config.schema_registry, looks_only=True,
                          registry_client=serializer.registry.client)


class DeadLetterReplay:
    """Plans, then applies, one replay; see the module doc. Clients are built lazily."""

    def __init__(self, compiled: CompiledConfig, *, dry_run: bool,
                 producer_factory: Callable[[dict[str, Any]], Any] = Producer,
                 changelog_factory: Callable[[dict[str, Any], str], Any] = ChangelogReader,
                 reader_factory: Callable[..., Any] = TopicReader,
                 describe_factory: DescribeFactory = admin_describe,
                 operations_factory: OperationsFactory = admin_operations) -> None:
        config = self._config = compiled.config
        _check(config)
        self._dry_run = dry_run
        if dry_run:  # a plan registers no schema (review 48-d F8)
            compiled = replace(compiled, serializers={
                name: _looking_up(serializer, config)
                for name, serializer in compiled.serializers.items()})
        common = clients.common_config(config)
        # A dry run only looks up partition counts: a plain producer, never transactional.
        self._producer = LatchingProducer(
            common if dry_run else clients.watched(clients.producer_config(config, INSTANCE)),
            producer_factory)
        self._changelog = changelog_factory(common, config.dedup.changelog_topic)
        self._letters = reader_factory(common, config.dead_letter.topic,
                                       group_id=replay_group(config), what="dead-letter")
        self._filter = ReplayFilter(window_ms=config.dedup.window_ms, max_ids=config.dedup.max_ids)
        self._destinations = clients.destinations(config, self._producer, operations_factory)
        self._describe = clients.topic_describe(config, describe_factory)
        self._step = RecordStep(compiled, self._destinations.partitions, seen=self._filter.seen,
                                timestamp_limits=(limits := clients.timestamp_limits(
                                    self._describe, config)))
        self._max_bytes = clients.dead_letter_limit(config)
        # A letter whose fixed route is a JetStream subject is published at its batch's
        # commit, with Nats-Msg-Id = its event id, before the Kafka transaction commits.
        self._publisher = None if dry_run else clients.jetstream_publisher(config, INSTANCE)
        self._txn: Transaction | None = None
        # Letters whose records the broker refused (as `run` tells them from a clock it refuses)
        self._poison = PoisonIsolation(record_refusals(config.delivery.record_timestamp), limits)
        self._done = 0  # items of the work applied and committed
        self._ledger = CommitLedger()  # the offsets this replay committed (review 59-r F-3)
        # For the last commit's count of letters not delivered (_undelivered, QA 52-b M1):
        self._read, self._delivered, self._settled = list[Letter](), set[str](), set[Any]()
        self._applied: list[tuple[Letter, str]] = []  # committed or in the open batch
        self._previous: dict[int, tuple[int, int | None]] = {}  # the last commit's

    def _letter_step(self, topic: str, key: bytes | None, value: bytes | None) -> StepResult:
        """The router's step for a router's letter; for the relay's (its source is the relay's
        table), the row in its value decoded as the relay does (relay/letters.py), then the
        step after decoding."""
        relay = self._config.relay
        if relay is None or topic != relay.qualified_table:
            return self._step(topic, key, value)
        return self._step.decoded(lambda: letter_event(value, self._config.source))

    def plan(self, selection: Selection) -> ReplayPlan:
        """Steps 1 to 3 of the module doc; nothing is produced."""
        self._step.preflight()
        if not self._dry_run:
            txn = self._txn = Transaction(
                self._producer, self._letters.consumer, delivery=self._config.delivery,
                changelog_topic=self._config.dedup.changelog_topic,
                bootstrap=self._config.kafka.bootstrap_servers,
                mark_key_prefix=REPLAYED_KEY_PREFIX,
                mark_group=self._config.source.group_id, publisher=self._publisher,
                fenced_hint="another `dlq replay` of this pipeline took over: run one at a time")
            try:
                txn.init()
            except BatchFailed as failure:
                raise init_failure(failure, self._producer) from failure
            self._max_bytes = clients.dead_letter_limit(self._config, self._describe)
        marks = list(self._changelog.catch_up(timeout_s=READ_TIMEOUT_S))
        letters, ends = self._read_letters()
        ours = sources_of(self._config)
        # Another pipeline's letter of an id of ours says nothing of our delivery of it.
        delivered = delivered_ids(marks, [letter for letter in letters
                                          if ours(letter.source_topic, letter.source_group)],
                                  group=self._config.source.group_id)
        self._filter.restore(delivered.items(), int(time.time() * 1000))
        relay = self._config.relay.qualified_table if self._config.relay else None
        # Only this pipeline's, as `dlq list` shows them (QA 62 F-9: the plan listed the
        # letters of another sharing the topic, which `list` leaves out). A letter without its
        # value (over the size limit): its raw record's (dlq_raw.py).
        chosen = [letter for letter in letters if selection.selects(letter)]
        selected = refilled([letter for letter in chosen if of_this_pipeline(letter, ours)],
                            lambda: RawRecords(self._config), ours, relay)
        horizon_ms = int(time.time() * 1000) - self._config.dedup.window_ms
        superseded = superseded_letters(letters, self._config.dead_letter.topic, ours)
        planned = plan_replay(selected, self._letter_step, self._filter, delivered, ours=ours,
                              superseded=superseded, relay_table=relay,
                              expired_before_ms=None if selection.include_expired else horizon_ms)
        self._read, self._delivered = letters, set(delivered)
        self._settled = {*superseded, *((item.letter.partition, item.letter.offset)
                                        for item in planned
                                        if item.action in ("skip", "superseded"))}
        if not self._dry_run:
            self._previous = self._committed(ends)
        consumers = sum(1 for letter in chosen if not of_this_pipeline(letter, ours)
                        and not letter.from_router)  # QA 63-b: counted as other pipelines'
        return ReplayPlan(planned, len(letters), ends,
                          others=len(chosen) - len(selected) - consumers, consumers=consumers)

    def apply(self, plan: ReplayPlan) -> ReplayResult:
        """Step 4: deliver and dead-letter again, with marks and offsets, in transactions.

        A batch the broker (or JetStream) aborts for records it refuses is done again with
        those letters dead-lettered again, as `run` isolates them (QA 33-c: one refused
        letter stopped every replay at it). Raises DeliveryError (exit 75) when a batch fails
        otherwise (aborted; the batches before stay committed), FatalKafkaError when another
        replay fenced this one, ProducerLost (exit 75) when its producer failed on its own.
        """
        result = ReplayResult()
        try:
            return self._apply(plan, result)
        except FatalKafkaError as failure:
            lost = producer_lost(failure, sum(result.committed.values()))
            if lost is None:
                raise
            raise lost from failure

    def _apply(self, plan: ReplayPlan, result: ReplayResult) -> ReplayResult:
        assert self._txn is not None, "plan() first, and not a dry run"
        txn = self._txn
        work = [item for item in plan.planned if item.action in ("deliver", "dead_letter")]
        self._done, failed, pending_abort = 0, 0, False
        while True:
            batch, done = Counter[str](), self._done
            del self._applied[sum(result.committed.values()):]  # the aborted batch's
            try:
                if pending_abort:
                    txn.abort()
                self._batches(work, batch, result)
                self._finish(plan.ends)
                result.committed = dict(Counter(result.committed) + batch)
                return result
            except (BatchFailed, KafkaException) as failure:
                cause, reason = abort_batch(txn, self._poison, self._destinations, failure,
                                            who="dlq replay")
                pending_abort = cause == "abort_failed"
                if lost := self._ledger.read_back(self._letters.consumer, _READ_BACK_S):
                    txn.discard()  # a batch before was lost: its letters are planned again
                    raise lost_batch(lost, sum(result.committed.values())) from failure
                # Refused records are progress (run's isolation); so is a committed batch. A
                # refusal's gap in the sequence numbers fails the next batch once, too.
                failed = 0 if cause == "record_refused" or self._done > done else failed + 1
                if failed > _RETRIES:  # the cluster's or NATS' (QA 56-e F-1: exit 1 said final)
                    txn.discard()
                    committed = sum(result.committed.values())
                    stopped = DeliveryError(f"dlq replay stopped: {reason}; {committed} letters "
                                            "were committed before; run it again (what was "
                                            "delivered is skipped)")
                    stopped.exit_code = EXIT_RESTART
                    raise stopped from failure
                if failed:
                    log.warning("event=batch_aborted cause=%s consecutive=%d reason=%r", cause,
                                failed, reason)
                    time.sleep(_BACKOFF_S * 2 ** (failed - 1))

    def _batches(self, work: list[Planned], batch: Counter[str], result: ReplayResult) -> None:
        """Apply the work after the committed (self._done), committing each due batch."""
        txn, topic = self._txn, self._config.dead_letter.topic
        assert txn is not None
        for index in range(self._done, len(work)):
            item = work[index]
            txn.begin()
            txn.consumed(topic, item.letter.partition, item.letter.offset)
            self._applied.append((item.letter, self._apply_one(txn, item)))
            batch[self._applied[-1][1]] += 1
            if txn.due():
                self._ledger.committed(txn.commit().offsets)
                self._poison.committed()
                result.committed = dict(Counter(result.committed) + batch)
                batch.clear()
                self._done = index + 1

    def _finish(self, ends: dict[int, int]) -> None:
        """The last transaction: the group's offsets to the end of what was read."""
        txn, topic = self._txn, self._config.dead_letter.topic
        assert txn is not None
        undone = self._undelivered()
        for partition, end in ends.items():
            txn.begin()
            txn.consumed(topic, partition, end - 1, undone.get(partition, 0))
        if txn.open:
            self._ledger.committed(txn.commit().offsets)
            self._poison.committed()

    def _committed(self, ends: dict[int, int]) -> dict[int, tuple[int, int | None]]:
        """Partition -> the group's committed offset and the letters undelivered before it;
        {} when Kafka does not say (the count is then not capped: see dlq_delivered.undelivered)."""
        topic = self._config.dead_letter.topic
        try:
            found = self._letters.consumer.committed(
                [TopicPartition(topic, partition) for partition in ends], READ_TIMEOUT_S)
        except KafkaException:
            return {}
        return {tp.partition: (tp.offset, undelivered_before(tp.metadata)) for tp in found
                if tp.offset >= 0}

    def _undelivered(self) -> dict[int, int]:
        """Partition -> this pipeline's letters read and not delivered once this replay
        commits (kafka/commit_stamp.py, dlq_delivered.undelivered)."""
        applied = self._applied
        return undelivered(
            self._read, self._delivered | {letter.event_id for letter, action in applied
                                           if action == "deliver" and letter.event_id},
            self._settled | {(letter.partition, letter.offset) for letter, action in applied
                             if action == "dead_letter"},
            sources_of(self._config), self._previous,
            [(letter.partition, letter.offset) for letter, action in applied
             if action in ("deliver", "dead_letter")])

    def _apply_one(self, txn: Transaction, item: Planned) -> str:
        letter, step = item.letter, item.result
        topic = self._config.dead_letter.topic
        if isinstance(step, Routed):
            # A refusal that is librdkafka's lagging metadata fails the batch (retried), as
            # in `run` (review 43: it was dead-lettered again).
            refused = produce_isolated(txn, self._poison, step.record,
                                       (topic, letter.partition, letter.offset),
                                       self._destinations.check_refusal)
            if refused is None:
                txn.mark(step.record.event_id, int(time.time() * 1000))
                return "deliver"
            step = DeadLettered("produce", DeliveryError(refused), step.record.event_id,
                                step.event)
        assert isinstance(step, DeadLettered)
        if fails_as_before(letter, step):  # refused as before: its letter says it already
            return "still_failing"
        txn.dead_letter(topic, self._again(letter, step))
        log.warning("event=dead_letter_again id=%s stage=%s reason=%r", step.shown_id,
                    step.stage, str(step.error))
        return "dead_letter"

    def _again(self, letter: Letter, failed: DeadLettered) -> DeadLetter:
        return dead_letter_again(letter, failed, dead_letter_topic=self._config.dead_letter.topic,
                                 max_bytes=self._max_bytes, group=self._config.source.group_id)

    def _read_letters(self) -> tuple[list[Letter], dict[int, int]]:
        letters: list[Letter] = []
        ends: dict[int, int] = {}
        for message in self._letters.read_to_end(end="stable", timeout_s=READ_TIMEOUT_S):
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            letters.append(read_letter(partition, offset, message.timestamp()[1], message.key(),
                                       message.value(), record_headers(message)))
            ends[partition] = max(ends.get(partition, 0), offset + 1)
        return letters, ends

    def close(self) -> None:
        close_all(self._letters, self._changelog, self._publisher)
