"""The outbox table: where it lives, what its columns are called, how its payload is stored.

OutboxColumns is the one model of the column names: router.yaml's `source.outbox` section is
this model (so its YAML keys are its field names), and the setup, the writer and the operator
tools read the same fields. The defaults are those of Debezium's EventRouter SMT, so a team can
switch from the SMT without touching its schema.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal

from psycopg import sql
from pydantic import ValidationError, model_validator

from cdc_router.config.fields import ConfigModel, field_problem
from cdc_router.errors import ConfigError
from cdc_router.postgres import check_identifier, split_table, table_identifier

PayloadType = Literal["jsonb", "bytea"]
PAYLOAD_TYPES: tuple[PayloadType, ...] = ("jsonb", "bytea")
# The columns an outbox may lack (None in OutboxColumns; `--column headers=` in the CLI).
OPTIONAL_COLUMNS = ("headers", "created_at")


class OutboxColumns(ConfigModel):
    """Column names of the outbox table; defaults are those of Debezium's EventRouter SMT."""

    id: str = "id"
    aggregatetype: str = "aggregatetype"
    aggregateid: str = "aggregateid"
    type: str = "type"
    payload: str = "payload"
    headers: str | None = "headers"  # None: the table has no headers column
    created_at: str | None = "created_at"  # None: records get the producer's time

    @property
    def required(self) -> tuple[str, str, str, str, str]:
        """The columns every outbox has, in this order (headers and created_at may be
        absent)."""
        return self.id, self.aggregatetype, self.aggregateid, self.type, self.payload

    @model_validator(mode="after")
    def _distinct(self) -> OutboxColumns:
        seen: dict[str, str] = {}
        for name, column in self.model_dump().items():
            if column is None:
                continue
            if not column.strip():
                # QA, session 29: accepted, then every event was a decode dead letter.
                raise field_problem(name, "a column name cannot be blank (leave the key out "
                                    "for the default name, or null where the column is "
                                    "optional)", column)
            if column in seen:
                raise field_problem(name, f"column {column!r} is already used for "
                                    f"{seen[column]}", column)
            seen[column] = name
        return self

    @cached_property
    def named(self) -> frozenset[str]:
        """The columns given a name here; a row's other columns are its extra columns."""
        return frozenset(column for column in self.model_dump().values() if column is not None)


@dataclass(frozen=True)
class OutboxSchema:
    """Where the outbox lives, its columns and its payload column's type, all checked."""

    table: str = "public.outbox"
    columns: OutboxColumns = field(default_factory=OutboxColumns)
    payload_type: PayloadType = "jsonb"
    # router.yaml's columns listed with several names over a rename (config/outbox_columns.py):
    # (field, names); `columns` holds the first of each until for_table() picks the table's.
    listed: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        split_table(self.table)
        for name, column in self.columns.model_dump().items():
            if column is not None:
                check_identifier(column, name)
        if self.payload_type not in PAYLOAD_TYPES:
            raise ConfigError("must be jsonb or bytea", field="payload_type",
                              value=self.payload_type)

    def for_table(self, present: Collection[str]) -> OutboxSchema:
        """This schema with each listed column the first of its names the table has (`present`:
        its columns), and nothing listed any more."""
        if not self.listed:
            return self
        chosen = {name: first_present(names, present) for name, names in self.listed}
        columns = OutboxColumns.model_validate({**self.columns.model_dump(), **chosen})
        return replace(self, columns=columns, listed=())

    def choices(self, present: Collection[str]) -> tuple[str, ...]:
        """For `status`: which of each listed column's names the table has."""
        return tuple(f"source.outbox.{name} lists {', '.join(names)}: the table has "
                     + (", ".join(found) if (found := [n for n in names if n in present])
                        else "none of them") for name, names in self.listed)

    @property
    def identifier(self) -> sql.Identifier:
        return table_identifier(self.table)

    @property
    def created_at_column(self) -> str:
        """The created_at column, which the operator tools need to tell a row's age."""
        if self.columns.created_at is None:
            raise ConfigError("the outbox has no created_at column, so rows have no age",
                              field="created_at", hint="name the column that holds it "
                              "(--column created_at=NAME, source.outbox.created_at)")
        return self.columns.created_at

    def with_columns(self, renames: Mapping[str, str | None]) -> OutboxSchema:
        """A copy with columns renamed by their default names: {"aggregatetype": "kind"}; None
        for an optional column the table does not have: {"headers": None}."""
        names = OutboxColumns.model_fields
        unknown = sorted(set(renames) - set(names))
        if unknown:
            raise ConfigError("unknown outbox column", field="column", value=unknown,
                              hint=f"one of {', '.join(names)}")
        try:
            columns = OutboxColumns.model_validate({**self.columns.model_dump(), **renames})
        except ValidationError as error:
            raise _config_error(error) from None
        return OutboxSchema(self.table, columns, self.payload_type)


def first_present(names: tuple[str, ...], present: Collection[str]) -> str:
    """The first of a column's `names` that is `present` (a row's or a table's columns); the
    first name when none is, for the caller's own missing-column error to name."""
    for name in names:
        if name in present:
            return name
    return names[0]


def _config_error(error: ValidationError) -> ConfigError:
    first = error.errors()[0]
    ctx: dict[str, Any] = dict(first.get("ctx") or {})
    return ConfigError(str(ctx.get("message", first["msg"])), field=ctx.get("field", "column"),
                       value=ctx.get("value"))
