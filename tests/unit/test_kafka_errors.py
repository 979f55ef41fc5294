"""Kafka errors are classified in one place: retry, abort and rewind, or stop."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from cdc_router.errors import EXIT_RESTART, BatchFailed, init_failure
from cdc_router.kafka.errors import ErrorAction, classify, kafka_error_of


def test_fatal_wins_over_everything():
    error = KafkaError(KafkaError._FATAL, "fatal", fatal=True, retriable=True)
    assert classify(error) is ErrorAction.FATAL


def test_fencing_is_fatal_even_unflagged():
    assert classify(KafkaError(KafkaError.PRODUCER_FENCED)) is ErrorAction.FATAL
    assert classify(KafkaError(KafkaError.FENCED_INSTANCE_ID)) is ErrorAction.FATAL


def test_abortable_then_retriable_then_abort_by_default():
    assert classify(KafkaError(KafkaError._TIMED_OUT, txn_requires_abort=True,
                               retriable=True)) is ErrorAction.ABORT
    assert classify(KafkaError(KafkaError._TIMED_OUT, retriable=True)) is ErrorAction.RETRY
    assert classify(KafkaError(KafkaError.INVALID_RECORD)) is ErrorAction.ABORT


def test_kafka_error_of_unwraps_exceptions():
    inner = KafkaError(KafkaError._TRANSPORT)
    assert kafka_error_of(KafkaException(inner)) is inner
    assert kafka_error_of(ValueError("x")) is None


def test_a_consumer_fatal_error_not_flagged_fatal_is_fatal_all_the_same() -> None:
    # How librdkafka hands a fenced static member's consumer its fatal error (chaos, seed 15).
    assert classify(KafkaError(KafkaError._FATAL, "Static consumer fenced")) is ErrorAction.FATAL


def test_a_start_whose_cluster_does_not_answer_exits_for_a_restart() -> None:
    # QA 44-a: a broker stopped at the router's start ended it with exit 1, which says
    # configuration; an outage is EXIT_RESTART, for the supervisor to start it again.
    unanswered = BatchFailed("step 'init' still fails after its one try",
                             KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True))
    assert init_failure(unanswered).exit_code == EXIT_RESTART
    assert init_failure(BatchFailed("no answer")).exit_code == EXIT_RESTART
    refused = BatchFailed("step 'init': refused", KafkaError(KafkaError.INVALID_CONFIG))
    assert init_failure(refused).exit_code == 1
    assert "still fails after its one try" in str(init_failure(unanswered))
