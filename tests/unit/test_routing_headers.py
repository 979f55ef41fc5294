"""Headers are encoded once per route where they can be: a header that UTF-8 cannot encode is
still named per event, in the order the record carries its headers."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from cdc_router.config.compiled import compile_config
from cdc_router.config.headers import is_reserved_header
from cdc_router.config.model import RouterConfig
from cdc_router.errors import RouteError
from cdc_router.router.debezium import OutboxEvent
from cdc_router.router.routing import OutboundRecord, Router


def event(headers: tuple[tuple[str, str], ...] = ()) -> OutboxEvent:
    return OutboxEvent(event_id="e-1", aggregate_type="Order", aggregate_id="42",
                       type="OrderPaid", payload=b"{}", payload_is_json=True, headers=headers,
                       created_at_ms=1_714_558_272_123, op="c", lsn=None, tx_id=None)


def routed(event: OutboxEvent, **rule: object) -> OutboundRecord:
    router = Router(compile_config(RouterConfig.model_validate(
        {"source": {"topics": ["raw"]}, "routes": [{"topic": "t", **rule}]})))
    result = router.route(event, lambda topic: 3)
    assert isinstance(result, OutboundRecord), result
    return result


def test_every_header_in_order_on_a_cloudevents_route() -> None:
    record = routed(event((("tenant", "acme"), ("attempt", "3"))), headers={"team": "pay"},
                    cloudevents=True, ce_source="/orders")
    assert record.headers == (
        ("id", b"e-1"), ("type", b"OrderPaid"), ("aggregatetype", b"Order"),
        ("aggregateid", b"42"), ("tenant", b"acme"), ("attempt", b"3"), ("team", b"pay"),
        ("ce_specversion", b"1.0"), ("ce_id", b"e-1"), ("ce_type", b"OrderPaid"),
        ("ce_source", b"/orders"), ("ce_time", b"2024-05-01T10:11:12.123Z"),
        ("content-type", b"application/json"))


def test_a_row_header_value_with_a_lone_surrogate_is_named() -> None:
    with pytest.raises(RouteError, match=r"header 'trace' holds a lone UTF-16 surrogate"):
        routed(event((("tenant", "acme"), ("trace", "x\ud800"))), headers={"team": "pay"})


def test_a_static_header_with_a_lone_surrogate_is_named_per_event() -> None:
    # Not UTF-8: it cannot be encoded once for the route, and each event names it as before.
    with pytest.raises(RouteError, match=r"header 'team' holds a lone UTF-16 surrogate"):
        routed(event((("tenant", "acme"),)), headers={"team": "p\udc00"})


def test_a_name_allowed_on_one_kind_of_route_is_still_refused_on_the_other() -> None:
    # content-type is a row's own header on a plain route, and reserved on a CloudEvents
    # route of the same Router.
    router = Router(compile_config(RouterConfig.model_validate(
        {"source": {"topics": ["raw"]}, "routes": [
            {"match": {"type": "Plain"}, "topic": "plain"},
            {"topic": "ce", "cloudevents": True, "ce_source": "/orders"}]})))
    row = (("content-type", "text/csv"), ("tenant", "acme"))
    plain = router.route(replace(event(row), type="Plain"), lambda topic: 3)
    assert isinstance(plain, OutboundRecord)
    assert ("content-type", b"text/csv") in plain.headers
    with pytest.raises(RouteError, match=r"row header 'content-type' is reserved"):
        router.route(event(row), lambda topic: 3)
    with pytest.raises(RouteError, match=r"row header 'id' is reserved"):
        router.route(replace(event((("tenant", "acme"), ("id", "x"))), type="Plain"),
                     lambda topic: 3)


@pytest.mark.parametrize("name, arrives_as", [("id\x00x", "id"), ("tenant\x00", "tenant"),
                                              ("\x00", "")])
def test_a_row_header_name_with_nul_is_refused_not_cut_into_another_header(
        name: str, arrives_as: str) -> None:
    # librdkafka ends a header name at NUL: "id\0x" would arrive as a second `id` header and
    # forge the event id that the idempotent consumer keys on.
    with pytest.raises(RouteError, match=rf"event 'e-1': row header name {re.escape(repr(name))} "
                                         rf"holds a NUL character.*arrive as {arrives_as!r}"):
        routed(event((("tenant", "acme"), (name, "00000000-dead"))))



@pytest.mark.parametrize("cloudevents", [False, True])
def test_routing_refuses_exactly_the_row_header_names_is_reserved_header_names(
        cloudevents: bool) -> None:
    # Routing tests the names inline (the hot path): it must agree with the one rule.
    rule = {"topic": "t", "cloudevents": True, "ce_source": "/o"} if cloudevents else {"topic": "t"}
    router = Router(compile_config(RouterConfig.model_validate(
        {"source": {"topics": ["raw"]}, "routes": [rule]})))
    for name in ["id", "type", "aggregatetype", "aggregateid", "ce_", "ce_id", "ce_x",
                 "content-type", "Content-Type", "ID", "idx", "tenant", "c", "cex", ""]:
        try:
            router.route(event(((name, "v"),)), lambda topic: 3)
            refused = False
        except RouteError as error:
            assert "is reserved" in str(error)
            refused = True
        assert refused == is_reserved_header(name, cloudevents=cloudevents), name
