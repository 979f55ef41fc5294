"""The relay's dead letters: a row as read, as JSON, and the event read back from one.

A router dead letter holds the raw change event; the relay has none, so its letter's value is
the row itself, `{"source": {table, seq, txid}, "after": {column: value}, "columns": {...}}`
(values as Debezium's JsonConverter would send them; `columns`: the Connect schemas the reader
knew, a bytea payload's). `dlq replay` rebuilds the event from it with the relay's own
decoding (debezium.event_from_row), then routes it like any other letter.
"""

from __future__ import annotations

import json
from typing import Any

from cdc_router.config.source import SourceSettings
from cdc_router.errors import DecodeError
from cdc_router.router import debezium
from cdc_router.router.debezium import OutboxEvent
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


def letter_event(value: bytes | None, settings: SourceSettings) -> OutboxEvent:
    """The event of a relay dead letter's row; DecodeError when it is not one, or the row
    still fails to decode."""
    try:
        document = parse_json(value or b"")
    except ValueError:  # malformed, too deep, or not UTF-8 (UnicodeDecodeError)
        document = None
    after = document.get("after") if isinstance(document, dict) else None
    if not isinstance(after, dict):
        raise DecodeError("not a relay dead letter: its value has no 'after' row")
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
        # Written before letters kept the columns' types: a bytea payload's base64 text
        # would pass for JSON.
        raise DecodeError("a relay dead letter of an earlier version, without its columns' "
                          "types: set source.payload_type (json or bytes) to replay it")
    return debezium.event_from_row(after, settings,
                                   columns=columns if isinstance(columns, dict) else None,
                                   tx_id=txid if isinstance(txid, int) else None,
                                   via_connect=False)  # read as the relay read it (53-k F-5)
