"""JetStream routes: the nats section, subject rules, and routing captured events to subjects."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from cdc_router.config.compiled import compile_config
from cdc_router.config.config_warnings import config_warnings
from cdc_router.config.load import load_config
from cdc_router.config.model import RouterConfig
from cdc_router.config.nats import subject_problem
from cdc_router.config.nats_subjects import subject_matches
from cdc_router.errors import ConfigError, RouteError
from cdc_router.router.debezium import OutboxEvent
from cdc_router.router.routing import OutboundRecord, Router
from tests.unit.test_routing import ORDER, SOURCE

STREAMS = {"streams": [{"name": "ORDERS", "subjects": ["orders.>"]}]}


def router(*routes: dict[str, Any], nats: dict[str, Any] | None = None,
           delivery: dict[str, Any] | None = None) -> Router:
    return Router(compile_config(RouterConfig.model_validate(
        {"source": {"topics": [SOURCE]}, "routes": list(routes), "nats": nats or STREAMS,
         "delivery": delivery or {}})))


def with_type(event: OutboxEvent, value: str) -> OutboxEvent:
    values = {**event.__dict__, "type": value}
    return type(event)(**values)


def with_aggregate_type(event: OutboxEvent, value: str) -> OutboxEvent:
    values = {**event.__dict__, "aggregate_type": value}
    return type(event)(**values)


def test_a_nats_route_renders_its_subject_with_the_contract_headers() -> None:
    out = router({"nats": {"subject": "orders.{type}"}}).route(ORDER, lambda topic: 1 / 0)
    assert isinstance(out, OutboundRecord)
    assert (out.nats, out.topic, out.partition) == (True, "orders.OrderPaid", None)
    assert out.value == ORDER.payload
    assert dict(out.headers)["id"] == ORDER.event_id.encode()


@pytest.mark.parametrize(("event_type", "reason"), [
    ("a b", "whitespace or control characters"),
    ("a\r\nPUB x 1", "whitespace or control characters"),
    ("*", "wildcard"),
    (">", "wildcard"),
    ("x.", "empty token"),
    ("", "empty token"),
    ("x" * 300, "at most 255 bytes"),
])
def test_a_subject_nats_would_refuse_is_a_route_error(event_type: str, reason: str) -> None:
    rt = router({"nats": {"subject": "orders.{type}"}})
    with pytest.raises(RouteError, match=f"routes\\[0\\] nats.subject .*{reason}"):
        rt.route(with_type(ORDER, event_type), lambda topic: 1)


def test_a_subject_no_declared_stream_captures_is_a_route_error() -> None:
    rt = router({"nats": {"subject": "{type}.x"}})
    with pytest.raises(RouteError, match=r"no stream of nats\.streams captures subject"):
        rt.route(ORDER, lambda topic: 1)
    with pytest.raises(RouteError, match="system or inbox subject"):
        rt.route(with_type(ORDER, "$JS.API.STREAM.DELETE.ORDERS"), lambda topic: 1)


def test_a_header_that_cannot_be_a_nats_header_line_is_a_route_error() -> None:
    rt = router({"nats": {"subject": "orders.x"}})
    hostile = type(ORDER)(**{**ORDER.__dict__, "headers": (("tenant", "a\r\nNats-Msg-Id: x"),)})
    with pytest.raises(RouteError, match="line break"):
        rt.route(hostile, lambda topic: 1)
    reserved = type(ORDER)(**{**ORDER.__dict__, "headers": (("Nats-Msg-Id", "x"),)})
    with pytest.raises(RouteError, match="reserved for NATS"):
        rt.route(reserved, lambda topic: 1)


@pytest.mark.parametrize("name", ["Status", "Description"])
def test_a_header_nats_py_reads_as_a_server_status_is_a_route_error(name: str) -> None:
    # QA 54-c F-1: a row header `Status: 404` was never delivered by a pull consumer, `503`
    # lost its whole batch, `abc` crashed JetStreamConsumer.run().
    rt = router({"nats": {"subject": "orders.x"}})
    status = type(ORDER)(**{**ORDER.__dict__, "headers": ((name, "404"),)})
    with pytest.raises(RouteError, match=f"header '{name}' is the name under which the NATS "
                                         "client .nats-py. keeps the server's status line"):
        rt.route(status, lambda topic: 1)
    # nats-py's match is case-sensitive: other spellings travel as they are.
    other = type(ORDER)(**{**ORDER.__dict__, "headers": ((name.upper(), "404"),
                                                         (name.lower(), "x"))})
    assert rt.route(other, lambda topic: 1) is not None


@pytest.mark.parametrize("id_or_value", ["  qa-1", "qa-1 ", "\u2028qa-1", "qa-1\t", "\xa0"])
def test_whitespace_the_nats_client_strips_is_a_route_error_not_a_changed_id(
        id_or_value: str) -> None:
    # QA 32-a: nats-py strips every header value, Nats-Msg-Id's too: events whose ids differ
    # only so were acked as duplicates of one another and dropped, their rows deleted.
    rt = router({"nats": {"subject": "orders.x"}})
    spaced_id = type(ORDER)(**{**ORDER.__dict__, "event_id": id_or_value})
    with pytest.raises(RouteError, match="whitespace at its start or end, which the NATS "
                                         "client strips from Nats-Msg-Id"):
        rt.route(spaced_id, lambda topic: 1)
    spaced_header = type(ORDER)(**{**ORDER.__dict__, "headers": (("tenant", id_or_value),)})
    with pytest.raises(RouteError, match="header 'tenant' has whitespace at the start or end "
                                         "of its value, which the NATS client strips"):
        rt.route(spaced_header, lambda topic: 1)
    assert isinstance(router({"topic": "orders"}).route(spaced_id, lambda topic: 1),
                      OutboundRecord), "Kafka carries the id byte for byte"


def test_an_event_id_holding_u_fffd_is_a_route_error_on_nats_only() -> None:
    # 54-m F-9: published, it reached our JetStream consumer, which dead-letters such an id
    # (nats-py reads bytes that are not UTF-8 as U+FFFD); the router says so at stage route.
    replaced = type(ORDER)(**{**ORDER.__dict__, "event_id": "order-\ufffd1"})
    with pytest.raises(RouteError, match=r"refuses this event id: it holds U\+FFFD, which "
                                         r"the NATS client puts in place of bytes that are not "
                                         "UTF-8.*route the event to Kafka"):
        router({"nats": {"subject": "orders.x"}}).route(replaced, lambda topic: 1)
    # Our Kafka consumer decodes the key and the id header strictly: U+FFFD is an id as good
    # as any there, distinct from every other.
    assert isinstance(router({"topic": "orders"}).route(replaced, lambda topic: 1),
                      OutboundRecord)


def test_a_ce_source_the_nats_client_would_strip_is_a_config_error() -> None:
    # Review 32-2: it loaded, and then every event of the route was a dead letter.
    with pytest.raises(ValueError, match=r"ce_source.*whitespace at the start or end"):
        router({"nats": {"subject": "orders.x"}, "cloudevents": True,
                "ce_source": "/orders-service "})


def test_a_message_over_max_payload_is_a_route_error() -> None:
    rt = router({"nats": {"subject": "orders.x"}}, nats={**STREAMS, "max_payload_bytes": 64})
    with pytest.raises(RouteError, match=r"over nats\.max_payload_bytes"):
        rt.route(ORDER, lambda topic: 1)


def test_a_nats_message_is_held_to_nats_max_payload_not_to_the_kafka_producers_limit() -> None:
    """QA 51-e F1: delivery.max_payload_bytes (the Kafka producer's) dead-lettered JetStream
    messages nats-server takes; a Kafka route beside it keeps that limit."""
    rt = router({"nats": {"subject": "orders.x"}, "match": {"aggregate_type": "Order"}},
                {"topic": "t"}, nats={**STREAMS, "max_payload_bytes": 100_000},
                delivery={"max_payload_bytes": 20})
    record = rt.route(ORDER, lambda topic: 1)
    assert isinstance(record, OutboundRecord) and record.nats and len(record.value) > 20
    with pytest.raises(RouteError, match=r"over delivery\.max_payload_bytes \(20\)"):
        rt.route(with_aggregate_type(ORDER, "Customer"), lambda topic: 1)


def test_headers_over_jetstreams_fixed_limit_are_a_route_error() -> None:
    # QA 33-c: 5,000 header keys went to JetStream, which refused them (err_code 10097), and
    # the letter's advice (raise max_msg_size) could not help: the limit is fixed.
    rt = router({"nats": {"subject": "orders.x"}}, nats={**STREAMS,
                                                          "max_payload_bytes": 8_000_000})
    many = type(ORDER)(**{**ORDER.__dict__, "headers": tuple(
        (f"h{n}", "x" * 20) for n in range(3_000))})
    with pytest.raises(RouteError, match=r"the NATS headers are \d+ bytes; JetStream takes "
                                         r"fewer than 65536 \(a fixed limit\): fewer or"):
        rt.route(many, lambda topic: 1)
    fewer = type(ORDER)(**{**ORDER.__dict__, "headers": many.headers[:1_000]})
    assert isinstance(rt.route(fewer, lambda topic: 1), OutboundRecord)


def test_a_header_block_of_exactly_the_limit_is_refused_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 33-3: nats-server refuses a block of exactly 65,536 bytes; the check let it by.
    from cdc_router.router import routing

    event = type(ORDER)(**{**ORDER.__dict__, "event_id": "e"})
    block = len("NATS/1.0\r\n\r\n") + len("Nats-Msg-Id") + len("e") + 4  # headers: none
    monkeypatch.setattr(routing, "JETSTREAM_MAX_HEADER_BYTES", block)
    with pytest.raises(RouteError, match=f"the NATS headers are {block} bytes; JetStream"):
        routing._check_nats_message(event, (), b"", 10**6)
    monkeypatch.setattr(routing, "JETSTREAM_MAX_HEADER_BYTES", block + 1)
    routing._check_nats_message(event, (), b"", 10**6)


def test_subject_rules_and_matching() -> None:
    assert subject_problem("orders.OrderPaid") is None
    assert subject_problem("orders.>", wildcards=True) is None
    assert subject_problem("orders.>.x", wildcards=True) is not None
    assert subject_problem("orders.a*b") is not None
    assert subject_matches("orders.>", "orders.a.b")
    assert not subject_matches("orders.>", "orders")
    assert subject_matches("orders.*", "orders.a")
    assert not subject_matches("orders.*", "orders.a.b")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "router.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("text", "expected"), [
    ("routes: [{nats: {subject: orders.x}}]",
     "field 'routes[0].nats': a JetStream route needs `nats:` with the streams"),
    ("routes: [{topic: x, nats: {subject: orders.x}}]\nnats: {streams: [{name: O, "
     "subjects: [orders.>]}]}", "field 'routes[0].topic': a route needs exactly one destination"),
    ("routes: [{nats: {subject: 'orders *.{type}'}}]", "holds whitespace, '*' or '>'"),
    ("routes: [{nats: {subject: 'orders.{tipe}'}}]", "unknown template field {tipe}"),
    # QA 49-a F1: an empty token in the template's own text passed, then every event of the
    # route was dead-lettered; '.{type}' was refused as a prefix no stream captures.
    *[(f"routes: [{{nats: {{subject: '{template}'}}}}]\nnats: {{streams: [{{name: O, "
       "subjects: ['>']}]}", f"field 'routes[0].nats.subject': subject template '{template}' "
       "has an empty token")
      for template in ("orders..{type}", "orders.{type}.", ".{type}", "orders.{type}..x",
                       "{type}..x", "orders..x")],
    ("routes: [{nats: {subject: other.x}}]\nnats: {streams: [{name: O, subjects: [orders.>]}]}",
     "field 'routes[0].nats.subject': no stream of nats.streams captures subject 'other.x'"),
    # A template whose whole tokens before row data already match no stream (QA, session 25:
    # accepted, then every event of the route was dead-lettered).
    ("routes: [{nats: {subject: 'nocap.{aggregate_id}'}}]\nnats: {streams: [{name: O, "
     "subjects: [orders.>, 'nocap']}]}", "field 'routes[0].nats.subject': no stream of "
     "nats.streams captures a subject that starts 'nocap.'"),
    ("routes: [{nats: {subject: orders.x}}]\nnats: {streams: [{name: 'a.b', "
     "subjects: [orders.>]}]}", "field 'nats.streams[0].name': stream name 'a.b' must be"),
    ("routes: [{nats: {subject: orders.x}, headers: {'a b': c}}]\nnats: {streams: [{name: O, "
     "subjects: [orders.>]}]}", "field 'routes[0].headers': header name 'a b'"),
    # QA 49-a F4: JetStream refused the second stream only at `streams apply --yes`, naming
    # neither ("subjects overlap with an existing stream").
    ("routes: [{nats: {subject: orders.x}}]\nnats: {streams: [{name: ORDERS, subjects: "
     "[orders.>]}, {name: P, subjects: [p.>]}, {name: SPECIAL, subjects: [x, orders.special.>]}]}",
     "field 'nats.streams[2].subjects': 'orders.special.>' of stream SPECIAL overlaps "
     "'orders.>' of stream ORDERS (nats.streams[0]), and JetStream stores a subject in one "
     "stream only: take it out of one of them; see"),
    ("routes: [{nats: {subject: orders.x}}]\nnats: {streams: [{name: A, subjects: [orders.*]}, "
     "{name: B, subjects: ['*.x']}]}", "'*.x' of stream B overlaps 'orders.*' of stream A"),
])
def test_nats_config_errors_are_one_line_naming_field_and_value(tmp_path: Path, text: str,
                                                              expected: str) -> None:
    path = write(tmp_path, "source: {topics: [outbox.public.outbox]}\n" + text + "\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "\n" not in str(caught.value)
    assert expected in str(caught.value)


@pytest.mark.parametrize(("template", "filters"), [
    ("orders.{aggregate_id}", ["orders.*"]), ("orders.eu.{type}", ["orders.*.*"]),
    ("orders.{type}.paid", ["orders.>"]), ("x-{type}.y", ["a.b"]), ("{type}", ["a"]),
    ("orders.{type}", [">"]), ("{type}.{aggregate_id}", [">"]), ("a.{type}{aggregate_id}", [">"])])
def test_a_template_some_stream_may_capture_loads(tmp_path: Path, template: str,
                                                  filters: list[str]) -> None:
    path = write(tmp_path, "source: {topics: [outbox.public.outbox]}\n"
                 f"routes: [{{nats: {{subject: '{template}'}}}}]\n"
                 f"nats: {{streams: [{{name: S, subjects: {filters}}}]}}\n")
    assert load_config(path).config.routes[0].destination == template


def test_a_kafka_and_a_nats_route_load_side_by_side(tmp_path: Path) -> None:
    path = write(tmp_path, "source: {topics: [outbox.public.outbox]}\nroutes:\n"
                 "  - {match: {type: 'Order*'}, nats: {subject: 'orders.{type}'}}\n"
                 "  - {topic: 'outbox.event.{aggregate_type}'}\n"
                 "nats: {url: 'nats://127.0.0.1:4222', streams: [{name: ORDERS, "
                 "subjects: ['orders.>'], duplicate_window_ms: 3600000}]}\n")
    compiled = load_config(path)
    assert [route.nats for route in compiled.routes] == [True, False]
    assert compiled.config.nats is not None
    assert compiled.config.nats.streams[0].duplicate_window_ms == 3_600_000


@pytest.mark.parametrize(("stream", "message"), [
    # QA 34-d: a 3 KB event on a stream of max_bytes 2000 (discard old) was acked, then
    # evicted at once with every older message.
    ("max_bytes: 2000", "field 'nats.streams[0].max_bytes': must be at least 1052672, "
                        "nats.max_payload_bytes (1048576) and 4096 for the subject"),
    ("max_bytes: 0", "field 'nats.streams[0].max_bytes': must be at least"),
    # Review 34-3: JetStream stores the subject too, so this one lost a near-maximum event.
    ("max_bytes: 1048576", "field 'nats.streams[0].max_bytes': must be at least 1052672"),
    # Review 34-3: nats-server refuses these only at `streams apply --yes` too.
    ("max_age_ms: 3600000", "field 'nats.streams[0].duplicate_window_ms': must be at most "
                            "max_age_ms (3600000)"),
    ("max_age_ms: 50, duplicate_window_ms: 100", "field 'nats.streams[0].max_age_ms': must be "
                                                 "0 (no limit) or at least 100"),
    # QA 34-d: nats-server refuses it (10052) only once `streams apply --yes` runs.
    ("duplicate_window_ms: 50", "field 'nats.streams[0].duplicate_window_ms': Input should be "
                                "greater than or equal to 100"),
])
def test_stream_limits_that_lose_events_or_that_nats_server_refuses_are_config_errors(
        tmp_path: Path, stream: str, message: str) -> None:
    path = write(tmp_path, "source: {topics: [raw]}\nroutes: [{nats: {subject: 's.x'}}]\n"
                 f"nats: {{streams: [{{name: S, subjects: ['s.>'], {stream}}}]}}\n")
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(path)


def test_stream_limits_nats_server_takes_load(tmp_path: Path) -> None:
    path = write(tmp_path, "source: {topics: [raw]}\nroutes: [{nats: {subject: 's.x'}}]\n"
                 "nats: {streams: [{name: S, subjects: ['s.>'], max_bytes: 1052672, "
                 "max_age_ms: 604800000, duplicate_window_ms: 3600000}, {name: T, "
                 "subjects: ['t.>'], max_bytes: -1, max_age_ms: 0}]}\n")
    assert [stream.max_bytes for stream in load_config(path).config.nats.streams] == [
        1052672, -1]


def test_a_duplicate_window_shorter_than_a_failed_batchs_republish_is_warned_about(
        tmp_path: Path) -> None:
    # QA 34-d: a 100 ms window stored 1,206 messages for 600 ids after an aborted batch.
    def warnings(window: int) -> list[str]:
        path = write(tmp_path, "source: {topics: [raw], group_id: g}\n"
                     "routes: [{nats: {subject: 's.x'}}]\n"
                     "nats: {ack_timeout_ms: 5000, streams: [{name: S, subjects: ['s.>'], "
                     f"duplicate_window_ms: {window}}}]}}\n")
        return config_warnings(load_config(path).config)

    [short] = warnings(39_999)
    assert short.startswith("nats.streams[0].duplicate_window_ms 39999 is under 40000")
    assert warnings(40_000) == []


def test_rules_check_shows_a_nats_route_and_its_streams(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cdc_router.cli import main

    path = write(tmp_path, "source: {topics: [outbox.public.outbox]}\nroutes:\n"
                 "  - {nats: {subject: 'orders.{type}'}}\n"
                 "nats: {streams: [{name: ORDERS, subjects: ['orders.>']}]}\n")
    result = CliRunner().invoke(main, ["rules", "check", "-c", str(path)])
    assert result.exit_code == 0, result.output
    assert "nats orders.{type}  json" in result.output
    assert "streams ORDERS (orders.>)" in result.output
    # QA, session 28: --explain showed "partition None" for a JetStream record.
    event = Path(__file__).parent / "fixtures" / "debezium" / "create_text.noschema.json"
    explained = CliRunner().invoke(main, ["rules", "check", "-c", str(path), "--explain",
                                          str(event)])
    assert explained.exit_code == 0, explained.output
    assert "record    NATS subject orders." in explained.output
    assert "Nats-Msg-Id " in explained.output and "partition" not in explained.output


def test_rules_check_of_a_kafka_config_shows_no_nats_line_for_local_envs_nats_url(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 36-c F2: `eval "$(cdc-router local env)"` exports CDC_ROUTER__NATS__URL, which gave a
    # Kafka-only config a nats section: `rules check` printed "nats ...; streams none".
    from click.testing import CliRunner

    from cdc_router.cli import main

    monkeypatch.setenv("CDC_ROUTER__NATS__URL", "nats://127.0.0.1:14222")
    path = write(tmp_path, "source: {topics: [outbox.public.outbox]}\nroutes:\n"
                 "  - {topic: 'orders'}\n")
    result = CliRunner().invoke(main, ["rules", "check", "-c", str(path)])
    assert result.exit_code == 0, result.output
    assert "nats " not in result.output and "dead letter" in result.output


JETSTREAM_CONFIG = {"source": {"topics": [SOURCE], "group_id": "g"},
                    "routes": [{"nats": {"subject": "orders.{type}"}}], "nats": STREAMS}


@pytest.mark.parametrize(("text", "expected"), [
    ("routes: [{nats: {subject: orders.x}, key: aggregate_id}]",
     "field 'routes[0].key': a JetStream route has no key or partition"),
    ("routes: [{nats: {subject: orders.x}, partition: key}]",
     "field 'routes[0].partition': a JetStream route has no key or partition"),
    ("routes: [{nats: {subject: orders.x}}]\ndelivery: {transaction_timeout_ms: 10000}",
     "field 'nats.ack_timeout_ms': nats.connect_timeout_ms + nats.ack_timeout_ms must stay "
     "below delivery.transaction_timeout_ms (10000)"),
])
def test_nats_route_settings_that_cannot_apply_are_refused(tmp_path: Path, text: str,
                                                          expected: str) -> None:
    path = write(tmp_path, "source: {topics: [outbox.public.outbox]}\n" + text + "\n"
                 "nats: {streams: [{name: O, subjects: [orders.>]}]}\n")
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config(path)
