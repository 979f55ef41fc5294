"""A configured outbox column, or a route's key column, that no event has: the config's fault.

Debezium sends every column of the row in `after`, so a column of source.outbox missing from
each event of a topic is a column name the config has wrong (a renamed column, a table of
its own names; QA 48-a: 7,219 of 7,219 events dead-lettered in under a second, the router
running on). One event without it is that record's dead letter; RUN_LIMIT of them in a row
on one topic, none of that topic read meanwhile, stop the router with the fix, as Debezium's
EventRouter fails its task on a wrong field name. A route's `key: <column>` is the same
(QA 60-c F-2: 18,736 letters in 20 s): RUN_LIMIT events of a route in a row without the
column, none of that route's with it meanwhile, stop the router naming routes[i].key; a NULL
in the column is only that row's letter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc_router.errors import ConfigError, MissingColumn, RouteError, show
from cdc_router.outbox.table import OutboxColumns

if TYPE_CHECKING:
    from cdc_router.router.debezium import OutboxEvent

RUN_LIMIT = 100


class MissingColumns:
    """Events without a configured column, in a row, per source topic."""

    def __init__(self, outbox: OutboxColumns) -> None:
        self._fields = {column: name for name, column in outbox.model_dump().items() if column}
        self.runs: dict[str, int] = {}  # empty but for a topic in such a run: cheap to test
        self.decoded: set[str] = set()  # the topics with an event read whole by this process

    def read(self, topic: str) -> None:
        """An event of `topic` was read: a run of missing columns there ends."""
        self.runs.pop(topic, None)
        self.decoded.add(topic)

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
                 "it is fixed (QA 48-g F4)" + (_RENAMED if topic in self.decoded else ""))


# QA 63-a: a column renamed under a backlog (rows written before the rename not yet routed):
# one batch held rows of both names, so each name stopped the router with the batch aborted,
# the other name's rows in it too, and no restart made progress.
_RENAMED = (
    ". Events of this topic before these had the column: if it was renamed while rows written "
    "before the rename were still to route, no one name reads both; start the router once "
    f"with CDC_ROUTER__DELIVERY__COMMIT_MAX_RECORDS={RUN_LIMIT // 2} (batches shorter than "
    "the run, so that those before the rename commit), then with the new name, then `cdc-router "
    "dlq replay` the letters in between")


class MissingKeyColumn(RouteError):
    """A route's key column that is not in an event's row at all (not a NULL in it)."""

    def __init__(self, event: OutboxEvent, column: str, index: int) -> None:
        self.column = column
        self.index = index
        self.row_columns = tuple(name for name, _ in event.extra_columns)
        super().__init__(
            f"event {show(event.event_id)}: key column {column!r} of routes[{index}] is not a "
            f"column of the row, whose other columns are {_listed(self.row_columns)}: "
            f"routes[{index}].key names a column the table does not have (Debezium sends "
            "every column)")


class MissingKeyColumns:
    """Events of a route without its key column, in a row, per route index."""

    def __init__(self) -> None:
        self.runs: dict[int, tuple[int, str]] = {}  # index -> (events, column); mostly empty

    def read(self, event: OutboxEvent, index: int | None) -> None:
        """An event of route `index` (None: of no route): one with the column ends its run."""
        if index is None or index not in self.runs:
            return
        column = self.runs[index][1]
        if any(name == column for name, _ in event.extra_columns):
            del self.runs[index]

    def missing(self, error: MissingKeyColumn) -> None:
        """One more event of the route without its key column; ConfigError at RUN_LIMIT."""
        count = self.runs.get(error.index, (0, ""))[0] + 1
        self.runs[error.index] = (count, error.column)
        if count < RUN_LIMIT:
            return
        raise ConfigError(
            f"the last {count} events of routes[{error.index}] have no column "
            f"{error.column!r}, and none of that route's between them had it: the table has "
            "no such column (Debezium sends every column of the row)",
            field=f"routes[{error.index}].key", value=error.column,
            hint=f"the rows' other columns are {_listed(error.row_columns)}: set "
                 f"routes[{error.index}].key to one of them (or id, aggregate_id, type, "
                 "aggregate_type) and start the router again. The dead letters logged in the "
                 "batch this stop aborted were never written (its events are read again); "
                 "those of batches committed before it, `cdc-router dlq replay` delivers once "
                 "it is fixed")


def _listed(columns: tuple[str, ...]) -> str:
    return show(", ".join(columns), 300) if columns else "none (only the outbox's own)"
