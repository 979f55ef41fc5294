"""The fast path of decode_change (an insert in the common shape, typed by msgspec) agrees with
the general path wherever it answers, and leaves every other record to the general path.

Each case is decoded twice: as the router does, and with the fast path switched off. The
outcome must be the same: an equal OutboxEvent or Skipped, or the same error class and message.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_router.config.source import SourceSettings
from cdc_router.router import debezium
from cdc_router.router.debezium import OutboxEvent, decode_change

FIXTURES = Path(__file__).parent / "fixtures" / "debezium"
ALL_FIXTURES = sorted(path.stem for path in FIXTURES.glob("*.json"))
TOPIC = "outbox.public.outbox"
SETTINGS = {
    "default": SourceSettings(topics=[TOPIC]),
    "no_snapshots": SourceSettings(topics=[TOPIC], snapshot_rows=False),
    "bytes": SourceSettings(topics=[TOPIC], payload_type="bytes"),
    "update_fails": SourceSettings(topics=[TOPIC], on_update="fail"),
}
INSERT = json.loads((FIXTURES / "create_jsonb.noschema.json").read_text("utf-8"))["value"]


def outcome(decode: Callable[[], Any]) -> Any:
    try:
        return decode()
    except Exception as error:  # the outcome compared is the error's class and message
        return type(error), str(error)


def both(value: bytes | None, source: SourceSettings,
         monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """(the router's outcome, the general path's outcome) for one raw value."""
    routed = outcome(lambda: decode_change(None, value, topic=TOPIC, settings=source))
    with monkeypatch.context() as patched:
        patched.setattr(debezium, "_common_insert", lambda value, settings: None)
        general = outcome(lambda: decode_change(None, value, topic=TOPIC, settings=source))
    return routed, general


def fast(value: bytes, source: SourceSettings | None = None) -> OutboxEvent | None:
    return debezium._common_insert(value, source or SETTINGS["default"])


def encoded(value: Any) -> bytes:
    return json.dumps(value).encode()


@pytest.mark.parametrize("source", SETTINGS)
@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_every_captured_record_decodes_as_on_the_general_path(
        name: str, source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    value = json.loads((FIXTURES / f"{name}.json").read_text("utf-8"))["value"]
    raw = None if value is None else encoded(value)
    routed, general = both(raw, SETTINGS[source], monkeypatch)
    assert routed == general


@pytest.mark.parametrize("name", ["create_jsonb.noschema", "create_text.noschema",
                                  "create_json.noschema", "snapshot_jsonb.noschema",
                                  "hostile_non_ascii.noschema", "hostile_long_300.noschema"])
def test_the_common_shapes_take_the_fast_path(name: str) -> None:
    value = json.loads((FIXTURES / f"{name}.json").read_text("utf-8"))["value"]
    assert isinstance(fast(encoded(value)), OutboxEvent)


def _with(**changes: Any) -> bytes:
    return encoded({**INSERT, **changes})


def _row(**changes: Any) -> bytes:
    return _with(after={**INSERT["after"], **changes})


# Raw values the fast path must leave to the general path (which skips them, or words the
# error): other ops, other shapes, types it does not expect, and texts msgspec refuses.
ODD_VALUES = {
    "update": _with(op="u"),
    "delete": _with(op="d"),
    "unknown_op": _with(op="x"),
    "op_null": _with(op=None),
    "op_number": _with(op=1),
    "no_op": encoded({key: item for key, item in INSERT.items() if key != "op"}),
    "after_null": _with(after=None),
    "after_list": _with(after=[1]),
    "no_after": encoded({key: item for key, item in INSERT.items() if key != "after"}),
    "source_text": _with(source="pg"),
    "lsn_bool": _with(source={"lsn": True, "txId": 1}),
    "lsn_float": _with(source={"lsn": 1.5, "txId": 1}),
    "lsn_text": _with(source={"lsn": "12", "txId": 1}),
    "with_schema": encoded({"schema": {"type": "struct"}, "payload": INSERT}),
    "array": b"[1, 2]",
    "null": b"null",
    "number": b"42",
    "not_utf8": _row(type="Order\udcff").replace(b"\\udcff", b"\xff"),
    "lone_surrogate": _row(type="Paid\ud800"),
    "nan": _row(tenant=float("nan")),
    "infinity": _row(tenant=float("inf")),
    "byte_order_mark": b"\xef\xbb\xbf" + _row(),
    "trailing_text": _row() + b" x",
    "truncated": _row()[:-3],
    "deep_column": _row(tenant=json.loads("[" * 300 + "]" * 300)),
    "deep_headers": _row(headers="[" * 300 + "]" * 300),
}


@pytest.mark.parametrize("case", ODD_VALUES)
def test_odd_values_fall_back_to_the_general_path(case: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    value = ODD_VALUES[case]
    assert fast(value) is None
    routed, general = both(value, SETTINGS["default"], monkeypatch)
    assert routed == general


def test_snapshot_reads_fall_back_when_snapshot_rows_is_off() -> None:
    read = _with(op="r")
    assert isinstance(fast(read), OutboxEvent)
    assert fast(read, SETTINGS["no_snapshots"]) is None


# Rows the fast path decodes: the row's own checks (event_from_row) are the general path's,
# errors included.
ROWS = {
    "duplicate_op_last_wins": _row().replace(b'"op": "c"', b'"op": "d", "op": "c"'),
    "source_null": _with(source=None),
    "lsn_beyond_64_bits": _with(source={"lsn": 2**70, "txId": 1}),
    "no_source": encoded({key: item for key, item in INSERT.items() if key != "source"}),
    "integer_id": _row(id=42),
    "empty_type": _row(type=""),
    "missing_payload": encoded({**INSERT, "after": {key: item for key, item in
                                                    INSERT["after"].items()
                                                    if key != "payload"}}),
    "payload_null": _row(payload=None),
    "expanded_payload": _row(payload={"a": [1, 2.5, None, True]}),
    "headers_not_json": _row(headers="{nope"),
    "headers_list": _row(headers="[1]"),
    "created_at_text": _row(created_at="2024-05-01T10:11:12.123456Z"),
    "created_at_year_12000": _row(created_at="+12000-01-01T00:00:00Z"),
    "created_at_bool": _row(created_at=True),
    "big_integer_column": _row(tenant=2**80),
    "surrogate_pair": _row(type="Paid\U0001f600"),
    "brackets_in_strings": _row(tenant="[" * 300),
}


@pytest.mark.parametrize("case", ROWS)
def test_rows_decode_as_on_the_general_path(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    routed, general = both(ROWS[case], SETTINGS["default"], monkeypatch)
    assert routed == general


_TEXT = st.text(alphabet='[]{}"\\ aé\u2028\x00', max_size=6)
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | _TEXT, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=20)
_COLUMNS = ["id", "aggregatetype", "aggregateid", "type", "payload", "headers", "created_at",
            "tenant"]


@settings(derandomize=True, max_examples=300)
@given(st.dictionaries(st.sampled_from(_COLUMNS), _JSON, max_size=4), st.booleans())
def test_any_row_decodes_as_on_the_general_path(changes: dict[str, Any],
                                                as_text: bool) -> None:
    if as_text:  # jsonb columns arrive as JSON text
        changes = {column: json.dumps(item) for column, item in changes.items()}
    value = _row(**changes)
    with pytest.MonkeyPatch.context() as monkeypatch:
        routed, general = both(value, SETTINGS["default"], monkeypatch)
    assert routed == general
