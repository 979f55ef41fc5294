"""The producer: a thin wrapper that latches the first delivery error and raises it on flush."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from cdc_router.dead_letter import batch_size
from cdc_router.errors import EXIT_RESTART, DeliveryError, ProducerHung
from cdc_router.kafka.consumer import record_headers
from cdc_router.kafka.errors import PURGED, describe, kafka_error_of
from cdc_router.kafka.watchdog import AbandonableCall, CallWatchdog

log = logging.getLogger("cdc_router")

Headers = list[tuple[str, bytes]]
# send_offsets_to_transaction is given up this long past its own timeout (the watchdog's
# default is 15 s): by then the coordinator has aborted the transaction at that same timeout,
# so waiting longer saves nothing, and a hung instance holds up its group's rebalance (QA 38-a:
# 35 s without delivery at each hang, a partition without owner meanwhile).
OFFSETS_SLACK_S = 5.0
RecordCoordinates = tuple[str, int, int]  # the input record a produced record came from


@dataclass(frozen=True)
class DeliveryFailure:
    """One record the broker did not take: where it went, why, and the input it came from."""

    topic: str
    error: KafkaError
    # None: one of the router's own records (dead letter, changelog mark).
    source: RecordCoordinates | None
    # The record's size as the broker counts an uncompressed batch (dead_letter.batch_size;
    # with compression the broker counts the compressed one, smaller); None: not known.
    size: int | None = None


class LatchingProducer:
    """Nothing fails silently in a callback: a failed delivery surfaces on the next flush.

    Every failed delivery of the current transaction is also kept, with the input record it
    came from, for the poison isolation to read (take_failures).

    Every call that blocks on the broker runs under a watchdog (kafka/watchdog.py): a call
    that outlives its own timeout by far ends the process rather than stall it for good, but
    send_offsets_to_transaction, whose client is given up instead (ProducerHung).
    """

    def __init__(self, config: Mapping[str, Any],
                 factory: Callable[[dict[str, Any]], Any] = Producer,
                 watchdog: CallWatchdog | None = None) -> None:
        self._config = dict(config)
        self._factory = factory
        self._watchdog = watchdog or CallWatchdog()
        self._producer: Any = None
        self._error: DeliveryFailure | None = None
        # Reports of an aborted transaction arrive late: each carries the generation it was
        # produced in, and only the current generation's count.
        self._generation = 0
        self._failures: list[DeliveryFailure] = []

    @property
    def transactional_id(self) -> str | None:
        """Its transactional.id; None for a producer without one."""
        value = self._config.get("transactional.id")
        return None if value is None else str(value)

    @property
    def client(self) -> Any:
        """Built on first use, so that constructing the router makes no network call."""
        if self._producer is None:
            self._producer = self._factory(self._config)
        return self._producer

    def _latch(self, error: KafkaError, message: Message, source: RecordCoordinates | None,
               generation: int) -> None:
        if generation != self._generation or error.code() in PURGED:
            return
        failure = DeliveryFailure(message.topic() or "", error, source,
                                  batch_size(message.key(), message.value(),
                                             record_headers(message)))
        self._failures.append(failure)
        if self._error is None:
            self._error = failure

    def take_failures(self) -> list[DeliveryFailure]:
        """The failed deliveries reported so far in this transaction (each once)."""
        if self._producer is None:  # given up or renewed: no report will come (review 38)
            failures, self._failures = self._failures, []
            return failures
        try:
            with _fatal_unwrapped():
                self.client.poll(0)  # serve the delivery reports that have arrived
        except DeliveryError as failure:
            if failure.kafka_error is not None:
                raise
            # No error to tell (see _fatal_unwrapped): the caller is aborting, and the abort
            # meets the producer's fatal error itself.
        failures, self._failures = self._failures, []
        return failures

    def serve(self) -> None:
        """Serve librdkafka's queue between transactions: its log lines (and error callbacks)
        reach Python only when served, so an idle or stalled router logged "Connection refused"
        at its next transaction, 23 s after the broker was back (chaos 53-e F1). An error served
        here is left to the next transactional call, which librdkafka fails with it too."""
        if self._producer is None:
            return
        try:
            with _fatal_unwrapped():
                self._producer.poll(0)
        except DeliveryError as failure:
            log.debug("event=producer_served error=%r", str(failure))

    def produce(self, topic: str, *, key: bytes | None, value: bytes | None,
                headers: Headers, partition: int | None = None,
                timestamp_ms: int | None = None, source: RecordCoordinates | None = None) -> None:
        """Queue one record; waits for room when librdkafka's queue is full."""
        if self._error is not None:
            self.raise_latched()
        generation = self._generation

        def on_delivery(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                self._latch(error, message, source, generation)

        client = self.client
        # confluent-kafka's own defaults: partition -1 lets librdkafka choose, timestamp 0 is
        # the producer's clock (a created_at of exactly 0 ms was always sent as 0 too).
        chosen = -1 if partition is None else partition
        timestamp = 0 if timestamp_ms is None else timestamp_ms
        while True:
            try:
                client.produce(topic, value=value, key=key, partition=chosen,
                               on_delivery=on_delivery, timestamp=timestamp, headers=headers)
                return
            except BufferError:
                # The local queue is full (queue.buffering.max.messages): let deliveries drain.
                with _fatal_unwrapped():
                    self.client.poll(0.1)
            except KafkaException as failure:
                error = kafka_error_of(failure)
                if error is None or error.code() != KafkaError._STATE:
                    raise
                raise self._transaction_failure(failure) from failure

    def _transaction_failure(self, failure: KafkaException) -> KafkaException:
        """What produce()'s "Erroneous state" (_STATE) stands for: the open transaction's own
        error, once it failed on librdkafka's thread (QA 35-e F5: AddPartitionsToTxn refused
        the dead-letter topic, TOPIC_AUTHORIZATION_FAILED, and every later produce() said only
        _STATE: the router took it for the cluster's trouble and retried for ever). librdkafka
        returns that error (txn_requires_abort, or fatal) from any transactional call its state
        forbids; begin_transaction() is the one that changes nothing in a transaction begun
        (measured: _STATE "Operation not valid in state InTransaction" in a healthy one)."""
        try:
            self.client.begin_transaction()
        except KafkaException as refused:
            error = kafka_error_of(refused)
            if error is not None and (error.txn_requires_abort() or error.fatal()):
                return refused
            return failure  # no error to tell
        # No transaction was open: end the one just begun, which nobody would (review 35-2).
        self.client.abort_transaction()
        return failure

    def flush(self, timeout_s: float) -> None:
        """Wait until every queued record is delivered; raise the first delivery error."""
        with self._watchdog.guard("flush", timeout_s), _fatal_unwrapped():
            remaining = self.client.flush(timeout_s)
        self.raise_latched()
        if remaining:
            raise DeliveryError(f"{remaining} records still undelivered after {timeout_s:.0f}s")

    def raise_latched(self) -> None:
        if self._error is not None:
            failure = self._error
            self._error = None
            raise DeliveryError(f"delivery to {failure.topic} failed: {describe(failure.error)}",
                                kafka_error=failure.error)

    def clear_latched(self) -> None:
        """Forget a latched error and the failures once their transaction has been aborted."""
        self._generation += 1
        self._error = None
        self._failures = []

    def renew(self) -> None:
        """Drop the client after it failed for good (its queue purged, not delivered): the
        next call builds a new one, whose init_transactions fences the old one's epoch."""
        if self._producer is not None:
            with suppress(KafkaException, SystemError):
                self._producer.purge()
            self._producer = None
        self.clear_latched()

    # Transactions: thin pass-throughs, so the router's procedure reads against KIP-98/447.
    def init_transactions(self, timeout_s: float) -> None:
        with self._watchdog.guard("init_transactions", timeout_s):
            self.client.init_transactions(timeout_s)

    def begin_transaction(self) -> None:
        self.client.begin_transaction()

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], group_metadata: Any,
                                    timeout_s: float) -> None:
        """On a thread of its own: when it blocks past the watchdog's limit (librdkafka #5456,
        #5511; QA 37-a: 5 of 10 instances at a coordinator move on a 3-broker cluster, each
        then restarted by its supervisor), the client is left to that thread and ProducerHung
        raised; the next call builds a new client (a new coordinator lookup), whose
        init_transactions fences the old epoch and aborts its transaction. Nothing of that
        transaction was committed: this is the step before its commit."""
        client, name = self.client, "send_offsets_to_transaction"
        call = AbandonableCall(name, lambda: client.send_offsets_to_transaction(
            offsets, group_metadata, timeout_s))
        with self._watchdog.guard(name, timeout_s, on_hang=call.hung, slack_s=OFFSETS_SLACK_S):
            if call.run():
                return
        self._producer = None  # not purged nor closed: a call into it may block too
        self.clear_latched()
        raise ProducerHung(
            f"librdkafka's {name} blocked {call.waited_s:.0f} s, past its own {timeout_s:.0f} s "
            "timeout (librdkafka issues #5456, #5511: the group coordinator moved); the "
            "producer is given up to its blocked thread and its transaction commits nothing "
            "(a new producer aborts it). The router takes a new producer and goes on, a few "
            f"times; other commands, and a router where it keeps happening, exit {EXIT_RESTART} "
            "(run it again; a supervisor restarts a router)")

    def commit_transaction(self, timeout_s: float) -> None:
        with self._watchdog.guard("commit_transaction", timeout_s):
            self.client.commit_transaction(timeout_s)

    def abort_transaction(self, timeout_s: float) -> None:
        if self._producer is None:  # a client not built yet has no transaction to abort
            return
        with self._watchdog.guard("abort_transaction", timeout_s):
            self.client.abort_transaction(timeout_s)

    def answers(self, timeout_s: float) -> bool:
        """Whether its built client gets the cluster's metadata now (so its login works);
        False for a client not built (it has never logged in) or one that gets none."""
        if self._producer is None:
            return False
        try:
            self.topics(timeout_s)
        except Exception:
            return False
        return True

    def topics(self, timeout_s: float) -> Mapping[str, Any]:
        """Every topic of the cluster: name -> metadata (.partitions, .error), one request."""
        topics: Mapping[str, Any] = self.client.list_topics(timeout=timeout_s).topics
        return topics


@contextmanager
def _fatal_unwrapped() -> Iterator[None]:
    """An error of a queue-serving call (poll, flush) as the DeliveryError it is, carrying its
    Kafka error. confluent-kafka (2.16) raises a producer's fatal error (a fence) from the next
    poll() or flush() as a KafkaException: left as it is, it passed every handler of the batch
    and stopped the router (exit 1) where a fence renews the producer (CI rehearsal, session
    29). confluent-kafka can also serve a delivery report while a fatal error it raised is
    pending: the report's callback then fails at its first call into the library, and the call
    ends in a SystemError caused by that error (measured: a second producer with the same
    transactional id fencing this one). Sometimes the SystemError carries no cause ("returned
    NULL without setting an exception", measured the same way): then the batch fails without
    a Kafka error, and the abort that follows meets the producer's fatal error itself."""
    try:
        yield
    except KafkaException as failure:
        error = kafka_error_of(failure)
        raise DeliveryError(f"the producer failed: {describe(error) if error else failure}",
                            kafka_error=error) from failure
    except SystemError as failure:
        cause = failure.__cause__  # where CPython puts the pending error
        error = kafka_error_of(cause) if isinstance(cause, KafkaException) else None
        if error is None:
            raise DeliveryError(f"the producer failed in confluent-kafka ({failure}); the "
                                "batch is aborted") from failure
        raise DeliveryError(f"the producer failed: {describe(error)}",
                            kafka_error=error) from cause
