"""What one raw record does to the router's open batch: the step's result written into the
transaction. A routed event is produced (alone while the poison isolation suspects it, a
confirmed one is dead-lettered unproduced: router/poison.py), a failed one dead-lettered with
its reason, a replay dropped with its line, a skipped record passed over; every delivered or
dead-lettered id is marked in the replay filter and the changelog with the batch.

The loop (router/loop.py) decides when batches begin, commit and abort; this module only what
each record adds to one.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Message

from cdc_router.config.model import RouterConfig
from cdc_router.dead_letter import dead_letter
from cdc_router.errors import DeliveryError
from cdc_router.kafka.consumer import SourceErrors, record_headers
from cdc_router.kafka.producer import RecordCoordinates
from cdc_router.router.destinations import DestinationMetadata
from cdc_router.router.poison import PoisonIsolation, produce_isolated
from cdc_router.router.replay import ReplayFilter
from cdc_router.router.replay_log import ReplayLines
from cdc_router.router.step import DeadLettered, Duplicate, RecordStep, Routed, StepResult
from cdc_router.router.transaction import Transaction
from cdc_router.router.values import Delivered

log = logging.getLogger("cdc_router.router")


class BatchWriter:
    """Writes each raw record the consumer hands out into the open batch (write())."""

    def __init__(self, config: RouterConfig, step: RecordStep, *, poison: PoisonIsolation,
                 destinations: DestinationMetadata, replay: ReplayFilter | None,
                 dead_letter_max_bytes: int) -> None:
        """`dead_letter_max_bytes`: the largest letter sent whole (clients.dead_letter_limit);
        the router narrows it at start to the dead-letter topic's own limit."""
        self._config = config
        self._step = step
        self._poison = poison
        self._destinations = destinations
        self._replay = replay
        self._replay_lines = ReplayLines(replay)
        self._source_errors = SourceErrors(log, group=config.source.group_id)
        self.dead_letter_max_bytes = dead_letter_max_bytes

    def idle(self) -> None:
        """Nothing was read: a run of replays that is over is summed up now."""
        self._replay_lines.idle()

    def write(self, txn: Transaction, message: Message) -> None:
        """Add the record's outcome to `txn`'s batch (begun if none is open). Raises what
        producing raises (BatchFailed, KafkaException): the loop aborts the batch."""
        error = message.error()
        if error is not None:
            self._source_errors.handle(error)
            return
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        assert topic is not None and partition is not None and offset is not None
        txn.begin()
        txn.consumed(topic, partition, offset)
        result: StepResult = self._step(topic, message.key(), message.value())
        self._replay_lines.read(isinstance(result, Duplicate))  # a run's summary (QA 64-a F-9)
        if isinstance(result, Routed):
            self._produce(txn, message, result, (topic, partition, offset))
        elif isinstance(result, DeadLettered):
            self._dead_letter(txn, message, result)
        elif isinstance(result, Duplicate):
            txn.passed_over(None)  # a replay, or an id reused (QA 44-a: not a word said)
            self._replay_lines.dropped(result.event_id,
                                       f"topic={topic} partition={partition} offset={offset}")
        else:
            txn.passed_over(result.reason)

    def _produce(self, txn: Transaction, message: Message, routed: Routed,
                 source: RecordCoordinates) -> None:
        record = routed.record
        refused = produce_isolated(txn, self._poison, record, source,
                                   self._destinations.check_refusal)
        if refused is not None:
            self._dead_letter(txn, message, DeadLettered("produce", DeliveryError(refused),
                                                         record.event_id, routed.event))
            return
        self._remember(txn, record.event_id)
        txn.delivered(Delivered(record.event_id, record.topic, routed.event.created_at_ms))

    def _dead_letter(self, txn: Transaction, message: Message, result: DeadLettered) -> None:
        letter = dead_letter(
            topic=message.topic() or "", partition=message.partition() or 0,
            offset=message.offset() or 0, key=message.key(), value=message.value(),
            original_headers=record_headers(message), stage=result.stage, error=result.error,
            event_id=result.event_id, max_bytes=self.dead_letter_max_bytes,
            group=self._config.source.group_id)
        txn.dead_letter(self._config.dead_letter.topic, letter)
        if result.marked_id is not None:
            self._remember(txn, result.marked_id, dead_lettered=True)
        log.warning("event=dead_letter stage=%s topic=%s partition=%s offset=%s id=%s "
                    "error=%s reason=%r", result.stage, message.topic(), message.partition(),
                    message.offset(), result.shown_id, type(result.error).__name__,
                    letter.reason)

    def _remember(self, txn: Transaction, event_id: str, *, dead_lettered: bool = False) -> None:
        """Mark the id delivered (or dead-lettered) with the batch: its replay is dropped."""
        if self._replay is None:
            return
        now_ms = int(time.time() * 1000)
        self._replay.add_pending(event_id, now_ms, dead_lettered=dead_lettered)
        txn.mark(event_id, now_ms, dead_lettered=dead_lettered)
