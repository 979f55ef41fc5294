"""Poison isolation: find the input record whose output the broker refuses, and dead-letter it.

In a transaction, a record the broker refuses makes the whole transaction abortable, and the
refusal names every record of its produce request (measured on Kafka 4.x: one INVALID_TIMESTAMP
fails all 11 records of its request to that partition). So one poison record costs at most two
aborted batches of its own, each followed by one in which librdkafka bumps its producer epoch
(loop.py):

1. its batch aborts; every input record named by the refusal becomes a suspect;
2. on the re-read, each suspect is produced alone (flush before, flush after): delivered, it
   was innocent and is forgotten; refused, it is confirmed, and its batch aborts again;
3. on the next re-read a confirmed record is dead-lettered (stage produce) without being
   produced, and forgotten once that batch commits.

JetStream acks each message alone, so a message it refuses for what it is (too big for the
stream) is confirmed at once (BatchFailed.refused): one aborted batch, then its dead letter.

A refusal of the router's own records (a dead letter, a changelog mark) is no input record's
fault and no re-read can fix it: it stops the router (FatalKafkaError). But one: a dead letter
refused as too large (LetterTooLarge) makes the router read the dead-letter topic's limit
again, and go on when it was lowered, sending letters over it without their value (loop.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Literal

from confluent_kafka import KafkaError

from cdc_router.errors import (
    EXIT_RESTART,
    BatchFailed,
    FatalKafkaError,
    GrantRevoked,
    JetStreamError,
    RecordRefused,
    fatal_kafka_error,
)
from cdc_router.kafka.errors import (
    RECORD_REFUSED,
    ErrorAction,
    classify,
    describe,
    kafka_error_of,
    likely_cause,
)
from cdc_router.kafka.producer import DeliveryFailure, RecordCoordinates
from cdc_router.nats.publisher import failure_cause
from cdc_router.router.timestamps import TIMESTAMP_HINT, TopicLimitsCache, size_advice

if TYPE_CHECKING:
    from cdc_router.router.destinations import DestinationMetadata
    from cdc_router.router.routing import OutboundRecord
    from cdc_router.router.transaction import Transaction

log = logging.getLogger("cdc_router.router")

# Why a batch was aborted: a record the broker refused (re-read at once, the suspects alone),
# the abort itself failed (call Transaction.abort() again later), or nobody's record (back off):
# Kafka's side, or JetStream's (nats/publisher.py's failure_cause: its storage full, a stream
# full with discard new, or else). Each is a label of cdc_router_batches_aborted_total.
AbortCause = Literal["record_refused", "abort_failed", "cluster", "jetstream_storage_full",
                     "jetstream_stream_full", "jetstream"]


def record_refusals(record_timestamp: str) -> frozenset[int]:
    """The error codes that refuse one record. With record_timestamp 'now' the timestamps are
    the producer's own: an INVALID_TIMESTAMP is then the host's clock, no record's fault."""
    if record_timestamp == "now":
        return RECORD_REFUSED - {KafkaError.INVALID_TIMESTAMP}
    return RECORD_REFUSED


def refusal_reason(failure: DeliveryFailure, limit: int | None = None) -> str:
    """One line for a dead letter: who refused what, why, and what to do; `limit`: the
    topic's max.message.bytes as read again after a size refusal (None: not known)."""
    reason = f"Kafka refused the record for {failure.topic}: {describe(failure.error)}"
    if failure.error.code() == KafkaError.INVALID_TIMESTAMP:
        reason += TIMESTAMP_HINT
    elif failure.error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
        # QA 57-a F-2: the broker's size refusal named neither the size nor the limit.
        reason += "; " + size_advice(failure.size, limit)
    return reason


class LetterTooLarge(FatalKafkaError):
    """The broker refused one of the router's own records (a dead letter, a changelog mark)
    as too large: `topic` and the record's `size` (None: not known). The router reads the
    dead-letter topic's limit again and goes on when it was lowered (loop.py); when it was
    not, it stops with unmended()."""

    def __init__(self, reason: str, *, topic: str, size: int | None) -> None:
        """`reason`: who refused what ("Kafka refused the record for T: ...")."""
        over = "" if size is None else f" of {size} bytes"
        super().__init__(f"{reason}; the router's own record{over} (or the batch it was in) "
                         f"is over {topic}'s max.message.bytes: raise that above the record "
                         "and the producer's batch.size", code=KafkaError.MSG_SIZE_TOO_LARGE)
        self.reason, self.topic, self.size = reason, topic, size

    def unmended(self, limit: int | None, batch_bytes: int) -> FatalKafkaError:
        """The error that stops the router when reading the dead-letter topic's limit again
        did not narrow the letters: no restart helps, as it takes the same path (reread 57-a
        F-1). `limit`: the topic's max.message.bytes as read now (None: not read, or not the
        dead-letter topic); `batch_bytes`: the producer's batch.size. The broker refuses a
        batch of small records over the limit as a whole (timestamps.SmallTopics)."""
        now = f" ({limit}, as read now)" if limit is not None else ""
        size = f" and the record's size ({self.size} bytes)" if self.size is not None else ""
        return FatalKafkaError(
            f"{self.reason}; a restart does not help: {self.topic}'s max.message.bytes{now} must "
            f"exceed the producer's batch.size ({batch_bytes}){size}, as the broker refuses "
            "a batch over it as a whole: raise the topic's max.message.bytes (kafka-configs "
            "--alter --entity-type topics), or set kafka.producer.batch.size below it",
            code=KafkaError.MSG_SIZE_TOO_LARGE)


def own_refusal(failure: DeliveryFailure) -> FatalKafkaError:
    """The error that stops the process when the broker refuses one of its own records."""
    reason = f"Kafka refused the record for {failure.topic}: {describe(failure.error)}"
    if failure.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
        # QA 31-b: a deleted topic's reason named only size limits and ACLs.
        return FatalKafkaError(f"{reason}; {failure.topic} does not exist (any more): create "
                               "it with `cdc-router topics apply`")
    if failure.error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
        # QA 57-a F-3: it named neither max.message.bytes nor a size, and pointed at ACLs.
        return LetterTooLarge(reason, topic=failure.topic, size=failure.size)
    return FatalKafkaError(f"{reason}; the dead-letter and dedup changelog topics must accept "
                           "the router's records (ACLs, the topic's policy)")


class PoisonIsolation:
    """Suspects, confirmed refusals and the one record produced alone; see the module doc."""

    def __init__(self, refusals: frozenset[int] = RECORD_REFUSED,
                 limits: TopicLimitsCache | None = None) -> None:
        """`limits`: the destinations' limits the records were checked against, read again
        for a topic whose record the broker refused as too large."""
        self._refusals = refusals
        self._limits = limits
        self._suspects: dict[RecordCoordinates, str] = {}
        self._refused: dict[RecordCoordinates, str] = {}
        self._isolated: RecordCoordinates | None = None
        self._settling: set[RecordCoordinates] = set()  # dead-lettered in the open batch

    @property
    def suspects(self) -> int:
        return len(self._suspects)

    def is_refusal(self, error: KafkaError | None) -> bool:
        return error is not None and error.code() in self._refusals

    def refused(self, source: RecordCoordinates) -> str | None:
        """The reason to dead-letter `source` without producing it, when it was refused alone."""
        reason = self._refused.get(source)
        if reason is not None:
            self._settling.add(source)
        return reason

    def alone(self, source: RecordCoordinates) -> bool:
        """True when `source` is a suspect: it must be produced alone (see delivered_alone)."""
        if source in self._suspects:
            self._isolated = source
            return True
        return False

    def delivered_alone(self, source: RecordCoordinates) -> None:
        """A suspect went through alone: it was innocent."""
        self._suspects.pop(source, None)
        self._isolated = None

    def learn(self, failures: Iterable[DeliveryFailure], batch_error: KafkaError | None,
              batch_sources: Sequence[RecordCoordinates]) -> bool:
        """Take an aborted batch's refusals; True when they name at least one input record.

        When the batch failed with a refusal (`batch_error`, e.g. from the commit) that no
        delivery report attributes, every input record the batch produced becomes a suspect:
        the refusal is attributed whatever path it surfaced by.
        """
        learned, own = False, None
        failures = list(failures)
        sizes = self._fresh_limits(failures)
        for failure in failures:
            if not self.is_refusal(failure.error):
                continue
            if failure.source is None:
                own = own or failure  # the input records' refusals are learned first
                continue
            learned |= self._blame(failure.source,
                                   refusal_reason(failure, sizes.get(failure.topic)))
        if own is not None:
            self._isolated = None
            self._settling.clear()
            raise own_refusal(own)
        if not learned and self.is_refusal(batch_error) and batch_error is not None:
            if batch_error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise GrantRevoked(f"Kafka refused a topic of the batch: {describe(batch_error)}"
                                   f"; a grant was revoked while this process ran: exiting "
                                   f"with {EXIT_RESTART} so that the next start checks every "
                                   "topic's grants (README, Kafka ACLs)",
                                   code=batch_error.code())
            reason = f"Kafka refused the batch: {describe(batch_error)}"
            for source in batch_sources:
                learned |= self._blame(source, reason)
        self._isolated = None
        self._settling.clear()
        return learned

    def _fresh_limits(self, failures: Sequence[DeliveryFailure]) -> dict[str, int | None]:
        """QA 57-a F-1: the broker refused a destination's record as too large, so the
        max.message.bytes cached for that topic (up to LIMITS_TTL_S old) is stale: read it
        again now (one DescribeConfigs a topic an abort), so that the re-read dead-letters the
        record before producing it instead of aborting batch after batch. The limit by topic."""
        fresh: dict[str, int | None] = {}
        if self._limits is None:
            return fresh
        for topic in {failure.topic for failure in failures if failure.source is not None and
                      failure.error.code() == KafkaError.MSG_SIZE_TOO_LARGE}:
            self._limits.forget(topic)
            limits = self._limits(topic)
            fresh[topic] = None if limits is None else limits.max_message_bytes
        return fresh

    def confirm(self, refused: dict[RecordCoordinates, str]) -> bool:
        """Records refused for certain (JetStream names each one): dead letters on the re-read,
        never produced again. True when one of them is new."""
        learned = False
        for source, reason in refused.items():
            self._suspects.pop(source, None)
            learned |= source not in self._refused
            self._refused.setdefault(source, reason)
        return learned

    def _blame(self, source: RecordCoordinates, reason: str) -> bool:
        if source in self._refused:
            return False
        if source == self._isolated:
            self._suspects.pop(source, None)
            self._refused[source] = reason  # refused alone: certainly this record
            return True
        if source in self._suspects:
            return False
        self._suspects[source] = reason
        return True

    def committed(self) -> None:
        """The batch committed: the refused records it dead-lettered are settled for good."""
        for source in self._settling:
            self._refused.pop(source, None)
        self._settling.clear()
        self._isolated = None


def produce_isolated(txn: Transaction, poison: PoisonIsolation, record: OutboundRecord,
                     source: RecordCoordinates,
                     check_refusal: Callable[[str, RecordRefused], None]) -> str | None:
    """Produce `record` of input `source` into the open batch (alone while it is a suspect);
    the reason to dead-letter it instead (stage produce): a refusal confirmed before, or one
    produce() raised on the spot. `check_refusal(topic, refusal)` (DestinationMetadata's)
    raises BatchFailed when the refusal is librdkafka's lagging metadata, no record's fault.
    The one sequence of the router, the relay and `dlq replay`."""
    refused = poison.refused(source)
    if refused is not None:
        return refused
    alone = poison.alone(source)
    try:
        txn.produce(record, source, alone=alone)
    except RecordRefused as refusal:  # e.g. too big for librdkafka: certainly this record
        check_refusal(record.topic, refusal)
        return f"Kafka refused the record for {record.topic}: {refusal}"
    if alone:
        poison.delivered_alone(source)
    return None


def abort_batch(txn: Transaction, poison: PoisonIsolation, destinations: DestinationMetadata,
                failure: BaseException, *, who: str) -> tuple[AbortCause, str]:
    """Abort the open batch after `failure` and learn which input records the broker refused;
    the cause and a reason for the log. The router, the relay and `dlq replay` share it. The
    batch is read again with the `destinations`' partition counts asked afresh.

    Raises FatalKafkaError when `failure` is fatal, naming `who` and the likely cause (the
    Transaction's fenced_hint).
    """
    error = kafka_error_of(failure)
    if error is not None and classify(error) is ErrorAction.FATAL:
        raise fatal_kafka_error(f"Kafka refused this {who} for good ({describe(error)}); "
                                f"{likely_cause(error, txn.fenced_hint)}", error) from failure
    sources = txn.sources
    destinations.refresh()
    try:
        failures = txn.abort()
    except BatchFailed as abort_failure:
        return "abort_failed", f"{failure}; then the abort failed: {abort_failure}"
    refused = failure.refused if isinstance(failure, BatchFailed) else {}
    if poison.learn(failures, error, sources) | poison.confirm(refused):
        log.warning("event=batch_aborted cause=record_refused suspects=%d reason=%r",
                    poison.suspects, str(failure))
        return "record_refused", str(failure)
    # The batch's JetStream publish failed (Transaction._publish raises BatchFailed from it).
    jetstream = failure.__cause__ if isinstance(failure.__cause__, JetStreamError) else None
    return ("cluster" if jetstream is None else failure_cause(jetstream)), str(failure)
