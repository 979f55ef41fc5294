"""The outbox rows' age in SQL: the retention cleanup's test, `outbox stats` and `status`.

created_at is a timestamp (with or without time zone, or a date), compared with Postgres's
clock as it is; or an integer of epoch milliseconds, microseconds or nanoseconds, which the
router reads per source.created_at_unit (router/connect_time.py), compared with Postgres's
clock in the same unit (review 49-b F5: a bigint column failed every DELETE, `bigint <
timestamp`, for ever). Any other type is a ConfigError at start: no comparison would be sound.
"""

from __future__ import annotations

from psycopg import sql

from cdc_router.errors import ConfigError
from cdc_router.outbox.table import OutboxSchema
from cdc_router.postgres import utc_now_for
from cdc_router.router.connect_time import MICROS_THRESHOLD, NANOS_THRESHOLD

_TIMES = ("timestamp", "date")  # format_type's names start so: "timestamp(6) with time zone"
INTEGER_TYPES = ("bigint", "integer", "smallint")
# source.created_at_unit auto reads an integer as the router does (connect_time.py): from
# NANOS_THRESHOLD up nanoseconds, from MICROS_THRESHOLD up microseconds, below milliseconds.
_NOW_MS = sql.SQL("(extract(epoch FROM now()) * 1000)::bigint")


def require_comparable(column_type: str, column: str, table: str) -> None:
    """A ConfigError unless created_at's `column_type` (format_type) can be compared with a
    time: the retention would fail every DELETE."""
    if not column_type.startswith(_TIMES + INTEGER_TYPES):
        raise ConfigError(
            f"cleanup.mode retention compares created_at with Postgres's clock, and "
            f"{table}.{column} is {column_type}", field="source.outbox.created_at",
            value=column, hint="make it timestamp(6), timestamptz or a bigint of epoch "
            "milliseconds, microseconds or nanoseconds (source.created_at_unit), or use "
            "cleanup.mode delete")


def created_ms(column: sql.Identifier, column_type: str, unit: str) -> sql.Composable:
    """created_at as epoch milliseconds (bigint); NULL for a NULL or an infinite one."""
    if not column_type.startswith(INTEGER_TYPES):
        return sql.SQL("CASE WHEN isfinite({c}) THEN (extract(epoch FROM {c}) * 1000)::bigint "
                       "END").format(c=column)
    if unit == "millis":
        return sql.SQL("{}::bigint").format(column)
    if unit == "micros":
        return sql.SQL("({}::bigint / 1000)").format(column)
    # Not abs(): abs() of bigint's least value is out of range, a failed DELETE.
    return sql.SQL("(CASE WHEN {c} >= {n} THEN {c}::bigint / 1000000 "
                   "WHEN {c} >= {m} OR {c} <= -{m} THEN {c}::bigint / 1000 ELSE "
                   "{c}::bigint END)").format(c=column, m=sql.Literal(MICROS_THRESHOLD),
                                              n=sql.Literal(NANOS_THRESHOLD))


def older_than(column: sql.Identifier, column_type: str, unit: str) -> sql.Composable:
    """`column` is older than the retention: a condition with one parameter, retention_ms."""
    if column_type.startswith(INTEGER_TYPES):
        return sql.SQL("{} < {} - %s").format(created_ms(column, column_type, unit), _NOW_MS)
    return sql.SQL("{} < {} - make_interval(secs => %s / 1000.0)").format(
        column, utc_now_for(column_type))


def require_time(column_type: str, schema: OutboxSchema) -> None:
    """A ConfigError for an integer created_at, which the tools that select rows by a time
    (purge, republish) do not read (QA 49-h F2: a bare `bigint < timestamp` SQL error)."""
    if column_type.startswith(INTEGER_TYPES):
        raise ConfigError(f"this tool selects rows by a time, and {schema.table}."
                          f"{schema.created_at_column} is {column_type} (epoch numbers)",
                          field="source.outbox.created_at", value=schema.created_at_column,
                          hint="select the rows by their ids in SQL (the router's retention "
                          "cleanup reads such a column)")
