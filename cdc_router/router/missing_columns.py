"""A configured outbox column that no change event of a topic has: the config's fault.

Debezium sends every column of the row in `after`, so a column of source.outbox missing from
each event of a topic is a column name the config has wrong (a renamed column, a table of
its own names; QA 48-a: 7,219 of 7,219 events dead-lettered in under a second, the router
running on). One event without it is that record's dead letter; RUN_LIMIT of them in a row
on one topic, none of that topic read meanwhile, stop the router with the fix, as Debezium's
EventRouter fails its task on a wrong field name.
"""

from __future__ import annotations

from cdc_router.errors import ConfigError, MissingColumn
from cdc_router.outbox.table import OutboxColumns

RUN_LIMIT = 100


class MissingColumns:
    """Events without a configured column, in a row, per source topic."""

    def __init__(self, outbox: OutboxColumns) -> None:
        self._fields = {column: name for name, column in outbox.model_dump().items() if column}
        self.runs: dict[str, int] = {}  # empty but for a topic in such a run: cheap to test

    def read(self, topic: str) -> None:
        """An event of `topic` was read: a run of missing columns there ends."""
        self.runs.pop(topic, None)

    def missing(self, topic: str, error: MissingColumn) -> None:
        """One more event of `topic` without a configured column; ConfigError at RUN_LIMIT."""
        count = self.runs[topic] = self.runs.get(topic, 0) + 1
        if count < RUN_LIMIT:
            return
        field = self._fields.get(error.column, "")
        raise ConfigError(
            f"the last {count} change events of {topic} have no column {error.column!r}, "
            "and none between them had it: the table's column has another name",
            field=f"source.outbox.{field}", value=error.column,
            hint=f"its rows have {', '.join(error.row_columns)}: set source.outbox.{field} to "
                 "the column's name and start the router again. The dead letters logged in "
                 "the batch this stop aborted were never written (its events are read again); "
                 "those of batches committed before it, `cdc-router dlq replay` delivers once "
                 "it is fixed (QA 48-g F4)")
