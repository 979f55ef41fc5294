"""The headers the router writes itself, which neither a route nor a row may write too."""

from __future__ import annotations

# The destination record's contract headers (DESIGN.md), on every record.
CONTRACT_HEADERS = frozenset({"id", "type", "aggregatetype", "aggregateid"})
# The CloudEvents Kafka binding (binary mode), on the records of a route with cloudevents on.
CLOUDEVENTS_HEADERS = frozenset(
    {"ce_id", "ce_type", "ce_source", "ce_time", "ce_specversion", "content-type"}
)
