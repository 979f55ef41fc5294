"""What a float or double field holds of a JSON number, and why one would not be written as
it was sent: beyond the type's range, NaN or infinity (JSON carries neither), an integer or a
float field's fraction rounded to another value (reviews 44-2, 48-d F4, 52-a F1, 52-j F1).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from fastavro.const import LONG_MAX_VALUE, LONG_MIN_VALUE

from cdc_router.errors import show


def number_reason(datum: Any, kind: str) -> Callable[[str], str] | None:
    """Why a JSON number in a `kind` (float or double) field would not be written as sent,
    as a reason given the field's path; None when it would."""
    if type(datum) is int:  # a JSON integer in a float or double field
        held = _held(datum, kind)
        if held is None:
            return lambda where: f"field {where!r} is {show(str(datum), 60)}, beyond an " \
                f"Avro {kind}"
        # Review 44-2: 9007199254740993 was written as 9007199254740992.0, without a word.
        if _as_written(datum, held, kind):
            return None
        double = _held(datum, "double") if kind == "float" else None
        kinds = [name for name, fits in (
            ("double", double is not None and _as_written(datum, double, "double")),
            ("long", LONG_MIN_VALUE <= datum <= LONG_MAX_VALUE)) if fits]
        fix = f"make the field a {' or a '.join(kinds)}, or send" if kinds else "send"
        return lambda where: f"field {where!r} is {show(datum, 60)}, which an Avro {kind} " \
            f"holds only as {held!r}: {fix} the number as a string"
    if not isinstance(datum, float):
        return None
    if not math.isfinite(datum):
        return lambda where: f"field {where!r} is {datum}, which JSON cannot carry: a " \
            "number beyond a double?"
    if kind == "float" and datum != 0:
        # Review 48-d F4: 16777217.0 was written as 16777216.0 (the integer 16777217 is
        # refused, above) and 1e-46 as 0.0, without a word. A fraction rounded to a float's
        # 24 bits (0.1) is what a float field asks for.
        held = _held(datum, kind)
        if held is None:
            return lambda where: f"field {where!r} is {datum}, beyond an Avro float (write " \
                "it as a double)"
        if held == 0 or (datum.is_integer() and not _as_written(datum, held, kind)):
            return lambda where: f"field {where!r} is {datum!r}, which an Avro float holds " \
                f"only as {held!r}: make the field a double"
    return None


def _held(datum: int | float | Decimal, kind: str) -> float | None:
    """What a `kind` (float or double) field holds for `datum` (rounded to nearest, as the
    writer does), or None when that rounds beyond the type's largest value."""
    try:
        if kind == "double":
            return float(datum)
        return float(struct.unpack("<f", struct.pack("<f", float(datum)))[0])
    except OverflowError:
        return None


def _as_written(datum: int | float, held: float, kind: str) -> bool:
    """Whether `held` reads back as the number written: the same value, or the shortest
    decimal that is `held`, which readers print (QA 52-a F1: jsonb writes a double as its
    shortest decimal with every digit, 1e23 as 100000000000000000000000, held as 1e+23;
    so is 264736620 in a float field, held as 264736624.0, printed 2.6473662E8)."""
    if held == datum:
        return True
    written = Decimal(datum) if type(datum) is int else Decimal(repr(datum))
    return _shortest(held, kind) == written


def _shortest(held: float, kind: str) -> Decimal:
    """The shortest decimal a `kind` field reads as `held`, the nearest of those, of an even
    last digit at a tie (as repr does for a double; a float's has at most 9 digits: at a
    power of two the nearest decimal of d digits may not read back where its neighbour
    does, review 52-j F1)."""
    if kind == "double":
        return Decimal(repr(held))
    exact = Decimal(held)
    for digits in range(1, 10):
        near = Decimal(f"{held:.{digits - 1}e}")
        step = Decimal(1).scaleb(near.adjusted() - digits + 1)
        fits = [c for c in (near - step, near, near + step) if _held(c, kind) == held]
        if fits:
            return min(fits, key=lambda c: (abs(c - exact), c.as_tuple().digits[-1] % 2))
    return exact
