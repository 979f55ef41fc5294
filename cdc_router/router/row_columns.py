"""The outbox row's payload, headers and created_at columns, as Debezium's JsonConverter sends
them (router/debezium.py reads the rest of the row).

An optional column the config names (`source.outbox.headers`, `created_at`) that a row lacks is
one WARNING per process (QA 34-e: a renamed headers column dropped every row's headers without
a word; a renamed created_at fell back to the change event's time): set the config to the
column's name, or to null when the table has none.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from cdc_router.config.utf8 import LONE_SURROGATE
from cdc_router.errors import DecodeError, JsonTooDeep, MissingColumn, show
from cdc_router.router.connect_time import UNIT_SCHEMAS, epoch_millis
from cdc_router.serde.json import (
    exact_json_text,
    json_kind,
    json_problem,
    parse_json,
)

if TYPE_CHECKING:
    from cdc_router.config.source import SourceSettings

log = logging.getLogger("cdc_router.router")
_warned: set[str] = set()  # the optional columns found missing from a row, once each


def _missing(column: str, field: str, effect: str) -> None:
    """One WARNING per process for an optional column the config names and a row lacks."""
    if column in _warned:
        return
    _warned.add(column)
    log.warning("event=column_missing column=%s field=source.outbox.%s hint=%r", column, field,
                f"the rows have no {column!r} column: {effect}; set source.outbox.{field} to "
                "the column's name (renamed?), or to null when the table has none")


def event_named(event_id: str) -> str:
    """How a row's reason names its event, built only when a check fails (the hot path)."""
    return f"event {show(event_id)}"


def payload_column(row: dict[str, Any], column: str, schema: dict[str, Any] | None,
             settings: SourceSettings, event_id: str) -> tuple[bytes, bool]:
    """The payload column as (bytes, is_json), per its schema or settings.payload_type."""
    if column not in row:
        raise MissingColumn(f"{event_named(event_id)}: payload column {column!r} is missing "
                            "from the row", column=column, row_columns=tuple(row))
    value = row[column]
    if value is None:
        raise DecodeError(f"{event_named(event_id)}: payload column {column!r} is null")
    kind = settings.payload_type
    if kind == "auto":
        kind = "bytes" if schema is not None and schema.get("type") == "bytes" else "json"
    if kind == "json":
        # A column already expanded into JSON (e.g. by an SMT): keep it as compact JSON text.
        text = value if isinstance(value, str) else _json(value)
        try:
            return text.encode("utf-8"), True
        except UnicodeEncodeError:
            raise DecodeError(f"{event_named(event_id)}: payload column {column!r} holds "
                              f"{LONE_SURROGATE}") from None
    if not isinstance(value, str):
        raise DecodeError(f"{event_named(event_id)}: bytea payload column {column!r} must "
                          f"arrive as a {settings.binary_handling} string, got "
                          f"{json_kind(value)}")
    try:
        if settings.binary_handling == "hex":
            return bytes.fromhex(value), False
        url_safe = settings.binary_handling == "base64-url-safe"  # - and _ for + and /
        return base64.b64decode(value, b"-_" if url_safe else None, validate=True), False
    except (ValueError, binascii.Error):
        # QA 35-c: on a jsonb column, payload_type bytes was the wrong setting, not this one.
        other = "; or the column is not bytea: then source.payload_type json (or auto)" \
            if settings.payload_type == "bytes" else ""
        raise DecodeError(f"{event_named(event_id)}: payload column {column!r} is not valid "
                          f"{settings.binary_handling} (source.binary_handling must match the "
                          f"connector's binary.handling.mode{other})") from None


def headers_column(row: dict[str, Any], column: str | None,
                   event_id: str) -> tuple[tuple[str, str], ...]:
    """The headers column: a JSON object (jsonb string) of headers; absent or null is none."""
    raw = row.get(column) if column else None
    if raw is None:
        if column and column not in row:
            _missing(column, "headers", "events go without the row's headers")
        return ()
    if isinstance(raw, str):
        try:
            # Exact numbers: a header value 1.10 is sent as "1.10", as the row wrote it.
            raw = parse_json(raw, exact_numbers=True, strict=True)
        except JsonTooDeep as error:
            raise DecodeError(f"{event_named(event_id)}: headers column {column!r} is JSON {error} "
                              "(MAX_JSON_DEPTH); headers are a flat object of strings") from None
        except json.JSONDecodeError as error:
            raise DecodeError(f"{event_named(event_id)}: headers column {column!r} is not valid "
                              f"JSON: {error.msg} at column {error.colno}") from None
        except ValueError as error:  # e.g. an integer over Python's 4,300 digits
            raise DecodeError(f"{event_named(event_id)}: headers column {column!r} "
                              f"{json_problem(error)}") from None
    if not isinstance(raw, dict):
        raise DecodeError(f"{event_named(event_id)}: headers column {column!r} must be a JSON "
                          f"object of headers, got {json_kind(raw)}")
    try:
        return tuple([(name, value if type(value) is str else exact_json_text(value))
                      for name, value in raw.items()])
    except ValueError as error:
        raise DecodeError(f"{event_named(event_id)}: headers column {column!r} cannot be read: "
                          f"{error}") from None


def created_at_column(row: dict[str, Any], column: str | None, columns: dict[str, dict[str, Any]],
                event_id: str, unit: str, otherwise: int | None, *,
                via_connect: bool = True) -> int | None:
    """created_at in epoch milliseconds, from any of Debezium's timestamp encodings;
    `otherwise` when the row has none (no such column, or null) and it is a Kafka timestamp
    (review 34-2: a ts_ms of 2^63+5 crashed the producer), else None (the producer's clock).
    `via_connect`: see connect_time.epoch_millis."""
    value = row.get(column) if column else None
    if value is None:
        if column and column not in row:
            _missing(column, "created_at", "records take the change event's time")
        return otherwise if otherwise is not None and 0 <= otherwise < 2**63 else None
    if isinstance(value, bool) or not isinstance(value, (int, str)):  # no Union built per row
        raise DecodeError(f"{event_named(event_id)}: created_at column {column!r} must be a "
                          f"timestamp, got {json_kind(value)}")
    named = columns[column].get("name") if column in columns else None
    try:
        return epoch_millis(value, (named if isinstance(named, str) else None)
                            or UNIT_SCHEMAS.get(unit), via_connect=via_connect)
    except ValueError as error:
        raise DecodeError(f"{event_named(event_id)}: created_at column {column!r} "
                          f"{error}") from None


def column_text(value: Any) -> str | None:
    """A column's value as text: None as None, a string as is, anything else as compact JSON."""
    if value is None or isinstance(value, str):
        return value
    if type(value) is int:
        return str(value)  # what json.dumps writes for an int (bool is not int's type)
    if type(value) is float and math.isfinite(value):
        return java_double_text(value)
    return _json(value)


def java_double_text(value: float) -> str:
    """A finite double as Java's Double.toString writes it, which is how Jackson wrote it into
    the change event and how the EventRouter SMT keys by it: `1.0E20`, `1.0E-5`, `1.0E7`,
    `0.001`, where Python writes 1e+20, 1e-05, 10000000.0 (QA 46-b: another key's bytes put
    6 of 12 rows keyed by a double precision column on another partition than the SMT's)."""
    if 1e-3 <= abs(value) < 1e7 or value == 0:
        return repr(value)  # Python's and Java's decimal forms agree here (`-0.0`, `100.0`)
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)  # finite
    text = "".join(map(str, digits))
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{exponent + len(text) - 1}"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
