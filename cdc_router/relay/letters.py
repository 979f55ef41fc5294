"""The relay's dead letters: a row as read, as JSON, and the event read back from one.

A router dead letter holds the raw change event; the relay has none, so its letter's value is
the row itself, `{"source": {table, seq, txid}, "after": {column: value}, "columns": {...}}`
(values as Debezium's JsonConverter would send them; `columns`: the Connect schemas the reader
knew, a bytea payload's). `dlq replay` rebuilds the event from it with the relay's own
decoding (debezium.event_from_row), then routes it like any other letter.
"""

from __future__ import annotations

import json
import re
from typing import Any

from cdc_router.config.model import RouterConfig
from cdc_router.config.source import SourceSettings
from cdc_router.dead_letter import DeadLetter, dead_letter
from cdc_router.errors import DecodeError
from cdc_router.relay.reader import RelayRow
from cdc_router.router import debezium
from cdc_router.router.debezium import OutboxEvent
from cdc_router.router.step import DeadLettered
from cdc_router.serde.json import parse_json


def letter_value(table: str, seq: int, txid: int, values: dict[str, Any],
                 columns: dict[str, dict[str, Any]], *,
                 undecodable: Exception | None = None) -> bytes:
    """The value of the relay's dead letter of one row; `undecodable`: why its text was not
    read (its values then hold the bytes escaped, which a replay must not deliver)."""
    document: dict[str, Any] = {"source": {"table": table, "seq": seq, "txid": txid},
                                "after": values, "columns": columns}
    if undecodable is not None:
        document["undecodable"] = str(undecodable)
    return json.dumps(document, ensure_ascii=False).encode(errors="replace")


def row_letter(config: RouterConfig, table: str, row: RelayRow,
               columns: dict[str, dict[str, Any]], result: DeadLettered, *,
               max_bytes: int | None) -> DeadLetter:
    """The dead letter of a row the relay read; its value is the row as read (letter_value)."""
    value = letter_value(table, row.seq, row.txid, row.values, columns,
                         undecodable=row.undecodable)
    key = row.values.get(config.source.outbox.for_row(row.values).id)
    return dead_letter(topic=table, partition=0, offset=row.seq,
                       key=None if key is None else str(key).encode(errors="replace"),
                       value=value, original_headers=None, stage=result.stage,
                       error=result.error, event_id=result.event_id, max_bytes=max_bytes,
                       group=config.source.group_id)


def letter_event(value: bytes | None, settings: SourceSettings) -> OutboxEvent:
    """The event of a relay dead letter's row; DecodeError when it is not one, or the row
    still fails to decode (with the row's id, for the log line and the new letter: QA 56-f
    F-5 logged id=None)."""
    try:
        document = parse_json(value or b"")
    except ValueError:  # malformed, too deep, or not UTF-8 (UnicodeDecodeError)
        document = None
    after = document.get("after") if isinstance(document, dict) else None
    if not isinstance(after, dict):
        raise DecodeError("not a relay dead letter: its value has no 'after' row")
    try:
        return _row_event(document, after, settings)
    except DecodeError as error:
        column = settings.outbox.for_row(after).id
        if error.event_id is None and after.get(column) is not None:
            error.event_id = str(after[column])
        raise


def _row_event(document: dict[str, Any], after: dict[str, Any],
               settings: SourceSettings) -> OutboxEvent:
    if document.get("undecodable"):  # QA 47-g F4: `caf\xe9` was delivered as seven characters
        raise DecodeError(f"the row's text was not UTF-8 when the relay read it "
                          f"({document['undecodable']}); the letter holds it escaped, so it is "
                          "not replayed: fix the row's text and write the event again as a "
                          "new outbox row")
    source = document.get("source")
    txid = source.get("txid") if isinstance(source, dict) else None
    columns = document.get("columns")
    if isinstance(columns, dict) and not all(isinstance(kind, dict)
                                             for kind in columns.values()):
        # QA 33-c: a hand-made letter's {"payload": "bytes"} gave an AttributeError's text.
        raise DecodeError("not a relay dead letter: its 'columns' must map each column to "
                          "its schema (an object)")
    if not isinstance(columns, dict) and settings.payload_type == "auto":
        settings = _earlier_letter_settings(after, settings)
    return debezium.event_from_row(after, settings,
                                   columns=columns if isinstance(columns, dict) else None,
                                   tx_id=txid if isinstance(txid, int) else None,
                                   via_connect=False)  # read as the relay read it (53-k F-5)


# Every character a bytea payload's text may hold, in base64, base64-url-safe or hex.
_BINARY_TEXT = re.compile(r"[A-Za-z0-9+/=_-]*")


def _earlier_letter_settings(after: dict[str, Any], settings: SourceSettings) -> SourceSettings:
    """`settings` for a letter of a relay before 0.2.0, which kept no columns' types: its
    payload is the column's text, JSON text (jsonb, json, text) or a bytea's base64 or hex
    (QA 56-f F-5: the first replay dead-lettered every such letter again). Text that reads as
    JSON and holds a character no binary encoding writes (`{`, `"`, `[`, `.`, a space) is
    JSON. Any other (`1234`, `true`, `null`, `SGk=`) may be either, and is refused."""
    payload = after.get(settings.outbox.for_row(after).payload)
    if isinstance(payload, str) and not _BINARY_TEXT.fullmatch(payload):
        try:
            parse_json(payload.encode())
        except ValueError:
            pass
        else:
            return settings.model_copy(update={"payload_type": "json"})
    # Written before letters kept the columns' types: a bytea payload's base64 text would
    # pass for JSON.
    raise DecodeError("a relay dead letter of an earlier version (before 0.2.0), without its "
                      "columns' types, whose payload may be JSON or a bytea's text: set "
                      "source.payload_type (json or bytes) to replay it")
