"""What one Avro body may claim: arrays of items that take no bytes (serde/avro_bounds.py)."""

from __future__ import annotations

import io
import json
import random
from typing import Any

import fastavro
import pytest

from cdc_router.serde import avro_bounds
from cdc_router.serde.avro_bounds import MAX_EMPTY_ITEMS, empty_items_problem
from cdc_router.serde.avro_schema import (
    SINGLE_OBJECT_MAGIC,
    load_schema,
    parse_schema_text,
    unreadable,
)
from cdc_router.serde.decode import PayloadDecodeError, PayloadDecoder

SCHEMA = parse_schema_text(json.dumps({
    "type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "string"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "gaps", "type": {"type": "array", "items": "null"}},
        {"name": "marks", "type": {"type": "array", "items": {
            "type": "record", "name": "Mark", "fields": [
                {"name": "none", "type": "null"},
                {"name": "pad", "type": {"type": "fixed", "name": "Pad", "size": 0}}]}}},
        {"name": "more_marks", "type": {"type": "array", "items": "shop.Mark"}},
        {"name": "lines", "type": {"type": "array", "items": {
            "type": "record", "name": "Line", "fields": [
                {"name": "sku", "type": ["null", "string"]},
                {"name": "qty", "type": "int"},
                {"name": "price", "type": "double"},
                {"name": "ok", "type": "boolean"},
                {"name": "kind", "type": {"type": "enum", "name": "Kind",
                                          "symbols": ["A", "B"]}},
                {"name": "tags", "type": {"type": "map", "values": "float"}},
                {"name": "raw", "type": "bytes"}]}}}]}), "order.avsc")


def _body(datum: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, SCHEMA.parsed, datum)
    return out.getvalue()


def _datum(rng: random.Random) -> dict[str, Any]:
    return {"id": "o" * rng.randrange(50), "at": rng.randrange(-2**40, 2**40),
            "gaps": [None] * rng.randrange(2000),
            "marks": [{"none": None, "pad": b""}] * rng.randrange(30),
            "more_marks": [{"none": None, "pad": b""}] * rng.randrange(3),
            "lines": [{"sku": rng.choice([None, "s" * rng.randrange(9)]),
                       "qty": rng.randrange(-2**31, 2**31), "price": rng.random(),
                       "ok": rng.random() < 0.5, "kind": rng.choice("AB"),
                       "tags": {f"t{i}": 1.5 for i in range(rng.randrange(4))},
                       "raw": bytes(rng.randrange(20))} for _ in range(rng.randrange(5))]}


def test_valid_bodies_pass_and_cut_ones_are_left_to_fastavro() -> None:
    rng = random.Random(47)
    for _ in range(300):
        body = _body(_datum(rng))
        assert empty_items_problem(body, SCHEMA) is None
        assert unreadable(body, SCHEMA) is None
        cut = body[:rng.randrange(len(body))]
        assert empty_items_problem(cut, SCHEMA) is None  # fastavro says why


def _varint(value: int) -> bytes:
    zigzag, out = (value << 1) ^ (value >> 63), b""
    while True:
        byte, zigzag = zigzag & 0x7F, zigzag >> 7
        if not zigzag:
            return out + bytes([byte])
        out += bytes([byte | 0x80])


def test_a_body_claiming_more_items_of_no_bytes_than_the_bound_is_refused_unread() -> None:
    # Review 47-a F5: 20 bytes claimed 2**62 nulls; fastavro appended them until memory ran out.
    head = _varint(1) + b"o" + _varint(0)  # id "o", at 0
    for gaps, marks in ((2**62 - 1, 0), (0, MAX_EMPTY_ITEMS + 1),
                        (MAX_EMPTY_ITEMS // 2, MAX_EMPTY_ITEMS // 2 + 1)):
        body = head + _varint(gaps) + (b"\x00" if gaps else b"") + _varint(marks) + \
            (b"\x00" if marks else b"") + b"\x00\x00"
        problem = unreadable(body, SCHEMA)
        assert problem is not None and "array items that take no bytes" in problem
    block = head + _varint(-MAX_EMPTY_ITEMS - 1) + _varint(0) + b"\x00" + b"\x00\x00\x00"
    assert "take no bytes" in (unreadable(block, SCHEMA) or "")  # a block with its size


def test_a_schema_without_such_arrays_is_not_walked(monkeypatch: Any) -> None:
    plain = parse_schema_text(json.dumps({"type": "record", "name": "P", "fields": [
        {"name": "xs", "type": {"type": "array", "items": "int"}}]}), "p.avsc")
    monkeypatch.setattr(avro_bounds._Walk, "skip", None)  # would raise if called
    assert empty_items_problem(_varint(3) + b"\x02\x04\x06\x00", plain) is None


def test_the_consumers_decoder_refuses_such_a_claim_too(tmp_path: Any) -> None:
    path = tmp_path / "nulls.avsc"
    path.write_text('{"type": "record", "name": "R", "fields": '
                    '[{"name": "xs", "type": {"type": "array", "items": "null"}}]}')
    decoder = PayloadDecoder(schemas=[str(path)])
    header = SINGLE_OBJECT_MAGIC + load_schema(path).fingerprint
    assert decoder.decode(header + _varint(3) + b"\x00").value == {"xs": [None] * 3}
    with pytest.raises(PayloadDecodeError, match="array items that take no bytes"):
        decoder.decode(header + _varint(2**62 - 1) + b"\x00")


def test_the_consumers_decoder_refuses_such_a_claim_in_the_registrys_wire_format() -> None:
    # Review 48-d F5: the wire-format path handed the body to the library unchecked: a 10-byte
    # record decoded into 3,000,000 Nones, one of 2**62 items ended in MemoryError.
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    text = '{"type": "record", "name": "R", "fields": [{"name": "xs", "type": ' \
           '{"type": "array", "items": "null"}}]}'
    registry = SchemaRegistryClient.new_client({"url": "mock://avro-bounds-wire"})
    header = b"\x00" + registry.register_schema("t-value", Schema(text, "AVRO")).to_bytes(4, "big")
    decoder = PayloadDecoder(registry=registry)
    assert decoder.decode(header + _varint(3) + b"\x00").value == {"xs": [None] * 3}
    with pytest.raises(PayloadDecodeError, match="array items that take no bytes"):
        decoder.decode(header + _varint(3_000_000) + b"\x00")


# --- varints wider than their type (QA 52-a F4) ---------------------------------------------

WIDE = parse_schema_text(json.dumps({
    "type": "record", "name": "W", "namespace": "qa", "fields": [
        {"name": "id", "type": "long"},
        {"name": "n", "type": "int"},
        {"name": "xs", "type": {"type": "array", "items": "int"}},
        {"name": "m", "type": {"type": "map", "values": ["null", "long"]}}]}), "w.avsc")


def _raw(zigzag: int, size: int) -> bytes:
    """`zigzag` as a varint of exactly `size` bytes (padded with continuation bytes)."""
    out = bytearray()
    for _ in range(size - 1):
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    return bytes(out) + bytes([zigzag])


def _zz(value: int) -> int:
    return value * 2 if value >= 0 else -value * 2 - 1


TAIL = _varint(0) + _varint(0)  # xs and m empty


@pytest.mark.parametrize(("body", "found"), [
    (b"\x80" * 11 + b"\x04" + _varint(1) + TAIL,  # 2**78 wrapped: fastavro reads 16384
     "field 'qa.W.id' has 302231454903657293676544 in a varint of 12 bytes, wider than an "
     "Avro long takes (at most 10): Java's BinaryDecoder refuses it (Invalid long encoding)"),
    (b"\xff" * 10 + b"\x01" + _varint(1) + TAIL, "in a varint of 11 bytes"),
    (_raw(_zz(2**63), 10) + _varint(1) + TAIL,  # 10 bytes, bits beyond 64
     "field 'qa.W.id' has 9223372036854775808, beyond an Avro long (64 bits)"),
    (_varint(1) + _varint(2**40) + TAIL,
     "field 'qa.W.n' has 1099511627776 in a varint of 6 bytes, wider than an Avro int takes "
     "(at most 5): Java's BinaryDecoder refuses it (Invalid int encoding)"),
    (_varint(1) + _raw(_zz(2**33), 5) + TAIL,
     "field 'qa.W.n' has 8589934592, beyond an Avro int (32 bits)"),
    (_varint(1) + _raw(0, 6) + TAIL, "field 'qa.W.n' has 0 in a varint of 6 bytes"),
    (_varint(1) + _varint(1) + _varint(2) + _varint(5) + _varint(-2**31 - 1) + _varint(0)
     + _varint(0), "field 'qa.W.xs[1]' has -2147483649, beyond an Avro int"),
    (_varint(1) + _varint(1) + _varint(0) + _varint(1) + _varint(1) + b"k" + _varint(1)
     + _raw(2, 11) + _varint(0), "field \"qa.W.m['k']\" has 1 in a varint of 11 bytes"),
    (_varint(1) + _varint(1) + _varint(0) + _varint(1) + _raw(2, 11) + b"k" + _varint(0)
     + _varint(0), "field 'qa.W.m' has the length 1 in a varint of 11 bytes"),
])
def test_a_varint_wider_than_its_type_is_refused_naming_the_field(body: bytes,
                                                                  found: str) -> None:
    fastavro.schemaless_reader(io.BytesIO(body), WIDE.parsed, None)  # fastavro reads it
    problem = unreadable(body, WIDE)
    assert problem is not None and found in problem, problem


def test_the_widest_valid_varints_pass() -> None:
    for value in (2**63 - 1, -2**63, 0, 1, -1, 2**40):
        for ints in (2**31 - 1, -2**31, 2**20):
            body = _body_w(value, ints)
            assert unreadable(body, WIDE) is None
    # Java reads a long of 10 bytes, an int of 5, a redundant 0x80 and an empty block alike.
    assert unreadable(_raw(2, 10) + _raw(2, 5) + TAIL, WIDE) is None


def _body_w(value: int, ints: int) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, WIDE.parsed, {"id": value, "n": ints, "xs": [ints] * 3,
                                                  "m": {"a": value, "b": None}})
    return out.getvalue()


def test_the_consumers_decoder_refuses_a_wide_varint_too(tmp_path: Any) -> None:
    path = tmp_path / "w.avsc"
    path.write_text(WIDE.text)
    decoder = PayloadDecoder(schemas=[str(path)])
    header = SINGLE_OBJECT_MAGIC + load_schema(path).fingerprint
    assert decoder.decode(header + _body_w(2**62, 7)).value["id"] == 2**62
    with pytest.raises(PayloadDecodeError, match=r"field .qa\.W\.n. has 1099511627776"):
        decoder.decode(header + _varint(1) + _varint(2**40) + TAIL)


def test_a_body_without_wide_bytes_is_not_walked(monkeypatch: Any) -> None:
    monkeypatch.setattr(avro_bounds._Walk, "skip", None)  # would raise if called
    assert avro_bounds.varint_problem(_body_w(2**20, 5), WIDE) is None
