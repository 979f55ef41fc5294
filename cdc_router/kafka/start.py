"""What ends a start whose init_transactions failed: the router's, the relay's, `dlq replay`'s."""

from __future__ import annotations

from cdc_router.errors import EXIT_RESTART, BatchFailed, CdcRouterError, ConfigError, DeliveryError
from cdc_router.kafka.errors import LOGIN_REFUSED
from cdc_router.kafka.logs import forget_refusal, refused_certificate, refused_login
from cdc_router.kafka.producer import LatchingProducer

LOGGED_IN_CHECK_S = 5.0  # how long init_failure waits for the cluster's metadata after a refusal


def init_failure(failure: BatchFailed, producer: LatchingProducer) -> CdcRouterError:
    """The error that ends a start whose init_transactions failed: with Kafka's retriable error
    (no answer through its retries: an outage, or an address nothing listens on) it exits
    EXIT_RESTART for the supervisor to start it again, as a registry that does not answer
    does (QA 44-a: exit 1, which says configuration); any other refusal exits 1.

    A login Kafka refused (its credentials, its SASL mechanism) is a ConfigError naming what to
    check, exit 1, as the other commands' refusals: the call itself only times out, and
    librdkafka's log said why, which `producer` serves first (kafka/logs.py refused_login;
    review 54: a wrong SASL password exited 75 with "is the cluster ... reachable?"). Unless
    `producer` gets the cluster's metadata now: its login works, the refusal noted is one since
    mended, forgotten, and the timeout an outage's, EXIT_RESTART (review 54-k F-3). Not for
    a certificate the TLS handshake refused (QA 56-d F-3: a ConfigError too): its 5 s of more
    failing handshakes were followed, now and then, by a SIGSEGV at the process's exit.
    """
    producer.serve()  # its log lines reach Python only when served
    error = failure.kafka_error
    refused = refused_login()
    if refused is not None and not refused_certificate() and \
            (error is None or error.retriable()) and producer.answers(LOGGED_IN_CHECK_S):
        forget_refusal()  # a refusal since mended (credentials just made): an outage's timeout
        refused = None
    if refused is not None and (error is None or error.retriable() or
                                error.code() in LOGIN_REFUSED):
        return ConfigError(refused)
    unreachable = DeliveryError(str(failure), kafka_error=error)
    if error is None or error.retriable():
        unreachable.exit_code = EXIT_RESTART
    return unreachable
