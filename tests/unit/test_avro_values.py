"""Values an Avro type validates but cannot hold, and what our own decoder does with them."""

from __future__ import annotations

import io
import json
from datetime import date
from pathlib import Path
from typing import Any

import fastavro
import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

from cdc_router.config.connections import SchemaRegistrySettings
from cdc_router.config.routes import RouteRule
from cdc_router.errors import RegistryError, SerializeError
from cdc_router.router.debezium import OutboxEvent
from cdc_router.serde.avro import AvroSerializer, encode, load_schema
from cdc_router.serde.avro_schema import parse_schema_text
from cdc_router.serde.decode import PayloadDecodeError, PayloadDecoder

TIMES = {"type": "record", "name": "Times", "namespace": "t", "fields": [
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "us", "type": ["null", {"type": "long", "logicalType": "local-timestamp-micros"}],
     "default": None},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": {"type": "int", "logicalType": "time-millis"}}]}
# confluent-kafka's in-memory registry class, through its public factory (its module is private).
MockRegistry: Any = type(SchemaRegistryClient.new_client({"url": "mock://class"}))
GOOD = {"ts": 1_700_000_000_000, "us": None, "day": 19_000, "at": 1000}


def event(payload: Any, raw: bytes | None = None) -> OutboxEvent:
    return OutboxEvent(event_id="e1", aggregate_type="A", aggregate_id="1", type="T",
                       payload=raw if raw is not None else json.dumps(payload).encode(),
                       payload_is_json=raw is None, headers=(), created_at_ms=1, op="c",
                       lsn=1, tx_id=1)


@pytest.fixture
def times(tmp_path: Any) -> RouteRule:
    path = tmp_path / "times.avsc"
    path.write_text(json.dumps(TIMES))
    return RouteRule.model_validate({"topic": "tp", "format": "avro", "schema": str(path)})


@pytest.mark.parametrize(("change", "reason"), [
    # Review 45 M5: each was written, then our own decoder refused it (or crashed on it).
    ({"ts": 2**62}, "'t.Times.ts' is 4611686018427387904, outside what readers with logical "
     "types take as long (timestamp-millis): -62135596800000 to 253402300799999 (milliseconds"),
    ({"ts": -62135596800001}, "'t.Times.ts' is -62135596800001, outside"),
    ({"us": 253402300800000000}, "'t.Times.us' is 253402300800000000, outside what readers "
     "with logical types take as long (local-timestamp-micros)"),
    ({"day": 3_000_000}, "'t.Times.day' is 3000000, outside what readers with logical types "
     "take as int (date): -719162 to 2932896 (days since 1970-01-01, years 1 to 9999)"),
    ({"at": 86_400_000}, "'t.Times.at' is 86400000, outside what readers with logical types "
     "take as int (time-millis): 0 to 86399999 (milliseconds after midnight)"),
    ({"at": -1}, "'t.Times.at' is -1, outside"),  # read back as 00:00:00.999, silently
])
@pytest.mark.parametrize("with_registry", [False, True])
def test_a_time_beyond_what_readers_take_is_a_dead_letter_naming_field_value_and_range(
        times: RouteRule, change: dict[str, Any], reason: str, with_registry: bool) -> None:
    client = SchemaRegistryClient.new_client({"url": "mock://times"})
    settings = SchemaRegistrySettings.model_validate({"url": "mock://times",
                                                      "auto_register": True})
    serializer = (AvroSerializer([times], settings, registry_client=client) if with_registry
                  else AvroSerializer([times]))
    decoder = PayloadDecoder(schemas=[str(times.schema_path)], registry=client)
    assert decoder.decode(serializer.serialize(event(GOOD), times, "tp")).value["day"].year == 2022
    with pytest.raises(SerializeError) as caught:
        serializer.serialize(event({**GOOD, **change}), times, "tp")
    assert reason in str(caught.value) and "check the value's unit" in str(caught.value)


def test_the_edges_of_each_range_are_written_and_read_back(times: RouteRule) -> None:
    decoder = PayloadDecoder(schemas=[str(times.schema_path)])
    for edge in ({"ts": -62135596800000, "us": 253402300799999999, "day": -719162, "at": 0},
                 {"ts": 253402300799999, "us": -62135596800000000, "day": 2932896,
                  "at": 86_399_999}):
        value = AvroSerializer([times]).serialize(event(edge), times, "tp")
        assert decoder.decode(value).value["day"].year in (1, 9999)


DATE = {"type": "int", "logicalType": "date"}
KIND = {"type": "enum", "name": "Kind", "symbols": ["A", "C"]}


@pytest.mark.parametrize("with_registry", [False, True])
def test_a_text_in_a_date_is_no_date_and_a_union_writes_it_as_text(
        tmp_path: Path, with_registry: bool) -> None:
    # Review 48-d F1: fastavro parses a str in a date with date.fromisoformat: "2024-01-05"
    # was written as a date, "Z" raised a bare ValueError (no field named), and "hello", valid
    # in [date, "string"], was dead-lettered for it; "2024-01-05" there was read as a date.
    path = tmp_path / "d.avsc"
    path.write_text(json.dumps({"type": "record", "name": "D", "fields": [
        {"name": "day", "type": DATE},
        {"name": "note", "type": ["null", DATE, "string"], "default": None},
        {"name": "more", "type": {"type": "array", "items": [DATE, KIND, "string"]},
         "default": []}]}))
    route = RouteRule.model_validate({"topic": "tp", "format": "avro", "schema": str(path)})
    client = SchemaRegistryClient.new_client({"url": "mock://dates"})
    settings = SchemaRegistrySettings.model_validate({"url": "mock://dates",
                                                      "auto_register": True})
    serializer = (AvroSerializer([route], settings, registry_client=client) if with_registry
                  else AvroSerializer([route]))
    decoder = PayloadDecoder(schemas=[str(path)], registry=client)
    for text in ("2024-01-05", "Z"):
        with pytest.raises(SerializeError, match=rf"field 'D.day' is str '{text}', expected int "
                           r"\(date\): a date is written as its number of days since 1970"):
            serializer.serialize(event({"day": text}), route, "tp")
    for text in ("hello", "2024-01-05", "Z"):
        payload = {"day": 19727, "note": text, "more": [text, "C", 1]}
        value = decoder.decode(serializer.serialize(event(payload), route, "tp")).value
        assert value == {"day": date(2024, 1, 5), "note": text,
                         "more": [text, "C", date(1970, 1, 2)]}


@pytest.mark.parametrize(("union", "value", "reason"), [
    # Review 48-d F3: each fits a later branch without a problem, so it was written, in the
    # first branch it fits (fastavro's writer's choice), which our decoder then refused.
    ([DATE, "long"], 86_400_000, "'R.x' is 86400000, outside what readers with logical types "
     "take as int (date)"),
    (["null", {"type": "int", "logicalType": "time-millis"}, "long"], 86_400_000,
     "'R.x' is 86400000, outside what readers with logical types take as int (time-millis)"),
    ([{"type": "string", "logicalType": "uuid"}, KIND], "C",
     "'R.x' is str 'C', expected string (uuid): not a UUID"),
    (["float", "long"], 16777217, "'R.x' is 16777217, which an Avro float holds only as "
     "16777216.0"),  # no double after the float: fastavro writes the float
])
def test_a_union_value_is_judged_in_the_branch_the_writer_takes(
        tmp_path: Path, union: list[Any], value: Any, reason: str) -> None:
    path = tmp_path / "r.avsc"
    path.write_text(json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "x", "type": union}]}))
    route = RouteRule.model_validate({"topic": "tp", "format": "avro", "schema": str(path)})
    with pytest.raises(SerializeError) as caught:
        AvroSerializer([route]).serialize(event({"x": value}), route, "tp")
    assert reason in str(caught.value)


@pytest.mark.parametrize(("union", "value"), [
    (["long", DATE], 86_400_000),  # the long first: written as a long
    (["float", "double"], 1e39), (["float", "double"], 16777217),  # fastavro's double
    ([KIND, {"type": "string", "logicalType": "uuid"}], "C"),
])
def test_a_union_value_the_writer_puts_in_a_branch_that_holds_it_is_read_back(
        tmp_path: Path, union: list[Any], value: Any) -> None:
    path = tmp_path / "r.avsc"
    path.write_text(json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "x", "type": union}]}))
    route = RouteRule.model_validate({"topic": "tp", "format": "avro", "schema": str(path)})
    written = AvroSerializer([route]).serialize(event({"x": value}), route, "tp")
    assert PayloadDecoder(schemas=[str(path)]).decode(written).value == {"x": value}


def test_a_record_another_writer_put_beyond_a_datetime_is_the_records_decode_error() -> None:
    # Review 45 M5: fastavro's reader raises OverflowError there, which escaped the decoder.
    schema = parse_schema_text(json.dumps(TIMES), "times")
    body = io.BytesIO()
    fastavro.schemaless_writer(body, schema.parsed, {**GOOD, "ts": 2**62})
    with pytest.raises(PayloadDecodeError, match=r"does not decode with schema t\.Times"):
        PayloadDecoder(schemas=[schema]).decode(schema.frame_single_object(body.getvalue()))
    client = SchemaRegistryClient.new_client({"url": "mock://other-writer"})
    schema_id = client.register_schema("tp-value", Schema(schema.text, "AVRO"))
    with pytest.raises(PayloadDecodeError, match=r"does not decode with schema t\.Times"):
        PayloadDecoder(registry=client).decode(
            b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue())


# --- a pre-encoded payload's schema id and the route's subject (review 45 M6) --------------

PAYMENT = Path(__file__).parent / "fixtures" / "avro" / "payment_confirmed.avsc"
PAID = {"payment_id": "pay-7", "order_id": 42, "amount_cents": 1999, "currency": "EUR",
        "note": None, "lines": [], "tags": {}}


def framed(client: SchemaRegistryClient, subject: str) -> bytes:
    """PAID in the wire format, its schema registered under `subject`."""
    schema = load_schema(PAYMENT)
    schema_id = client.register_schema(subject, Schema(schema.text, "AVRO"))
    return b"\x00" + schema_id.to_bytes(4, "big") + encode(PAID, schema)


def payments(strategy: str = "topic") -> tuple[RouteRule, SchemaRegistrySettings]:
    return (RouteRule.model_validate({"topic": "payments", "format": "avro",
                                      "schema": str(PAYMENT)}),
            SchemaRegistrySettings.model_validate({"url": "mock://m6",
                                                   "subject_name_strategy": strategy}))


def test_a_framed_payload_whose_id_is_no_version_of_its_subject_is_a_dead_letter() -> None:
    client = SchemaRegistryClient.new_client({"url": "mock://m6-other"})
    route, settings = payments()
    value = framed(client, "orders-value")  # another topic's subject only
    serializer = AvroSerializer([route], settings, registry_client=client)
    with pytest.raises(SerializeError, match=r"names schema id 1, which is no version of subject "
                       r"'payments-value' \(topic strategy\): write it with one of that "
                       "subject's versions, or register that schema under it"):
        serializer.serialize(event(None, raw=value), route, "payments")
    client.register_schema("payments-value", Schema(load_schema(PAYMENT).text, "AVRO"))
    assert serializer.serialize(event(None, raw=value), route, "payments") == value


def test_under_the_record_strategy_the_subject_is_the_writer_schemas_name() -> None:
    client = SchemaRegistryClient.new_client({"url": "mock://m6-record"})
    route, settings = payments("record")
    value = framed(client, "shop.payments.PaymentConfirmed")
    serializer = AvroSerializer([route], settings, registry_client=client)
    assert serializer.serialize(event(None, raw=value), route, "payments") == value


class LookupFails(MockRegistry):  # type: ignore[misc, valid-type]
    """The mock registry, whose subject look-ups get `answer`."""

    answer: Exception = RuntimeError("unused")

    def lookup_schema(self, *args: Any, **kwargs: Any) -> Any:
        raise self.answer


@pytest.mark.parametrize(("answer", "stops"), [
    (httpx.ConnectError("[Errno 111] Connection refused"), True),
    (ClientError(503, 50003, "Error while forwarding the request to the leader"), True),
    (ClientError(404, -1, "<html>Not Found</html>"), True),  # a proxy's: the URL's fault
    (ClientError(403, 40301, "User is denied operation Read on subject"), True),  # a static one
    (ClientError(404, 40401, "Subject 'payments-value' not found."), False),
])
def test_a_registry_that_cannot_answer_for_the_subject_blames_no_record(
        answer: Exception, stops: bool) -> None:
    client = LookupFails({"url": "mock://m6-fails"})
    client.answer = answer
    route, settings = payments()
    serializer = AvroSerializer([route], settings, registry_client=client)
    with pytest.raises(RegistryError if stops else SerializeError) as caught:
        serializer.serialize(event(None, raw=framed(client, "payments-value")), route,
                             "payments")
    assert isinstance(caught.value, SerializeError) is not stops


def test_an_id_of_a_schema_that_is_not_avro_is_a_dead_letter_naming_it() -> None:
    client = SchemaRegistryClient.new_client({"url": "mock://m6-json"})
    schema_id = client.register_schema("payments-value", Schema('{"type": "object"}', "JSON"))
    route, settings = payments()
    serializer = AvroSerializer([route], settings, registry_client=client)
    with pytest.raises(SerializeError, match=f"schema id {schema_id} is JSON, not AVRO"):
        serializer.serialize(event(None, raw=b"\x00" + schema_id.to_bytes(4, "big") + b"\x02"),
                             route, "payments")


# --- one classifier of the registry's answers (review 45 L5) --------------------------------

class GetFails(MockRegistry):  # type: ignore[misc, valid-type]
    answer: Exception = RuntimeError("unused")

    def get_schema(self, *args: Any, **kwargs: Any) -> Any:
        raise self.answer


@pytest.mark.parametrize(("answer", "records_fault"), [
    (ClientError(404, 40403, "Schema not found"), True),
    (ClientError(404, 40400, "Schema Not Found"), True),  # confluent-kafka's mock://
    (ClientError(404, -1, "<html>Not Found</html>"), False),
    (ClientError(403, 0, "Forbidden"), False),
    (ClientError(401, 40101, "Unauthorized"), False),
    (ClientError(500, 50001, "Error in the backend data store"), False),
    (httpx.ReadTimeout("timed out"), False),
])
def test_the_decoder_and_the_pass_through_read_a_writer_schema_alike(
        answer: Exception, records_fault: bool) -> None:
    client = GetFails({"url": "mock://l5"})
    client.answer = answer
    route, settings = payments()
    value = b"\x00\x00\x00\x00\x07\x02"
    with pytest.raises(PayloadDecodeError if records_fault else RegistryError) as decoded:
        PayloadDecoder(registry=client, registry_url="mock://l5").decode(value)
    with pytest.raises(SerializeError if records_fault else RegistryError) as serialized:
        AvroSerializer([route], settings, registry_client=client).serialize(
            event(None, raw=value), route, "payments")
    assert "schema id 7" in str(decoded.value) and "schema id 7" in str(serialized.value)
    assert isinstance(decoded.value, RegistryError) is isinstance(serialized.value, RegistryError)
