"""Decoding real Debezium 3.6 change events captured from the local stack (fixtures/debezium)."""

from __future__ import annotations

import base64
import calendar
import json
import logging
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cdc_router.config.source import SourceSettings
from cdc_router.errors import DecodeError
from cdc_router.outbox import OutboxColumns
from cdc_router.router.debezium import OutboxEvent, Skipped, decode_change

FIXTURES = Path(__file__).parent / "fixtures" / "debezium"
PAYLOAD = {"orderId": 42, "amount": "19.99", "currency": "EUR", "note": "crème brûlée ✓"}
BYTEA = b"\x00\x01\xfe\xffbinary\x80"
MODES = ["schema", "noschema"]


def record(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text("utf-8"))
    return loaded


def raw(value: Any) -> bytes | None:
    return None if value is None else json.dumps(value, separators=(",", ":")).encode()


def run(name: str, settings: SourceSettings | None = None, **changes: Any) -> OutboxEvent | Skipped:
    rec = record(name)
    return decode_change(raw(rec["key"]), raw(rec["value"]), topic=rec["topic"],
                  settings=settings or SourceSettings(topics=[rec["topic"]], **changes))


def event(name: str, **changes: Any) -> OutboxEvent:
    result = run(name, **changes)
    assert isinstance(result, OutboxEvent), result
    return result


def row_of(value: dict[str, Any]) -> dict[str, Any]:
    """The 'after' row inside a captured value, in either converter mode (to mutate it)."""
    envelope: dict[str, Any] = value["payload"] if "schema" in value else value
    after: dict[str, Any] = envelope["after"]
    return after


def decode_mutated(name: str, mutate: Any, **changes: Any) -> OutboxEvent | Skipped:
    rec = record(name)
    mutate(rec["value"])
    return decode_change(None, raw(rec["value"]), topic=rec["topic"],
                  settings=SourceSettings(topics=[rec["topic"]], **changes))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["jsonb", "json", "text"])
def test_create_with_json_payload_columns(kind: str, mode: str) -> None:
    rec = record(f"create_{kind}.{mode}")
    decoded = event(f"create_{kind}.{mode}")
    assert decoded.event_id == rec["key"].get("payload", rec["key"])["id"]
    assert (decoded.aggregate_type, decoded.aggregate_id, decoded.op) != ("", "", "")
    assert decoded.op == "c"
    assert decoded.payload_is_json
    assert json.loads(decoded.payload) == PAYLOAD
    assert dict(decoded.headers) == {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tenant": "acme-eu", "attempt": "3"}  # non-string header values come JSON-encoded


def test_jsonb_event_fields_and_source_metadata() -> None:
    decoded = event("create_jsonb.schema")
    source = record("create_jsonb.schema")["value"]["payload"]["source"]
    assert (decoded.aggregate_type, decoded.aggregate_id, decoded.type) == (
        "Order", "order-42", "OrderPaid")
    assert (decoded.lsn, decoded.tx_id) == (source["lsn"], source["txId"])
    assert decoded.column("tenant") == "acme-eu"
    assert ("tenant", "acme-eu") in decoded.extra_columns


@pytest.mark.parametrize("name", ["create_jsonb", "create_json", "create_text", "snapshot_jsonb"])
def test_both_converter_modes_decode_to_the_same_event(name: str) -> None:
    # Two connectors read the same row; only where each read it (snapshots differ) may differ.
    def row_only(decoded: OutboxEvent) -> OutboxEvent:
        return replace(decoded, lsn=None, tx_id=None)

    assert row_only(event(f"{name}.schema")) == row_only(event(f"{name}.noschema"))


def test_timestamp_micro_from_timestamp6_column() -> None:
    micros = row_of(record("create_jsonb.noschema")["value"])["created_at"]
    assert event("create_jsonb.noschema").created_at_ms == micros // 1000
    assert event("create_jsonb.schema").created_at_ms == micros // 1000


def test_created_at_unit_reads_rows_dated_before_1973_without_schemas() -> None:
    # Review and QA, session 27: 1972-01-01 as a timestamp(6) column without schemas
    # (63072000000000 us) was read as milliseconds: the year 3968.
    micros = 63_072_000_000_000

    def dated(value: dict[str, Any]) -> None:
        row_of(value)["created_at"] = micros

    said = decode_mutated("create_jsonb.noschema", dated, created_at_unit="micros")
    assert isinstance(said, OutboxEvent)
    assert said.created_at_ms == micros // 1000  # 1972-01-01
    meant = decode_mutated("create_jsonb.noschema", dated, created_at_unit="millis")
    assert isinstance(meant, OutboxEvent) and meant.created_at_ms == micros  # the year 3968
    millis = decode_mutated("create_jsonb.noschema", lambda value: row_of(value).update(
        created_at=10**15), created_at_unit="millis")
    assert isinstance(millis, OutboxEvent) and millis.created_at_ms == 10**15
    # A schema the connector sends outranks the setting.
    assert event("create_jsonb.schema").created_at_ms == decode_mutated(
        "create_jsonb.schema", lambda value: None, created_at_unit="millis").created_at_ms  # type: ignore[union-attr]


@pytest.mark.parametrize(("value", "meant"), [(20_789, "days"), (1_796_228_597, "seconds")])
def test_an_integer_created_at_that_is_days_or_seconds_is_a_decode_dead_letter(
        value: int, meant: str) -> None:
    # QA, session 29: a `date` column (days) and an epoch-seconds bigint were read as
    # milliseconds: records of January 1970, delivered so on a topic that keeps records.
    with pytest.raises(DecodeError, match=f"created_at column 'created_at' is {value}, which as "
                       r"milliseconds is 1970-.*source\.created_at_unit: millis"):
        decode_mutated("create_jsonb.noschema",
                       lambda row: row_of(row).update(created_at=value))
    said = decode_mutated("create_jsonb.noschema", lambda row: row_of(row).update(
        created_at=value), created_at_unit="millis")  # the user says it is that time
    assert isinstance(said, OutboxEvent) and said.created_at_ms == value, meant


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("value", "word"), [(2**63 - 1, "infinity"), (-2**63, "-infinity")])
def test_a_created_at_of_infinity_is_a_decode_dead_letter_that_says_so(
        mode: str, value: int, word: str) -> None:
    # QA 54-c F-6: Debezium's Long.MAX_VALUE for Postgres' infinity was read as the year 2262,
    # and the letter suggested record_timestamp: now, which would deliver the row as of now.
    with pytest.raises(DecodeError, match=f"created_at column 'created_at' holds {word} "
                       rf"\(Debezium sends Postgres' '{word}' as {value}, ") as info:
        decode_mutated(f"create_jsonb.{mode}", lambda row: row_of(row).update(created_at=value))
    assert "record_timestamp" not in str(info.value)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("value", "word"), [(9_223_372_036_825_200_000, "infinity"),
                                             (-9_223_372_036_832_400_000, "-infinity")])
def test_a_timestamp6_created_at_of_infinity_as_debezium_sends_it_says_so(
        mode: str, value: int, word: str) -> None:
    # QA 60-c F-4: Debezium 3.6 sends a timestamp(6) column's infinity as pgjdbc's
    # DATE_POSITIVE_INFINITY microseconds, not Long.MAX_VALUE: the letter named the year 2262
    # and blamed the clock (infinity), or said "before 1970" (-infinity).
    with pytest.raises(DecodeError, match=f"created_at column 'created_at' holds {word} "
                       rf"\(Debezium sends Postgres' '{word}' in a timestamp column as {value}, "
                       "pgjdbc's DATE_") as info:
        decode_mutated(f"create_jsonb.{mode}", lambda row: row_of(row).update(created_at=value))
    assert "2262" not in str(info.value) and "record_timestamp" not in str(info.value)


@pytest.mark.parametrize(("value", "schema", "word"), [
    (9_223_372_036_825_200, "io.debezium.time.Timestamp", "infinity"),  # timestamp(0..3)
    (-9_223_372_036_832_400, "org.apache.kafka.connect.data.Timestamp", "-infinity"),
    (9_223_372_036_825_200, None, "infinity"),  # no schema: 2262 as microseconds otherwise
    ("infinity", "io.debezium.time.ZonedTimestamp", "infinity"),  # timestamptz, every mode
    ("-infinity", None, "-infinity"),  # the relay reads Postgres' text
    ("+294247-01-10T04:00:25.2Z", "io.debezium.time.IsoTimestamp", "infinity"),  # isostring
    ("-290308-12-21T19:59:27.6Z", None, "-infinity"),
])
def test_every_encoding_of_a_postgres_infinity_says_so(value: int | str, schema: str | None,
                                                      word: str) -> None:
    from cdc_router.router.connect_time import epoch_millis
    with pytest.raises(ValueError, match=f"holds {word} .*which is no point in time"):
        epoch_millis(value, schema)


@pytest.mark.parametrize("word", ["infinity", "-infinity"])
def test_the_relays_infinity_says_the_relay_read_it_not_debezium(word: str) -> None:
    # QA 61-a F-5: a relay row's 'infinity' created_at was said to come from Debezium.
    from cdc_router.router.connect_time import epoch_millis
    with pytest.raises(ValueError, match=f"^holds {word} \\(the relay reads Postgres' '{word}'"
                       "\\), which is no point in time"):
        epoch_millis(word, None, via_connect=False)
    with pytest.raises(ValueError, match=f"^holds {word} \\(Debezium sends"):
        epoch_millis(word, None)


def test_times_near_debezium_s_infinity_encodings_are_still_times() -> None:
    from cdc_router.router.connect_time import epoch_millis
    # The same integers under another unit's schema are no infinity of Debezium's.
    assert epoch_millis(9_223_372_036_825_200, "io.debezium.time.MicroTimestamp") == \
        9_223_372_036_825_200 // 1000
    assert epoch_millis(9_223_372_036_825_199, None) == 9_223_372_036_825_199 // 1000
    assert epoch_millis(9_223_372_036_825_201, None) == 9_223_372_036_825_201 // 1000


def test_a_created_at_of_0_names_the_converter_setting_that_writes_a_null_so() -> None:
    # QA 48-a F-med-2: a NULL created_at in a column with a DEFAULT arrived as 0 (JsonConverter's
    # replace.null.with.default); the reason asked for timestamp(6), which the column was.
    with pytest.raises(DecodeError, match=r"is 0 \(1970-01-01\): a NULL in a column with a "
                       r"DEFAULT.*value\.converter\.replace\.null\.with\.default: false"):
        decode_mutated("create_jsonb.noschema", lambda row: row_of(row).update(created_at=0))


@pytest.mark.parametrize("name", ["create_jsonb.schema", "create_jsonb.noschema"])
def test_a_created_at_of_0_is_a_dead_letter_with_schemas_too(name: str) -> None:
    # Review 49-f F5: with schemas (MicroTimestamp) a NULL written as the default 0 was
    # delivered stamped 1970-01-01 where the topic keeps records.
    with pytest.raises(DecodeError, match=r"is 0 \(1970-01-01\).*replace\.null\.with\.default"):
        decode_mutated(name, lambda row: row_of(row).update(created_at=0))


def test_an_iso_created_at_of_the_epoch_is_a_dead_letter_too() -> None:
    from cdc_router.router.connect_time import epoch_millis
    with pytest.raises(ValueError, match=r"is 0 \(1970-01-01\)"):
        epoch_millis("1970-01-01T00:00:00Z", "io.debezium.time.ZonedTimestamp")


def test_an_integer_created_at_in_nanoseconds_is_read_as_such_without_schemas() -> None:
    # Review 49-f F1: time.precision.mode=nanoseconds; 1796021196617825000 ns was read as
    # microseconds, the year 58900 (delivered so on Kafka 3.x's defaults).
    millis = 1_796_021_196_617
    said = decode_mutated("create_jsonb.noschema", lambda row: row_of(row).update(
        created_at=millis * 1_000_000 + 825_000))
    assert isinstance(said, OutboxEvent) and said.created_at_ms == millis
    micros = decode_mutated("create_jsonb.noschema", lambda row: row_of(row).update(
        created_at=millis * 1_000 + 825))
    assert isinstance(micros, OutboxEvent) and micros.created_at_ms == millis


def test_a_timestamp6_created_at_in_1970_names_the_unit_that_reads_it() -> None:
    # QA 44-a: '1970-01-01 00:00:00.001' in a timestamp(6) column (1000 us) was a letter whose
    # reason offered only created_at_unit: millis, which reads it as 00:00:01.
    with pytest.raises(DecodeError, match=r"as microseconds 1970-01-01T00:00:00\.001.*"
                       r"timestamp\(6\) column dated in 1970.*created_at_unit: micros"):
        decode_mutated("create_jsonb.noschema", lambda row: row_of(row).update(created_at=1000))
    said = decode_mutated("create_jsonb.noschema", lambda row: row_of(row).update(
        created_at=1000), created_at_unit="micros")
    assert isinstance(said, OutboxEvent) and said.created_at_ms == 1


@pytest.mark.parametrize(("micros", "as_millis"), [(94_694_400_000_000, "4970-09-30"),
                                                   (63_072_000_000_000, "3968-09-03")])
def test_a_timestamp6_created_at_before_1973_read_as_millis_is_a_decode_dead_letter(
        micros: int, as_millis: str) -> None:
    # QA 36-b F2: 1973-01-01 (under 10^14 us) was taken for milliseconds, the year 4970, and
    # delivered (ce_time too) or refused by the broker with a reason that did not name
    # source.created_at_unit.
    with pytest.raises(DecodeError, match=f"created_at column 'created_at' is {micros}, which as "
                       f"milliseconds is {as_millis}T.* and as microseconds 19(72|73)-01-01T.*"
                       r"source\.created_at_unit: micros"):
        decode_mutated("create_jsonb.noschema",
                       lambda row: row_of(row).update(created_at=micros))


def test_an_auto_created_at_up_to_2200_in_millis_is_still_read_as_millis() -> None:
    last = 7_258_118_399_999  # 2199-12-31T23:59:59.999 in milliseconds
    read = decode_mutated("create_jsonb.noschema",
                          lambda row: row_of(row).update(created_at=last))
    assert isinstance(read, OutboxEvent) and read.created_at_ms == last


def test_timestamp_zoned_from_timestamptz_column() -> None:
    text = row_of(record("create_json.schema")["value"])["created_at"]
    assert text.endswith("Z")  # io.debezium.time.ZonedTimestamp, UTC
    moment = datetime.fromisoformat(text)
    expected = calendar.timegm(moment.utctimetuple()) * 1000 + moment.microsecond // 1000
    assert event("create_json.schema").created_at_ms == expected
    assert event("create_json.noschema").created_at_ms == expected


def test_timestamp_millis_from_timestamp3_column() -> None:
    millis = row_of(record("create_text.schema")["value"])["created_at"]
    assert event("create_text.schema").created_at_ms == millis  # io.debezium.time.Timestamp
    assert event("create_text.noschema").created_at_ms == millis  # told apart by magnitude


def test_naive_iso_timestamp_is_utc() -> None:
    def naive(value: dict[str, Any]) -> None:
        row_of(value)["created_at"] = "2024-05-01T10:11:12.345678"

    decoded = decode_mutated("create_jsonb.noschema", naive)
    assert isinstance(decoded, OutboxEvent)
    assert decoded.created_at_ms == int(datetime(2024, 5, 1, 10, 11, 12, 345000,
                                                 tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize("name", ["create_bytea.schema", "snapshot_bytea.schema"])
def test_bytea_with_schema_is_recognised(name: str) -> None:
    decoded = event(name)
    assert decoded.payload == BYTEA
    assert not decoded.payload_is_json


def test_bytea_without_schema_needs_payload_type_bytes() -> None:
    assert event("create_bytea.noschema", payload_type="bytes").payload == BYTEA
    # Without a schema a base64 string looks like text: it is taken as JSON text (and the JSON
    # serializer will refuse it), which is why source.payload_type exists.
    assert event("create_bytea.noschema").payload_is_json


def test_bytea_hex_mode() -> None:
    decoded = event("create_bytea.hex", payload_type="bytes", binary_handling="hex")
    assert decoded.payload == BYTEA
    assert replace(event("create_bytea.schema"), lsn=None, tx_id=None) == \
        replace(decoded, lsn=None, tx_id=None)


def test_bytea_wrong_binary_handling_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="not valid base64") as raised:
        run("create_bytea.hex", payload_type="bytes")
    # QA 35-c: on a jsonb column the wrong setting is payload_type bytes: the reason says so.
    assert "or the column is not bytea: then source.payload_type json (or auto)" in \
        str(raised.value)


def test_bytea_base64_url_safe_mode() -> None:
    # QA 31-a: Debezium's base64-url-safe mode writes - and _ for + and /: a payload with those
    # bytes was a dead letter ("not valid base64"), others went through.
    rec = record("create_bytea.noschema")
    row_of(rec["value"])["payload"] = base64.urlsafe_b64encode(b"\xfb\xff" + BYTEA).decode()
    assert "-" in row_of(rec["value"])["payload"] or "_" in row_of(rec["value"])["payload"]

    def decoded(handling: str) -> OutboxEvent | Skipped:
        return decode_change(raw(rec["key"]), raw(rec["value"]), topic=rec["topic"],
                             settings=SourceSettings(topics=[rec["topic"]], payload_type="bytes",
                                                     binary_handling=handling))

    url_safe = decoded("base64-url-safe")
    assert isinstance(url_safe, OutboxEvent) and url_safe.payload == b"\xfb\xff" + BYTEA
    with pytest.raises(DecodeError, match="not valid base64"):
        decoded("base64")


@pytest.mark.parametrize("mode", MODES)
def test_snapshot_rows_are_routed_unless_disabled(mode: str) -> None:
    assert event(f"snapshot_jsonb.{mode}").op == "r"
    assert run(f"snapshot_jsonb.{mode}", snapshot_rows=False) == Skipped("snapshot_disabled")


@pytest.mark.parametrize("mode", MODES)
def test_update_is_skipped_or_fails(mode: str) -> None:
    assert run(f"update.{mode}") == Skipped("update")
    with pytest.raises(DecodeError, match="insert-only") as raised:
        run(f"update.{mode}", on_update="fail")
    # QA, session 26: its dead letter carried no dlq.event.id, although the row's id is known.
    assert raised.value.event_id == row_of(record(f"update.{mode}")["value"])["id"]


@pytest.mark.parametrize("mode", MODES)
def test_delete_and_its_tombstone_are_skipped(mode: str) -> None:
    assert run(f"delete.{mode}") == Skipped("delete")
    assert record(f"tombstone.{mode}")["value"] is None
    assert run(f"tombstone.{mode}") == Skipped("tombstone")


@pytest.mark.parametrize("mode", [*MODES, "hex"])
def test_heartbeats_are_skipped(mode: str) -> None:
    # On their own topic, which the router reads when a ^pattern source takes it in.
    result = run(f"heartbeat.{mode}", SourceSettings(topics=["^.*"]))
    assert isinstance(result, Skipped) and result.reason == "heartbeat"


@pytest.mark.parametrize("mode", MODES)
def test_an_insert_on_a_topic_under_the_heartbeat_prefix_is_an_event(mode: str) -> None:
    # QA 47-g F5: with a ^pattern source (unchecked at load), topics under the prefix had
    # every event skipped as a heartbeat, offsets committed past them, nothing said.
    rec = record(f"create_jsonb.{mode}")
    settings = SourceSettings(topics=["^qahb\\..*"], heartbeat_topic_prefix="qahb")
    decoded = decode_change(None, raw(rec["value"]), topic="qahb.public.outbox",
                            settings=settings)
    assert isinstance(decoded, OutboxEvent)
    heartbeat = decode_change(None, raw(record(f"heartbeat.{mode}")["value"]),
                              topic="qahb.public.outbox", settings=settings)
    assert isinstance(heartbeat, Skipped) and heartbeat.reason == "heartbeat"


@pytest.mark.parametrize("mode", MODES)
def test_heartbeat_recognised_by_shape_on_any_topic(mode: str) -> None:
    value = raw(record(f"heartbeat.{mode}")["value"])
    result = decode_change(None, value, topic="outbox.public.outbox",
                    settings=SourceSettings(topics=["outbox.public.outbox"]))
    assert isinstance(result, Skipped) and result.reason == "heartbeat"


@pytest.mark.parametrize("mode", [*MODES, "hex"])
@pytest.mark.parametrize("status", ["begin", "end"])
def test_transaction_metadata_is_skipped(status: str, mode: str) -> None:
    result = run(f"transaction_{status}.{mode}")
    assert isinstance(result, Skipped) and result.reason == "transaction_metadata"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("case", "aggregate_type"), [
    ("internal_topic", "__consumer_offsets"), ("path_traversal", "../x"),
    ("long_300", "A" * 300), ("crlf", "Order\r\nX-Injected: 1"), ("non_ascii", "Bestellung-Ü"),
])
def test_hostile_aggregate_types_decode_verbatim(case: str, aggregate_type: str,
                                                 mode: str) -> None:
    # Decoding does not judge values; routing refuses the topics they would build.
    assert event(f"hostile_{case}.{mode}").aggregate_type == aggregate_type


@pytest.mark.parametrize(("value", "reason"), [
    (b'{"before": null, "after": {"id": ', "malformed JSON at line 1"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b"[1, 2]", "the value is an array"),
    (b'"text"', "the value is a string"),
    (b'{"foo": 1}', "no 'op' field"),
    (b'{"op": "x", "after": {}}', "unknown Debezium op 'x'"),
    (b'{"op": "c", "after": null}', "no 'after' row"),
    (b'{"schema": {}, "payload": {"op": "c"}}', "no 'after' row"),
])
def test_malformed_records_are_decode_errors(value: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        decode_change(None, value, topic="t", settings=SourceSettings(topics=["t"]))


@pytest.mark.parametrize("body", [
    raw(record("create_jsonb.schema")["value"]),  # JsonSchemaConverter: framed JSON
    b"\x00\x02Hd3b1\xc8\x01\xfe\xff",  # AvroConverter: framed binary, not UTF-8
    b"",
])
def test_a_schema_registry_framed_value_names_the_converter_to_set(body: bytes | None) -> None:
    # Review 49-f F2: a JSON Schema record was "malformed JSON at line 1, column 1".
    framed = b"\x00" + (4242).to_bytes(4, "big") + (body or b"")
    with pytest.raises(DecodeError) as caught:
        decode_change(None, framed, topic="t", settings=SourceSettings(topics=["t"]))
    reason = str(caught.value)
    assert reason.startswith("the value starts with byte 0 and a 4-byte schema id (4242): it "
                             "looks like schema-registry framing")
    assert reason.endswith("on the connector, set value.converter=org.apache.kafka.connect."
                           "json.JsonConverter and value.converter.schemas.enable=false (as "
                           "connectors/outbox-connector.json has it)")
    with pytest.raises(DecodeError, match="malformed JSON"):  # too short for a schema id
        decode_change(None, b"\x00\x01", topic="t", settings=SourceSettings(topics=["t"]))


@pytest.mark.parametrize("value", [b'"{\\"orderId\\": 42}"', b"42", b"[]"])
def test_a_value_that_is_no_object_points_at_a_transform(
        value: bytes) -> None:
    # QA 35-a F3: the EventRouter SMT left on the connector: every letter said "the value is
    # a string, not an object", with no hint at the SMT (the unwrap case had one).
    with pytest.raises(DecodeError, match=r"not an object; a transform on the connector \(such "
                       r"as the EventRouter SMT\) may have reshaped it"):
        decode_change(None, value, topic="t", settings=SourceSettings(topics=["t"]))


def _drop(column: str) -> Any:
    return lambda value: row_of(value).pop(column)


def _set(column: str, new: Any) -> Any:
    return lambda value: row_of(value).__setitem__(column, new)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("mutate", "reason"), [
    (_drop("aggregatetype"), "column 'aggregatetype' .aggregate type. is missing"),
    (_drop("id"), "column 'id' .event id. is missing"),
    (_drop("payload"), "payload column 'payload' is missing"),
    (_set("aggregateid", None), "column 'aggregateid' .aggregate id. must be text"),
    (_set("type", {"nested": 1}), "column 'type' .event type. must be text, uuid or an integer, "
                                  "got an object"),
    (_set("type", ""), "is empty"),
    # QA, session 28: blank ids were delivered, and the idempotent consumer refused them.
    (_set("id", " "), "column 'id' .event id. is blank"),
    (_set("id", "\t\u3000"), "column 'id' .event id. is blank"),
    (_set("payload", None), "payload column 'payload' is null"),
    (_set("headers", "{not json"), "headers column 'headers' is not valid JSON"),
    (_set("headers", '["a"]'), "must be a JSON object of headers, got an array"),
    (_set("created_at", "yesterday"), "not an ISO-8601 timestamp"),
    (_set("created_at", True), "must be a timestamp"),
])
def test_bad_rows_are_decode_errors_naming_event_and_column(mutate: Any, reason: str,
                                                            mode: str) -> None:
    with pytest.raises(DecodeError, match=reason) as caught:
        decode_mutated(f"create_jsonb.{mode}", mutate)
    assert "\n" not in str(caught.value)


def test_a_numeric_id_sent_as_a_double_names_the_connectors_decimal_mode() -> None:
    # QA 35-a F2: numeric(20,2) aggregateid under decimal.handling.mode=double: every row a
    # letter saying "got a number", not what to change.
    with pytest.raises(DecodeError, match=r"column 'aggregateid' .aggregate id. must be text, "
                       r"uuid or an integer, got a number; .*decimal\.handling\.mode=double: "
                       r"set decimal\.handling\.mode=string on the connector") as caught:
        decode_mutated("create_jsonb.noschema", _set("aggregateid", 1001.1))
    assert caught.value.event_id is not None  # the letter names the event
    with pytest.raises(DecodeError, match=r"column 'id' .event id. .*decimal\.handling\.mode"):
        decode_mutated("create_jsonb.noschema", _set("id", 7.0))
    for other_value in ([1], {"scale": 0}, {"scale": 0, "value": "Kg==", "x": 1}):
        with pytest.raises(DecodeError) as other:
            decode_mutated("create_jsonb.noschema", _set("aggregateid", other_value))
        assert "decimal" not in str(other.value)


@pytest.mark.parametrize("column", ["aggregateid", "id"])
def test_a_numeric_id_sent_as_a_variable_scale_decimal_names_the_connectors_decimal_mode(
        column: str) -> None:
    # Review 49-f F6: a `numeric` id under decimal.handling.mode=precise (Debezium's default)
    # without schemas was "got an object", no word of the setting (apply warns of it).
    with pytest.raises(DecodeError) as caught:
        decode_mutated("create_jsonb.noschema", _set(column, {"scale": 0, "value": "Kg=="}))
    reason = str(caught.value)
    assert "must be text, uuid or an integer, got an object; a numeric column arrives as " \
           "Debezium's VariableScaleDecimal {scale, value}" in reason
    assert "decimal.handling.mode=precise, its default" in reason
    assert reason.endswith("set decimal.handling.mode=string on the connector (or make the "
                           "column text)")


def test_optional_columns_may_be_null_or_absent() -> None:
    decoded = decode_mutated("create_jsonb.noschema",
                             lambda v: (_set("headers", None)(v), _drop("created_at")(v),
                                        v.pop("ts_ms")))
    assert isinstance(decoded, OutboxEvent)
    assert decoded.headers == () and decoded.created_at_ms is None


@pytest.mark.parametrize("mode", MODES)
def test_without_created_at_the_record_takes_the_change_events_ts_ms_as_the_smt_does(
        mode: str) -> None:
    # Review 34: the SMT's own table has no created_at; the record took the router's clock.
    ts_ms = {"noschema": 1796021196710, "schema": 1796021197003}[mode]
    for mutate in (_drop("created_at"), _set("created_at", None)):
        decoded = decode_mutated(f"create_jsonb.{mode}", mutate)
        assert isinstance(decoded, OutboxEvent) and decoded.created_at_ms == ts_ms
    kept = decode_mutated(f"create_jsonb.{mode}", lambda v: None)
    assert isinstance(kept, OutboxEvent) and kept.created_at_ms == 1796021196617
    unset = decode_mutated(f"create_jsonb.{mode}", lambda v: None,
                           outbox={"created_at": None})
    assert isinstance(unset, OutboxEvent) and unset.created_at_ms == ts_ms


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ts_ms", [-1, 2**63, 2**63 + 5, 10**30])
def test_a_ts_ms_outside_kafkas_timestamps_leaves_the_record_to_the_producers_clock(
        mode: str, ts_ms: int) -> None:
    # Review 34-2: a ts_ms of 2^63+5 crashed the producer on a LogAppendTime topic.
    def mutate(value: dict[str, Any]) -> None:
        row_of(value).pop("created_at")
        (value["payload"] if mode == "schema" else value)["ts_ms"] = ts_ms

    decoded = decode_mutated(f"create_jsonb.{mode}", mutate)
    assert isinstance(decoded, OutboxEvent) and decoded.created_at_ms is None


def test_integer_ids_are_text() -> None:
    decoded = decode_mutated("create_jsonb.noschema", _set("aggregateid", 12345))
    assert isinstance(decoded, OutboxEvent) and decoded.aggregate_id == "12345"


def test_custom_column_names() -> None:
    def rename(value: dict[str, Any]) -> None:
        row = row_of(value)
        row["event_id"] = row.pop("id")
        row["kind"] = row.pop("type")
        row["body"] = row.pop("payload")

    columns = OutboxColumns(id="event_id", type="kind", payload="body", headers=None)
    decoded = decode_mutated("create_jsonb.noschema", rename, outbox=columns)
    assert isinstance(decoded, OutboxEvent)
    assert decoded.type == "OrderPaid" and json.loads(decoded.payload) == PAYLOAD
    assert decoded.headers == ()  # no headers column configured
    assert decoded.column("headers") is not None  # so it is one of the other columns


def test_expanded_json_payload_is_kept_as_compact_json() -> None:
    decoded = decode_mutated("create_jsonb.noschema", _set("payload", {"a": [1, "é"]}))
    assert isinstance(decoded, OutboxEvent)
    assert decoded.payload == '{"a":[1,"é"]}'.encode()


def test_header_and_column_values_of_every_json_kind_are_json_text() -> None:
    values: list[Any] = [3, -2**70, True, False, None, 1.5, 1e16, [1, "é"], {"k": None}, "text"]

    def fill(value: dict[str, Any]) -> None:
        row = row_of(value)
        row["headers"] = json.dumps({f"h{i}": v for i, v in enumerate(values)})
        row.update({f"c{i}": v for i, v in enumerate(values)})

    decoded = decode_mutated("create_jsonb.noschema", fill)
    assert isinstance(decoded, OutboxEvent)
    as_json = [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False,
                                                       separators=(",", ":")) for v in values]
    assert decoded.headers == tuple((f"h{i}", text) for i, text in enumerate(as_json))
    # A double column as Jackson wrote it into the change event (QA 46-b F1), not as JSON text.
    as_java = {1.5: "1.5", 1e16: "1.0E16"}
    assert [decoded.column(f"c{i}") for i in range(len(values))] == \
        [None if v is None else as_java.get(v, text) if type(v) is float else text
         for v, text in zip(values, as_json, strict=True)]


@pytest.mark.parametrize("mode", MODES)
def test_an_event_id_over_1024_bytes_is_a_decode_error_that_does_not_repeat_it(mode: str) -> None:
    # Review, session 26: a 600 KB id made the event's dead letter (key and dlq.event.id, the
    # id twice) too large for Kafka, and the batch was retried for ever.
    name = f"create_jsonb.{mode}"
    fits = decode_mutated(name, _set("id", "é" * 512))  # 1,024 bytes
    assert isinstance(fits, OutboxEvent) and fits.event_id == "é" * 512
    with pytest.raises(DecodeError, match=r"'id' \(event id\) is 1,026 bytes, over the 1,024") \
            as raised:
        decode_mutated(name, _set("id", "é" * 513))
    assert raised.value.event_id is None


def test_a_header_number_is_sent_as_the_row_wrote_it() -> None:
    # Review, session 27: header numbers went through a float: 1.10 was sent as "1.1" (and a
    # `match.header` on "1.10" missed), 12345678901234567890.5 as "1.2345678901234567e+19".
    def fill(value: dict[str, Any]) -> None:
        row_of(value)["headers"] = ('{"version": 1.10, "amount": 19.90, "exp": 1e+16, '
                                    '"big": 12345678901234567890.5, "nested": {"v": [1.50], '
                                    '"e": 1.5e3, "huge": 1E+400}}')

    decoded = decode_mutated("create_jsonb.noschema", fill)
    assert isinstance(decoded, OutboxEvent)
    # Review 34: a nested number was written as a Decimal (1.5e3 as 1.5E+3).
    assert dict(decoded.headers) == {"version": "1.10", "amount": "19.90", "exp": "1e+16",
                                     "big": "12345678901234567890.5",
                                     "nested": '{"v":[1.50],"e":1.5e3,"huge":1E+400}'}


@pytest.mark.parametrize(("text", "reason"), [
    ('{"v": NaN}', "is not valid JSON: NaN is not JSON"),
    # Fuzz 32-c: Python's own words were the reason ("use sys.set_int_max_str_digits()").
    ('{"v": ' + "9" * 4400 + "}", "holds an integer of over 4300 digits: valid JSON, but "
                                  "beyond what this router")])
def test_a_headers_column_json_cannot_hold_is_a_decode_error_with_the_event_id(
        text: str, reason: str) -> None:
    with pytest.raises(DecodeError, match=f"headers column 'headers' {reason}") as raised:
        decode_mutated("create_jsonb.noschema", lambda value: row_of(value).update(headers=text))
    assert raised.value.event_id is not None


@pytest.mark.parametrize(("value", "reason"), [
    (b'{"op": "c", "v": ' + b"9" * 4400 + b"}", "the value holds an integer of over 4300 "
                                               "digits: valid JSON, but beyond"),
    ("\ufeff{}".encode(), "the value is not valid JSON: it starts with a byte order mark")])
def test_an_envelope_python_cannot_read_is_worded_not_pythons_message(value: bytes,
                                                                       reason: str) -> None:
    # Fuzz 32-c: "... use sys.set_int_max_str_digits()", "... decode using utf-8-sig".
    with pytest.raises(DecodeError, match=reason):
        decode_change(None, value, topic="t", settings=SourceSettings(topics=["t"]))


def test_odd_connect_schemas_of_a_decimal_or_created_at_column_are_read_past() -> None:
    # Fuzz 32-c: a Decimal schema whose parameters were not an object raised AttributeError,
    # a created_at schema named by a list TypeError, as the records' reasons.
    def odd_schemas(value: dict[str, Any]) -> None:
        after = next(f for f in value["schema"]["fields"] if f["field"] == "after")
        for field in after["fields"]:
            if field["field"] == "aggregateid":
                field.update(name="org.apache.kafka.connect.data.Decimal", parameters="2")
            if field["field"] == "created_at":
                field["name"] = ["io.debezium.time.MicroTimestamp"]

    decoded = decode_mutated("create_jsonb.schema", odd_schemas)
    assert isinstance(decoded, OutboxEvent)
    assert decoded.aggregate_id == event("create_jsonb.schema").aggregate_id
    assert decoded.created_at_ms == event("create_jsonb.schema").created_at_ms


@pytest.mark.parametrize("where", ["envelope", "after"])
def test_an_envelope_schema_whose_fields_are_no_list_is_read_as_no_schema(where: str) -> None:
    # Review 47-a F4: a number there was dead-lettered as "TypeError: 'int' object is not
    # iterable", naming nothing.
    def odd_fields(value: dict[str, Any]) -> None:
        if where == "envelope":
            value["schema"]["fields"] = 5
        else:
            next(f for f in value["schema"]["fields"] if f["field"] == "after")["fields"] = 5

    decoded = decode_mutated("create_jsonb.schema", odd_fields)
    assert isinstance(decoded, OutboxEvent)
    assert decoded.event_id == event("create_jsonb.schema").event_id


def test_a_configured_optional_column_missing_from_the_rows_is_one_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # QA 34-e: `ALTER TABLE outbox RENAME COLUMN headers TO hdrs` dropped every row's headers,
    # with no line anywhere; a renamed created_at fell back to ts_ms as silently.
    from cdc_router.router import row_columns

    monkeypatch.setattr(row_columns, "_warned", set())

    def renamed(value: dict[str, Any]) -> None:
        row = row_of(value)
        row["hdrs"], row["made"] = row.pop("headers"), row.pop("created_at")

    with caplog.at_level(logging.WARNING, logger="cdc_router.router"):
        # First, while nothing was warned about: a NULL is no missing column (review 34-3).
        nulls = decode_mutated("create_jsonb.noschema",
                               lambda v: row_of(v).update(headers=None, created_at=None))
        assert isinstance(nulls, OutboxEvent) and caplog.records == []
        for _ in range(3):
            decoded = decode_mutated("create_jsonb.noschema", renamed)
            assert isinstance(decoded, OutboxEvent) and decoded.headers == ()
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("event=column_missing column=headers field=source.outbox.headers")
    assert "without the row's headers" in lines[0] and "or to null" in lines[0]
    assert lines[1].startswith("event=column_missing column=created_at "
                               "field=source.outbox.created_at")


@pytest.mark.parametrize(("number", "text"), [
    (1e20, "1.0E20"), (1e-5, "1.0E-5"), (123456789.0, "1.23456789E8"), (1e7, "1.0E7"),
    (12345678.9, "1.23456789E7"), (-2.5e-10, "-2.5E-10"), (9999999.0, "9999999.0"),
    (0.001, "0.001"), (1.5, "1.5"), (-0.0, "-0.0"), (0.30000000000000004, "0.30000000000000004"),
])
def test_a_double_column_reads_as_java_writes_it_as_the_smt_keys_by_it(
        number: float, text: str) -> None:
    # QA 46-b F1: a route keyed by a double precision column took Python's text (1e+20), the
    # SMT Java's (1.0E20): other key bytes, another partition for 6 of 12 rows.
    decoded = decode_mutated("create_jsonb.noschema",
                             lambda value: row_of(value).update(k_float=number))
    assert isinstance(decoded, OutboxEvent)
    assert decoded.column("k_float") == text
