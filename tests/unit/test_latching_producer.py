"""LatchingProducer: what confluent-kafka's SystemError on a fatal producer becomes."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc_router.errors import DeliveryError
from cdc_router.kafka.errors import ErrorAction, classify, kafka_error_of
from cdc_router.kafka.producer import LatchingProducer

_FENCED = KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)


class _FailingFlush:
    """A client whose flush fails as confluent-kafka 2.16 did once the producer was fenced."""

    def __init__(self, cause: BaseException | None) -> None:
        self._cause = cause

    def flush(self, timeout: float) -> int:
        failure = SystemError("<method 'flush' of 'cimpl.Producer' objects> returned NULL "
                              "without setting an exception")
        if self._cause is not None:
            raise failure from self._cause
        raise failure

    def poll(self, timeout: float) -> int:
        return 0


def _flush(client: Any) -> DeliveryError:
    with pytest.raises(DeliveryError) as raised:
        LatchingProducer({}, lambda conf: client).flush(1)
    return raised.value


def test_a_system_error_caused_by_a_fatal_error_is_that_error() -> None:
    failure = _flush(_FailingFlush(KafkaException(_FENCED)))
    error = kafka_error_of(failure)
    assert error is not None and classify(error) is ErrorAction.FATAL
    assert "_FENCED" in str(failure)


def test_a_system_error_without_a_cause_fails_the_batch_not_the_process() -> None:
    # Measured (a router fenced by another init_transactions of its id): no cause at all, and
    # the SystemError went up as a traceback. Now the batch fails; the abort meets the fence.
    failure = _flush(_FailingFlush(None))
    assert kafka_error_of(failure) is None
    assert "returned NULL" in str(failure) and "aborted" in str(failure)


class _FailingPoll(_FailingFlush):
    def poll(self, timeout: float) -> int:
        return self.flush(timeout)


def test_the_failures_of_an_aborting_batch_survive_a_system_error_without_a_cause() -> None:
    quiet = LatchingProducer({}, lambda conf: _FailingPoll(None))
    assert quiet.client is not None and quiet.take_failures() == []
    fenced = LatchingProducer({}, lambda conf: _FailingPoll(KafkaException(_FENCED)))
    assert fenced.client is not None  # the batch's client, built when it began
    with pytest.raises(DeliveryError, match="_FENCED"):
        fenced.take_failures()


def test_a_client_never_built_or_given_up_has_no_failures_nor_transaction_to_abort() -> None:
    built: list[int] = []
    producer = LatchingProducer({}, lambda conf: built.append(1))
    assert producer.take_failures() == []
    producer.abort_transaction(1.0)
    assert built == [], "no client is built only to abort nothing (review 38)"


class _Refusing:
    """A client whose produce() says only "Erroneous state" (_STATE), as librdkafka's does in a
    transaction that failed on its thread; begin_transaction() tells the real error, if any."""

    def __init__(self, transaction_error: KafkaError | None) -> None:
        self.transaction_error = transaction_error
        self.calls: list[str] = []

    def produce(self, *args: Any, **kwargs: Any) -> None:
        raise KafkaException(KafkaError(KafkaError._STATE, "Erroneous state"))

    def begin_transaction(self) -> None:
        self.calls.append("begin")
        if self.transaction_error is not None:
            raise KafkaException(self.transaction_error)

    def abort_transaction(self) -> None:
        self.calls.append("abort")


def _produce(client: _Refusing) -> KafkaError | None:
    with pytest.raises(KafkaException) as raised:
        LatchingProducer({}, lambda conf: client).produce("t", key=None, value=b"v", headers=[])
    return kafka_error_of(raised.value)


def test_erroneous_state_is_the_transaction_s_own_error_and_a_probe_leaves_no_transaction(
        ) -> None:
    # QA 35-e F5: the transaction's own error (the dead-letter topic refused) took _STATE's
    # place; review 35-2: a probe that began a transaction, none being open, must end it.
    refused = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed",
                         txn_requires_abort=True)
    told = _produce(_Refusing(refused))
    assert told is not None and told.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    idle = _Refusing(None)
    told = _produce(idle)
    assert told is not None and told.code() == KafkaError._STATE
    assert idle.calls == ["begin", "abort"]
