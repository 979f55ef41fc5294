"""An event's payload and headers as the JSON text write_event() stores, checked first.

What Postgres would refuse at the INSERT (a NUL in a jsonb string, a lone surrogate, a row over
the outbox's size check) and what the router would dead-letter or a consumer's JSON reader
refuse (NaN and Infinity, also in a bytea payload, which nothing else checks; nesting deeper
than MAX_JSON_DEPTH; an integer beyond a double) is an InvalidEventError naming the field,
raised before anything is sent: a server error would also abort the caller's transaction
(review 50-d F3/F4). The common path is one json.dumps, one encode and a few C-speed scans.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

from cdc_router.config.json_bounds import (
    BEYOND_DOUBLE,
    MAX_JSON_DEPTH,
    beyond_double,
    beyond_double_reason,
    dumped_json_problem,
)
from cdc_router.config.utf8 import LONE_SURROGATE, join_surrogate_pairs, utf8_encodable
from cdc_router.errors import InvalidEventError, show
from cdc_router.outbox.setup import MAX_EVENT_BYTES, SIZE_CHECK

# Postgres's numeric (jsonb's numbers): at most 16,383 digits after the decimal point; its
# 131,072 before it are past a double, refused first.
NUMERIC_SCALE_MAX = 16_383
_SPACED = (", ", ": ")  # as Postgres writes jsonb: the size check measures that text
_COMPACT = (",", ":")
# A Decimal stands in json.dumps's text as this string, then as its own digits: no payload
# string is it (the random part is this process's).
_MARK = f"decimal-{os.urandom(12).hex()}-"
_NUMBER = re.compile(f'"{_MARK}([0-9]+)"')
# Numbers Python writes with an exponent, which jsonb (numeric_out) writes in full: a float's
# repr (1e+300, 1.5e-07) and a Decimal's str (1E+2, 1.23E-7), one digit before the point, and a
# positive exponent only when it is at least the digits after the point. Strings match first,
# so that no number is read in one (their groups are empty: no copy).
# Where Python wrote an exponent: after a digit (text such as "e-mail" is not one; reread
# 51-h L2: it sent most payloads through the count below).
_EXPONENT = re.compile(rb"[0-9][eE][+-]")
_STRING = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
# A number is tried from its start only, its digits once (possessive): no backtracking.
_START = rb"(?<![0-9.])"
_STRING_OR_NUMBER_SHAPE = re.compile(
    _STRING + rb"|" + _START + rb"(-?)([0-9])(\.?)[0-9]*+[eE]([+-][0-9]+)")
_STRING_OR_LARGE_FRACTION = re.compile(_STRING + rb"|" + _START + rb"-?[1-9]\.([0-9]++)[eE]\+")


def payload_json(payload: dict[str, Any] | list[Any], *, jsonb: bool) -> bytes:
    """The payload's JSON: as Postgres writes jsonb (for the size), or compact and ASCII for a
    bytea column (its bytes as before)."""
    text = _dumps(payload, "payload", _SPACED) if jsonb else \
        _dumps(payload, "payload", _COMPACT, ascii_only=True)  # its bytes as they always were
    problem = dumped_json_problem(text, payload)  # first: the walks below stay shallow
    if problem is not None:
        # Its field, as NaN's and a Decimal's (QA 50-h F1); depth is the whole payload's. A
        # key is written as a string, whatever its number (reread 51-h M1).
        path = None
        if BEYOND_DOUBLE in problem:
            path = next((path for path, item, is_key in _walk(payload, "")
                         if not is_key and beyond_double(item)), None)
        raise InvalidEventError(f"{_where('payload', path, False)} {problem}; the router would "
                                "dead-letter the event")
    if not jsonb:
        if "\\ud" in text:  # a surrogate's escape: of a pair (an emoji), or a lone one
            _utf8(_dumps(payload, "payload", _COMPACT), payload, "payload")
        return text.encode()
    _no_nul(text, payload, "payload")
    return _utf8(text, payload, "payload")


def headers_json(headers: dict[str, str]) -> bytes:
    """The headers' jsonb text: no NUL and no lone surrogate in a value."""
    text = _dumps(headers, "headers", _SPACED)
    data = _utf8(text, headers, "headers")
    _no_nul(text, headers, "headers")
    return data


def jsonb_size(data: bytes) -> int:
    """The length of the jsonb text Postgres writes for `data` (payload_json's, jsonb=True):
    its own but for each number Python wrote with an exponent, which jsonb (numeric) writes
    without one (QA 50-h F2: 14,000 floats 1e300 are 112 KB here and 4.2 MB there, 301 digits
    each; 1e-300 is "0." and 299 zeros and 1). One C-speed search for a payload with no digit
    before an e+, e-, E+ or E-, a count of the numbers' shapes for the others."""
    if _EXPONENT.search(data) is None:
        return len(data)
    shapes = Counter(_STRING_OR_NUMBER_SHAPE.findall(data))
    del shapes[(b"", b"", b"", b"")]  # the strings
    size = len(data) + sum(_longer_in_jsonb(*shape) * count for shape, count in shapes.items())
    if any(point and digit != b"0" and exponent[0] == ord("+")
           for _, digit, point, exponent in shapes):
        # Their digits after the point, which _longer_in_jsonb left out: jsonb writes them
        # once, in the whole part (1.2345678901234568e+16 is 12345678901234568).
        size -= len(b"".join(_STRING_OR_LARGE_FRACTION.findall(data)))
    return size


def _longer_in_jsonb(sign: bytes, digit: bytes, point: bytes, exponent_text: bytes) -> int:
    """How many bytes longer jsonb writes a number of this shape than Python wrote it, leaving
    out, for a positive exponent, the digits after the point (jsonb_size takes them off).
    numeric_in keeps as many digits after the point as the input has less the exponent (none
    for a positive one: see _STRING_OR_NUMBER_SHAPE); numeric_out writes them in full, with no
    exponent, and no sign on a zero."""
    exponent = int(exponent_text)
    written = len(sign) + 1 + len(point) + 1 + len(exponent_text)  # and its fraction's digits
    if digit == b"0":  # a Decimal zero (no digits after its point): 0E+5 is 0
        return (1 if exponent >= 0 else 2 - exponent) - written
    if exponent >= 0:  # its digits in full, then zeros: exponent + 1 of them
        return len(sign) + exponent + 1 - written
    # 0. and -exponent - 1 zeros, then its digits (as many as Python wrote)
    return len(sign) + 2 - exponent - written


def check_size(payload_bytes: int, headers_bytes: int) -> None:
    """The pipeline's size limit, whatever the table (reread 50-i F4: an SMT's own outbox has
    no check cdc_router_event_size, outbox init's): refused here, not by the server. Give it
    the jsonb text's length (jsonb_size), Postgres's to the byte but for keys jsonb keeps once
    ({1: .., "1": ..}) and a negative zero's sign, which jsonb drops (-0.0 is 0.0): refused
    here a byte early, a payload near the limit should be split anyway."""
    if payload_bytes + headers_bytes > MAX_EVENT_BYTES:
        raise InvalidEventError(
            f"the event is {payload_bytes + headers_bytes:,} bytes of payload and headers, over "
            f"the pipeline's limit of {MAX_EVENT_BYTES:,} (the size check {SIZE_CHECK} that "
            "`outbox init` gives an outbox): a change event that big would stop Debezium's "
            "connector; store the data elsewhere and send a reference to it")


def _dumps(value: Any, field: str, separators: tuple[str, str], *,
           ascii_only: bool = False) -> str:
    """json.dumps, with a decimal.Decimal written as its own text (review 50-d F2: an exact
    amount could only be sent as a string); json calls `exact` for nothing else it knows."""
    numbers: list[str] = []

    def exact(item: object) -> str:
        if not isinstance(item, Decimal) or _decimal_problem(item) is not None:
            raise TypeError(item.__class__.__name__)  # _not_json says where, and why
        numbers.append(str(item))
        return f"{_MARK}{len(numbers) - 1}"

    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=ascii_only,
                          separators=separators, default=exact)
        return _NUMBER.sub(lambda found: numbers[int(found[1])], text) if numbers else text
    except RecursionError:
        raise InvalidEventError(f"{field} is nested too deeply to write as JSON (the router "
                                f"reads up to {MAX_JSON_DEPTH} levels)") from None
    except (TypeError, ValueError) as error:
        if "Circular reference" in str(error):
            raise InvalidEventError(f"{field} contains itself (a circular reference), which "
                                    "JSON cannot hold") from None
        try:
            reason = _not_json(value, field)
        except RecursionError:
            reason = None
        raise InvalidEventError(reason or f"{field} is not JSON: {error}") from None


def _not_json(value: Any, field: str) -> str | None:
    """Where `value` holds what JSON cannot: NaN, Infinity, a key or value of another type."""
    for path, item, is_key in _walk(value, ""):
        where = _where(field, path, is_key)
        if isinstance(item, Decimal) and not is_key:
            problem = _decimal_problem(item)
            if problem is None:
                continue
            return f"{where} {problem}"
        if isinstance(item, float) and not math.isfinite(item):
            return (f"{where} is {item!r}, which JSON cannot hold (NaN and Infinity are not "
                    "JSON): send null or a string")
        if is_key and not isinstance(item, str | int | float | bool | None):
            return f"{where} is a {item.__class__.__name__}: JSON keys are strings"
        if not isinstance(item, str | int | float | bool | dict | list | tuple | None):
            return (f"{where} is a {item.__class__.__name__}, which is not JSON: convert it "
                    "first (a string, a number, a dict or a list)")
    return None


def _decimal_problem(number: Decimal) -> str | None:
    if not number.is_finite():
        return (f"is {number!r}, which JSON cannot hold (NaN and Infinity are not JSON): send "
                "null or a string")
    if math.isinf(float(number)):  # the router's strict read refuses it, as 1e400
        return beyond_double_reason(f"{BEYOND_DOUBLE} ({str(number)[:40]})")
    scale = -int(number.as_tuple().exponent)
    if scale > NUMERIC_SCALE_MAX:  # jsonb's numeric input refuses it (reread 50-i F1)
        return (f"has {scale:,} digits after the decimal point, over the {NUMERIC_SCALE_MAX:,} "
                "Postgres's numeric holds: round it first (Decimal.quantize), or send a string")
    return None


def _utf8(text: str, value: Any, field: str) -> bytes:
    """`text` as UTF-8, a surrogate pair held as two code points joined into its character
    (review 50-i F9: as jsonb joins an escaped pair), or InvalidEventError naming where `value`
    holds a lone surrogate."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        joined = _pairs_joined(text)
        if joined is not None:
            return joined.encode("utf-8")
        path, is_key = _first(value, lambda item: isinstance(item, str)
                              and _pairs_joined(item) is None)
        raise InvalidEventError(f"{_where(field, path, is_key)} holds {LONE_SURROGATE}") \
            from None


def _pairs_joined(text: str) -> str | None:
    """`text` with each surrogate pair joined into one character, or None if one is lone."""
    joined = join_surrogate_pairs(text)
    return joined if utf8_encodable(joined) else None


def _no_nul(text: str, value: Any, field: str) -> None:
    if "\\u0000" not in text:  # json.dumps escapes a NUL so; a match may be an escaped "\\"
        return
    found = _first(value, lambda item: isinstance(item, str) and "\x00" in item)
    if found[0] is not None:
        path, is_key = found
        raise InvalidEventError(f"{_where(field, path, is_key)} holds a NUL character "
                                "(\\u0000), which Postgres jsonb cannot store")


def _first(value: Any, test: Callable[[Any], bool]) -> tuple[str | None, bool]:
    return next(((path, is_key) for path, item, is_key in _walk(value, "") if test(item)),
                (None, False))


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any, bool]]:
    """(path, item, is it a key) for every key and value in `value`, depth first. Only on the
    way to an error."""
    yield path, value, False
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            yield where, key, True
            yield from _walk(item, where)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}[{index}]")


def _where(field: str, path: str | None, is_key: bool) -> str:
    if not path:
        return field
    return f"{field} {'key' if is_key else 'field'} {show(path)}"
