"""Values an Avro type validates but cannot hold, and what our own decoder does with them."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from cdc_router.config.connections import SchemaRegistrySettings
from cdc_router.config.routes import RouteRule
from cdc_router.errors import SerializeError
from cdc_router.router.debezium import OutboxEvent
from cdc_router.serde.avro import AvroSerializer
from cdc_router.serde.avro_schema import parse_schema_text
from cdc_router.serde.decode import PayloadDecodeError, PayloadDecoder

TIMES = {"type": "record", "name": "Times", "namespace": "t", "fields": [
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "us", "type": ["null", {"type": "long", "logicalType": "local-timestamp-micros"}],
     "default": None},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": {"type": "int", "logicalType": "time-millis"}}]}
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
