"""router.yaml's `source.outbox`: the outbox's column names, one each, or several over a rename.

A column renamed (ALTER TABLE ... RENAME COLUMN) while rows written before the rename are still
to route leaves change events of both names on the raw topic, in one batch (QA 63-a F-1: either
name alone stopped the router on the other's rows, for ever). Listed, `aggregatetype:
[aggregate_type, kind]`, an event's value is the first of them with a value in its row (an
expand and contract migration's old column left null too); a row with none of the names is
the missing column it always was. What reads the table itself (the relay, status, the cleanup,
`outbox republish`) takes the first of them the table has (OutboxSchema.for_table).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from functools import cached_property
from typing import Any

from pydantic import field_validator, model_validator

from cdc_router.config.fields import ConfigModel, field_problem
from cdc_router.config.yaml_text import yaml_kind
from cdc_router.errors import ConfigError
from cdc_router.outbox.table import OutboxColumns, OutboxSchema, first_present
from cdc_router.postgres import check_identifier

ColumnNames = str | list[str]  # one name, or a rename's names (old and new): the first found


class OutboxColumnNames(ConfigModel):
    """The outbox's columns as router.yaml names them; defaults are the EventRouter SMT's."""

    id: ColumnNames = "id"
    aggregatetype: ColumnNames = "aggregatetype"
    aggregateid: ColumnNames = "aggregateid"
    type: ColumnNames = "type"
    payload: ColumnNames = "payload"
    headers: ColumnNames | None = "headers"  # None: the table has no headers column
    created_at: ColumnNames | None = "created_at"  # None: records get the producer's time

    @field_validator("*", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        if not value:
            raise ValueError("an empty list names no column: name the column, or list its "
                             "names over a rename (old and new, e.g. [aggregate_type, kind])")
        for name in value:
            if not isinstance(name, str):
                raise ValueError(f"lists {yaml_kind(name)}, not a column name: quote it if "
                                 "it is one, or leave it out")
        twice = sorted({name for name in value if value.count(name) > 1})
        if twice:
            raise ValueError(f"lists {', '.join(map(repr, twice))} twice: each name once")
        return value[0] if len(value) == 1 else value

    @model_validator(mode="after")
    def _distinct(self) -> OutboxColumnNames:
        seen: dict[str, str] = {}
        for field, names in self.listed_names.items():
            for name in names:
                if not name.strip():  # QA, session 29: every event was a decode dead letter
                    raise field_problem(field, "a column name cannot be blank (leave the key "
                                        "out for the default name, or null where the column "
                                        "is optional)", name)
                try:
                    check_identifier(name, field)
                except ConfigError as error:
                    raise field_problem(field, error.args[0].partition(": ")[2], name) from None
                if name in seen:
                    raise field_problem(field, f"column {name!r} is already used for "
                                        f"{seen[name]}", name)
                seen[name] = field
        return self

    @cached_property
    def listed_names(self) -> dict[str, tuple[str, ...]]:
        """Each field's names, first first; a field without a column (null) left out."""
        return {field: (value,) if isinstance(value, str) else tuple(value)
                for field, value in self.model_dump().items() if value is not None}

    @cached_property
    def first(self) -> OutboxColumns:
        """The first name of each column: the only one, unless it is listed."""
        return OutboxColumns.model_validate(
            {field: value if isinstance(value, str) or value is None else value[0]
             for field, value in self.model_dump().items()})

    @cached_property
    def renamed(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(field, names) of each column listed with several names; mostly empty."""
        return tuple((field, names) for field, names in self.listed_names.items()
                     if len(names) > 1)

    @cached_property
    def named(self) -> frozenset[str]:
        """Every name given here; a row's other columns are its extra columns."""
        return frozenset(name for names in self.listed_names.values() for name in names)

    @cached_property
    def fields(self) -> dict[str, str]:
        """Column name -> the field it names (aggregatetype for kind)."""
        return {name: field for field, names in self.listed_names.items() for name in names}

    def for_row(self, row: Mapping[str, Any]) -> OutboxColumns:
        """The columns of a row (its values by column): of each listed column, the first name
        with a value in the row, else the first it has (a null: the row's letter), else the
        first name (the row's missing column). A value, not only a name: over an expand and
        contract migration (ADD COLUMN kind, the old one left null by the new writers) both
        columns are in every row (rv64: each order dead-lettered one writer's rows)."""
        if not self.renamed:
            return self.first
        state = tuple(2 if row.get(name) is not None else name in row
                      for _, names in self.renamed for name in names)
        cached = self._for_rows.get(state)
        if cached is None:
            chosen = {field: next((name for name in names if row.get(name) is not None),
                                  None) or first_present(names, row)
                      for field, names in self.renamed}
            cached = self._for_rows[state] = OutboxColumns.model_validate(
                {**self.first.model_dump(), **chosen})
        return cached

    @cached_property
    def _for_rows(self) -> dict[tuple[int, ...], OutboxColumns]:
        return {}  # a handful: which of the listed names a row has, with a value or null

    def outbox_schema(self, table: str = "public.outbox") -> OutboxSchema:
        """The OutboxSchema of `table` with these names, listed ones to resolve (for_table)."""
        return OutboxSchema(table, self.first, listed=self.renamed)

    def for_table(self, present: Collection[str]) -> OutboxColumns:
        """The columns of a table whose columns are `present`: of each listed column, the first
        name it has."""
        return self.outbox_schema().for_table(present).columns
