"""A payload that does not fit is blamed where it fails (serde/avro_blame.py): a nested value
by its path from the root, not by its record's type (QA 55-c F-6), and a value no branch of a
union of records takes by the branch it comes nearest to (QA 55-c F-7)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from cdc_router.config.connections import SchemaRegistrySettings
from cdc_router.config.routes import RouteRule
from cdc_router.router.debezium import OutboxEvent
from cdc_router.serde.avro import AvroSerializer, SerializeError
from cdc_router.serde.avro_diagnostics import payload_problem
from cdc_router.serde.avro_schema import AvroSchema, parse_schema_text
from cdc_router.serde.avro_unions import union_walk

NODE = {"type": "record", "name": "Node", "fields": [
    {"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"], "default": None}]}
LINE = {"type": "record", "name": "Line", "fields": [
    {"name": "sku", "type": "string"}, {"name": "price", "type": "double"},
    {"name": "id", "type": {"type": "string", "logicalType": "uuid"}, "default":
     "7a1d0a8e-3a5b-4c9e-8f0e-0d9c3b2a1f00"}]}
RICH = {"type": "record", "name": "Rich", "namespace": "shop", "fields": [
    {"name": "node", "type": ["null", NODE], "default": None},
    {"name": "order", "type": ["null", {"type": "record", "name": "Order", "fields": [
        {"name": "lines", "type": {"type": "array", "items": LINE}}]}], "default": None},
    {"name": "by_sku", "type": {"type": "map", "values": "Line"}, "default": {}}]}
UNION = {"type": "record", "name": "R", "namespace": "shop", "fields": [
    {"name": "x", "type": [
        {"type": "record", "name": "A", "fields": [{"name": "a", "type": "int"}]},
        {"type": "record", "name": "B", "fields": [
            {"name": "a", "type": "int"}, {"name": "b", "type": "string"}]}]}]}


def schema_of(document: Any) -> AvroSchema:
    return parse_schema_text(json.dumps(document), "test.avsc")


def problem(datum: Any, document: Any, extra_fields: str = "reject") -> str | None:
    schema = schema_of(document)
    return payload_problem(datum, schema, extra_fields, union_walk(schema))


LINES = [{"sku": "a", "price": 1.0}, {"sku": "b", "price": 2.0}]


@pytest.mark.parametrize(("datum", "reason"), [
    # Before: "field 'shop.Node.v' is str 'x'": which of the nested Nodes?
    ({"node": {"v": 1, "next": {"v": 2, "next": {"v": "x"}}}},
     "field 'shop.Rich.node.next.next.v' is str 'x', expected int"),
    ({"node": {"v": 1, "next": {"v": 2, "next": {"next": None}}}},
     "field 'shop.Rich.node.next.next.v' is missing or null, expected int"),
    # Before: "field 'shop.Line.price'": which line?
    ({"order": {"lines": [*LINES, {"sku": "c", "price": "9.5"}]}},
     "field 'shop.Rich.order.lines[2].price' is str '9.5', expected double"),
    ({"by_sku": {"a": LINES[0], "b": {"sku": 5, "price": 1.0}}},
     "field \"shop.Rich.by_sku['b'].sku\" is int 5, expected string"),
    # The value checks past validation too (before: 'shop.Line.price', 'shop.Line.id').
    ({"order": {"lines": [*LINES, {"sku": "c", "price": 1e400}]}},
     "field 'shop.Rich.order.lines[2].price' is inf, which JSON cannot carry"),
    ({"order": {"lines": [*LINES, {"sku": "c", "price": 9007199254740993}]}},
     "field 'shop.Rich.order.lines[2].price' is 9007199254740993, which an Avro double"),
    ({"order": {"lines": [LINES[0], {"sku": "c", "price": 1.0, "id": "x"}]}},
     "field 'shop.Rich.order.lines[1].id' is str 'x', expected string (uuid)"),
    # A key no field takes was named by its payload path already, and still is.
    ({"order": {"lines": [LINES[0], {**LINES[1], "zz": 1}]}},
     "field 'shop.Line.zz' is not in the schema (payload key order.lines[1].zz; "
     "extra_fields: reject)"),
])
def test_a_nested_value_is_named_by_its_path_from_the_root(datum: Any, reason: str) -> None:
    found = problem(datum, RICH)
    assert found is not None and found.startswith(reason), found


def test_the_root_and_its_own_fields_are_named_as_before() -> None:
    assert problem([1], RICH) == "field '(the payload)' is list [1], expected record shop.Rich"
    assert problem({"node": 3}, RICH) == \
        "field 'shop.Rich.node' is int 3, expected null | record shop.Node"


@pytest.mark.parametrize(("datum", "reason"), [
    # Before: "field 'shop.A.b' is not in the schema": B has b, its value is the fault.
    ({"x": {"a": 2, "b": 5}},
     "field 'shop.R.x' fits no branch of record shop.A | record shop.B; nearest record "
     "shop.B: field 'shop.R.x.b' is int 5, expected string"),
    # Before: "field 'shop.A.c' is not in the schema", without a word of B refusing it too.
    ({"x": {"a": 1, "c": 2}},
     "field 'shop.R.x' fits no branch of record shop.A | record shop.B; nearest record "
     "shop.A: field 'shop.A.c' is not in the schema (payload key x.c; extra_fields: reject)"),
    # Before: "field 'shop.B.a'" (the last branch's complaint) for a value A is nearer to.
    ({"x": {"a": "z"}},
     "field 'shop.R.x' fits no branch of record shop.A | record shop.B; nearest record "
     "shop.A: field 'shop.R.x.a' is str 'z', expected int"),
    # fastavro's branch hint names the branch meant.
    ({"x": {"-type": "shop.A", "a": "z", "b": "s"}},
     "field 'shop.R.x' fits no branch of record shop.A | record shop.B; nearest record "
     "shop.A: field 'shop.R.x.a' is str 'z', expected int"),
    ({"x": 3}, "field 'shop.R.x' is int 3, expected record shop.A | record shop.B"),
])
def test_a_value_no_union_branch_takes_is_blamed_on_the_nearest(datum: Any,
                                                                 reason: str) -> None:
    assert problem(datum, UNION) == reason


def test_a_value_a_union_branch_takes_is_not_blamed() -> None:
    assert problem({"x": {"a": 1, "b": "s"}}, UNION) is None
    assert problem({"x": {"a": 1}}, UNION) is None
    assert problem({"x": {"a": 2, "b": 5}}, UNION, "ignore") is None  # A, b left out


def test_the_dead_letter_reason_names_the_path_and_the_nearest_branch(
        tmp_path: Path) -> None:
    client = SchemaRegistryClient.new_client({"url": "mock://blame"})
    registry = SchemaRegistrySettings(url="mock://blame", auto_register=True)
    for name, document, datum, reason in (
            ("rich", RICH, {"node": {"v": 1, "next": {"v": "x"}}},
             "field 'shop.Rich.node.next.v' is str 'x'"),
            ("union", UNION, {"x": {"a": 2, "b": 5}},
             "nearest record shop.B: field 'shop.R.x.b' is int 5")):
        path = tmp_path / f"{name}.avsc"
        path.write_text(json.dumps(document))
        rule = RouteRule.model_validate({"topic": name, "format": "avro", "schema": str(path)})
        serializer = AvroSerializer([rule], registry, registry_client=client)
        event = OutboxEvent(event_id="e1", aggregate_type="T", aggregate_id="1", type="T",
                            payload=json.dumps(datum).encode(), payload_is_json=True,
                            headers=(), created_at_ms=1, op="c", lsn=1, tx_id=1)
        with pytest.raises(SerializeError) as caught:
            serializer.serialize(event, rule, name)
        assert reason in str(caught.value)
