"""Dead letters Kafka will not take as they are: a record near message.max.bytes loses its value
(not its coordinates), and a dead letter Kafka refuses for good stops the consumer with one
line instead of retrying forever."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from cdc_router.consumer import ConsumedEvent, RetryPolicy
from cdc_router.dead_letter import VALUE_DROPPED
from cdc_router.errors import FatalKafkaError
from tests.unit.consumer_fakes import Harness, dlq_headers, rec, record_size

NEAR_1_MB = b"x" * 999_000


def poison(event: ConsumedEvent, _: None) -> None:
    if event.event_id == "big":
        raise ValueError("order 42 is unknown: " + "why " * 400)


def test_a_record_near_message_max_bytes_is_dead_lettered_without_its_value() -> None:
    h = Harness({0: [(b"big", NEAR_1_MB, [("trace", b"t-1")]), rec("next")]}, handler=poison)
    h.run()
    [dead] = h.producer.sent
    assert dead["value"] is None and dead["key"] == b"big"
    headers = dlq_headers(dead)
    assert headers[VALUE_DROPPED] == str(len(NEAR_1_MB))
    assert (headers["dlq.source.offset"], headers["dlq.stage"]) == ("0", "handle")
    assert headers["dlq.error.message"].startswith("order 42 is unknown")
    assert ("trace", b"t-1") in dead["headers"]  # the record's own headers travel along
    assert record_size(dead["key"], dead["value"], dead["headers"]) < 1_000_000
    assert h.loop.stats.processed == 1  # "next": the partition moved on
    assert h.kafka.committed == {0: 2}


def test_a_record_that_fits_keeps_its_value() -> None:
    value = b"y" * 10_000
    h = Harness({0: [(b"big", value, [])]}, handler=poison)
    h.run()
    [dead] = h.producer.sent
    assert dead["value"] == value and VALUE_DROPPED not in dlq_headers(dead)


def test_the_limit_follows_the_producers_message_max_bytes() -> None:
    h = Harness({0: [(b"big", b"z" * 150_000, [])]}, handler=poison,
                producer_config={"message.max.bytes": "200000"})
    h.run()
    [dead] = h.producer.sent
    assert dead["value"] is None and dlq_headers(dead)[VALUE_DROPPED] == "150000"


def test_a_dead_letter_the_broker_finds_too_large_is_retried_without_its_value() -> None:
    # The dead-letter topic's max.message.bytes may be below the producer's limit.
    h = Harness({0: [(b"big", b"v" * 100_000, []), rec("next")]}, handler=poison)
    h.producer.refusals = [KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)]
    h.run()
    [dead] = h.producer.sent
    assert dead["value"] is None and dlq_headers(dead)[VALUE_DROPPED] == "100000"
    assert h.kafka.committed == {0: 2}


def test_a_dead_letter_too_large_is_retried_without_its_value_with_max_attempts_one() -> None:
    # Review 47-e F6: the first refusal stopped the consumer, at every restart.
    h = Harness({0: [(b"big", b"v" * 100_000, []), rec("next")]}, handler=poison,
                retry=RetryPolicy(max_attempts=1, initial_backoff_s=0.01))
    h.producer.refusals = [KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)]
    h.run()
    [dead] = h.producer.sent
    assert dead["value"] is None and h.kafka.committed == {0: 2}


@pytest.mark.parametrize("code", [KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                  KafkaError.MSG_SIZE_TOO_LARGE])
def test_a_dead_letter_refused_for_good_stops_the_consumer_after_max_attempts(code: int) -> None:
    h = Harness({0: [(None, b"{}", [])]})  # malformed: no event id
    h.producer.refusals = [KafkaError(code)] * 10
    with pytest.raises(FatalKafkaError, match=r"dead-letter .*payments.confirmed\[0\]@0.*"
                                             r"fulfillment.dlq.*refused it 3 times"):
        h.run()
    assert h.producer.attempts == 3  # max_attempts, not forever
    assert h.kafka.stored == {} and h.kafka.closed


def test_a_dead_letter_that_times_out_is_retried_beyond_max_attempts() -> None:
    # Not a refusal of the record: the broker may be away; never give up on it.
    h = Harness({0: [(None, b"{}", []), rec("next")]})
    h.producer.failures_left = 7
    h.run()
    assert len(h.producer.sent) == 1 and h.producer.attempts == 8
    assert h.kafka.committed == {0: 2}


def test_while_its_dead_letter_times_out_the_handler_does_not_run_again() -> None:
    # QA 56-e F-2 (found on JetStream, the same here): each retry of the dead-letter write
    # ran the handler again first, once per retry for as long as the broker was away, and
    # the letter's dlq.attempts counted those runs.
    calls: list[str] = []

    def failing(event: ConsumedEvent, _: None) -> None:
        calls.append(event.event_id)
        if event.event_id == "poison":
            raise ValueError("order 42 is unknown")

    h = Harness({0: [rec("poison"), rec("next")]}, handler=failing)
    h.producer.failures_left = 5
    h.run()
    assert calls == ["poison"] * 3 + ["next"]  # max_attempts, not 3 + 5
    [dead] = h.producer.sent
    assert (dlq_headers(dead)["dlq.attempts"], dlq_headers(dead)["dlq.stage"]) == ("3", "handle")
    assert h.producer.attempts == 6 and h.kafka.committed == {0: 2}


def test_a_fatal_dead_letter_producer_is_rebuilt() -> None:
    h = Harness({0: [(None, b"{}", [])]})
    h.producer.refusals = [KafkaError(KafkaError._FATAL, "idempotence broken", fatal=True)]
    h.run()
    assert h.producers_built == 2  # the fatal one was dropped, not retried
    assert len(h.producer.sent) == 1


def test_a_dead_letters_offset_is_committed_at_once() -> None:
    # QA session 27-b: a consumer killed within commit_interval_s of a dead letter sent it
    # again on each restart (3 kills, 3 identical letters).
    h = Harness({0: [rec("a"), (b"big", b"{}", []), rec("c")]}, handler=poison)
    h.run()
    sent = next(i for i, entry in enumerate(h.kafka.journal) if entry == ("store", (0, 2)))
    assert h.kafka.journal[sent + 1] == ("commit", {0: 2})  # before any later record


def test_the_dead_letter_producer_takes_the_consumers_security_settings() -> None:
    # QA 32-d: with TLS in consumer_config only, the dead-letter producer spoke PLAINTEXT to
    # the TLS port, and the first poison record stalled the consumer for ever.
    from cdc_router.consumer import ConsumerSettings

    settings = ConsumerSettings(
        bootstrap_servers="b:9093", group_id="g", topics=("t",), dead_letter_topic="t.dlq",
        consumer_config={"security.protocol": "SSL", "ssl.ca.location": "/ca.pem",
                         "sasl.mechanism": "SCRAM-SHA-512", "fetch.min.bytes": "10"},
        producer_config={"ssl.ca.location": "/producer-ca.pem"})
    producer = settings.librdkafka_producer()
    assert producer["security.protocol"] == "SSL" and producer["sasl.mechanism"] == \
        "SCRAM-SHA-512"
    assert producer["ssl.ca.location"] == "/producer-ca.pem"  # its own wins
    assert "fetch.min.bytes" not in producer  # a consumer's own setting stays its own


def test_a_client_config_librdkafka_refuses_is_a_config_error_naming_the_file() -> None:
    # QA 32-d: a missing CA file was a cimpl.KafkaException traceback.
    from confluent_kafka import Consumer

    from cdc_router.consumer.settings import built
    from cdc_router.errors import ConfigError

    config = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "log_level": "0",
              "security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"}
    with pytest.raises(ConfigError, match=r"ConsumerSettings: field 'consumer_config': "
                       r"librdkafka refused the client config: .*ssl\.ca\.location.*; "
                       r"ssl\.ca\.location /nonexistent/ca\.pem does not exist"):
        built(Consumer, config, "consumer_config")


def test_a_sasl_login_without_its_password_is_a_config_error_naming_the_password() -> None:
    # The consumer's twin of review 51-d F4 (a secret not mounted): the hint was "check the
    # file paths, the key password and the property names".
    from confluent_kafka import Consumer

    from cdc_router.consumer.settings import built
    from cdc_router.errors import ConfigError

    config = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "log_level": "0",
              "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
              "sasl.username": "router"}
    with pytest.raises(ConfigError, match=r"field 'consumer_config': librdkafka refused the "
                       r"client config: sasl\.password is not set, and a SASL PLAIN or SCRAM "
                       r"login needs both; give the missing one"):
        built(Consumer, config, "consumer_config")


def test_a_producer_config_librdkafka_refuses_stops_the_consumer_at_its_start() -> None:
    # Review 32-3: the dead-letter producer was built at the first poison record, after the
    # handler had failed max_attempts times.
    from cdc_router.consumer import ConsumerSettings, IdempotentConsumer
    from cdc_router.consumer.dedup.memory import MemoryDedupStore
    from cdc_router.errors import ConfigError

    handled: list[object] = []
    settings = ConsumerSettings(
        bootstrap_servers="127.0.0.1:1", group_id="g", topics=("t",), dead_letter_topic="t.dlq",
        consumer_config={"log_level": "0"},
        producer_config={"log_level": "0", "security.protocol": "SSL",
                         "ssl.ca.location": "/nonexistent/producer-ca.pem"})
    consumer = IdempotentConsumer(settings, MemoryDedupStore(),
                                  lambda event, context: handled.append(event))
    with pytest.raises(ConfigError, match=r"field 'producer_config': .*ssl\.ca\.location "
                                          r"/nonexistent/producer-ca\.pem does not exist"):
        consumer.run()
    assert handled == []


@pytest.mark.parametrize(("extra", "named"), [
    # Review 52-c F-low-3: the hint was "check the file paths, the key password and the
    # property names", none of which was at fault.
    ({"max.poll.interval.ms": "8000"},
     "check max.poll.interval.ms=8000 and session.timeout.ms (not set: librdkafka's default)"),
    ({"session.timeout.ms": "0"}, "check session.timeout.ms=0 "),
    ({"auto.offset.reset": "newest"}, "check auto.offset.reset=newest "),
    ({"linger.ms": "-5"}, "check linger.ms=-5 "),  # refused as queue.buffering.max.ms
])
def test_a_value_librdkafka_refuses_is_named_with_its_value(extra: dict[str, str],
                                                            named: str) -> None:
    from confluent_kafka import Consumer

    from cdc_router.consumer.settings import built
    from cdc_router.errors import ConfigError

    config = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "log_level": "0", **extra}
    with pytest.raises(ConfigError) as raised:
        built(Consumer, config, "consumer_config")
    text = str(raised.value)
    assert named in text and "key password" not in text and "\n" not in text


@pytest.mark.parametrize("decoder", ["parse_json", "PayloadDecoder", "Avro PayloadDecoder",
                                     "an Avro decoder of the consumer's own"])
def test_a_tombstone_given_to_the_decoder_is_malformed_with_a_reason_saying_so(
        decoder: str) -> None:
    # QA 54-c F-5: the letter said "TypeError: object of type 'NoneType' has no len()".
    # Review 54-m F-7: and then "not JSON" in a pipeline of Avro values.
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

    import confluent_kafka
    import fastavro

    from cdc_router.consumer.event import read_event
    from cdc_router.errors import MalformedRecord, PayloadDecodeError
    from cdc_router.serde.decode import PayloadDecoder
    from cdc_router.serde.json import parse_json

    avsc = Path(__file__).parent / "fixtures" / "avro" / "payment_confirmed.avsc"
    decode: Callable[[Any], Any] = {
        "parse_json": parse_json, "PayloadDecoder": PayloadDecoder().decode,
        "Avro PayloadDecoder": PayloadDecoder(schemas=[avsc]).decode,
        "an Avro decoder of the consumer's own": lambda value: fastavro.schemaless_reader(
            value, fastavro.schema.load_schema(str(avsc)), None)}[decoder]
    tombstone = confluent_kafka.Message(topic="payments", partition=0, offset=12, key=b"k",
                                        value=None, headers=[("id", b"e1")])
    with pytest.raises(MalformedRecord) as info:
        read_event(tombstone, source="auto", header="id", decoder=decode, attempt=1)
    assert str(info.value) == ("value cannot be decoded: the value is null (a tombstone: a "
                               "record without a value)")
    assert info.value.event_id == "e1"
    if decoder.startswith("an Avro decoder"):
        return  # its own error; read_event says what the value is
    with pytest.raises((ValueError, PayloadDecodeError), match=r"the value is null \(a tomb"):
        decode(None)


def test_a_letter_names_the_consumer_group_that_wrote_it() -> None:
    """QA 67-b F-3: six groups shared one dead-letter topic, 92 letters of 20 records, and no
    header said which service's handler failed."""
    h = Harness({0: [(b"big", b"{}", [])]}, handler=poison)
    h.run()
    [dead] = h.producer.sent
    assert dlq_headers(dead)["dlq.consumer.group"] == "fulfillment"
    assert "dlq.source.group" not in dlq_headers(dead)  # a router's, for its pipelines
