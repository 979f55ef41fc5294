"""JSON: the payload goes out as the bytes the row holds, once checked to be JSON."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, NoReturn

from cdc_router.errors import SerializeError

if TYPE_CHECKING:
    from cdc_router.debezium import OutboxEvent
    from cdc_router.settings import RouteRule


def _reject_constant(name: str) -> NoReturn:
    # Python's json accepts NaN and Infinity; JSON (RFC 8259) and downstream parsers do not.
    raise ValueError(f"{name} is not JSON")


class JsonSerializer:
    """Passes the payload through unchanged: JSON text checked to parse, or bytea as is."""

    def serialize(self, event: OutboxEvent, rule: RouteRule, topic: str) -> bytes:
        """The payload bytes; SerializeError when a JSON payload does not parse as JSON."""
        if event.payload_is_json:
            try:
                json.loads(event.payload, parse_constant=_reject_constant)
            except (ValueError, UnicodeDecodeError) as error:
                raise SerializeError(f"event {event.event_id!r}: payload for {topic!r} is not "
                                     f"valid JSON: {error}") from None
        return event.payload
