"""The pure per-record step on real captured Debezium events: every outcome, every stage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc_router.config import compiled as compiled_module
from cdc_router.config.compiled import compile_config
from cdc_router.config.load import load_config
from cdc_router.config.model import RouterConfig
from cdc_router.config.routes import RouteRule
from cdc_router.errors import DecodeError, RouteError, SerializeError
from cdc_router.router import debezium, routing
from cdc_router.router.partitioner import java_default_partition
from cdc_router.router.step import DeadLettered, Duplicate, RecordStep, Routed, Skipped
from cdc_router.serde import Serializer, serializer_for
from cdc_router.serde.json import JsonSerializer
from tests.unit.router_fakes import FIXTURES, raw_event

AVRO = Path(__file__).parent / "fixtures" / "avro"
SOURCE = "outbox.public.outbox"
EVENT_ID = "73484e51-061a-454f-81ea-e90c17837bc9"


def step(*routes: dict[str, Any], partitions: dict[str, int] | None = None,
         seen: frozenset[str] = frozenset(), **top: Any) -> RecordStep:
    config = RouterConfig.model_validate({"source": {"topics": [SOURCE]},
                                          "routes": list(routes), **top})
    known = partitions if partitions is not None else {"orders": 6}
    return RecordStep(compile_config(config), known.get, seen=seen.__contains__)


def captured(name: str) -> bytes:
    return json.dumps(json.loads((FIXTURES / f"{name}.json").read_text("utf-8"))["value"]).encode()


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def test_a_captured_event_is_routed_with_its_record() -> None:
    result = step({"topic": "orders"})(SOURCE, None, captured("create_jsonb.noschema"))
    assert isinstance(result, Routed)
    record = result.record
    assert (record.topic, record.key) == ("orders", EVENT_ID.encode())
    assert record.partition == java_default_partition(b"order-42", 6)
    assert record.timestamp_ms == 1796021196617  # created_at, µs -> ms
    assert result.event.event_id == EVENT_ID


def test_record_timestamp_now_leaves_the_timestamp_to_the_producer() -> None:
    result = step({"topic": "orders"}, delivery={"record_timestamp": "now"})(
        SOURCE, None, captured("create_jsonb.noschema"))
    assert isinstance(result, Routed) and result.record.timestamp_ms is None


def test_skipped_and_duplicate() -> None:
    routed = step({"topic": "orders"}, seen=frozenset({EVENT_ID}))
    assert routed(SOURCE, b"k", None) == Skipped("tombstone")
    assert routed(SOURCE, None, captured("create_jsonb.noschema")) == Duplicate(EVENT_ID)
    unmatched = step({"match": {"type": "Nope"}, "topic": "orders"}, unmatched="skip")
    result = unmatched(SOURCE, None, captured("create_jsonb.noschema"))
    assert isinstance(result, Skipped) and result.reason == "unmatched"
    assert result.event is not None and result.event.event_id == EVENT_ID


def test_malformed_json_is_a_decode_dead_letter() -> None:
    result = step({"topic": "orders"})(SOURCE, b"k", b'{"op": "c", "after": {"id": ')
    assert isinstance(result, DeadLettered) and result.stage == "decode"
    assert type(result.error).__name__ == "DecodeError" and result.event_id is None


def test_headers_nested_3000_deep_is_a_decode_dead_letter_not_a_crash() -> None:
    value = raw_event("e-1", headers=nested(3000))
    result = step({"topic": "orders"})(SOURCE, None, value)
    assert isinstance(result, DeadLettered) and result.stage == "decode"
    assert isinstance(result.error, DecodeError) and "MAX_JSON_DEPTH" in str(result.error)
    assert result.event_id == "e-1"


@pytest.mark.parametrize("columns", [{"aggregate_type": ""}, {"event_type": ""},
                                     {"headers": '["not", "an", "object"]'},
                                     {"created_at_us": 2**80}])
def test_a_row_that_fails_after_its_id_names_the_id_for_dlq_list_and_replay(
        columns: dict[str, Any]) -> None:
    # dlq.event.id: `dlq list` shows it and `dlq replay --id` selects the letter by it.
    result = step({"topic": "orders"})(SOURCE, None, raw_event("e-7", **columns))
    assert isinstance(result, DeadLettered) and result.stage == "decode", result
    assert result.event_id == "e-7" and "event 'e-7'" in str(result.error)
    no_id = step({"topic": "orders"})(SOURCE, None, raw_event(""))
    assert isinstance(no_id, DeadLettered) and no_id.event_id is None


def test_a_payload_with_a_byte_order_mark_is_a_serialize_dead_letter_saying_so() -> None:
    # A text payload column may hold one; json.loads of bytes skipped it, Python's json.loads
    # of the consumer's text (and other parsers) refuse it.
    result = step({"topic": "orders"})(SOURCE, None, raw_event("e-9", payload='\ufeff{"a": 1}'))
    assert isinstance(result, DeadLettered) and result.stage == "serialize"
    assert "starts with a byte order mark (U+FEFF)" in str(result.error)


def test_a_payload_with_an_integer_python_cannot_read_is_not_called_invalid_json() -> None:
    # QA, session 30: Postgres took a 5,000-digit number; the reason said "not valid JSON".
    result = step({"topic": "orders"})(SOURCE, None,
                                       raw_event("e-10", payload='{"n": ' + "7" * 5000 + "}"))
    assert isinstance(result, DeadLettered), result
    assert "holds an integer of over 4300 digits: valid JSON" in str(result.error)


def test_payload_nested_3000_deep_is_a_serialize_dead_letter() -> None:
    result = step({"topic": "orders"})(SOURCE, None, raw_event("e-2", payload=nested(3000)))
    assert isinstance(result, DeadLettered) and result.stage == "serialize"
    assert isinstance(result.error, SerializeError) and result.event_id == "e-2"
    assert "MAX_JSON_DEPTH" in str(result.error)


def test_a_lone_surrogate_on_an_avro_route_is_a_serialize_dead_letter() -> None:
    route = {"topic": "payments", "format": "avro",
             "schema": str(AVRO / "payment_confirmed.avsc")}
    payload = json.dumps({"payment_id": "\ud800", "order_id": 1, "amount_cents": 5})
    result = step(route, partitions={"payments": 1})(
        SOURCE, None, raw_event("e-3", event_type="PaymentConfirmed", payload=payload))
    assert isinstance(result, DeadLettered) and result.stage == "serialize"
    assert isinstance(result.error, SerializeError) and "surrogate" in str(result.error)


def test_created_at_in_year_12000_on_a_cloudevents_route_is_a_route_dead_letter() -> None:
    year_12000_us = 316_592_000_000 * 1_000_000
    route = {"topic": "orders", "cloudevents": True, "ce_source": "/shop"}
    result = step(route)(SOURCE, None, raw_event("e-4", created_at_us=year_12000_us))
    assert isinstance(result, DeadLettered) and result.stage == "route"
    assert isinstance(result.error, RouteError) and "year 9999" in str(result.error)


@pytest.mark.parametrize("stage", ["decode", "route", "serialize"])
def test_an_unforeseen_exception_is_that_records_dead_letter(
        stage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure no check foresaw (a library's own exception) still ends as a dead letter."""
    def boom(*args: object, **kwargs: object) -> NoReturn:
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    target = {"decode": (debezium, "decode_change"), "route": (routing.Router, "route"),
              "serialize": (JsonSerializer, "serialize")}[stage]
    monkeypatch.setattr(*target, boom)
    result = step({"topic": "orders"})(SOURCE, None, raw_event("e-5"))
    assert isinstance(result, DeadLettered) and result.stage == stage
    assert isinstance(result.error, UnicodeEncodeError)


def test_a_missing_destination_is_a_route_dead_letter() -> None:
    result = step({"topic": "orders.{type}"})(SOURCE, None, captured("create_jsonb.noschema"))
    assert isinstance(result, DeadLettered) and result.stage == "route"
    assert isinstance(result.error, RouteError)
    assert "orders.OrderPaid does not exist" in str(result.error)


@pytest.mark.parametrize("failure", [
    KafkaException(KafkaError(KafkaError._TIMED_OUT, "metadata timed out")),
    MemoryError("out of memory"),
])
def test_process_level_failures_escape_instead_of_dead_lettering(failure: BaseException) -> None:
    config = RouterConfig.model_validate({"source": {"topics": [SOURCE]},
                                          "routes": [{"topic": "orders"}]})

    def broken_lookup(topic: str) -> int | None:
        raise failure

    with pytest.raises(type(failure)):
        RecordStep(compile_config(config), broken_lookup)(
            SOURCE, None, captured("create_jsonb.noschema"))


def test_the_step_reuses_the_serializers_compiled_at_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    def counting(rule: RouteRule, config: RouterConfig | None = None) -> Serializer:
        built.append(rule.format)
        return serializer_for(rule, config)

    monkeypatch.setattr(compiled_module, "serializer_for", counting)
    path = tmp_path / "router.yaml"
    path.write_text(f"source: {{topics: [{SOURCE}]}}\nroutes: [{{topic: orders}}]\n")
    step = RecordStep(load_config(path), {"orders": 6}.get)
    assert isinstance(step(SOURCE, None, captured("create_jsonb.noschema")), Routed)
    assert built == ["json"]  # once, at load: the step compiles nothing again


def test_an_event_that_outlasted_the_transaction_twice_is_a_dead_letter() -> None:
    # Review 44-2: one Avro payload took 74 s to encode; its batch's transaction (20 s)
    # expired, was aborted and read again, and the same event took 74 s again, for ever.
    config = RouterConfig.model_validate({"source": {"topics": [SOURCE]},
                                          "routes": [{"topic": "orders"}]})
    # Each try: (decoding begins, decoded, routed and serialized).
    ticks = iter([0.0, 0.1, 25.0,  # the first try: 25 s (a stopped process, perhaps)
                  30.0, 30.05, 30.1,  # another event: 0.1 s
                  40.0, 40.1, 70.0,  # the second try: 30 s, twice over the transaction's 20 s
                  80.0, 80.1])  # the third: decoded only
    slow = RecordStep(compile_config(config), {"orders": 6}.get, timer=lambda: next(ticks))
    value = captured("create_jsonb.noschema")
    assert isinstance(slow(SOURCE, None, value), Routed)  # once may be a stopped process
    other = json.loads(value)
    other["after"]["id"] = "another-event"
    assert isinstance(slow(SOURCE, None, json.dumps(other).encode()), Routed)
    again = slow(SOURCE, None, value)  # read again after its batch failed, slow again
    assert isinstance(again, DeadLettered) and again.stage == "serialize"
    assert isinstance(again.error, SerializeError)
    assert "took 30.0 s, twice longer than delivery.transaction_timeout_ms (20 s)" in \
        str(again.error)
    assert again.marked_id == EVENT_ID
    third = slow(SOURCE, None, value)  # without routing it again (no tick left for it)
    assert isinstance(third, DeadLettered)


def test_an_event_slower_to_decode_than_the_transaction_twice_is_dead_lettered_unread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 47-a: 13.5 MB of doubles of big exponents took 23 s to decode, outside the
    # timer of route(): the batch's transaction (20 s) expired at every read, for ever.
    config = RouterConfig.model_validate({"source": {"topics": [SOURCE]},
                                          "routes": [{"topic": "orders"}]})
    ticks = iter([0.0, 21.0, 21.0,  # the first read: decoded in 21 s
                  30.0, 30.05, 30.1,  # another event: 0.1 s
                  40.0, 62.0, 62.0])  # the second read: 22 s again
    slow = RecordStep(compile_config(config), {"orders": 6}.get, timer=lambda: next(ticks))
    value = captured("create_jsonb.noschema")
    other = json.loads(value)
    other["after"]["id"] = "another-event"
    assert isinstance(slow(SOURCE, None, value), Routed)  # once may be a stopped process
    assert isinstance(slow(SOURCE, None, json.dumps(other).encode()), Routed)
    second = slow(SOURCE, None, value)  # the decode's letter at once (review 47-f)
    assert isinstance(second, DeadLettered) and second.stage == "decode"
    decodes: list[bytes | None] = []
    monkeypatch.setattr(debezium, "decode_change",
                        lambda key, value, **_: decodes.append(value))  # never called
    third = slow(SOURCE, None, value)  # no tick left: not decoded, not timed
    assert isinstance(third, DeadLettered) and third.stage == "decode"
    assert "decoding it took 22.0 s, twice longer than delivery.transaction_timeout_ms " \
        "(20 s)" in str(third.error)
    assert third.event_id == EVENT_ID and decodes == []


def test_at_least_once_has_no_transaction_to_outlast() -> None:
    config = RouterConfig.model_validate({"source": {"topics": [SOURCE]},
                                          "routes": [{"topic": "orders"}],
                                          "delivery": {"guarantee": "at_least_once"}})
    ticks = iter([0.0, 50.0, 100.0, 100.0, 150.0, 200.0])
    slow = RecordStep(compile_config(config), {"orders": 6}.get, timer=lambda: next(ticks))
    value = captured("create_jsonb.noschema")
    assert isinstance(slow(SOURCE, None, value), Routed)
    assert isinstance(slow(SOURCE, None, value), Routed)
