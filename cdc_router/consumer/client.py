"""The idempotent consumer's Kafka client at run time: what librdkafka reports to error_cb
alone (a refused login, a refused certificate), which errors stop the consumer, and how a
batch is read."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from cdc_router.errors import FatalKafkaError
from cdc_router.kafka.consumer import group_protocol_refusal, unfetched_offsets
from cdc_router.kafka.errors import (
    LOGIN_REFUSED,
    ErrorAction,
    classify,
    describe,
    kafka_error_of,
    stops_consumer,
)
from cdc_router.kafka.tls import certificate_failure, certificate_refusal

log = logging.getLogger(__name__)


def noting_errors(config: dict[str, Any], noted: list[KafkaError]) -> dict[str, Any]:
    """`config` whose client appends to `noted` what librdkafka reports to error_cb alone (a
    refused SASL login never comes out of consume(): review 51-d F2), and still calls the
    user's error_cb if consumer_config has one. Not with an oauth_cb: confluent-kafka calls
    error_cb while a failed oauth_cb's exception is pending, and the call raised SystemError
    out of the client's construction (review 51-j F4); such a config is left as given."""
    if "oauth_cb" in config:
        return config
    theirs = config.get("error_cb")

    def note(error: KafkaError) -> None:
        noted.append(error)
        if callable(theirs):
            theirs(error)

    return {**config, "error_cb": note}


def refusal(error: KafkaError) -> str | None:
    """The one line for credentials the cluster refused, or None for another error."""
    if error.code() not in LOGIN_REFUSED:
        return None
    return (f"Kafka refused this consumer's credentials: {describe(error)}; check "
            "consumer_config's sasl.username, sasl.password, sasl.mechanism and "
            "security.protocol")


# A TLS handshake's failure comes to error_cb as _SSL (the broker's certificate not verified)
# or _TRANSPORT (the client's certificate refused by the broker's alert), never to consume().
_HANDSHAKE_CODES = frozenset({KafkaError._SSL, KafkaError._TRANSPORT})


def certificate_refused(error: KafkaError) -> str | None:
    """The one line for a TLS handshake that failed for a certificate (kafka/tls.py), or None:
    no restart mends it, so the consumer stops (QA 56-d F-1: it logged librdkafka's line once
    a minute for ever)."""
    kind = certificate_refusal(error.str()) if error.code() in _HANDSHAKE_CODES else None
    if kind is None:
        return None
    return certificate_failure(kind, describe(error), "consumer_config")


def protocol_refused(error: KafkaError, group: str = "") -> str | None:
    """The one line for a join the group refused because this member's assignors share none
    with its other members' (kafka/consumer.py's group_protocol_refusal; a classic member
    beside KIP-848 ones is taken, Kafka 4.3), or None: the consumer stops."""
    return group_protocol_refusal(
        error, "this member", "its consumer_config partition.assignment.strategy is not of "
        "the kind the group's other members use (eager: range or roundrobin, librdkafka's "
        "default; cooperative: cooperative-sticky): switch every member of the group at once "
        "(stop them all, start them all with the same setting; the consumer README's "
        "\"Partition assignment\"); a member of the other kind that was killed holds the "
        "group until its session.timeout.ms passes; or another application (Kafka Connect's "
        "workers, say) uses this group: give the consumer a group of its own", group=group)


def consumer_error(error: KafkaError, group: str = "") -> None:
    """Raise for an error that stops the consumer (the router's one classifier: fenced, as
    another member with our group.instance.id, although librdkafka does not flag it fatal;
    credentials that may not read the topics; a certificate the TLS handshake refused; a join
    its group refused for its assignors, naming `group`), or offsets it could not fetch; log
    others."""
    if certificate := certificate_refused(error):
        raise FatalKafkaError(certificate, code=error.code())
    if refused := protocol_refused(error, group):
        raise FatalKafkaError(refused, code=error.code())
    if stops_consumer(error):
        raise FatalKafkaError(refusal(error) or f"Kafka consumer failed fatally: "
                              f"{describe(error)}", code=error.code())
    stranded = unfetched_offsets(error)
    if stranded is not None:
        raise stranded
    if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
        # A topic not created yet is waited for, as the router waits for its raw topic; a
        # typo'd name looks the same, so the line names the setting and the fix (QA 67-b F-1:
        # librdkafka's words alone, once, then silence for ever).
        log.warning("event=topic_missing group=%s error=%r: a topic of ConsumerSettings.topics "
                    "does not exist; the consumer waits for it: check the name against the "
                    "router's route topics, or create the topic", group, error.str())
    elif error.code() != KafkaError._PARTITION_EOF:
        log.warning("event=consumer_error code=%s error=%s", error.name(), error.str())


def raise_reported(reported: list[KafkaError], *, at_start: bool, group: str = "") -> None:
    """consumer_error for what error_cb alone was given (a refused login, a join refused for
    its assignors; a refused certificate `at_start`, before any assignment: later one may be
    brief, a proxy's during a rollout, and is waited out as the router does, reread 56-s F-2)
    that stops us; `reported` is emptied."""
    for error in reported:
        if stops_consumer(error) or protocol_refused(error) or \
                (at_start and certificate_refused(error)):
            consumer_error(error, group)
    reported.clear()


def consume_batch(consumer: Any, size: int, timeout: float) -> list[Any]:
    """Up to `size` records: those librdkafka has fetched already, without waiting, else the
    first to come within `timeout`. consume(size, timeout) waits its whole timeout unless
    `size` records come (review 52-c F-low-9: each retry took poll_timeout_s, 1 s, more than
    its backoff). One call hands records over: each serves the rebalance callbacks before
    its records, so none comes of a partition revoked after it (reread 52-l F3: a poll, then
    consume(0), ran a revocation between them, and the retry's seek on the polled record
    stopped the consumer)."""
    fetched = consumer.consume(num_messages=size, timeout=0)
    if fetched:
        return list(fetched)
    first = consumer.poll(timeout)
    return [] if first is None else [first]


def commit_stored(consumer: Any, group_id: str) -> bool:
    """Commit `consumer`'s stored offsets synchronously; whether some are still to commit (a
    refused commit only means redelivery). FatalKafkaError when the group refuses for good."""
    try:
        consumer.commit(asynchronous=False)
    except KafkaException as error:
        kafka_error = kafka_error_of(error)
        if kafka_error is not None and kafka_error.code() == KafkaError._NO_OFFSET:
            return False
        if kafka_error is not None and classify(kafka_error) is ErrorAction.FATAL:
            raise FatalKafkaError(f"cannot commit offsets of group {group_id}: "
                                  f"{describe(kafka_error)}") from error
        # Still to commit: at the next interval, a revocation or the stop (review 33: a
        # failed commit was never tried again, and the next owner redid the work).
        log.warning("event=commit_failed group=%s error=%s", group_id, error)
        return True
    return False


def positions_past(consumer: Any, stored: dict[tuple[str, int], int],
                   skip: Callable[[tuple[str, int]], bool]) -> list[tuple[tuple[str, int], int]]:
    """Each assigned partition's position where it passed its last `stored` offset without a
    record (the commit markers of a transactional producer, as the router's, which
    read_committed never hands over: QA 35-b saw every group lag 1 a partition for ever), but
    not the partitions `skip` names. librdkafka says no position (-1001) after a seek or an
    assignment, until a record comes."""
    assigned = consumer.assignment()
    return [((position.topic, position.partition), position.offset)
            for position in (consumer.position(assigned) if assigned else ())
            if not skip((position.topic, position.partition))
            and position.offset > stored.get((position.topic, position.partition), -1)]
