"""parse_json reads with msgspec and hands what msgspec refuses to json.loads: every text must
come out exactly as json.loads alone reads it (value and type, or the same error), and bytes as
json.loads reads their UTF-8 text (RFC 8259 8.1: no BOM, no UTF-16 or UTF-32, which json.loads
of bytes would take)."""

from __future__ import annotations

import json
import random
import struct
import sys
from typing import Any

import pytest

from cdc_router.serde.json import json_problem, parse_json

EDGE_CASES = [
    '"a\x01b"', '"\t"', "01", "-0", "-0.0", "1E5", "1e-400", "1e308", "2e308", "-2e308", "[1,]",
    '{"a":1,}', "//c\n1", "\x00", " \n\r\t1 \n", "\u00a01", '"\\u0000"', "tru", "1.", ".5", "+1",
    "0x10", '"\\x41"', '"\\/"', "1e", "-", "[]]", "{} {}", "1 2", '"\\ud800\\udc00"',
    '"\\ud800"', '"\\udc00x"', '{"\\ud800": 1}', '"\\uDBFF\\uDFFF"', "4.9e-324",
    "123456789012345678901234567890", "-9223372036854775809", "18446744073709551616",
    "123456789012345678901234567890.5e-3", "2.2250738585072011e-308", "9007199254740993",
    "1.7976931348623157e308", "1.7976931348623158e308", "NaN", "Infinity", "-Infinity",
    '{"a" : 1 , "a": [true, false, null]}', "\ufeff{}", '"\u2028"', '{"\\u0061":1}', "",
    '{"nested": {"k": [1, 2.5, "x", {"y": null}]}}',
]


def outcome(parse: Any, text: str | bytes) -> tuple[str, Any]:
    try:
        value = parse(text)
    except (ValueError, UnicodeDecodeError) as error:
        return "error", type(error)
    return "value", (repr(value), type(value))


@pytest.mark.parametrize("text", EDGE_CASES)
def test_parse_json_reads_edge_cases_as_json_loads_does(text: str) -> None:
    assert outcome(parse_json, text) == outcome(json.loads, text)
    given = text.encode("utf-8", "surrogatepass")
    assert outcome(parse_json, given) == outcome(lambda raw: json.loads(raw.decode()), given)


@pytest.mark.parametrize("raw", [b'\xef\xbb\xbf{"a": 1}', '{"a": 1}'.encode("utf-16"),
                                 '{"a": 1}'.encode("utf-32-le")])
def test_bytes_that_are_not_plain_utf8_json_are_refused(raw: bytes) -> None:
    # json.loads(bytes) reads all three; a consumer reading UTF-8 JSON chokes on each.
    assert json.loads(raw) == {"a": 1}
    with pytest.raises(ValueError):  # JSONDecodeError (BOM) or UnicodeDecodeError
        parse_json(raw)


def test_parse_json_reads_numbers_as_json_loads_does() -> None:
    rng = random.Random(14)
    for i in range(30_000):
        if i % 3 == 0:
            number = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
            text = repr(number) if number == number and abs(number) != float("inf") else "0"
        elif i % 3 == 1:
            text = (f"{rng.randint(-10**25, 10**25)}.{rng.randint(0, 10**rng.randint(1, 30))}"
                    f"e{rng.randint(-330, 330)}")
        else:
            text = str(rng.randint(-10**40, 10**40))
        assert outcome(parse_json, text) == outcome(json.loads, text), text


def test_malformed_text_keeps_json_loads_position() -> None:
    with pytest.raises(json.JSONDecodeError) as failure:
        parse_json('{"a": 1,\n "b": nope}')
    assert (failure.value.lineno, failure.value.colno) == (2, 7)


def test_strict_refuses_nan_and_lone_surrogates_pass_through() -> None:
    with pytest.raises(ValueError, match="NaN is not JSON"):
        parse_json('{"a": NaN}', strict=True)
    assert parse_json('{"a": NaN}')["a"] != parse_json('{"a": NaN}')["a"]  # NaN, as json reads
    assert parse_json('"\\ud800"') == "\ud800"  # kept: the callers name where it is


def test_a_base64_payload_refused_as_json_names_the_payload_type_setting() -> None:
    # QA session 27-a: a bytea outbox with payload_type auto was dead-lettered as "not valid
    # JSON", with nothing pointing at source.payload_type.
    error = json.JSONDecodeError("Expecting value", "q2/4AA==", 0)
    assert "source.payload_type: bytes" in json_problem(error, b"q2/4AA==")
    assert "payload_type" not in json_problem(error, b"{nope")


@pytest.mark.parametrize("text", [b"0001", b"1e10ff", b"deadbeef", b"1234abcd00"])
def test_a_hex_payload_refused_as_json_names_hex(text: bytes) -> None:
    # QA 35-a F4: the hex of a bytea payload was hinted at as base64 (when its length was a
    # multiple of 4), or not at all.
    error = json.JSONDecodeError("Extra data", text.decode(), 1)
    problem = json_problem(error, text)
    assert "it looks like hex" in problem and "source.payload_type: bytes" in problem
    assert "source.binary_handling: hex" in problem and "base64" not in problem
    assert "looks like base64" in json_problem(error, b"q2/4AA==")


def test_the_consumer_examples_decoder_refuses_a_byte_order_mark() -> None:
    # QA, session 28: the consumer README said a BOM is refused, and its example decoded with
    # json.loads, which takes one.
    from cdc_router.examples.fulfillment import decode_payment

    assert decode_payment(b'{"order_id": 7}') == {"order_id": 7}
    with pytest.raises(ValueError):
        decode_payment(b'\xef\xbb\xbf{"order_id": 7}')


@pytest.mark.parametrize("text", ['{"x": 1e400}', '{"x": -1e400}', "[1.5, 2e308]",
                                  '{"a": {"b": [0.1, 1E+309]}}'])
def test_strict_refuses_a_number_beyond_a_double_in_the_words_of_nan(text: str) -> None:
    # QA 36-b F1: json.loads reads 1e400 as infinity without calling parse_constant, so strict
    # delivered it, where Go's and Rust's readers refuse it.
    with pytest.raises(ValueError, match="a number beyond a double") as refused:
        parse_json(text, strict=True)
    problem = json_problem(refused.value, text.encode())
    assert problem.startswith("holds a number beyond a double (") and "Go's and Rust's" in problem
    assert "write it as a string" in problem
    assert outcome(parse_json, text) == outcome(json.loads, text)  # not strict: as json reads
    # Exact numbers (the headers column) keep the text, never read as a double: nothing lost.
    assert parse_json('{"x": -1e400}', strict=True, exact_numbers=True) == {"x": "-1e400"}


MAX_DOUBLE_INTEGER = int(sys.float_info.max)


@pytest.mark.parametrize("text", [
    '{"n": 1' + "0" * 400 + "}",  # jsonb's own text of 1e400
    "[-" + str(MAX_DOUBLE_INTEGER + 10**292) + "]",  # 309 digits, past the largest double
    "[" + str(2**1024 - 2**970) + "]",  # the least integer float() rounds to infinity
    " " * 150 + '{"a": [1, {"b": ' + "9" * 5000 + "}]}",  # past Python's digit limit too
])
def test_strict_refuses_an_integer_beyond_a_double_as_it_refuses_1e400(text: str) -> None:
    # QA 45-a F1: Postgres stores 1e400 in a jsonb column as 1 and 400 zeros, which strict
    # delivered: the README's own example of a poison number, in the shipped table.
    for given in (text, text.encode()):
        with pytest.raises(ValueError) as refused:
            parse_json(given, strict=True)
        problem = json_problem(refused.value, text.encode())
        assert "write it as a string" in problem


@pytest.mark.parametrize("text", [
    "[" + str(MAX_DOUBLE_INTEGER) + "]",  # the largest double, as an integer
    "[" + str(2**1024 - 2**970 - 1) + "]",  # rounds to the largest double, as float() does
    '{"n": 1' + "0" * 307 + "}",
    '{"s": "' + "9" * 500 + '"}',  # digits in a string
    "[0." + "0" * 400 + "1, 1." + "5" * 400 + "]",  # digits of a fraction
])
def test_strict_reads_long_digit_runs_a_double_holds(text: str) -> None:
    assert parse_json(text, strict=True) == json.loads(text)


def test_strict_still_reads_the_largest_double_and_underflow() -> None:
    assert parse_json("[1.7976931348623157e308, 1e-400]", strict=True) == [1.7976931348623157e308,
                                                                           0.0]
    # The slow path (a lone surrogate sends the text to json.loads) reads floats too.
    assert parse_json('["\\ud800", 2.5, 1e308]', strict=True)[1:] == [2.5, 1e308]


@pytest.mark.parametrize(("text", "said"), [(b"", "is empty, not JSON"),
                                            (b" \n\t", "is blank (only whitespace), not JSON")])
def test_an_empty_or_blank_payload_says_so_and_not_where_json_was_expected(
        text: bytes, said: str) -> None:
    # Review 49-f F6: "Expecting value: line 1 column 1 (char 0)" for an empty payload. QA
    # 58-a: the SMT passes it on as is by default (a tombstone only with
    # route.tombstone.on.empty.payload), which the reason said it did not.
    with pytest.raises(ValueError) as raised:
        parse_json(text)
    assert json_problem(raised.value, text).startswith(said)
    assert "SMT passed it on as is, or sent a tombstone with route.tombstone.on.empty" \
        ".payload" in json_problem(raised.value, text)
    assert json_problem(raised.value).startswith("is not valid JSON")  # no text: no guess
