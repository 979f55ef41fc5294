"""JSON: parsing with bounded nesting, and the JSON route format (the payload passed through).

Every place that parses JSON from a record (the change event, the headers column, a payload)
goes through `parse_json`, so a hostile row fails with one readable reason instead of a
RecursionError or a UnicodeEncodeError further down.

`parse_json` parses with msgspec (about 3x faster than json.loads on a change event) and hands
every text msgspec refuses to json.loads, which decides and words the outcome: NaN, Infinity
and numbers beyond a double (json.loads reads them, `strict` refuses them), lone surrogates
(json.loads keeps them, the callers name where), malformed text (json.loads's line and
column). What msgspec accepts, json.loads reads to the same value (integers of any size stay
exact, floats correctly rounded, the last of duplicate keys wins); tests/unit/test_json_parse.py
checks it.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NoReturn

import msgspec

from cdc_router.config.json_bounds import BEYOND_DOUBLE as _BEYOND_DOUBLE
from cdc_router.config.json_bounds import DOUBLE_DIGITS as _DOUBLE_DIGITS
from cdc_router.config.json_bounds import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from cdc_router.config.json_bounds import beyond_double_reason
from cdc_router.config.json_bounds import deeper_than as _deeper_than
from cdc_router.config.json_bounds import refuse_huge_integers as _refuse_huge_integers
from cdc_router.config.utf8 import LONE_SURROGATE, utf8_encodable
from cdc_router.errors import JsonTooDeep, SerializeError, show

if TYPE_CHECKING:
    from cdc_router.config.routes import RouteRule
    from cdc_router.router.debezium import OutboxEvent

# The escaped form of a UTF-16 surrogate (\uD800 to \uDFFF): the only way JSON text that is
# valid UTF-8 can carry one. A match only means "look closer": it may be a paired surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")

_FAST = msgspec.json.Decoder()


class RawNumber(str):
    """A JSON number with a fraction or an exponent, as its text was written (1.10 stays 1.10,
    where a float would print 1.1): what parse_json(exact_numbers=True) gives for it."""


_EXACT = msgspec.json.Decoder(float_hook=RawNumber)
_EXACT_TEXT = msgspec.json.Encoder(decimal_format="number")


def _reject_constant(name: str) -> NoReturn:
    # Python's json accepts NaN and Infinity; JSON (RFC 8259) and downstream parsers do not.
    raise ValueError(f"{name} is not JSON")



def _finite_float(text: str) -> float:
    # 1e400 is valid JSON that json.loads reads as infinity without calling parse_constant
    # (QA 36-b F1), where Go's and Rust's readers refuse it: the same poison as Infinity. Only
    # the slow path calls this: msgspec refuses such a number, so the fast path never gets here.
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{_BEYOND_DOUBLE} ({show(text, 40)})")
    return value


# A record with no value (a Kafka tombstone) given to a decoder (QA 54-c F-5), of any format:
# not "not JSON" to a pipeline of Avro values (review 54-m F-7).
NULL_VALUE = "the value is null (a tombstone: a record without a value)"


def parse_json(text: str | bytes | None, *, max_depth: int = MAX_JSON_DEPTH,
               strict: bool = False, exact_numbers: bool = False) -> Any:
    """json.loads, refusing nesting deeper than `max_depth` levels (JsonTooDeep).

    Raises ValueError (json.JSONDecodeError for malformed text, JsonTooDeep, NULL_VALUE) or
    UnicodeDecodeError (bytes that are not UTF-8). `strict` also refuses NaN, Infinity and
    numbers beyond a double (1e400). `exact_numbers`: non-integer numbers as RawNumber, their
    text (see exact_json_text), so any size passes: it is kept as written, never read as a double.
    """
    if text is None:
        raise ValueError(NULL_VALUE)
    # deeper_than's own first test, without its call for the short texts most rows hold.
    if len(text) > max_depth and _deeper_than(text, max_depth):
        raise JsonTooDeep(max_depth)
    try:
        parsed = (_EXACT if exact_numbers else _FAST).decode(text)
    except (msgspec.DecodeError, RecursionError):
        parsed = _parse_slowly(text, max_depth, strict, exact_numbers)
    if strict and len(text) >= _DOUBLE_DIGITS - 1 and not exact_numbers:
        _refuse_huge_integers(text, parsed)
    return parsed


def _parse_slowly(text: str | bytes, max_depth: int, strict: bool, exact_numbers: bool) -> Any:
    """json.loads, which decides what msgspec refused, and words the reason (module doc)."""
    try:
        # JSON between systems is UTF-8 without a byte order mark (RFC 8259 8.1); json.loads
        # of bytes would also take UTF-16, UTF-32 and a BOM, which consumers then choke on.
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text,
                          parse_constant=_reject_constant if strict else None,
                          parse_float=(RawNumber if exact_numbers
                                       else _finite_float if strict else None))
    except RecursionError:  # only when the caller's own stack is already deep
        raise JsonTooDeep(max_depth) from None


def exact_json_text(value: Any) -> str:
    """Compact JSON text of a tree parse_json(exact_numbers=True) gave: its numbers as they
    were written; non-ASCII as is (json.dumps's ensure_ascii=False). A lone surrogate, which
    msgspec cannot write, stays in the text (as json.dumps leaves it) for the caller's check.
    ValueError for a number nested in it that cannot be written back (only with a lone
    surrogate in the tree, which msgspec refuses)."""
    if isinstance(value, RawNumber) or type(value) is int:
        return str(value)  # its very text; an int's is what msgspec writes (the hot path)
    try:  # inside an object or array too (review 34: 1.5e3 was written 1.5E+3)
        return _EXACT_TEXT.encode(_as_written(value)).decode()
    except UnicodeEncodeError:
        return json.dumps(_decimals(value), ensure_ascii=False, separators=(",", ":"),
                          default=str)


def _as_written(value: Any) -> Any:
    """The tree with each RawNumber as msgspec.Raw: its text, encoded as it is."""
    return _numbers(value, lambda number: msgspec.Raw(number.encode()))


def _decimals(value: Any) -> Any:
    return _numbers(value, _decimal)


def _decimal(value: RawNumber) -> Decimal:
    try:
        return Decimal(value)
    except ArithmeticError:  # an exponent beyond Decimal's, inside an object or array
        raise ValueError(f"the number {show(str(value), 40)} cannot be written back as "
                         "JSON") from None


def _numbers(value: Any, convert: Callable[[RawNumber], Any]) -> Any:
    """The tree with each RawNumber replaced by convert(it)."""
    if isinstance(value, RawNumber):
        return convert(value)
    if isinstance(value, dict):
        return {name: _numbers(item, convert) for name, item in value.items()}
    if isinstance(value, list):
        return [_numbers(item, convert) for item in value]
    return value


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, for a reason: 'an object', 'null', ..."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def json_problem(error: ValueError | UnicodeDecodeError, text: bytes | None = None) -> str:
    """Why parse_json refused `text` (when given), to follow its noun: 'is not valid JSON:
    ...'."""
    if isinstance(error, JsonTooDeep):
        return f"is JSON {error} (MAX_JSON_DEPTH)"
    if text is not None and not text.strip():  # review 49-f F6: "Expecting value: line 1"
        return (f"is {'blank (only whitespace)' if text else 'empty'}, not JSON (the "
                "EventRouter SMT passed it on as is, or sent a tombstone with "
                "route.tombstone.on.empty.payload; the router sends neither)")
    text = text or b""
    if isinstance(error, json.JSONDecodeError) and error.msg.startswith("Unexpected UTF-8 BOM"):
        return ("is not valid JSON: it starts with a byte order mark (U+FEFF), which JSON "
                "sent between systems must not have (RFC 8259 8.1); remove it")
    if str(error).startswith(_BEYOND_DOUBLE):
        return beyond_double_reason(str(error))
    if "Exceeds the limit" in str(error) and "digits" in str(error):
        # Valid JSON (QA, session 30): Python reads no integer over sys.get_int_max_str_digits.
        return (f"holds an integer of over {sys.get_int_max_str_digits()} digits: valid "
                "JSON, but beyond what this router (and most JSON readers) take; write it as a "
                "string")
    # Hex first: hex digits in fours are base64's letters too (QA 35-a F4: the hex of bytea
    # payloads was hinted at as base64, or not at all).
    if _HEX.fullmatch(text):
        return (f"is not valid JSON: {error}; it looks like hex: a bytea payload column needs "
                "source.payload_type: bytes, with source.binary_handling: hex when the "
                "connector's binary.handling.mode is hex")
    if _BASE64.fullmatch(text):
        return (f"is not valid JSON: {error}; it looks like base64: a bytea payload column "
                "needs source.payload_type: bytes unless the connector sends schemas with "
                "binary.handling.mode bytes")
    return f"is not valid JSON: {error}"


# What a bytea column looks like through JsonConverter without schemas (binary.handling.mode
# base64): only a hint in a reason, never a decision.
_BASE64 = re.compile(rb"(?:[A-Za-z0-9+/]{4})+(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
# ... and binary.handling.mode hex: two digits a byte.
_HEX = re.compile(rb"(?:[0-9A-Fa-f]{2})+")


def lone_surrogate(text: str | bytes, parsed: Any) -> str | None:
    """Where `parsed` (the value of JSON `text`) holds a lone surrogate, or None.

    The answer is a path like `items[2].name` (or `(the payload)`, `key of items[2]`): UTF-8
    cannot encode a lone surrogate, so Avro, Kafka headers and strict JSON parsers refuse it.
    Cheap unless `text` has a surrogate escape.
    """
    escaped = (_SURROGATE_ESCAPE_BYTES.search(text) if isinstance(text, bytes)
               else _SURROGATE_ESCAPE.search(text))
    if escaped is None:
        return None
    return _surrogate_path(parsed, "")


def _surrogate_path(value: Any, path: str) -> str | None:
    if isinstance(value, str):
        return None if utf8_encodable(value) else (path or "(the value)")
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if not utf8_encodable(key):
                return f"a key in {path or '(the value)'}"
            found = _surrogate_path(item, where)
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _surrogate_path(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


class JsonSerializer:
    """Passes the payload through unchanged: JSON text checked to parse, or bytea as is."""

    def serialize(self, event: OutboxEvent, rule: RouteRule, topic: str) -> bytes:
        """The payload bytes; SerializeError when a JSON payload is not JSON every consumer
        reads: malformed, NaN, 1e400, nested deeper than MAX_JSON_DEPTH, a lone surrogate."""
        if event.payload_is_json:
            try:
                parsed = parse_json(event.payload, strict=True)
            except (ValueError, UnicodeDecodeError) as error:
                raise SerializeError(f"event {show(event.event_id)}: payload for {topic!r} "
                                     f"{json_problem(error, event.payload)}") from None
            where = lone_surrogate(event.payload, parsed)
            if where is not None:
                raise SerializeError(surrogate_message(event, topic, where))
        return event.payload


def surrogate_message(event: OutboxEvent, topic: str, where: str) -> str:
    """The reason for a payload with a lone surrogate at `where` (a lone_surrogate path)."""
    return (f"event {show(event.event_id)}: payload field {show(where)} for {topic!r} holds "
            f"{LONE_SURROGATE}; fix the text in the outbox row")
