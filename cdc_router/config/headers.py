"""The headers the router writes itself, which neither a route nor a row may write too, and the
header names that Kafka clients cannot carry.

One rule for both: config validation refuses such a name among a route's static `headers`, and
routing dead-letters an event whose row carries one in its headers column.
"""

from __future__ import annotations

# The destination record's contract headers (DESIGN.md), on every record.
CONTRACT_HEADERS = frozenset({"id", "type", "aggregatetype", "aggregateid"})
# What the CloudEvents Kafka binding (binary mode) writes besides its `ce_*` attributes.
CLOUDEVENTS_CONTENT_TYPE = "content-type"
CLOUDEVENTS_PREFIX = "ce_"
# For error lines: which names is_reserved_header() refuses.
RESERVED_HEADERS = ("the contract headers (id, type, aggregatetype, aggregateid), every ce_* "
                    "name, and content-type on a cloudevents route")


def is_reserved_header(name: str, *, cloudevents: bool) -> bool:
    """True when a route (static headers) or a row (headers column) may not write `name`.

    Reserved always: the contract headers and every `ce_*` name; with cloudevents on, also
    content-type. `ce_*` is reserved whatever the route says, not only the five attributes the
    router writes, because the CloudEvents Kafka binding reads every `ce_*` header as an
    attribute and a consumer takes a record with `ce_specversion` for a CloudEvent: a row's
    `ce_id` would then stand for the event id that downstream dedup relies on, and a row's
    `ce_subject` would pass for part of the envelope. Refusing them on every route also means
    that turning cloudevents on for a route leaves a row's `ce_*` headers as refused as before.
    Routing tests a row header's name inline (router/routing.py, the hot path): a new case goes
    there too.
    """
    if name in CONTRACT_HEADERS or name.startswith(CLOUDEVENTS_PREFIX):
        return True
    return cloudevents and name == CLOUDEVENTS_CONTENT_TYPE


def header_name_problem(name: str) -> str | None:
    """Why a Kafka record cannot carry a header named `name` as written, or None.

    librdkafka takes a header name as a C string, which ends at the first NUL: `id\\0x` would
    arrive as a second `id` header, a forged event id for downstream dedup. Routing tests a row
    header's name for NUL inline (router/routing.py, the hot path): a new case goes there too.
    """
    if "\x00" not in name:
        return None
    arrives_as = name.partition("\x00")[0]
    return (f"holds a NUL character, at which Kafka clients end a header name (it would arrive "
            f"as {arrives_as!r})")
