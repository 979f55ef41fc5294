"""Numeric columns as Debezium sends them with `decimal.handling.mode=precise` (its default), read
back as decimal text when the envelope's schema says what they are.

Precise mode sends a `numeric(p, s)` as Kafka Connect's Decimal (the unscaled value's two's-
complement bytes, base64 in JSON, the scale in the schema's parameters) and a `numeric` without
a scale as Debezium's VariableScaleDecimal (`{"scale": s, "value": base64}`). Taken as text, an
aggregate id or a `key: <column>` of such a column was its base64 (QA 31-a: 19.90 went out as
`B8Y=`). Without a schema (schemas.enable=false) the bytes cannot be told from text: the shipped
connector sets `decimal.handling.mode=string` (connectors/README.md).
"""

from __future__ import annotations

import base64
import binascii
from decimal import Decimal
from typing import Any

CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"


def decimals_as_text(row: dict[str, Any], columns: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`row` with each Decimal or VariableScaleDecimal value of `columns` (the row's Connect
    field schemas) as its decimal text; a value that does not decode stays as it is, for the
    row's own checks to word."""
    decoded = {}
    for name, schema in columns.items():
        kind = schema.get("name")
        if kind == CONNECT_DECIMAL:
            parameters = schema.get("parameters")
            text = _decimal_text(row.get(name), parameters.get("scale")
                                 if isinstance(parameters, dict) else None)
        elif kind == VARIABLE_SCALE_DECIMAL and isinstance(row.get(name), dict):
            value = row[name]
            text = _decimal_text(value.get("value"), value.get("scale"))
        else:
            continue
        if text is not None:
            decoded[name] = text
    return {**row, **decoded} if decoded else row


# No Postgres numeric goes beyond these: 131,072 digits before the point and 16,383 after
# (61,230 bytes unscaled, 81,640 in base64); a declared scale is within +-1000. A value beyond
# them is no Debezium's, and its text would cost time and memory without bound (review 47-a: a
# scale of 3,000,000,000 in a 4.7 KB event raised MemoryError; 700 KB of digits took 67 s).
_MAX_SCALE = 16_383
_MAX_BASE64 = 81_640


def _decimal_text(encoded: Any, scale: Any) -> str | None:
    if not isinstance(encoded, str) or len(encoded) > _MAX_BASE64:
        return None
    try:
        exponent = -int(scale)
        if abs(exponent) > _MAX_SCALE:
            return None
        unscaled = int.from_bytes(base64.b64decode(encoded, validate=True), "big", signed=True)
        sign, digits, _ = Decimal(unscaled).as_tuple()  # exact: no context's precision
        return f"{Decimal((sign, digits, exponent)):f}"  # 1200, not 1.2E+3 (scale -2)
    except (binascii.Error, ValueError, TypeError, ArithmeticError):
        return None
