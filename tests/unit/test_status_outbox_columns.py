"""status's outbox section: every column source.outbox names is asked of Postgres (QA 63-a)."""

from __future__ import annotations

import re
from typing import Any

from psycopg import errors

from cdc_router.ops.database import _checked
from cdc_router.outbox.table import OutboxColumns, OutboxSchema


class RenamedColumnTable:
    """A connection to an outbox whose aggregate type column a migration renamed `kind`:
    Postgres refuses a query naming the old name, as it words it (the query quoted after)."""

    columns = ("id", "kind", "aggregateid", "type", "payload", "headers", "created_at")

    def execute(self, query: Any, params: Any = None) -> Any:
        text = query.as_string(None)
        for name in re.findall(r'"([^"]+)"', text.split(" FROM ")[0]):
            if name not in self.columns:
                raise errors.UndefinedColumn(f'column "{name}" does not exist\n'
                                             f"LINE 1: {text}")
        raise AssertionError(f"status read the outbox with a column it lacks: {text}")


def test_a_configured_column_the_table_lost_is_named_with_its_setting() -> None:
    # QA 63-a: after `RENAME COLUMN aggregate_type TO kind`, `status` with the config still
    # naming aggregate_type said `status: ok` (it reads created_at only); the router
    # dead-lettered the next events and stopped at 100 of them.
    schema = OutboxSchema("public.outbox", OutboxColumns(aggregatetype="aggregate_type"))
    state = _checked(RenamedColumnTable(), schema, None, "cleanup.table")  # type: ignore[arg-type]
    assert state.answered and state.error is not None
    assert state.error.startswith('Postgres: column "aggregate_type" does not exist'), \
        state.error
    assert "in public.outbox (renamed?): set source.outbox.aggregatetype to the column's " \
        "name" in state.error, state.error
