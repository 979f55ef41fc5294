"""Poison isolation: a refused record is found and dead-lettered within two aborted batches."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from cdc_router.errors import FatalKafkaError, GrantRevoked
from cdc_router.kafka.producer import DeliveryFailure
from cdc_router.router.poison import LetterTooLarge, PoisonIsolation, record_refusals
from cdc_router.router.timestamps import _UNLIMITED, TopicLimits, TopicLimitsCache

A, B, C = ("raw", 0, 1), ("raw", 0, 2), ("raw", 0, 3)
TIMESTAMP = KafkaError(KafkaError.INVALID_TIMESTAMP, "Broker: Invalid timestamp")
TOO_LARGE = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large")


def refused(source: tuple[str, int, int] | None, error: KafkaError = TIMESTAMP) -> DeliveryFailure:
    return DeliveryFailure("orders", error, source)


def test_a_refusal_of_a_whole_request_makes_suspects_then_the_one_refused_alone_is_confirmed(
) -> None:
    poison = PoisonIsolation()
    # Abort 1: the broker names every record of the request.
    assert poison.learn([refused(A), refused(B), refused(C)], None, [A, B, C])
    assert poison.suspects == 3 and poison.refused(A) is None
    # Re-read: each suspect alone; A and C go through, B is refused alone (abort 2).
    assert poison.alone(A)
    poison.delivered_alone(A)
    assert poison.alone(B)
    assert poison.learn([refused(B)], None, [A, B])
    # Next re-read: B is dead-lettered without producing, C is still produced alone.
    reason = poison.refused(B)
    assert reason is not None and "INVALID_TIMESTAMP" in reason
    assert "delivery.record_timestamp: now" in reason
    assert not poison.alone(A) and poison.alone(C)
    poison.delivered_alone(C)
    poison.committed()
    assert poison.refused(B) is None and poison.suspects == 0


def test_an_abort_that_is_no_records_fault_teaches_nothing() -> None:
    poison = PoisonIsolation()
    timed_out = KafkaError(KafkaError._MSG_TIMED_OUT)
    assert not poison.learn([refused(A, timed_out)], timed_out, [A])
    assert not poison.learn([], KafkaError(KafkaError.NOT_ENOUGH_REPLICAS), [A, B])
    assert not poison.learn([refused(A, KafkaError(KafkaError.INVALID_REQUIRED_ACKS))], None, [A])
    assert poison.suspects == 0


def test_a_refusal_no_report_attributes_makes_every_record_of_the_batch_a_suspect() -> None:
    poison = PoisonIsolation()
    assert poison.learn([], KafkaError(KafkaError.INVALID_TIMESTAMP), [A, B])
    assert poison.suspects == 2


def test_an_authorization_refusal_no_report_names_exits_for_a_fresh_grants_check() -> None:
    # QA 31-c: Write on the changelog revoked while the router ran: AddPartitionsToTxn refused
    # the batch, each record was blamed and isolated in turn, 151 aborts in 75 s, for ever.
    with pytest.raises(GrantRevoked, match="a grant was revoked while this process ran") as \
            raised:
        PoisonIsolation().learn([], KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                               "Failed to add partition(s) to transaction"),
                                [A, B])
    assert raised.value.exit_code == 75


def test_a_refusal_of_the_routers_own_record_is_fatal() -> None:
    with pytest.raises(FatalKafkaError, match="dead-letter and dedup changelog"):
        PoisonIsolation().learn([refused(None, KafkaError(KafkaError.INVALID_RECORD))],
                                None, [])
    # QA 57-a F-3: a letter over the dead-letter topic's lowered limit pointed at ACLs.
    with pytest.raises(LetterTooLarge, match=r"the router's own record of 5678 bytes \(or the "
                       r"batch it was in\) is over dlq's max.message.bytes: raise that") as \
            too_large:
        PoisonIsolation().learn([DeliveryFailure("dlq", TOO_LARGE, None, 5678),
                                 refused(A)], None, [A])
    assert too_large.value.topic == "dlq" and too_large.value.size == 5678
    assert "restart" not in str(too_large.value)
    # Reread 57-a F-1: when reading the limit again did not narrow the letters, the line said
    # a restart would help, though a restart takes the same path.
    stop = str(too_large.value.unmended(3000, 1_000_000))
    assert "a restart does not help: dlq's max.message.bytes (3000, as read now) must exceed " \
        "the producer's batch.size (1000000) and the record's size (5678 bytes)" in stop
    assert "set kafka.producer.batch.size below it" in stop
    assert "max.message.bytes must exceed the producer's batch.size (16384), as" in \
        str(LetterTooLarge("r", topic="marks", size=None).unmended(None, 16384))
    # QA 31-b: a deleted topic's reason named only size limits and ACLs.
    with pytest.raises(FatalKafkaError, match=r"does not exist \(any more\): create it with "
                       "`cdc-router topics apply`"):
        PoisonIsolation().learn([refused(None, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))],
                                None, [])


def test_with_record_timestamp_now_an_invalid_timestamp_is_the_clock_not_a_record() -> None:
    poison = PoisonIsolation(record_refusals("now"))
    assert not poison.learn([refused(A)], TIMESTAMP, [A])
    assert PoisonIsolation(record_refusals("created_at")).learn([refused(A)], None, [A])


def test_an_aborted_batch_keeps_the_refusal_it_was_dead_lettering() -> None:
    poison = PoisonIsolation()
    poison.learn([refused(A)], None, [A])
    assert poison.alone(A)
    poison.learn([refused(A)], None, [A])
    assert poison.refused(A) is not None
    poison.learn([], KafkaError(KafkaError._TRANSPORT), [])  # that batch failed elsewhere
    assert poison.refused(A) is not None  # still dead-lettered on the next re-read


def test_a_size_refusal_reads_the_topics_limit_again_at_once_and_names_size_and_limit() -> None:
    # QA 57-a F-1/F-2: max.message.bytes lowered while the router ran: the cached limit (up to
    # 5 minutes old) let every large record be produced and refused, 2 to 4 aborted batches
    # each; the letter said only "MSG_SIZE_TOO_LARGE: Broker: Message size too large".
    reads: list[str] = []
    limit = {"max.message.bytes": "1000000"}

    def describe(topic: str, timeout_s: float) -> dict[str, str]:
        reads.append(topic)
        return dict(limit)

    limits = TopicLimitsCache(describe, clock=lambda: 0.0)
    assert limits("orders") == TopicLimits(_UNLIMITED, _UNLIMITED, max_message_bytes=1000000)
    limit["max.message.bytes"] = "3000"  # lowered by the operator; the cache still says 1 MB
    poison = PoisonIsolation(limits=limits)
    poison.learn([DeliveryFailure("orders", TOO_LARGE, A, 5241)], None, [A])
    assert reads == ["orders", "orders"]  # read again at once, not after LIMITS_TTL_S
    fresh = limits("orders")
    assert fresh is not None and fresh.max_message_bytes == 3000  # the re-read's own check
    assert poison.alone(A)
    poison.learn([DeliveryFailure("orders", TOO_LARGE, A, 5241)], None, [A])
    reason = poison.refused(A)
    assert reason is not None
    assert "5241 bytes" in reason and "max.message.bytes (3000)" in reason
    assert "raise the topic's max.message.bytes" in reason and "message.max.bytes" in reason
    assert "make the event smaller" in reason and "dlq replay" in reason


def test_a_size_refusal_without_a_readable_limit_still_says_the_size_and_what_to_do() -> None:
    poison = PoisonIsolation()
    poison.learn([DeliveryFailure("orders", TOO_LARGE, A, 800)], None, [A])
    poison.alone(A)
    poison.learn([DeliveryFailure("orders", TOO_LARGE, A, 800)], None, [A])
    reason = poison.refused(A)
    assert reason is not None and "800 bytes" in reason and "not readable" in reason
    assert "make the event smaller" in reason


def test_the_check_before_producing_and_the_brokers_refusal_give_one_size_advice() -> None:
    """Two wordings of one advice (session 58): the check before producing said to "shrink the
    payload" and forgot the producer's own message.max.bytes, which refuses a record a raised
    topic limit lets through."""
    from cdc_router.router.poison import refusal_reason

    over = ("the record is 5241 bytes as the broker counts it (key, value, headers and the "
            "record batch's framing), over the topic's max.message.bytes (3000)")
    fix = ("raise the topic's max.message.bytes (and kafka.producer.message.max.bytes if the "
           "record is over it too) or make the event smaller, then `cdc-router dlq replay` it")
    before = TopicLimits(_UNLIMITED, _UNLIMITED, max_message_bytes=3000).size_problem(
        "orders", 5241)
    assert before == ("Kafka would refuse the record for orders (MSG_SIZE_TOO_LARGE): "
                      f"{over}; dead-lettered before producing; {fix}")
    refused = refusal_reason(DeliveryFailure("orders", TOO_LARGE, A, 5241), 3000)
    assert refused.startswith("Kafka refused the record for orders: MSG_SIZE_TOO_LARGE")
    assert refused.endswith(f"; {over}; {fix}")
