"""Routing real captured events: matching, topics, keys, partitions, headers, hostile inputs."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from cdc_router.cli import main
from cdc_router.config.compiled import compile_config
from cdc_router.config.model import RouterConfig
from cdc_router.config.source import SourceSettings
from cdc_router.config.topic_names import parse_topic_template, render_topic, static_topic
from cdc_router.errors import ConfigError, RouteError, SerializeError
from cdc_router.router.debezium import OutboxEvent, Skipped, decode_change
from cdc_router.router.missing_columns import MissingKeyColumn
from cdc_router.router.partitioner import java_default_partition
from cdc_router.router.routing import OutboundRecord, Router, rfc3339

FIXTURES = Path(__file__).parent / "fixtures" / "debezium"
SOURCE = "outbox.public.outbox"


def captured(name: str, **source: Any) -> OutboxEvent:
    rec = json.loads((FIXTURES / f"{name}.json").read_text("utf-8"))
    value = json.dumps(rec["value"]).encode()
    result = decode_change(None, value, topic=rec["topic"],
                    settings=SourceSettings(topics=[SOURCE], **source))
    assert isinstance(result, OutboxEvent)
    return result


ORDER = captured("create_jsonb.schema")  # Order / order-42 / OrderPaid, tenant acme-eu
PAYMENT = captured("create_json.noschema")  # Payment / pay-7 / PaymentConfirmed
DOCUMENT = captured("create_bytea.schema")  # Document / doc-9, bytea payload


def router(*routes: dict[str, Any], **top: Any) -> Router:
    return Router(compile_config(RouterConfig.model_validate(
        {"source": {"topics": [SOURCE]}, "routes": list(routes), **top})))


def record(rt: Router, event: OutboxEvent, partitions: int = 6) -> OutboundRecord:
    result = rt.route(event, lambda topic: partitions)
    assert isinstance(result, OutboundRecord), result
    return result


def test_default_route_builds_the_contract_record() -> None:
    out = record(router({"topic": "outbox.event.{aggregate_type}"}), ORDER)
    assert out.topic == "outbox.event.Order"
    assert out.key == ORDER.event_id.encode()
    assert out.partition == java_default_partition(b"order-42", 6)
    assert out.value == ORDER.payload
    assert out.timestamp_ms == ORDER.created_at_ms
    assert (out.event_id, out.route_index, out.format) == (ORDER.event_id, 0, "json")
    assert out.headers[:4] == (("id", ORDER.event_id.encode()), ("type", b"OrderPaid"),
                               ("aggregatetype", b"Order"), ("aggregateid", b"order-42"))
    assert dict(out.headers)["tenant"] == b"acme-eu"  # the row's own headers follow
    assert dict(out.headers)["attempt"] == b"3"


def test_every_template_field() -> None:
    out = record(router({"topic": "x.{aggregate_type}.{aggregate_id}.{type}.{id}"}), ORDER)
    assert out.topic == f"x.Order.order-42.OrderPaid.{ORDER.event_id}"


def test_first_matching_route_wins() -> None:
    rt = router({"match": {"aggregate_type": "Order*"}, "topic": "orders"},
                {"match": {"type": "OrderPaid"}, "topic": "paid"},
                {"topic": "rest"})
    assert record(rt, ORDER).topic == "orders"
    assert record(rt, PAYMENT).topic == "rest"
    found = rt.explain(PAYMENT)
    assert found is not None and found[0] == 2 and found[1].topic == "rest"


@pytest.mark.parametrize(("pattern", "matches"), [
    ("Order", True), ("order", False), ("Ord", False),            # exact, case-sensitive
    ("Ord*", True), ("O?der", True), ("[OP]rder", True), ("*x", False),  # glob
    ("re:Or.er", True), ("re:Or", False), ("re:(?i)ORDER", True),  # regex, full match
    (["Invoice", "Ord*"], True), (["Invoice", "Payment"], False),  # any of a list
])
def test_aggregate_type_patterns(pattern: Any, matches: bool) -> None:
    rt = router({"match": {"aggregate_type": pattern}, "topic": "hit"}, unmatched="skip")
    result = rt.route(ORDER, lambda topic: 1)
    assert isinstance(result, OutboundRecord) == matches
    assert (rt.explain(ORDER) is not None) == matches


def test_header_match_on_the_rows_headers() -> None:
    rt = router({"match": {"header": {"tenant": "acme-*"}}, "topic": "acme"},
                {"match": {"header": {"missing": "*"}}, "topic": "never"},
                {"topic": "rest"})
    assert record(rt, ORDER).topic == "acme"
    assert record(rt, replace(ORDER, headers=(("tenant", "other"),))).topic == "rest"


def test_all_conditions_must_hold() -> None:
    rt = router({"match": {"aggregate_type": "Order", "type": "OrderShipped"}, "topic": "a"},
                {"topic": "b"})
    assert record(rt, ORDER).topic == "b"


def test_unmatched_goes_to_dead_letter_or_is_skipped() -> None:
    with pytest.raises(RouteError, match="no route matches aggregate_type 'Payment'"):
        router({"match": {"type": "OrderPaid"}, "topic": "t"}).route(PAYMENT, lambda t: 1)
    skipping = router({"match": {"type": "OrderPaid"}, "topic": "t"}, unmatched="skip")
    assert skipping.route(PAYMENT, lambda t: 1) == Skipped("unmatched")


def test_an_event_missing_a_route_on_its_header_alone_is_said_so() -> None:
    # QA 55-a F-3: the reason named only the aggregate type and type, as if those had not
    # matched; a team debugging a header match could not tell why.
    rt = router({"match": {"type": "OrderShipped"}, "topic": "shipped"},
                {"match": {"type": "OrderPaid", "header": {"tenant": ["globex-*", "initech"]}},
                 "topic": "paid"},
                {"match": {"aggregate_type": "Order", "header": {"region": "eu"}},
                 "topic": "eu"})
    with pytest.raises(RouteError) as caught:
        rt.route(ORDER, lambda topic: 1)  # OrderPaid, tenant acme-eu, no region header
    assert str(caught.value) == (
        f"event {ORDER.event_id!r}: no route matches aggregate_type 'Order' type 'OrderPaid'; "
        "routes[1] takes its types but header 'tenant' is 'acme-eu', not 'globex-*', "
        "'initech'; routes[2] takes its types but the event has no header 'region' (the "
        "route wants 'eu')")
    with pytest.raises(RouteError) as caught:  # a type miss is not a header miss
        router({"match": {"type": "OrderShipped", "header": {"tenant": "x"}},
                "topic": "t"}).route(ORDER, lambda topic: 1)
    assert str(caught.value).endswith("no route matches aggregate_type 'Order' type 'OrderPaid'")


def test_explain_says_which_header_a_route_missed(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(json.dumps({
        "source": {"topics": [SOURCE]},
        "routes": [{"match": {"type": "OrderPaid", "header": {"tenant": "globex-*"}},
                    "topic": "paid"}]}))
    result = CliRunner().invoke(main, ["rules", "check", "-c", str(config), "--explain",
                                       str(FIXTURES / "create_jsonb.schema.json")])
    assert "routes[0] takes its types but header 'tenant' is 'acme-eu', not 'globex-*'" in \
        result.output, result.output


def test_explain_tells_a_key_column_the_table_lacks(tmp_path: Path) -> None:
    # QA 60-c F-2: `rules check --explain` gives the router's reason, which names the fix.
    config = tmp_path / "router.yaml"
    config.write_text(json.dumps({"source": {"topics": [SOURCE]},
                                  "routes": [{"topic": "t", "key": "regoin"}]}))
    result = CliRunner().invoke(main, ["rules", "check", "-c", str(config), "--explain",
                                       str(FIXTURES / "create_jsonb.schema.json")])
    assert result.exit_code == 1, result.output
    assert "key column 'regoin' of routes[0] is not a column of the row, whose other columns " \
           "are 'tenant': routes[0].key names a column the table does not have" in \
           " ".join(result.output.split()), result.output


@pytest.mark.parametrize(("key", "expected"), [
    ("id", ORDER.event_id), ("aggregate_id", "order-42"), ("aggregateid", "order-42"),
    ("type", "OrderPaid"), ("tenant", "acme-eu"),
])
def test_key_options(key: str, expected: str) -> None:
    assert record(router({"topic": "t", "key": key}), ORDER).key == expected.encode()


def test_key_column_missing_or_null_is_a_route_error() -> None:
    # QA 60-c F-2: a column the row does not have (the config's fault) and a NULL in a real
    # column (the row's) had one reason, "is missing or null in the row".
    with pytest.raises(MissingKeyColumn, match=r"key column 'region' of routes\[0\] is not a "
                       r"column of the row, whose other columns are 'tenant'") as absent:
        router({"topic": "t", "key": "region"}).route(ORDER, lambda t: 1)
    assert (absent.value.column, absent.value.index) == ("region", 0)
    assert isinstance(absent.value, RouteError)  # still the event's letter at stage route
    with pytest.raises(RouteError, match=r"key column 'tenant' of routes\[0\] is null in the row"
                       ) as null:
        router({"topic": "t", "key": "tenant"}).route(PAYMENT, lambda t: 1)  # tenant is null
    assert not isinstance(null.value, MissingKeyColumn)


def test_payload_column_cannot_be_the_key() -> None:
    with pytest.raises(ConfigError, match=r"routes\[0\].key"):
        router({"topic": "t", "key": "payload"})


def test_partition_options() -> None:
    by_key = record(router({"topic": "t", "partition": "key", "key": "aggregate_id"}), ORDER, 7)
    assert by_key.partition == java_default_partition(b"order-42", 7)
    asked: list[str] = []

    def partitions_for(topic: str) -> int:
        asked.append(topic)
        return 1

    default = router({"topic": "t", "partition": "kafka_default"}).route(ORDER, partitions_for)
    assert isinstance(default, OutboundRecord) and default.partition is None and asked == []


def test_events_of_one_aggregate_share_a_partition() -> None:
    rt = router({"topic": "t"})
    partitions = {record(rt, replace(ORDER, event_id=f"e{i}"), 12).partition for i in range(50)}
    assert partitions == {java_default_partition(b"order-42", 12)}


def test_topic_without_partitions_is_a_route_error() -> None:
    with pytest.raises(RouteError, match="has no partitions"):
        router({"topic": "t"}).route(ORDER, lambda topic: 0)


@pytest.mark.parametrize(("case", "reason"), [
    ("internal_topic", "starts with '__'"),
    ("path_traversal", r"illegal characters '/'"),
    ("long_300", "at most 249 characters"),
    ("crlf", "illegal characters"),
    ("non_ascii", "illegal characters 'Ü'"),
])
@pytest.mark.parametrize("mode", ["schema", "noschema"])
def test_hostile_aggregate_types_never_make_a_bad_topic(case: str, reason: str,
                                                        mode: str) -> None:
    event = captured(f"hostile_{case}.{mode}")
    with pytest.raises(RouteError, match=reason) as caught:
        router({"topic": "{aggregate_type}"}).route(event, lambda topic: 1)
    assert "\n" not in str(caught.value) and "\r" not in str(caught.value)
    assert len(str(caught.value)) < 400  # the 300 characters are cut in the message


def test_path_traversal_inside_a_template_is_refused() -> None:
    event = captured("hostile_path_traversal.noschema")
    with pytest.raises(RouteError, match="illegal characters '/'"):
        router({"topic": "outbox.event.{aggregate_type}"}).route(event, lambda t: 1)


@pytest.mark.parametrize("aggregate_type", ["dlq", "dedup", "public.outbox"])
def test_template_cannot_reach_the_routers_own_topics(aggregate_type: str) -> None:
    rt = router({"topic": "{type}.{aggregate_type}"})
    target = {"dlq": "cdc-router", "dedup": "cdc-router", "public.outbox": "outbox"}
    event = replace(ORDER, type=target[aggregate_type], aggregate_type=aggregate_type)
    with pytest.raises(RouteError, match="one of the router's own topics"):
        rt.route(event, lambda t: 1)


def refused(rt: Router, aggregate_type: str) -> str:
    """The reason `rt` refuses the event whose aggregate type renders the topic."""
    with pytest.raises(RouteError) as caught:
        rt.route(replace(ORDER, aggregate_type=aggregate_type), lambda t: 1)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"event {ORDER.event_id!r}: routes[0]")
    return message


@pytest.mark.parametrize("name", ["connect-configs", "connect-offsets", "connect-status",
                                  "_schemas"])
def test_kafka_connect_and_registry_topics_are_protected_by_default(name: str) -> None:
    assert f"{name!r} is protected by protected_topics entry {name!r}" in refused(
        router({"topic": "{aggregate_type}"}), name)


@pytest.mark.parametrize("name", ["__consumer_offsets", "__transaction_state",
                                  "__debezium-heartbeat.outbox"])
def test_internal_topics_are_refused(name: str) -> None:
    assert "starts with '__', which marks Kafka's internal topics" in refused(
        router({"topic": "{aggregate_type}"}), name)


def test_protected_topics_replace_the_defaults_and_take_globs() -> None:
    rt = router({"topic": "{aggregate_type}"}, protected_topics=["prod-connect-*", "re:_.*"])
    assert "protected by protected_topics entry 'prod-connect-*'" in refused(
        rt, "prod-connect-offsets")
    assert "protected by protected_topics entry 're:_.*'" in refused(rt, "_schemas")
    assert record(rt, ORDER, 1).topic == "Order"
    assert record(rt, replace(ORDER, aggregate_type="connect-offsets"), 1).topic == \
        "connect-offsets"  # not this cluster's Connect topic any more
    assert "starts with '__'" in refused(rt, "__consumer_offsets")  # always
    assert "one of the router's own topics" in refused(rt, SOURCE)  # always


@pytest.mark.parametrize("name", [SOURCE, "outbox.other.outbox", "outbox.x"])
def test_a_regex_source_protects_every_name_it_subscribes_to(name: str) -> None:
    rt = Router(compile_config(RouterConfig.model_validate(
        {"source": {"topics": [r"^outbox\..*"]}, "routes": [{"topic": "{aggregate_type}"}]})))
    assert (f"{name!r} matches source pattern '^outbox\\\\..*', that is one of the router's "
            "own topics (source.topics): it would consume its own output") in refused(rt, name)
    assert record(rt, replace(ORDER, aggregate_type="outboxes")).topic == "outboxes"


def test_dead_letter_and_changelog_are_refused_naming_the_setting() -> None:
    rt = router({"topic": "{aggregate_type}"}, dead_letter={"topic": "dlq"},
                dedup={"changelog_topic": "seen"})
    assert "'dlq' is one of the router's own topics (its dead-letter topic, dead_letter.topic)" \
        in refused(rt, "dlq")
    assert "(its dedup changelog, dedup.changelog_topic)" in refused(rt, "seen")


def test_allowed_topics_limit_templated_routes() -> None:
    rt = router({"topic": "events.{aggregate_type}"},
                allowed_topics=["events.Order*", "re:events\\.(Payment|Invoice)"])
    assert record(rt, ORDER).topic == "events.Order"
    assert record(rt, PAYMENT).topic == "events.Payment"
    assert ("'events.Shipment' matches none of allowed_topics ('events.Order*', "
            "'re:events\\\\.(Payment|Invoice)'); add a pattern for it there, or change the "
            "route's topic") in refused(rt, "Shipment")
    protected = router({"topic": "{aggregate_type}"}, allowed_topics=["*"])
    assert "is protected" in refused(protected, "connect-status")  # allowed never overrides


_LEGAL = re.compile(r"[a-zA-Z0-9._-]{1,249}")


@given(st.text(max_size=300))
def test_no_aggregate_type_yields_an_illegal_topic(aggregate_type: str) -> None:
    rt = router({"topic": "{aggregate_type}"})
    try:
        result = rt.route(replace(ORDER, aggregate_type=aggregate_type), lambda topic: 3)
    except RouteError as error:
        assert "\n" not in str(error)
        return
    assert isinstance(result, OutboundRecord)
    assert _LEGAL.fullmatch(result.topic) and result.topic not in (".", "..")
    assert not result.topic.startswith("__")
    assert result.topic not in {SOURCE, "cdc-router.dlq", "cdc-router.dedup", "connect-configs",
                                "connect-offsets", "connect-status", "_schemas"}


def test_payload_over_the_limit_is_a_route_error() -> None:
    rt = router({"topic": "t"}, delivery={"max_payload_bytes": 50})
    with pytest.raises(RouteError, match=r"over delivery\.max_payload_bytes") as refused:
        rt.route(ORDER, lambda t: 1)
    # QA 57-b F-4: the reason named the field and the value, not what to do.
    assert str(refused.value).endswith(
        "over delivery.max_payload_bytes (50): raise it, kafka.producer.message.max.bytes and the "
        "max.message.bytes of t above the payload, or shrink it; then `cdc-router dlq replay` it")


def test_cloudevents_binary_mode_headers() -> None:
    rt = router({"topic": "t", "cloudevents": True, "ce_source": "/orders"})
    headers = dict(record(rt, ORDER).headers)
    assert headers["ce_specversion"] == b"1.0"
    assert headers["ce_id"] == ORDER.event_id.encode()
    assert headers["ce_type"] == b"OrderPaid"
    assert headers["ce_source"] == b"/orders"
    assert ORDER.created_at_ms is not None
    assert headers["ce_time"] == rfc3339(ORDER.created_at_ms).encode()
    assert headers["content-type"] == b"application/json"
    assert dict(record(rt, DOCUMENT).headers)["content-type"] == b"application/octet-stream"


def test_cloudevents_on_an_avro_route_say_the_value_is_avro(tmp_path: Path) -> None:
    # Review, session 27: README's own CloudEvents + Avro route labelled its Avro records
    # application/json (decided by the payload column, not the record's encoding).
    schema = tmp_path / "order.avsc"
    schema.write_text(json.dumps({"type": "record", "name": "Order", "fields": [
        {"name": name, "type": "string"} for name in ("note", "amount", "currency")] + [
        {"name": "orderId", "type": "long"}]}))
    rt = router({"topic": "t", "cloudevents": True, "ce_source": "/orders", "format": "avro",
                 "schema": str(schema)})
    out = record(rt, ORDER)
    assert out.value[:2] == b"\xc3\x01"  # Avro single-object encoding
    assert dict(out.headers)["content-type"] == b"application/avro"


def test_rfc3339() -> None:
    assert rfc3339(1_714_558_272_123) == "2024-05-01T10:11:12.123Z"
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"


def test_static_route_headers_follow_the_rows() -> None:
    headers = record(router({"topic": "t", "headers": {"producer": "cdc-router"}}), ORDER).headers
    assert headers[-1] == ("producer", b"cdc-router")


def test_a_static_route_header_replaces_a_row_header_of_its_name() -> None:
    # QA, session 30: both went out, and a consumer saw the one its client picks.
    row = replace(ORDER, headers=(("producer", "app"), ("trace", "t-1")))
    headers = record(router({"topic": "t", "headers": {"producer": "cdc-router"}}), row).headers
    assert [(name, value) for name, value in headers if name in ("producer", "trace")] == [
        ("trace", b"t-1"), ("producer", b"cdc-router")]


def test_row_header_may_not_shadow_a_contract_header() -> None:
    with pytest.raises(RouteError, match="row header 'id' is reserved for the router"):
        router({"topic": "t"}).route(replace(ORDER, headers=(("id", "spoof"),)), lambda t: 1)


@pytest.mark.parametrize("cloudevents", [False, True])
@pytest.mark.parametrize("name", ["ce_id", "ce_subject", "ce_dataschema"])
def test_row_ce_headers_are_refused_on_every_route(name: str, cloudevents: bool) -> None:
    # A consumer reads every ce_* header as a CloudEvents attribute: a row's ce_id would pose
    # as the event id. The same rule refuses them among a route's static headers.
    route = {"topic": "t", **({"cloudevents": True, "ce_source": "/o"} if cloudevents else {})}
    with pytest.raises(RouteError, match=f"row header '{name}' is reserved for the router"):
        router(route).route(replace(ORDER, headers=((name, "spoof"),)), lambda t: 1)


def test_a_rows_content_type_is_refused_only_on_a_cloudevents_route() -> None:
    row = replace(ORDER, headers=(("content-type", "text/plain"),))
    assert dict(record(router({"topic": "t"}), row).headers)["content-type"] == b"text/plain"
    with pytest.raises(RouteError, match="row header 'content-type' is reserved"):
        router({"topic": "t", "cloudevents": True, "ce_source": "/o"}).route(row, lambda t: 1)


def test_json_payload_is_checked_and_bytes_pass_through() -> None:
    rt = router({"topic": "t"})
    assert record(rt, DOCUMENT).value == b"\x00\x01\xfe\xffbinary\x80"
    for bad in (b"{not json", b'{"a": NaN}'):
        with pytest.raises(SerializeError, match="not valid JSON"):
            rt.route(replace(ORDER, payload=bad), lambda t: 1)


@pytest.mark.parametrize("payload", [b'{"x": 1e400}', b'{"x": -1e400}'])
def test_a_json_payload_number_beyond_a_double_is_a_serialize_error(payload: bytes) -> None:
    # QA 36-b F1: delivered, where NaN was refused; Go's and Rust's readers refuse it too.
    with pytest.raises(SerializeError, match=r"payload for 't' holds a number beyond a double "
                                             r"\('-?1e400'\)"):
        router({"topic": "t"}).route(replace(ORDER, payload=payload), lambda t: 1)


def test_bytea_read_as_text_fails_in_the_json_serializer() -> None:
    wrong = captured("create_bytea.noschema")  # payload_type auto without schema: base64 text
    with pytest.raises(SerializeError):
        router({"topic": "t"}).route(wrong, lambda t: 1)


def test_record_before_1970_is_a_route_error() -> None:
    with pytest.raises(RouteError, match=r"before 1970.*set delivery\.record_timestamp: now"):
        router({"topic": "t"}).route(replace(ORDER, created_at_ms=-5), lambda t: 1)
    # QA session 27-a: with record_timestamp now the record carries the producer's clock, so
    # a created_at before 1970 is no reason to refuse it (no setting could deliver it).
    now = router({"topic": "t"}, delivery={"record_timestamp": "now"})
    assert isinstance(now.route(replace(ORDER, created_at_ms=-5), lambda t: 1), OutboundRecord)


def test_an_avro_route_without_its_schema_file_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"routes\[0\].schema.*s.avsc: file not found"):
        router({"topic": "t", "format": "avro", "schema": "s.avsc"})


def explain(*args: str) -> tuple[int, str]:
    config = Path(__file__).parents[2] / "cdc_router" / "examples" / "router.yaml"
    result = CliRunner().invoke(main, ["rules", "check", "-c", str(config), *args])
    return result.exit_code, result.output


def test_rules_check_warns_of_a_route_to_a_fixed_topic_not_declared(tmp_path: Path) -> None:
    # QA 43-a F1: "valid", exit 0, and every event of the route would be a dead letter.
    config = tmp_path / "router.yaml"
    config.write_text(json.dumps({
        "source": {"topics": ["outbox.public.outbox"]},
        "routes": [{"match": {"aggregate_type": "Customer"}, "topic": "qa.customerz"},
                   {"match": {"aggregate_type": "Order"}, "topic": "declared"},
                   {"topic": "orders.{type}"}],
        "topics": [{"name": "declared", "partitions": 3}]}))
    result = CliRunner().invoke(main, ["rules", "check", "-c", str(config)])
    assert result.exit_code == 0, result.output
    warned = [line for line in result.output.splitlines() if "sends to topic" in line]
    assert warned == [
        "warning: routes[0] sends to topic qa.customerz, which is not declared under `topics:` "
        "(if it is created otherwise, `rules check --cluster` asks Kafka): the router never "
        "creates topics, so every event this route takes would be a dead letter; declare it "
        "and run `cdc-router topics apply`"]


def test_explain_shows_the_route_and_record() -> None:
    code, output = explain("--explain", str(FIXTURES / "create_jsonb.schema.json"),
                           "--partitions", "6", "-o", "json")
    assert code == 0, output
    [result] = json.loads(output)["events"]
    assert result["outcome"] == "routed" and result["route"]["index"] == 0
    assert result["record"]["topic"] == "orders.OrderPaid"
    assert result["record"]["key"] == ORDER.event_id
    assert result["record"]["partition"] == java_default_partition(b"order-42", 6)
    assert ["aggregateid", "order-42"] in result["record"]["headers"]
    assert json.loads(result["record"]["value"]) == json.loads(ORDER.payload)


@pytest.mark.parametrize("fixture", ["create_jsonb.noschema.json", "create_jsonb.schema.json"])
@pytest.mark.parametrize("value_field", ["value", "payload"])
def test_explain_reads_a_captured_value_written_as_text(tmp_path: Path, fixture: str,
                                                        value_field: str) -> None:
    # Review 50-d F16: kcat -J's {topic, key, payload} and a {topic, key, value} whose value
    # is the record's text were dead letters "not a Debezium change event".
    capture = tmp_path / "capture.json"
    capture.write_text(json.dumps({
        "topic": "outbox.public.outbox", "partition": 0, "offset": 5, "tstype": "create",
        "ts": 1, "broker": 1, "key": json.dumps({"id": ORDER.event_id}),
        value_field: json.dumps(json.loads((FIXTURES / fixture).read_text())["value"])}))
    code, output = explain("--explain", str(capture), "-o", "json")
    assert code == 0, output
    [result] = json.loads(output)["events"]
    assert result["outcome"] == "routed", result
    assert result["record"]["topic"] == "orders.OrderPaid"


@pytest.mark.parametrize("producer, partition, said", [
    ({}, java_default_partition(ORDER.event_id.encode(), 6),
     "the producer's murmur2_random: murmur2 of the key"),
    ({"partitioner": "murmur2"}, java_default_partition(ORDER.event_id.encode(), 6),
     "the producer's murmur2: murmur2 of the key"),
    ({"partitioner": "fnv1a_random"}, None, "the producer's fnv1a_random, when it sends")])
def test_explain_shows_the_producers_partition_of_a_kafka_default_route(
        tmp_path: Path, producer: dict[str, str], partition: int | None, said: str) -> None:
    # Review 50-b F8: `partition: kafka_default` printed "partition None"; the router's
    # producer puts such a record where murmur2 of the key says (its partitioner).
    config = yaml.safe_load((Path(__file__).parents[2] / "cdc_router" / "examples" /
                             "router.yaml").read_text())
    config["routes"][0]["partition"] = "kafka_default"
    config["kafka"] = {**config.get("kafka", {}), "producer": producer}
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(config))
    args = ["rules", "check", "-c", str(path), "--explain",
            str(FIXTURES / "create_jsonb.schema.json"), "--partitions", "6"]
    result = CliRunner().invoke(main, [*args, "-o", "json"])
    assert result.exit_code == 0, result.output
    [explained] = json.loads(result.output)["events"]
    assert (explained["record"]["partition"], explained["record"]["partitioner"]) == \
        (partition, said)
    text = CliRunner().invoke(main, args).output
    shown = "chosen" if partition is None else str(partition)
    assert f"record    topic orders.OrderPaid, partition {shown} ({said}), key " in text
    assert "None" not in text


def test_explain_skipped_and_dead_letter_outcomes(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_bytes(b'{"op": "c", "after": {"id": ')
    code, output = explain("--explain", str(FIXTURES / "tombstone.noschema.json"),
                           "--explain", str(FIXTURES / "hostile_path_traversal.schema.json"),
                           "--explain", str(broken))
    assert code == 1  # some event would be dead-lettered
    assert "skipped   tombstone" in output
    assert "dead letter to cdc-router.dlq (stage route)" in output and "illegal characters '/'" \
        in output
    assert "(stage decode): malformed JSON at line 1" in output


def test_explain_dead_letters_a_row_older_than_a_declared_retention(tmp_path: Path) -> None:
    # QA, session 30: explain showed the record; the router dead-letters it at stage produce
    # (Kafka would delete it within minutes). The fixture's row is from 2026-11-30.
    config = yaml.safe_load((Path(__file__).parents[2] / "cdc_router" / "examples" /
                             "router.yaml").read_text())
    config["topics"] = [{"name": "orders.OrderPaid", "config": {"retention.ms": "3600000"}}]
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(main, ["rules", "check", "-c", str(path), "--explain",
                                       str(FIXTURES / "create_jsonb.schema.json")])
    assert result.exit_code == 1, result.output
    assert "(stage produce): its timestamp 2026-11-30" in result.output
    assert "retention.ms of orders.OrderPaid (3600000)" in result.output


def test_explain_bare_value_file(tmp_path: Path) -> None:
    bare = tmp_path / "value.json"
    bare.write_text(json.dumps(json.loads(
        (FIXTURES / "create_jsonb.noschema.json").read_text("utf-8"))["value"]), "utf-8")
    code, output = explain("--explain", str(bare))
    assert code == 0, output
    assert "(from outbox.public.outbox)" in output
    assert "record    topic orders.OrderPaid, partition " in output


def test_explain_with_a_relay_only_config_routes_the_event(tmp_path: Path) -> None:
    # QA, session 26: a config with no source topic (the relay's) ended in a traceback.
    config = tmp_path / "relay.yaml"
    config.write_text("source: {group_id: shop}\nroutes: [{topic: 'outbox.event.{type}'}]\n"
                      "relay: {table: public.outbox}\n", "utf-8")
    result = CliRunner().invoke(main, ["rules", "check", "-c", str(config), "--explain",
                                       str(FIXTURES / "create_jsonb.noschema.json"), "-o", "json"])
    # exit 1: the destination is not declared, so the event would be dead-lettered
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    [explained] = json.loads(result.output)["events"]
    assert explained["event"]["type"] == "OrderPaid"
    assert explained["route"]["topic"] == "outbox.event.{type}"


def test_explain_says_dead_letter_for_a_destination_the_router_would_find_missing(
        tmp_path: Path) -> None:
    # The default route renders outbox.event.Invoice, which the example config does not
    # declare: the router dead-letters such an event, so the explanation must say so.
    code, output = explain("--explain", str(FIXTURES / "create_text.noschema.json"), "-o", "json")
    assert code == 1, output
    [result] = json.loads(output)["events"]
    assert result["outcome"] == "dead_letter" and result["stage"] == "route"
    assert "outbox.event.Invoice is not declared under `topics:`" in result["reason"]
    assert "`rules check --cluster` asks Kafka" in result["reason"]
    assert result["route"]["index"] == 2


def test_explain_in_json_of_an_event_whose_header_holds_a_lone_surrogate_is_a_document(
        tmp_path: Path) -> None:
    # QA 60-c F-3: a header '{"h": "\\ud800"}' ended `-o json` in a UnicodeEncodeError (the
    # whole run's document lost); text output said the event is a dead letter.
    capture = json.loads((FIXTURES / "create_text.noschema.json").read_text())
    capture["value"]["after"]["headers"] = '{"h": "\\ud800"}'
    event = tmp_path / "lone.json"
    event.write_text(json.dumps(capture))
    code, output = explain("--explain", str(event), "-o", "json")
    assert code == 1, output
    [result] = json.loads(output)["events"]
    assert result["outcome"] == "dead_letter" and result["stage"] == "route"
    assert "header 'h' holds a lone UTF-16 surrogate" in result["reason"]
    assert output.isascii(), "every non-ASCII character escaped in this one"


def test_one_rendering_serves_static_topics_avro_planning_and_events() -> None:
    pieces = parse_topic_template("orders.{type}.{aggregate_id}")
    assert render_topic(parse_topic_template("orders.paid"), {}) == "orders.paid"
    assert render_topic(pieces, {}) is None  # row data fills it
    assert static_topic("orders.paid") and not static_topic("orders.{type}.{aggregate_id}")
    assert render_topic(pieces, {"type": "OrderPaid"}) is None  # the Avro plan cannot know it
    assert render_topic(pieces, {"type": "OrderPaid", "aggregate_id": "42"}) == \
        "orders.OrderPaid.42"
