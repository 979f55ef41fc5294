"""The options `cdc-router outbox` commands share: the outbox table, its columns, KEY=VALUE."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from cdc_router.errors import ConfigError
from cdc_router.outbox import OPTIONAL_COLUMNS, PAYLOAD_TYPES, OutboxColumns, OutboxSchema

F = TypeVar("F", bound=Callable[..., Any])


def schema_options(command: F) -> F:
    """--table, --column and --payload-type, handed to the command as `schema: OutboxSchema`."""

    @click.option("--table", default="public.outbox", show_default=True,
                  help="The outbox table, schema.table.")
    @click.option("--column", "columns", multiple=True, metavar="DEFAULT=NAME",
                  help=f"Rename a column ({', '.join(OutboxColumns.model_fields)}); DEFAULT= "
                       f"(or DEFAULT=null) for a table without it "
                       f"({', '.join(OPTIONAL_COLUMNS)}); repeatable.")
    @click.option("--payload-type", type=click.Choice(PAYLOAD_TYPES), default="jsonb",
                  show_default=True, help="payload column type: JSON, or bytes already encoded.")
    @functools.wraps(command)
    def wrapper(*args: Any, table: str, columns: tuple[str, ...], payload_type: str,
                **kwargs: Any) -> Any:
        renames = dict(_column(item) for item in columns)
        schema = OutboxSchema(table=table, payload_type=payload_type)  # type: ignore[arg-type]
        return command(*args, schema=schema.with_columns(renames), **kwargs)

    return wrapper  # type: ignore[return-value]


def _column(item: str) -> tuple[str, str | None]:
    """DEFAULT=NAME, or DEFAULT= for a table without that optional column (review 50-d F6: as
    router.yaml's `source.outbox.headers: null`; the CLI had no way to say it); DEFAULT=null
    too for those (reread 50-i F11: it was a column named null)."""
    key, value = key_value(item, "--column")
    absent = not value.strip() or (key in OPTIONAL_COLUMNS and value.strip().lower() == "null")
    if not absent or key not in OutboxColumns.model_fields:
        return key, value  # a blank name or an unknown key: with_columns says what is wrong
    if key not in OPTIONAL_COLUMNS:
        raise ConfigError(f"every outbox has its {key} column: only "
                          f"{' and '.join(OPTIONAL_COLUMNS)} may be absent (as "
                          f"{OPTIONAL_COLUMNS[0]}=)", field="--column", value=item)
    return key, None


def key_value(item: str, option: str) -> tuple[str, str]:
    """KEY=VALUE split at its first '='; a ConfigError naming `option` otherwise."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ConfigError("expected KEY=VALUE", field=option, value=item)
    return key, value
