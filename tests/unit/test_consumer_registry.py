"""The idempotent consumer decoding Avro with a schema registry that fails: an outage is retried
like a dedup-store outage (never acknowledged), an unknown schema id is dead-lettered."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import fastavro
import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from cdc_router.consumer.event import RegistryRefused
from cdc_router.serde.avro import CONFLUENT_MAGIC, load_schema
from cdc_router.serde.avro_schema import SINGLE_OBJECT_MAGIC
from cdc_router.serde.decode import PayloadDecodeError, PayloadDecoder
from cdc_router.serde.json import parse_json
from cdc_router.serde.registry import RegistryError
from tests.unit.consumer_fakes import Harness, Record, dlq_headers

PAYMENT = Path(__file__).parent / "fixtures" / "avro" / "payment_confirmed.avsc"
GOOD = {"payment_id": "pay-7", "order_id": 42, "amount_cents": 1999,
        "lines": [{"sku": "brulee", "quantity": 2}]}


class FlakyRegistry:
    """confluent-kafka's mock registry behind a switch: the next `failures_left` lookups raise
    `failure`, as the real client does when the registry is down, slow or failing."""

    def __init__(self) -> None:
        self.inner = SchemaRegistryClient.new_client({"url": "mock://consumer-registry"})
        self.failure: Exception = RuntimeError("unused")
        self.failures_left = 0

    def config(self) -> dict[str, Any]:
        return self.inner.config()  # type: ignore[no-any-return]

    def get_schema(self, schema_id: int, *rest: Any) -> Any:
        if self.failures_left:
            self.failures_left -= 1
            raise self.failure
        return self.inner.get_schema(schema_id, *rest)


def wire_format(registry: FlakyRegistry, schema_id: int | None = None) -> bytes:
    """GOOD in the Confluent wire format; `schema_id` overrides the registered id."""
    schema = load_schema(PAYMENT)
    registered = registry.inner.register_schema("payments-value", Schema(schema.text, "AVRO"))
    body = io.BytesIO()
    fastavro.schemaless_writer(body, schema.parsed, GOOD)
    framing = (schema_id if schema_id is not None else registered).to_bytes(4, "big")
    return CONFLUENT_MAGIC + framing + body.getvalue()


OUTAGES = [
    httpx.ConnectError("[Errno 111] Connection refused"),
    httpx.ReadTimeout("timed out"),
    SchemaRegistryError(503, 50003, "Error while forwarding the request to the leader"),
    SchemaRegistryError(500, 50001, "Error in the backend data store"),
]
# No retry mends these (QA 66-a F-4): refused credentials; a 404 without the registry's
# "schema not found" code, a wrong URL or a proxy's page.
REFUSALS = [
    SchemaRegistryError(401, 40101, "Unauthorized"),
    SchemaRegistryError(404, -1, "<html>Not Found</html>"),
]


@pytest.mark.parametrize("failure", OUTAGES + REFUSALS, ids=lambda e: type(e).__name__)
def test_a_registry_that_cannot_answer_is_a_registry_error(failure: Exception) -> None:
    registry = FlakyRegistry()
    value = wire_format(registry)
    registry.failure, registry.failures_left = failure, 1
    with pytest.raises(RegistryError, match="schema id 1"):
        PayloadDecoder(registry=registry).decode(value)  # type: ignore[arg-type]


def test_an_id_the_registry_does_not_know_is_the_records_fault() -> None:
    registry = FlakyRegistry()
    with pytest.raises(PayloadDecodeError, match="schema id 99 is unknown to the registry"):
        PayloadDecoder(registry=registry).decode(  # type: ignore[arg-type]
            wire_format(registry, schema_id=99))


def test_an_unknown_id_is_explained_to_the_consumer_not_with_the_routers_advice() -> None:
    # QA 55-c F-5: Apicurio answers an unknown id with 40403, read as "not among its subject's
    # registered versions; if the .avsc changed, `cdc-router schemas check` ...": a consumer
    # has no .avsc and no subject, and the router's commands cannot help it.
    registry = FlakyRegistry()
    value = wire_format(registry, schema_id=99999)
    registry.failure = SchemaRegistryError(404, 40403, "No content with ID '99999' was found.")
    registry.failures_left = 1
    with pytest.raises(PayloadDecodeError) as caught:
        PayloadDecoder(registry=registry,  # type: ignore[arg-type]
                       registry_url="http://user:secret@sr:8081").decode(value)
    text = str(caught.value)
    assert text.startswith("schema id 99999 is unknown to the registry at "
                           "http://user:*****@sr:8081: it holds no such id"), text
    assert "another registry" in text and ".avsc" not in text and "schemas " not in text


@pytest.mark.parametrize(("failure", "check"), [
    (OUTAGES[0], "check the url of the SchemaRegistryClient given to PayloadDecoder (its host "
                 "and port)"),
    (REFUSALS[0], "check that client's basic.auth.user.info")])
def test_a_decoder_on_the_users_own_client_names_that_clients_url(failure: Exception,
                                                                   check: str) -> None:
    # Review 62 #9: it said "the schema registry at (the decoder's client) did not answer ...
    # check schema_registry.url": a decoder built on one's own client has no such setting.
    registry = FlakyRegistry()
    registry._conf = {"url": "http://user:secret@sr.example:8081"}  # type: ignore[attr-defined]
    value = wire_format(registry)
    registry.failure, registry.failures_left = failure, 1
    with pytest.raises(RegistryError) as caught:
        PayloadDecoder(registry=registry).decode(value)  # type: ignore[arg-type]
    text = str(caught.value)
    assert "http://user:*****@sr.example:8081" in text and check in text, text
    assert "schema_registry." not in text and "CDC_ROUTER__" not in text, text
    # A decoder of a router config (PayloadDecoder.for_config) names the config's settings.
    registry.failures_left = 1
    with pytest.raises(RegistryError, match="check schema_registry"):
        PayloadDecoder(registry=registry,  # type: ignore[arg-type]
                       registry_url="http://sr:8081").decode(value)


def avro_harness(registry: FlakyRegistry, records: list[Record]) -> Harness:
    decoder = PayloadDecoder(registry=registry)  # type: ignore[arg-type]
    return Harness({0: records}, decoder=lambda raw: decoder.decode(raw or b"").value)


@pytest.mark.parametrize("failure", OUTAGES, ids=lambda e: type(e).__name__)
def test_a_registry_outage_is_retried_beyond_max_attempts_and_never_dead_lettered(
        failure: Exception) -> None:
    registry = FlakyRegistry()
    value = wire_format(registry)
    h = avro_harness(registry, [(b"evt-1", value, []), (b"evt-2", value, [])])
    # More failures than max_attempts (3): an outage is not the record's fault.
    registry.failure, registry.failures_left = failure, 7
    h.run()
    assert h.producer.sent == []
    assert [e.event_id for e in h.effects] == ["evt-1", "evt-2"]
    assert h.effects[0].payload["payment_id"] == "pay-7"
    assert h.loop.stats.retries == 7
    # Nothing was acknowledged while the registry was down: the first store is evt-1's.
    stores = [entry for entry in h.kafka.journal if entry[0] == "store"]
    assert stores == [("store", (0, 1)), ("store", (0, 2))]
    assert h.kafka.committed == {0: 2}


@pytest.mark.parametrize("failure", REFUSALS, ids=lambda e: str(e.http_status_code))
def test_refused_credentials_or_no_registry_end_run_with_nothing_acknowledged(
        failure: Exception) -> None:
    # QA 66-a F-4: a 401 (a wrong basic_auth_user_info) was retried without end, 29 retries
    # in 60 s on the stack, the consumer stalled on its first Avro record and looked alive;
    # refused Kafka credentials and a refused dedup store end run(), so does the registry.
    registry = FlakyRegistry()
    value = wire_format(registry)
    h = avro_harness(registry, [(b"evt-1", value, []), (b"evt-2", value, [])])
    registry.failure, registry.failures_left = failure, 7
    with pytest.raises(RegistryRefused, match="the schema registry refused this consumer's "
                       "decoder: cannot read schema id 1: ") as caught:
        h.run()
    assert caught.value.exit_code == 1
    assert h.effects == [] and h.producer.sent == []
    assert [entry for entry in h.kafka.journal if entry[0] == "store"] == []
    assert registry.failures_left == 6  # asked once, not retried


def test_an_unknown_schema_id_is_dead_lettered_and_the_partition_goes_on() -> None:
    registry = FlakyRegistry()
    h = avro_harness(registry, [(b"evt-1", wire_format(registry, schema_id=99), []),
                                (b"evt-2", wire_format(registry), [])])
    h.run()
    assert [e.event_id for e in h.effects] == ["evt-2"]
    [dead] = h.producer.sent
    headers = dlq_headers(dead)
    assert headers["dlq.stage"] == "decode"
    assert "schema id 99 is unknown" in headers["dlq.error.message"]
    assert h.kafka.committed == {0: 2}


def test_a_json_decoder_on_an_avro_topic_says_the_value_is_avro_and_which_decoder_reads_it(
        ) -> None:
    # QA 66-a F-6: a consumer given parse_json for the router's Avro topic dead-lettered each
    # record as "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xca in position 10"
    # (43,700 letters in 50 s on the stack), naming neither Avro nor PayloadDecoder.
    registry = FlakyRegistry()
    wire = wire_format(registry)
    single = SINGLE_OBJECT_MAGIC + load_schema(PAYMENT).fingerprint + wire[5:]
    h = Harness({0: [(b"evt-1", wire, []), (b"evt-2", single, []), (b"evt-3", b"{x", [])]},
                decoder=parse_json)
    h.run()
    reasons = [dlq_headers(sent)["dlq.error.message"] for sent in h.producer.sent]
    schema_id = int.from_bytes(wire[1:5], "big")
    assert reasons[0].endswith(f"(the value is in the schema registry's wire format, schema "
                               f"id {schema_id}, as the router writes its Avro: decode this "
                               "topic with cdc_router.serde.decode.PayloadDecoder, not a JSON "
                               "decoder)"), reasons[0]
    assert "(the value is in Avro single-object encoding: " in reasons[1], reasons[1]
    assert "Avro" not in reasons[2], reasons[2]  # JSON that is not: its own words only
