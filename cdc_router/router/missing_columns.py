"""A configured outbox column, or a route's key column, that no event has: the config's fault.

Debezium sends every column of the row in `after`, so a column of source.outbox missing from
each event of a topic is a column name the config has wrong (a renamed column, a table of
its own names; QA 48-a: 7,219 of 7,219 events dead-lettered in under a second, the router
running on). One event without it is that record's dead letter; RUN_LIMIT of them in a row
on one topic, none of that topic read meanwhile, stop the router with the fix, as Debezium's
EventRouter fails its task on a wrong field name. A route's `key: <column>` is the same
(QA 60-c F-2: 18,736 letters in 20 s): RUN_LIMIT events of a route in a row without the
column, none of that route's with it meanwhile, stop the router naming routes[i].key; a NULL
in the column is only that row's letter. A column listed with several names (a rename) is
missing only from a row that has none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc_router.errors import ConfigError, MissingColumn, RouteError, show

if TYPE_CHECKING:
    from cdc_router.config.outbox_columns import OutboxColumnNames
    from cdc_router.router.debezium import OutboxEvent

RUN_LIMIT = 100


class MissingColumns:
    """Events without a configured column, in a row, per source topic."""

    def __init__(self, outbox: OutboxColumnNames) -> None:
        self._fields = outbox.fields  # every name -> its field
        self._names = outbox.listed_names  # field -> its names
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
        names = self._names.get(field, (error.column,))
        which = (f"no column {error.column!r}" if len(names) == 1 else
                 f"none of the columns {', '.join(map(repr, names))}")
        raise ConfigError(
            f"the last {count} change events of {topic} have {which}, and none between them "
            "had it: the table's column has another name",
            field=f"source.outbox.{field}", value=error.column if len(names) == 1 else list(names),
            hint=f"its rows have {', '.join(error.row_columns)}: set source.outbox.{field} to "
                 "the column's name and start the router again" + (renamed(
                     f"source.outbox.{field}", names, topic in self.decoded)
                     if topic in self.decoded else "") + ". The dead "
                 "letters logged in the batch this stop aborted were never written (its "
                 "events are read again); those of batches committed before it, `cdc-router "
                 "dlq replay` delivers once it is fixed (QA 48-g F4)")


def renamed(setting: str, names: tuple[str, ...], had_it: bool) -> str:
    """The way through a column renamed while rows of the old name were still to route (QA
    63-a F-1, F-7): one batch holds rows of both names, so no one name reads them all; listed,
    the first name with a value in a row is read. `had_it`: earlier events here had a name
    the config gives (then a rename is the likely cause). Review 64: the outbox's stop says
    it only then, not for a name no event had (a typo, a new pipeline): rows of the old name
    still to route come before the new ones, so they would have been read."""
    old = names[-1]
    return ((". Earlier events had it: " if had_it else ". ") +
            f"if it was renamed while rows written before the rename were still to route, list "
            f"the new name after the old ones, `{setting}: [{', '.join(names)}, NEW]` (the "
            "first name with a value in a row is read), start the router again, and drop "
            f"{old!r} from the list once its rows are routed")


class MissingKeyColumn(RouteError):
    """A route's key column that is not in an event's row at all (not a NULL in it); with its
    names over a rename, none of them."""

    def __init__(self, event: OutboxEvent, columns: str | tuple[str, ...], index: int) -> None:
        self.columns = (columns,) if isinstance(columns, str) else columns
        self.column = self.columns[0]
        self.index = index
        self.row_columns = tuple(name for name, _ in event.extra_columns)
        which = (f"key column {self.column!r} of routes[{index}] is not" if len(self.columns)
                 == 1 else f"none of the key columns {', '.join(map(repr, self.columns))} of "
                 f"routes[{index}] is")
        super().__init__(
            f"event {show(event.event_id)}: {which} a column of the row, whose other columns "
            f"are {_listed(self.row_columns)}: "
            f"routes[{index}].key names a column the table does not have (Debezium sends "
            "every column)")


class MissingKeyColumns:
    """Events of a route without its key column, in a row, per route index."""

    def __init__(self) -> None:
        self.runs: dict[int, tuple[int, tuple[str, ...]]] = {}  # index -> (events, columns)

    def read(self, event: OutboxEvent, index: int | None) -> None:
        """An event of route `index` (None: of no route): one with the column ends its run."""
        if index is None or index not in self.runs:
            return
        columns = self.runs[index][1]
        if any(name in columns for name, _ in event.extra_columns):
            del self.runs[index]

    def missing(self, error: MissingKeyColumn) -> None:
        """One more event of the route without its key column; ConfigError at RUN_LIMIT."""
        count = self.runs.get(error.index, (0, ()))[0] + 1
        self.runs[error.index] = (count, error.columns)
        if count < RUN_LIMIT:
            return
        setting, names = f"routes[{error.index}].key", error.columns
        which = (f"no column {error.column!r}" if len(names) == 1 else
                 f"none of the columns {', '.join(map(repr, names))}")
        raise ConfigError(
            f"the last {count} events of routes[{error.index}] have {which}, and none of that "
            "route's between them had it: the table has no such column (Debezium sends every "
            "column of the row)",
            field=setting, value=error.column if len(names) == 1 else list(names),
            hint=f"the rows' other columns are {_listed(error.row_columns)}: set {setting} to "
                 "one of them (or id, aggregate_id, type, aggregate_type) and start the router "
                 "again" + renamed(setting, names, False) + ". The dead letters logged in the "
                 "batch this stop aborted were never written (its events are read again); "
                 "those of batches committed before it, `cdc-router dlq replay` delivers once "
                 "it is fixed")


def _listed(columns: tuple[str, ...]) -> str:
    return show(", ".join(columns), 300) if columns else "none (only the outbox's own)"
