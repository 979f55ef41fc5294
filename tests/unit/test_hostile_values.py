"""Hostile values in one row fail in their own stage with one readable reason, never a crash.

Each case is a real captured Debezium event with its row altered (fixtures/debezium/hostile_*,
see their "altered" note), put through decode_change() and Router.route() as the router does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from cdc_router.cli import main
from cdc_router.config.compiled import compile_config
from cdc_router.config.model import RouterConfig
from cdc_router.config.source import SourceSettings
from cdc_router.errors import DecodeError, JsonTooDeep, RouteError, SerializeError
from cdc_router.router.debezium import OutboxEvent, decode_change
from cdc_router.router.routing import OutboundRecord, Router, rfc3339
from cdc_router.serde.decode import PayloadDecodeError, PayloadDecoder
from cdc_router.serde.json import MAX_JSON_DEPTH, lone_surrogate, parse_json

FIXTURES = Path(__file__).parent / "fixtures" / "debezium"
MODES = ["schema", "noschema"]
YEAR_12000_MS = 316_516_204_800_000
# The captured lone-surrogate payload's fields, as an Avro record.
PAYMENT_SCHEMA = {"type": "record", "name": "Payment", "namespace": "shop", "fields": [
    {"name": "orderId", "type": "int"}, {"name": "amount", "type": "string"},
    {"name": "currency", "type": "string"}, {"name": "note", "type": "string"}]}


def captured(name: str) -> dict[str, Any]:
    """The captured record: topic, key, value (the envelope)."""
    loaded: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text("utf-8"))
    return loaded


def decoded(name: str, value: dict[str, Any] | None = None) -> OutboxEvent | Any:
    """decode_change() of the fixture's value, or of `value` (an altered copy) on its topic."""
    rec = captured(name)
    raw = json.dumps(value if value is not None else rec["value"]).encode()
    return decode_change(None, raw, topic=rec["topic"],
                         settings=SourceSettings(topics=[rec["topic"]]))


def event(name: str) -> OutboxEvent:
    result = decoded(name)
    assert isinstance(result, OutboxEvent), result
    return result


def route(event: OutboxEvent, **rule: Any) -> OutboundRecord:
    router = Router(compile_config(RouterConfig.model_validate(
        {"source": {"topics": ["outbox.public.outbox"]}, "routes": [{"topic": "t", **rule}]})))
    result = router.route(event, lambda topic: 3)
    assert isinstance(result, OutboundRecord), result
    return result


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and len(text) < 400, text
    return text


# --- JSON nested deeper than MAX_JSON_DEPTH ---------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_deep_payload_is_a_serialize_error_on_json_and_avro_routes(mode: str,
                                                                  tmp_path: Path) -> None:
    deep = event(f"hostile_deep_payload.{mode}")  # jsonb arrives as text: decoding is fine
    assert deep.payload.count(b"[") == 3000
    with pytest.raises(SerializeError, match=r"is JSON nested deeper than 256 levels") as caught:
        route(deep)
    one_line(caught.value)
    schema = tmp_path / "payment.avsc"
    schema.write_text(json.dumps(PAYMENT_SCHEMA))
    with pytest.raises(SerializeError, match=r"is JSON nested deeper than 256 levels"):
        route(deep, format="avro", schema=str(schema))


@pytest.mark.parametrize("mode", MODES)
def test_deep_headers_column_is_a_decode_error(mode: str) -> None:
    with pytest.raises(DecodeError, match=r"headers column 'headers' is JSON nested deeper "
                                          r"than 256 levels") as caught:
        decoded(f"hostile_deep_headers.{mode}")
    assert one_line(caught.value).startswith("event '")


def test_deep_expanded_payload_in_the_change_event_is_a_decode_error() -> None:
    # A payload column expanded into the envelope (e.g. by an SMT) nests in the event itself.
    value = captured("hostile_deep_payload.noschema")["value"]
    value["after"]["payload"] = json.loads("[" * 500 + "]" * 500)
    with pytest.raises(DecodeError, match=r"the value is JSON nested deeper than 259 levels: a "
                                          r"column holds more than 256"):
        decoded("hostile_deep_payload.noschema", value)


def test_depth_limit_is_exact_and_ignores_brackets_inside_strings() -> None:
    at_limit = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json(at_limit) == parse_json(at_limit.encode())
    for over in ("[" * 257 + "]" * 257, '{"a":' * 257 + "1" + "}" * 257):
        for text in (over, over.encode()):
            with pytest.raises(JsonTooDeep, match="nested deeper than 256 levels"):
                parse_json(text)
    brackets_in_text = json.dumps({"note": "[" * 5000, "quote\"[": ["]" * 10]})
    assert parse_json(brackets_in_text)["note"] == "[" * 5000
    assert parse_json(brackets_in_text.encode())["quote\"["] == ["]" * 10]


def _depth(value: Any) -> int:
    children = value.values() if isinstance(value, dict) else value
    if not isinstance(value, dict | list):
        return 0
    return 1 + max(map(_depth, children), default=0)


_TRICKY_TEXT = st.text(alphabet='[]{}"\\ ab\u00e9', max_size=6)
_JSON_VALUES = st.recursive(st.none() | st.integers() | _TRICKY_TEXT, lambda inner: st.lists(
    inner, max_size=3) | st.dictionaries(_TRICKY_TEXT, inner, max_size=3), max_leaves=40)


@given(_JSON_VALUES, st.booleans())
def test_measured_depth_is_the_real_depth(value: Any, ascii_only: bool) -> None:
    # Brackets, quotes and backslashes inside strings must not count: the cases that a
    # scan of the raw text gets wrong.
    text = json.dumps(value, ensure_ascii=ascii_only)
    depth = _depth(value)
    parse_json(text, max_depth=depth)
    parse_json(text.encode(), max_depth=depth)
    if depth:
        with pytest.raises(JsonTooDeep):
            parse_json(text.encode(), max_depth=depth - 1)


def test_consumer_side_decoder_refuses_deep_json() -> None:
    with pytest.raises(PayloadDecodeError, match="nested deeper than 256 levels"):
        PayloadDecoder().decode(b"[" * 3000 + b"]" * 3000)


# --- a lone surrogate -------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_lone_surrogate_payload_is_a_serialize_error_naming_the_field(mode: str,
                                                                     tmp_path: Path) -> None:
    hostile = event(f"hostile_lone_surrogate.{mode}")
    assert b"\\ud800" in hostile.payload  # a json column keeps the escape verbatim
    schema = tmp_path / "payment.avsc"
    schema.write_text(json.dumps(PAYMENT_SCHEMA))
    for rule in ({"format": "avro", "schema": str(schema)}, {}):
        with pytest.raises(SerializeError, match=r"payload field 'note' for 't' holds a lone "
                                                 r"UTF-16 surrogate") as caught:
            route(hostile, **rule)
        one_line(caught.value)
    # The same event with the surrogate's pair is fine on both.
    paired = OutboxEvent(**{**hostile.__dict__,
                            "payload": hostile.payload.replace(b"\\ud800", b"\\ud83d\\ude00")})
    assert route(paired).value == paired.payload
    assert route(paired, format="avro", schema=str(schema)).value


def test_lone_surrogate_paths() -> None:
    for text, path in ([r'{"a": [1, {"b": "\udfff"}]}', "a[1].b"], [r'"\ud800"', "(the value)"],
                       [r'{"\ud800": 1}', "a key in (the value)"]):
        assert lone_surrogate(text, json.loads(text)) == path
    escaped_backslash = r'{"a": "\\ud800"}'  # a backslash, then the letters: no surrogate
    assert lone_surrogate(escaped_backslash, json.loads(escaped_backslash)) is None


@pytest.mark.parametrize("mode", MODES)
def test_lone_surrogate_in_a_header_is_a_route_error(mode: str) -> None:
    hostile = event(f"hostile_lone_surrogate_header.{mode}")
    with pytest.raises(RouteError, match=r"header 'tenant' holds a lone UTF-16 surrogate") \
            as caught:
        route(hostile)
    one_line(caught.value)


def test_lone_surrogate_in_an_identifier_or_expanded_payload_is_a_decode_error() -> None:
    value = captured("create_json.noschema")["value"]
    value["after"]["aggregatetype"] = "Order\ud800"  # json.dumps escapes it: a hostile producer
    with pytest.raises(DecodeError, match=r"column 'aggregatetype' \(aggregate type\) holds a "
                                          r"lone UTF-16 surrogate"):
        decoded("create_json.noschema", value)
    value = captured("create_json.noschema")["value"]
    value["after"]["payload"] = {"note": "\ud800"}
    with pytest.raises(DecodeError, match=r"payload column 'payload' holds a lone UTF-16"):
        decoded("create_json.noschema", value)


# --- created_at outside years 1 to 9999 -------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_year_12000_on_a_cloudevents_route_is_a_route_error(mode: str) -> None:
    late = event(f"hostile_year_12000.{mode}")  # timestamp(6): MicroTimestamp
    assert late.created_at_ms == YEAR_12000_MS
    with pytest.raises(RouteError, match=r"created_at cannot be CloudEvents' ce_time: "
                                         r"316516204800000 ms since 1970 is after year 9999, and "
                                         r"RFC 3339 writes 4-digit years") as caught:
        route(late, cloudevents=True, ce_source="/orders")
    one_line(caught.value)
    assert route(late).timestamp_ms == YEAR_12000_MS  # no ce_time: the broker decides


@pytest.mark.parametrize("mode", MODES)
def test_year_12000_as_a_zoned_timestamp_is_a_decode_error(mode: str) -> None:
    with pytest.raises(DecodeError, match=r"created_at column 'created_at' is "
                                          r"'\+12000-01-01T00:00:00Z', outside the years 1 to "
                                          r"9999"):
        decoded(f"hostile_year_12000_tz.{mode}")


@pytest.mark.parametrize(("created_at", "reason"), [
    ("-0044-03-15T12:00:00Z", "outside the years 1 to 9999"),
    ("0000-01-01T00:00:00Z", "outside the years 1 to 9999"),  # review 47-a F8: Postgres's 1 BC
    (2**63 * 1000, "beyond any Kafka timestamp"),
])
def test_created_at_outside_what_the_router_represents(created_at: Any, reason: str) -> None:
    value = captured("create_json.noschema")["value"]
    value["after"]["created_at"] = created_at
    with pytest.raises(DecodeError, match=reason):
        decoded("create_json.noschema", value)


def test_rfc3339_covers_years_1_to_9999_with_four_digits() -> None:
    assert rfc3339(-62_135_596_800_000) == "0001-01-01T00:00:00.000Z"
    assert rfc3339(253_402_300_799_999) == "9999-12-31T23:59:59.999Z"
    assert rfc3339(-1) == "1969-12-31T23:59:59.999Z"
    for outside in (253_402_300_800_000, -62_135_596_800_001):
        with pytest.raises(ValueError, match="year"):
            rfc3339(outside)


EXAMPLE = Path(__file__).parents[2] / "cdc_router" / "examples" / "router.yaml"


def test_explain_shows_a_year_12000_event_without_crashing() -> None:
    # And, as the router does (QA, session 30), dead-letters it: Kafka 4's default topic
    # refuses a timestamp over an hour ahead.
    result = CliRunner().invoke(main, ["rules", "check", "-c", str(EXAMPLE), "--explain",
                                       str(FIXTURES / "hostile_year_12000.schema.json")])
    assert result.exit_code == 1, result.output
    assert "created_at 316516204800000 ms since 1970" in result.output
    assert "(stage produce): Kafka would refuse the record for orders.OrderPaid " \
        "(INVALID_TIMESTAMP)" in result.output
    declared_now = CliRunner().invoke(
        main, ["rules", "check", "-c", str(EXAMPLE), "--explain",
               str(FIXTURES / "hostile_year_12000.schema.json")],
        env={"CDC_ROUTER__DELIVERY__RECORD_TIMESTAMP": "now"})
    assert declared_now.exit_code == 0, declared_now.output


def test_explain_a_deep_event_file_is_a_decode_dead_letter(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"op": "c", "after": ' + "[" * 5000 + "]" * 5000 + "}")
    result = CliRunner().invoke(main, ["rules", "check", "-c", str(EXAMPLE), "--explain",
                                       str(deep)])
    assert result.exit_code == 1, result.output
    assert "(stage decode): the value is JSON nested deeper than 259 levels" in result.output


# --- reasons stay one line whatever the row holds ---------------------------------------------

def test_an_unknown_payload_key_with_a_line_break_is_escaped_in_the_reason(
        tmp_path: Path) -> None:
    schema = tmp_path / "payment.avsc"
    schema.write_text(json.dumps(PAYMENT_SCHEMA))
    payload = {"orderId": 42, "amount": "19.99", "currency": "EUR", "note": "n",
               "X-Injected:\r\n" + "k" * 300: 1}
    hostile = OutboxEvent(**{**event("create_json.noschema").__dict__,
                             "payload": json.dumps(payload).encode()})
    with pytest.raises(SerializeError, match=r"is not in the schema \(payload key "
                                             r"'X-Injected:\\r\\nkkk") as caught:
        route(hostile, format="avro", schema=str(schema))
    one_line(caught.value)


def test_an_envelope_without_op_names_its_keys_escaped() -> None:
    value = {"ts_ms": 1, "evil\nkey\ud800": 2}
    with pytest.raises(DecodeError, match=r"no 'op' field \(keys: 'evil\\nkey\\ud800', "
                                          r"'ts_ms'\)") as caught:
        decode_change(None, json.dumps(value).encode(), topic="t",
               settings=SourceSettings(topics=["t"]))
    one_line(caught.value)
    str(caught.value).encode("utf-8")  # a dead letter's reason header is UTF-8
