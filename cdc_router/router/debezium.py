"""Pure decoding of Debezium PostgreSQL change events (Kafka Connect JsonConverter) to OutboxEvents,
with schemas (`{"schema": ..., "payload": ...}`) or without: a schema tells how payload,
created_at and numeric columns are encoded; else SourceSettings does."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from cdc_router.config.converter import CONVERTER_FIX
from cdc_router.config.utf8 import LONE_SURROGATE, utf8_encodable
from cdc_router.dead_letter import MAX_EVENT_ID_BYTES
from cdc_router.errors import DecodeError, JsonTooDeep, MissingColumn, show
from cdc_router.router.connect_decimal import decimals_as_text
from cdc_router.router.row_columns import (
    column_text,
    created_at_column,
    event_named,
    headers_column,
    payload_column,
)
from cdc_router.router.values import quick_init
from cdc_router.serde.json import (
    MAX_JSON_DEPTH,
    json_kind,
    json_problem,
    parse_json,
)

if TYPE_CHECKING:
    from cdc_router.config.outbox_columns import OutboxColumnNames
    from cdc_router.config.source import SourceSettings

# Skipped.reason values, for counting.
TOMBSTONE = "tombstone"
DELETE = "delete"
UPDATE = "update"
TRUNCATE = "truncate"
MESSAGE = "message"
HEARTBEAT = "heartbeat"
TRANSACTION_METADATA = "transaction_metadata"
SNAPSHOT_DISABLED = "snapshot_disabled"

# Confluent's wire format: byte 0, the schema's id in 4 bytes, then the converter's encoding.
_REGISTRY_MAGIC = b"\x00"
_REGISTRY_HEADER = 5

# Levels a column value sits below the record value's top: {schema, payload} > after > column.
_ENVELOPE_LEVELS = 3


@quick_init
@dataclass(frozen=True)
class OutboxEvent:
    """One outbox row, as inserted: the event the router delivers."""

    event_id: str
    aggregate_type: str
    aggregate_id: str
    type: str
    payload: bytes  # JSON text for jsonb/json/text columns, the raw bytes for bytea
    payload_is_json: bool
    headers: tuple[tuple[str, str], ...]
    created_at_ms: int | None
    op: str
    lsn: int | None
    tx_id: int | None
    # The row's other columns, as text (non-strings JSON-encoded), for `key: <column>` routes.
    extra_columns: tuple[tuple[str, str | None], ...] = ()

    def column(self, name: str) -> str | None:
        """The text of one of extra_columns; KeyError when the row has no such column."""
        for column, value in self.extra_columns:
            if column == name:
                return value
        raise KeyError(name)


@dataclass(frozen=True)
class Skipped:
    """A record that carries no event to deliver, and why (one of this module's reason names)."""

    reason: str
    detail: str = ""


def decode_change(key: bytes | None, value: bytes | None, *, topic: str,
           settings: SourceSettings) -> OutboxEvent | Skipped:
    """Decode one raw change record into an OutboxEvent, or say why it carries none.

    Routed: op c, and op r unless settings.snapshot_rows is off. Skipped: tombstones, deletes,
    updates (unless settings.on_update is 'fail'), truncates, logical messages, heartbeats and
    transaction metadata. Raises DecodeError, with the reason, for anything else. `key` is not
    needed (the event id is a column) and is accepted for symmetry with the consumed record.
    """
    del key
    if value is None:
        return Skipped(TOMBSTONE)
    inserted = _common_insert(value, settings)
    if inserted is not None:
        return inserted
    document = _parse_json(value)
    schema: dict[str, Any] | None = None
    envelope: Any = document
    if isinstance(document, dict) and set(document) == {"schema", "payload"}:
        schema, envelope = document["schema"], document["payload"]
    if not isinstance(envelope, dict):
        # QA 35-a F3: Debezium's EventRouter SMT left on the connector sends the payload
        # column as a JSON string.
        raise DecodeError(f"not a Debezium change event: the value is {json_kind(envelope)}, "
                          "not an object; a transform on the connector (such as the "
                          "EventRouter SMT) may have reshaped it: the router reads Debezium's "
                          "raw change events through JsonConverter")
    op = envelope.get("op")
    if op is None:  # a change with an op is read on any topic (QA 47-g F5: a ^pattern
        if topic.startswith(settings.heartbeat_topic_prefix):  # source's topics under the
            return Skipped(HEARTBEAT, topic)  # prefix had every event skipped, unsaid)
        return _not_a_change(envelope)
    if op == "d":
        return Skipped(DELETE)
    if op == "t":
        return Skipped(TRUNCATE)
    if op == "m":
        return Skipped(MESSAGE)
    if op == "u":
        if settings.on_update == "fail":
            failure = DecodeError("update of an outbox row (op 'u'): an outbox is insert-only "
                                  "and source.on_update is 'fail'")
            after = envelope.get("after")
            updated = after.get(settings.outbox.for_row(after).id) \
                if isinstance(after, dict) else None
            if isinstance(updated, str | int) and not isinstance(updated, bool) and \
                    len(str(updated).encode("utf-8", "surrogatepass")) <= MAX_EVENT_ID_BYTES:
                failure.event_id = str(updated)  # for dlq list and dlq replay --id
            raise failure
        return Skipped(UPDATE)
    if op == "r" and not settings.snapshot_rows:
        return Skipped(SNAPSHOT_DISABLED)
    if op not in ("c", "r"):
        raise DecodeError(f"unknown Debezium op {show(op)}; expected c, r, u, d, t or m")
    row = envelope.get("after")
    if not isinstance(row, dict):
        raise DecodeError(f"op {op!r} event has no 'after' row (got {json_kind(row)})")
    found, columns = envelope.get("source"), _row_schema(schema)
    source: dict[str, Any] = found if isinstance(found, dict) else {}
    return event_from_row(decimals_as_text(row, columns), settings, columns=columns,
                          op=str(op), lsn=_optional_int(source.get("lsn")),
                          tx_id=_optional_int(source.get("txId")),
                          envelope_ms=_optional_int(envelope.get("ts_ms")))


class _Source(msgspec.Struct):
    lsn: int | None = None
    txId: int | None = None  # Debezium's name


class _Insert(msgspec.Struct):
    """The fields the router reads of an insert without a schema (the shipped connector's
    JsonConverter, schemas.enable=false); msgspec skips the others without building them."""

    op: str
    after: dict[str, Any]
    source: _Source | None = None
    ts_ms: int | None = None


_INSERT = msgspec.json.Decoder(_Insert)


def _common_insert(value: bytes, settings: SourceSettings) -> OutboxEvent | None:
    """The event of an insert (or routed snapshot read) in the common shape, decoded straight
    into typed fields; None for any other record or shape, which the general path decodes.

    Equal to the general path wherever it answers: the same msgspec parse of the same text (a
    text msgspec refuses goes to the general path, which words the reason), the same row
    checks (event_from_row), and no more brackets than the general path's depth limit. One
    difference, kept for speed: bytes that are not UTF-8 in a field it skips (`source`,
    `before`) pass here and are the general path's decode letter (review 47-a F1); the fields
    it reads are checked, and Debezium's JsonConverter writes no such bytes anywhere.
    """
    if value.count(b"{") + value.count(b"[") > MAX_JSON_DEPTH + _ENVELOPE_LEVELS:
        return None
    try:
        change = _INSERT.decode(value)
    except msgspec.DecodeError:  # also a field of another type (ValidationError)
        return None
    op = change.op
    if op != "c" and (op != "r" or not settings.snapshot_rows):
        return None
    source = change.source
    if source is None:
        return event_from_row(change.after, settings, op=op, envelope_ms=change.ts_ms)
    return event_from_row(change.after, settings, op=op, lsn=source.lsn, tx_id=source.txId,
                          envelope_ms=change.ts_ms)


def _parse_json(value: bytes) -> Any:
    if value[:1] == _REGISTRY_MAGIC and len(value) >= _REGISTRY_HEADER:  # never JSON's start
        schema_id = int.from_bytes(value[1:_REGISTRY_HEADER], "big")
        # Review 49-f F2: a JSON Schema record was "malformed JSON at line 1, column 1".
        raise DecodeError(f"the value starts with byte 0 and a 4-byte schema id ({schema_id}): "
                          "it looks like schema-registry framing (Confluent's AvroConverter, "
                          "JsonSchemaConverter or ProtobufConverter), not the JSON the router "
                          f"decodes: on the connector, {CONVERTER_FIX}")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DecodeError(f"the value is not UTF-8 (byte {error.start}); the router reads "
                          "Kafka Connect's JsonConverter output") from None
    try:
        # A column may hold MAX_JSON_DEPTH levels of its own, below the envelope's.
        return parse_json(text, max_depth=MAX_JSON_DEPTH + _ENVELOPE_LEVELS)
    except JsonTooDeep as error:
        raise DecodeError(f"the value is JSON {error}: a column holds more than "
                          f"{MAX_JSON_DEPTH} (MAX_JSON_DEPTH)") from None
    except ValueError as error:  # JSONDecodeError; an integer over Python's 4,300 digits
        if isinstance(error, json.JSONDecodeError) and "BOM" not in error.msg:
            raise DecodeError(f"malformed JSON at line {error.lineno}, column {error.colno}: "
                              f"{error.msg}") from None
        raise DecodeError(f"the value {json_problem(error)}") from None  # fuzz 32-c


def _not_a_change(envelope: dict[str, Any]) -> Skipped:
    """Records without an op on a change topic: transaction metadata or heartbeats, else bad.
    Told apart by shape, not by topic name: the router knows neither the connector's topic.prefix
    nor its topic.transaction name, and a suffix test would catch a table called `transaction`."""
    if envelope.get("status") in ("BEGIN", "END") and "id" in envelope:
        return Skipped(TRANSACTION_METADATA, str(envelope["status"]))
    if set(envelope) == {"ts_ms"}:
        return Skipped(HEARTBEAT)
    keys = ", ".join(show(key, 40) for key in sorted(map(str, envelope))[:8])
    raise DecodeError(f"not a Debezium change event: no 'op' field (keys: {keys}); a "
                      "transform such as ExtractNewRecordState strips the envelope it reads")


def _row_schema(schema: Any) -> dict[str, dict[str, Any]]:
    """Column name -> its Connect field schema, from the envelope schema's 'after' struct."""
    # A list where the fields are, else none (review 47-a F4: a number there was a TypeError).
    fields = schema.get("fields") if isinstance(schema, dict) else None
    for field in fields if isinstance(fields, list) else []:
        if isinstance(field, dict) and field.get("field") == "after":
            columns = field.get("fields")
            return {f["field"]: f for f in columns if isinstance(f, dict) and
                    isinstance(f.get("field"), str)} if isinstance(columns, list) else {}
    return {}


def event_from_row(row: dict[str, Any], settings: SourceSettings, *,
                   columns: dict[str, dict[str, Any]] | None = None, op: str = "c",
                   lsn: int | None = None, tx_id: int | None = None,
                   envelope_ms: int | None = None, via_connect: bool = True) -> OutboxEvent:
    """One outbox row, its values encoded as Debezium's JsonConverter sends them, as an event.

    The one home of the row's checks, for the router (a change event's `after`) and the relay
    (a row it read itself). `columns`: column name -> its Connect field schema, when known.
    `envelope_ms`: the change event's ts_ms, the record's time when the row has no created_at
    (as the EventRouter SMT's). `via_connect`: False for the relay's rows, read from Postgres
    (a created_at of exactly 0 is then a time). Raises DecodeError, with the reason.
    """
    columns = columns or {}
    # The first name of each column, unless a rename lists several (QA 63-a F-1): the one
    # check, for a config with no list; then the first of them this row has.
    listed = settings.outbox
    names = listed.first if not listed.renamed else listed.for_row(row)
    try:
        event_id = _identifier(row, names.id, "event id", None)
    except MissingColumn as error:  # review 64: a listed id was named by its first name
        raise _none_listed(error, listed, None) if listed.renamed else error from None
    if len(event_id) > MAX_EVENT_ID_BYTES // 4:  # a str of fewer characters fits anyway
        _check_id_size(event_id, names.id)
    if "\x00" in event_id:  # QA 54-c F-7: every idempotent consumer would refuse it
        raise DecodeError(f"column {names.id!r} (event id) holds a NUL byte, which the "
                          "idempotent consumer and its dedup stores refuse (Postgres text "
                          f"cannot hold it): {show(event_id, 60)}")
    try:
        payload, is_json = payload_column(row, names.payload, columns.get(names.payload),
                                           settings, event_id)
        named = listed.named
        return OutboxEvent(
            event_id=event_id,
            aggregate_type=_identifier(row, names.aggregatetype, "aggregate type", event_id),
            aggregate_id=_identifier(row, names.aggregateid, "aggregate id", event_id),
            type=_identifier(row, names.type, "event type", event_id),
            payload=payload,
            payload_is_json=is_json,
            headers=headers_column(row, names.headers, event_id),
            created_at_ms=created_at_column(row, names.created_at, columns, event_id,
                                            settings.created_at_unit, envelope_ms,
                                            via_connect=via_connect),
            op=op,
            lsn=lsn,
            tx_id=tx_id,
            # A list comprehension, then a tuple: faster than a generator, and a str (most
            # columns) is its own text.
            extra_columns=tuple([(name, value if type(value) is str else column_text(value))
                                 for name, value in row.items() if name not in named]),
        )
    except DecodeError as error:
        error.event_id = event_id  # for the dead letter's dlq.event.id
        if listed.renamed and isinstance(error, MissingColumn):
            raise _none_listed(error, listed, event_id) from None
        raise


def _none_listed(error: MissingColumn, listed: OutboxColumnNames,
                 event_id: str | None) -> MissingColumn:
    """The letter of a row with none of a listed column's names names them all; `event_id`
    None: the id's own (the row has no event id to name)."""
    field = listed.fields.get(error.column, "")
    names = listed.listed_names.get(field, ())
    if len(names) < 2:
        return error
    prefix = f"{event_named(event_id)}: " if event_id is not None else ""
    missing = MissingColumn(f"{prefix}none of the columns {', '.join(map(repr, names))} "
                            f"(source.outbox.{field}) is in the row: list the column's name "
                            "there", column=error.column, row_columns=error.row_columns)
    missing.event_id = event_id if event_id is not None else error.event_id
    return missing


def _identifier(row: dict[str, Any], column: str, what: str, event_id: str | None) -> str:
    """A required identifier column: text, uuid (a string) or an integer; never empty."""
    value = row.get(column)
    if type(value) is str and value and value.isascii() and not value.isspace():
        return value  # the common case: every check below would pass
    prefix = f"{event_named(event_id)}: " if event_id is not None else ""
    if column not in row:
        raise MissingColumn(f"{prefix}column {column!r} ({what}) is missing from the row; "
                            "check source.outbox column names", column=column,
                            row_columns=tuple(row))
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise DecodeError(f"{prefix}column {column!r} ({what}) must be text, uuid or an "
                          f"integer, got {json_kind(value)}{_decimal_fix(value)}")
    text = str(value)
    if not text:
        raise DecodeError(f"{prefix}column {column!r} ({what}) is empty")
    if text.isspace():  # the idempotent consumer refuses a blank id too (consumer/event.py)
        raise DecodeError(f"{prefix}column {column!r} ({what}) is blank: {show(text)}")
    if not text.isascii() and not utf8_encodable(text):
        raise DecodeError(f"{prefix}column {column!r} ({what}) holds {LONE_SURROGATE}: "
                          f"{show(text)}")
    return text


def _decimal_fix(value: Any) -> str:
    """The connector setting that sent a numeric column as `value`, and the one to set; ''
    for a value no numeric column becomes."""
    if isinstance(value, float):  # QA 35-a F2
        mode = "a number with the connector's decimal.handling.mode=double"
    elif isinstance(value, dict) and set(value) == {"scale", "value"}:  # review 49-f F6
        mode = ("Debezium's VariableScaleDecimal {scale, value} (its unscaled bytes in base64) "
                "with the connector's decimal.handling.mode=precise, its default, when the "
                "column has no scale and the value no schema")
    else:
        return ""
    return (f"; a numeric column arrives as {mode}: set decimal.handling.mode=string on the "
            "connector (or make the column text)")


def _check_id_size(event_id: str, column: str) -> None:
    """DecodeError for an id over MAX_EVENT_ID_BYTES: the letter carries no dlq.event.id
    (neither does it have a mark), as the id itself is the trouble."""
    size = len(event_id.encode("utf-8", "surrogatepass"))
    if size > MAX_EVENT_ID_BYTES:
        raise DecodeError(f"column {column!r} (event id) is {size:,} bytes, over the "
                          f"{MAX_EVENT_ID_BYTES:,} an event id may have (the idempotent "
                          f"consumer and its dedup stores refuse longer ids): "
                          f"{show(event_id, 60)}")


def _optional_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
