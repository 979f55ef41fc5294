"""Union branches decided once (serde/avro_unions.py): the same bytes and the same reasons as
fastavro's own choice, in time linear in the payload (QA, session 45: a tree 16 levels deep
took 17 s, each union validating its whole subtree again)."""

from __future__ import annotations

import io
import json
import random
import string
from functools import partial
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer as ValueSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from cdc_router.config.connections import SchemaRegistrySettings
from cdc_router.config.routes import RouteRule
from cdc_router.router.debezium import OutboxEvent
from cdc_router.serde import avro_diagnostics, avro_unions
from cdc_router.serde.avro import AvroSerializer, encode
from cdc_router.serde.avro_diagnostics import payload_problem
from cdc_router.serde.avro_schema import AvroSchema, parse_schema_text
from cdc_router.serde.avro_union_schema import plain_dates
from cdc_router.serde.avro_unions import UnionWalk, writer_datum

TREE = {"type": "record", "name": "N", "fields": [
    {"name": "v", "type": "long"},
    {"name": "kids", "type": {"type": "array", "items": "N"}, "default": []},
    {"name": "next", "type": ["null", "N"], "default": None}]}


def schema_of(document: Any) -> AvroSchema:
    return parse_schema_text(json.dumps(document), "test.avsc")


def tree(depth: int, width: int) -> dict[str, Any]:
    """A chain `depth` deep through the union, each link with `width` leaf kids."""
    node: dict[str, Any] = {"v": 0}
    for level in range(depth):
        node = {"v": level, "kids": [{"v": n} for n in range(width)], "next": node}
    return node


def fastavro_bytes(datum: Any, schema: AvroSchema) -> bytes:
    """fastavro's own writer, each date an int (review 48-d F1: no str parsed as a date)."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, plain_dates(schema)[0], datum)
    return out.getvalue()


def test_a_deep_tree_encodes_to_fastavros_own_bytes_with_each_union_decided() -> None:
    schema = schema_of(TREE)
    datum = tree(16, 400)
    assert encode(datum, schema) == fastavro_bytes(datum, schema)
    written = writer_datum(datum, schema)
    for _ in range(16):  # the writer gets each link as ("N", value): it validates nothing
        name, written = written["next"]
        assert name == "N"
    assert written == {"v": 0}
    assert payload_problem(datum, schema) is None


def test_the_registry_wire_format_of_a_deep_tree_is_confluent_kafkas_own(
        tmp_path: Path) -> None:
    path = tmp_path / "tree.avsc"
    path.write_text(json.dumps(TREE))
    rule = RouteRule.model_validate({"topic": "trees", "format": "avro", "schema": str(path)})
    client = SchemaRegistryClient.new_client({"url": "mock://unions"})
    registry = SchemaRegistrySettings(url="mock://unions", auto_register=True)
    serializer = AvroSerializer([rule], registry, registry_client=client)
    datum = tree(16, 50)
    event = OutboxEvent(event_id="e1", aggregate_type="T", aggregate_id="1", type="T",
                        payload=json.dumps(datum).encode(), payload_is_json=True, headers=(),
                        created_at_ms=1, op="c", lsn=1, tx_id=1)
    value = serializer.serialize(event, rule, "trees")
    own = ValueSerializer(client, json.dumps(TREE))  # the library alone, given the plain datum
    assert value == own(datum, SerializationContext("trees", MessageField.VALUE))
    assert value[5:] == fastavro_bytes(datum, schema_of(TREE))


def visits(datum: Any, schema: AvroSchema, monkeypatch: pytest.MonkeyPatch) -> int:
    """Values the walk validates, and payload_problem and encode together validate by
    fastavro, counted in datum nodes (each fits() call counts its whole subtree)."""
    count = 0
    valid, fits = UnionWalk.valid, avro_diagnostics.fits

    def counted_valid(walk: UnionWalk, value: Any, node: Any) -> bool:
        nonlocal count
        count += 1
        return valid(walk, value, node)

    def counted_fits(value: Any, schema: AvroSchema, part: Any = None) -> bool:
        nonlocal count
        count += len(json.dumps(value)) // 8  # ~ the nodes fastavro validates
        return fits(value, schema, part)

    monkeypatch.setattr(UnionWalk, "valid", counted_valid)
    monkeypatch.setattr(avro_diagnostics, "fits", counted_fits)
    monkeypatch.setattr(avro_unions, "fits", counted_fits)
    assert payload_problem(datum, schema) is None
    encode(datum, schema)
    return count


def test_the_work_grows_with_the_payload_not_with_its_depth(
        monkeypatch: pytest.MonkeyPatch) -> None:
    schema = schema_of(TREE)
    shallow = visits(tree(8, 800), schema, monkeypatch)  # as many nodes, half as deep
    deep = visits(tree(16, 400), schema, monkeypatch)
    bigger = visits(tree(16, 800), schema, monkeypatch)
    assert deep <= 1.1 * shallow  # before: each union validated its subtree, ~ depth x size
    assert bigger <= 2.2 * deep


def test_the_checks_ask_fastavros_validation_once_however_deep(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    fits = avro_diagnostics.fits
    monkeypatch.setattr(avro_diagnostics, "fits",
                        lambda *args: calls.append(args) or fits(*args))
    schema = schema_of({"type": "record", "name": "M", "fields": [
        {"name": "x", "type": "double"}, {"name": "next", "type": ["null", "M"]}]})
    datum: dict[str, Any] = {"x": 1.5, "next": None}
    for _ in range(30):
        datum = {"x": 0.5, "next": datum}
    assert payload_problem(datum, schema) is None
    assert len(calls) == 1  # before: once more per level, for the writer's branch


def test_a_union_of_an_array_of_a_named_type_takes_a_valid_payload() -> None:
    # Before: fastavro's validation of the branch alone lacked the named types, and raised
    # UnknownType for this valid payload, which was dead-lettered for it.
    schema = schema_of({"type": "record", "name": "L", "fields": [
        {"name": "more", "type": ["null", {"type": "array", "items": "L"},
                                  {"type": "map", "values": "L"}]}]})
    for datum in ({"more": [{"more": None}]}, {"more": {"k": {"more": []}}}):
        assert payload_problem(datum, schema) is None
        assert avro_diagnostics._walked_problem(datum, schema, "reject", None) is None
        assert encode(datum, schema) == fastavro_bytes(datum, schema)


def test_a_deep_payload_is_walked_within_the_recursion_limit() -> None:
    schema = schema_of(TREE)
    datum = tree(250, 1)  # parse_json lets through 256 levels
    assert UnionWalk(schema).decided(datum, schema.parsed) is not datum
    assert encode(datum, schema) == fastavro_bytes(datum, schema)


@pytest.mark.parametrize(("value", "shown"), [
    (5, "int 5"), ("123e4567-e89b-12d3-a456-426614174000",
                   "str '123e4567-e89b-12d3-a456-426614174000'")])
def test_a_scalar_in_a_recursive_union_is_named_with_the_field_and_its_types(
        value: Any, shown: str) -> None:
    # QA 54-c F-3: the branch "N" parsed on its own raised UnknownType, and the letter's
    # reason was the bare name of the type. A uuid in the schema asks the value checks too.
    document = {**TREE, "fields": [*TREE["fields"], {"name": "u", "type": ["null", {
        "type": "string", "logicalType": "uuid"}], "default": None}]}
    schema = schema_of(document)
    assert payload_problem({"v": 1, "next": value}, schema) == \
        f"field 'N.next' is {shown}, expected null | record N"
    assert payload_problem({"v": 1, "next": {"v": 2, "next": value}}, schema) == \
        f"field 'N.next.next' is {shown}, expected null | record N"  # the path (QA 55-c F-6)


def test_a_payload_too_deep_for_the_checks_is_refused_with_its_depth() -> None:
    # QA 54-c F-4: the letter's reason was "maximum recursion depth exceeded in comparison".
    document = {**TREE, "fields": [*TREE["fields"], {"name": "u", "type": ["null", {
        "type": "string", "logicalType": "uuid"}], "default": None}]}
    schema = schema_of(document)
    datum = json.loads('{"v": 1, ' + '"next": {"v": 1, ' * 900 + '"u": "zz"' + "}" * 901)
    assert payload_problem(datum, schema) == (
        "field 'next' nests 901 levels deep (payload path 'next.next.next ... next.u'), "
        "deeper than the Avro checks follow: expected a value nested less deeply (e.g. a "
        "list in place of a chain of records)")


def test_values_the_walk_leaves_to_fastavro_are_written_as_before() -> None:
    schema = schema_of({"type": "record", "name": "W", "namespace": "t", "fields": [
        {"name": "u", "type": ["null",
                               {"type": "record", "name": "A", "fields": [
                                   {"name": "x", "type": "int"}]},
                               {"type": "record", "name": "B", "fields": [
                                   {"name": "x", "type": "int"}]}]}]})
    hinted = {"u": {"-type": "t.B", "x": 1}}  # fastavro's branch hint: its own check decides
    assert writer_datum(hinted, schema) is hinted
    assert encode(hinted, schema) == fastavro_bytes(hinted, schema)
    assert payload_problem(hinted, schema) == \
        avro_diagnostics._walked_problem(hinted, schema, "reject", None)
    tupled = {"u": ("t.B", {"x": 1})}  # not JSON: fastavro's tuple notation, as given
    assert writer_datum(tupled, schema) is tupled


# The property test: every Avro type, unions of records alike, of each primitive, of a
# record and a map, logical types, named references and namespaces.
SCHEMAS: list[Any] = [
    TREE,
    {"type": "record", "name": "Pair", "namespace": "a.b", "fields": [
        {"name": "u", "type": ["null",
                               {"type": "record", "name": "A", "fields": [
                                   {"name": "x", "type": "int"},
                                   {"name": "y", "type": "string", "default": "d"}]},
                               {"type": "record", "name": "B", "namespace": "c", "fields": [
                                   {"name": "x", "type": "int"},
                                   {"name": "y", "type": "string"},
                                   {"name": "z", "type": ["null", "a.b.A", "c.B"],
                                    "default": None}]},
                               {"type": "map", "values": "int"}]},
        {"name": "again", "type": {"type": "array", "items": ["c.B", "A"]}, "default": []}]},
    {"type": "record", "name": "Every", "fields": [
        {"name": "u", "type": ["null", "string", "bytes", "int", "long", "float", "double",
                               "boolean", {"type": "array", "items": ["long", "string"]},
                               {"type": "map", "values": ["null", "double"]}]},
        {"name": "f", "type": "float"}, {"name": "d", "type": ["float", "double"]},
        {"name": "e", "type": {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]}},
        {"name": "o", "type": ["null", "Colour",
                               {"type": "fixed", "name": "Four", "size": 4}], "default": None},
        {"name": "m", "type": {"type": "map", "values": {"type": "array", "items": "Every"}},
         "default": {}}]},
    {"type": "record", "name": "Times", "fields": [
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "id", "type": ["null", {"type": "string", "logicalType": "uuid"}]},
        {"name": "t", "type": ["null", {"type": "int", "logicalType": "time-millis"},
                               {"type": "array", "items": "Times"}]},
        {"name": "amount", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                             "precision": 6, "scale": 2}], "default": None},
        {"name": "fail", "type": ["null", {"type": "error", "name": "Oops", "fields": [
            {"name": "x", "type": "int"}]}, {"type": "record", "name": "Fine", "fields": [
                {"name": "x", "type": "int"}, {"name": "w", "type": "string", "default": ""}]}],
         "default": None}]},
    ["null", {"type": "record", "name": "Top", "fields": [
        {"name": "k", "type": ["null", "Top", {"type": "map", "values": "Top"}]}]}],
]


def _named(document: Any, found: dict[str, Any], space: str = "") -> None:
    if isinstance(document, list):
        for branch in document:
            _named(branch, found, space)
    elif isinstance(document, dict):
        space = document.get("namespace", space)
        if "name" in document:
            name = document["name"]
            full = name if "." in name or not space else f"{space}.{name}"
            found[full] = found[name] = document
        for part in (document.get("fields") or []):
            _named(part["type"], found, space)
        for key in ("items", "values"):
            if key in document:
                _named(document[key], found, space)


def _scalar(rng: random.Random) -> Any:
    return rng.choice([None, True, False, 0, 1, -7, 2**31, 2**63, 1.5, 1e39, "x",
                       "2024-02-30", "2024-01-05", [], {}])


def generate(node: Any, named: dict[str, Any], rng: random.Random, depth: int) -> Any:
    """A JSON value for `node`: mostly one that fits, sometimes not."""
    if rng.random() < 0.04:
        return _scalar(rng)
    if isinstance(node, list):
        branches = [b for b in node if depth < 4 or b in ("null", "string", "long")] or node
        return generate(rng.choice(branches), named, rng, depth)
    if isinstance(node, str) and node in named:
        node = named[node]
    kind = node if isinstance(node, str) else node["type"]
    logical = None if isinstance(node, str) else node.get("logicalType")
    if logical == "date":
        return rng.choice(["2024-01-05", 19000, "not a day"])
    if logical == "uuid":
        return rng.choice(["7f1b3c8e-58a4-4c34-9f67-2a1f2a1f2a1f", "no-uuid"])
    simple = {"null": lambda: None, "boolean": lambda: rng.random() < 0.5,
              "int": lambda: rng.randint(-2**31, 2**31), "long": lambda: rng.randint(-9, 2**40),
              "float": lambda: rng.choice([0.5, 3, 1e39, 16777217]),
              "double": lambda: rng.choice([0.25, 2, 9007199254740993]),
              "string": lambda: "".join(rng.choices(string.ascii_letters, k=3)),
              "bytes": lambda: "ab", "fixed": lambda: "abcd"}
    if kind in simple:
        return simple[kind]()
    if kind == "enum":
        return rng.choice([*node["symbols"], "BLUE"])
    if kind == "array":
        return [generate(node["items"], named, rng, depth + 1)
                for _ in range(rng.randint(0, 3 if depth < 4 else 0))]
    if kind == "map":
        return {f"k{n}": generate(node["values"], named, rng, depth + 1)
                for n in range(rng.randint(0, 3 if depth < 4 else 0))}
    record = {}
    for field in node["fields"]:
        if "default" not in field or rng.random() < 0.7:
            record[field["name"]] = generate(field["type"], named, rng, depth + 1)
    if rng.random() < 0.1:
        record["extra"] = 1
    return record


def outcome(action: Any) -> Any:
    try:
        return action()
    except Exception as error:  # the comparison is of what each raises
        return f"{type(error).__name__}: {error}"


@pytest.mark.parametrize("document", SCHEMAS, ids=lambda document: json.dumps(document)[:40])
def test_random_payloads_give_fastavros_bytes_and_the_same_reasons(document: Any) -> None:
    schema = schema_of(document)
    named: dict[str, Any] = {}
    _named(document, named)
    rng = random.Random(45)
    decided = 0
    for _ in range(400):
        datum = generate(document, named, rng, 0)
        assert outcome(partial(encode, datum, schema)) == \
            outcome(partial(fastavro_bytes, datum, schema)), datum
        for extra_fields in ("reject", "ignore"):
            assert outcome(partial(payload_problem, datum, schema, extra_fields)) == \
                outcome(partial(old_payload_problem, datum, schema, extra_fields)), datum
        decided += writer_datum(datum, schema) is not datum
    assert decided > 20  # the walk, not the fallback, wrote most of them


def old_payload_problem(datum: Any, schema: AvroSchema, extra_fields: str) -> str | None:
    """payload_problem with every union branch chosen by fastavro's validation, as before."""
    if not avro_diagnostics.fits(datum, schema):
        return payload_problem(datum, schema, extra_fields)  # fastavro's reason, as before
    return avro_diagnostics._walked_problem(datum, schema, extra_fields, None)
