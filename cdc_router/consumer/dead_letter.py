"""Dead-letter records of the idempotent consumer: the raw record plus where and why it failed.

Header names are the router's (cdc_router.dead_letter), so one tool reads both dead-letter
topics; the consumer's stages are "decode" and "handle".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException

from cdc_router.consumer.event import KafkaMessage
from cdc_router.consumer.settings import built
from cdc_router.dead_letter import CONSUMER_GROUP, dead_letter_max_bytes, fitted
from cdc_router.dead_letter import dead_letter_headers as _headers
from cdc_router.errors import (
    DeadLetterRefused,
    DeliveryError,
    FatalKafkaError,
    MalformedRecord,
    UnreadableHeaders,
)
from cdc_router.kafka.consumer import UNREADABLE_HEADERS, record_headers
from cdc_router.kafka.errors import RECORD_REFUSED, ErrorAction, classify, describe, kafka_error_of
from cdc_router.kafka.logs import serve_logs

log = logging.getLogger(__name__)

STAGE_DECODE = "decode"  # no event id or undecodable value: dead-lettered at once
STAGE_HANDLE = "handle"  # the handler failed on every attempt
# The dead-letter topic's first metadata ask waits 1 s, each next one twice as long, until
# dead_letter_timeout_s: a refused login (librdkafka tells error_cb within about a second of
# the connection) is raised between asks.
_FIRST_ASK_S = 1.0


def letter_class(stage: str, error: BaseException) -> str:
    """The error class a dead letter names, in its dlq.error.class header and its log line
    (review 52-c F-low-2: the log said MalformedRecord, the header JSONDecodeError): for a
    malformed record that of the underlying cause (UnicodeDecodeError, JSONDecodeError) when
    there is one, what an operator searches for."""
    cause = error.__cause__ if stage == STAGE_DECODE and error.__cause__ is not None else error
    return type(cause).__name__


def dead_letter_headers(message: KafkaMessage, *, stage: str, error: BaseException,
                        attempts: int, event_id: str | None = None) -> list[tuple[str, bytes]]:
    """The dlq.* headers for `message` failing at `stage` with `error` after `attempts` tries;
    the class is letter_class's."""
    if event_id is None and isinstance(error, MalformedRecord):
        event_id = error.event_id  # read before the value failed to decode
    return _headers(topic=message.topic(), partition=message.partition(),
                    offset=message.offset(), stage=stage, error=error, attempts=attempts,
                    event_id=event_id, error_class=letter_class(stage, error))


class DeadLetterWriter:
    """Produces dead-letter records and waits for each acknowledgement before returning.

    The consumer acknowledges a poison record only after its dead-letter copy is durable, so
    a crash can repeat a dead-letter record but never lose one. A record that would exceed
    the producer's message.max.bytes with the dlq.* headers goes without its value (the
    source topic still holds it): a dead letter Kafka refuses would stall the partition.
    The producer is built on first use, and built again after a fatal error.
    """

    def __init__(self, topic: str, config: dict[str, str],
                 producer_factory: Callable[[dict[str, str]], Any], timeout_s: float,
                 group: str = "") -> None:
        self.topic = topic
        self._group = [(CONSUMER_GROUP, group.encode())] if group else []  # dlq.consumer.group
        self._config = config
        self._factory = producer_factory
        self._timeout_s = timeout_s
        self._producer: Any = None
        self._max_bytes = dead_letter_max_bytes(config.get("message.max.bytes"))

    def open(self) -> None:
        """Build the producer, if not yet: at the consumer's start, so that a config
        librdkafka refuses stops it then, not at its first poison record (review 32-3)."""
        if self._producer is None:
            self._producer = built(self._factory, self._config, "producer_config")

    def require_topic(self, consumer: Any, refused: Callable[[], None]) -> None:
        """Stop at start, in one line, when the dead-letter topic does not exist (QA, session
        30): the first poison record would hold its partition for minutes, each try of its
        letter timing out, and run its handler again at every try. An unreachable cluster is
        no verdict: the consumer starts and waits for it, as before. `consumer`: any client
        of the cluster (its metadata); `refused()` raises when that client's login was
        refused, called between the metadata asks (QA 51-i L1: the check waited its whole
        timeout, then blamed the network, before the refusal was raised)."""
        topic, asked_s, wait_s = self.topic, 0.0, _FIRST_ASK_S
        while True:
            wait_s = min(wait_s, self._timeout_s - asked_s)
            try:
                found = consumer.list_topics(topic, timeout=wait_s)
                break
            except KafkaException as error:
                refused()
                asked_s += wait_s
                if asked_s >= self._timeout_s:
                    # QA 57-c F-4: a typo'd port looks like an outage; say what to check.
                    log.warning("event=dead_letter_topic_unchecked topic=%s error=%r: no "
                                "broker of bootstrap_servers %s answered in %g s; the consumer "
                                "starts and waits for the cluster: if this lasts, check "
                                "bootstrap_servers (its hosts and ports) and that Kafka runs "
                                "there", topic, str(error), self._config.get("bootstrap.servers"),
                                asked_s)
                    return
                wait_s *= 2  # a cluster slow to answer gets its answer (review 52-j F7)
        found = found.topics.get(topic)
        code = found.error.code() if found is not None and found.error is not None else None
        if found is None or code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            raise FatalKafkaError(
                f"the dead-letter topic {topic!r} does not exist: create it (kafka-topics.sh "
                f"--bootstrap-server {self._config.get('bootstrap.servers')} --create --topic "
                f"{topic}), or name an existing one in dead_letter_topic; "
                "poison records are never dropped, so the consumer does not start without it",
                code=KafkaError.UNKNOWN_TOPIC_OR_PART)

    def serve(self) -> None:
        """Hand the producer's queued librdkafka lines to its logger (it is polled only in a
        send, and an idle one queued them while a broker was away)."""
        if self._producer is not None:
            serve_logs(self._producer)

    def send(self, message: KafkaMessage, *, stage: str, error: BaseException,
             attempts: int, event_id: str | None = None, drop_value: bool = False) -> None:
        """Write `message` plus dlq.* headers, without its value when it would not fit (or
        `drop_value`); DeadLetterRefused if Kafka refuses it, DeliveryError if not acked."""
        self.open()
        failures: list[KafkaError] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(err)

        # Message.headers() once a record, and never again on one whose headers it could not
        # read (kafka/consumer.py: record_headers).
        headers = list(UNREADABLE_HEADERS) if isinstance(error, UnreadableHeaders) \
            else record_headers(message)
        key, value, headers = fitted(
            message.key(), message.value(), headers + dead_letter_headers(
                message, stage=stage, error=error, attempts=attempts, event_id=event_id)
            + self._group, self._max_bytes, drop_value=drop_value)
        where = f"dead-letter record for {message.topic()}[{message.partition()}]" \
                f"@{message.offset()}"
        try:
            self._producer.produce(self.topic, key=key, value=value,
                                   headers=headers, on_delivery=delivered)
        except KafkaException as produce_error:
            self._raise(where, kafka_error_of(produce_error), str(produce_error))
        except BufferError as produce_error:
            raise DeliveryError(f"{where} not written to {self.topic}: {produce_error}") \
                from produce_error
        # A few seconds more than delivery.timeout.ms, so the delivery report (success or
        # timeout) arrives within the flush.
        pending = self._producer.flush(self._timeout_s + 5)
        if failures:
            self._raise(where, failures[0], describe(failures[0]))
        if pending:
            raise DeliveryError(f"{where} not written to {self.topic}: no acknowledgement "
                                "in time")
        log.warning("event=dead_lettered topic=%s partition=%d offset=%d stage=%s "
                    "error_class=%s attempts=%d value_dropped=%s", message.topic(),
                    message.partition(), message.offset(), stage, letter_class(stage, error),
                    attempts, value is None and message.value() is not None)

    def _raise(self, where: str, error: KafkaError | None, text: str) -> NoReturn:
        if error is not None and classify(error) is ErrorAction.FATAL:
            # This producer can never deliver again (its idempotence state is broken, say);
            # the retry builds a new one.
            self._producer = None
        reason = f"{where} not written to {self.topic}: {text}"
        if error is not None and error.code() in RECORD_REFUSED:
            raise DeadLetterRefused(reason, code=error.code())
        raise DeliveryError(reason)

    def close(self) -> None:
        """Flush what is pending; nothing is pending after send returned."""
        if self._producer is not None:
            self._producer.flush(self._timeout_s)
            self._producer = None
