"""Whether a payload an Avro route passes through as already encoded is framed so that a reader
finds its schema: Confluent's wire format with a registry, else Avro's single-object encoding.
Unframed bytes that are JSON text (QA 63-a F-6: an application still writing JSON after its
payload column became bytea) are said to be JSON, with the column type that encodes them."""

from __future__ import annotations

import json

from cdc_router.serde.avro_schema import SINGLE_OBJECT_HEADER, SINGLE_OBJECT_MAGIC

# Recognised, written here only for a plan (looks_only): confluent-kafka's serializer writes it.
CONFLUENT_MAGIC = b"\x00"  # Confluent wire format: magic byte, then a 4-byte schema id
CONFLUENT_HEADER = len(CONFLUENT_MAGIC) + 4


def unframed(value: bytes, *, registry: bool) -> str | None:
    """Why `value` is not framed as a route with (`registry`) or without a registry needs it,
    after 'the binary payload for <topic>'; None when it is."""
    if registry:
        ok, framing = (value[:1] == CONFLUENT_MAGIC and len(value) > CONFLUENT_HEADER,
                       "the registry's wire format (byte 0 + schema id)")
    else:
        ok, framing = (value[:2] == SINGLE_OBJECT_MAGIC and len(value) > SINGLE_OBJECT_HEADER,
                       "Avro single-object encoding (0xC3 0x01 + fingerprint)")
    if ok:
        return None
    return (f"is not framed in {framing}; already-encoded payloads pass through unchanged, so "
            f"they must be framed (starts with {value[:4].hex() or 'nothing'})"
            + (_AS_JSON if _json_text(value) else ""))


_AS_JSON = (
    "; its bytes are JSON text: an Avro route encodes a JSON payload into Avro from a jsonb, "
    "json or text payload column (source.payload_type auto or json), while a bytea column's "
    "bytes (payload_type bytes) pass through as already encoded: keep JSON in a jsonb column "
    "(ALTER TABLE ... ALTER COLUMN <payload> TYPE jsonb USING convert_from(<payload>, "
    "'UTF8')::jsonb), or have the application write framed Avro into the bytea column")


def _json_text(value: bytes) -> bool:
    """True for UTF-8 JSON text of an object or array (what a jsonb payload holds)."""
    if value.lstrip()[:1] not in (b"{", b"["):
        return False
    try:
        json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return True
