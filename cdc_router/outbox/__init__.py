"""The database side: the outbox table, its setup for Debezium, write_event(), operators' tools.

    table   where the outbox lives and what its columns are called (OutboxColumns: the one
            column model, also router.yaml's `source.outbox`)
    setup   the idempotent DDL: table, heartbeat table, insert-only publication, replication role
    existing  what setup says of an outbox table and publication that exist already
    writer  write_event(), write_event_async(): one outbox row in the application's own
            transaction
    event_json  an event's payload and headers as the JSON text write_event() stores, checked
            first (what Postgres or the router would refuse is an InvalidEventError)
    relay_columns  the two columns (and index) `cdc-router relay` reads
    tools   stats and purge, for operators
    age     the rows' age in SQL: the retention cleanup's test, stats and status
    republish  rows as Debezium's change events, for `outbox republish` after a lost slot

Applications import from here: `from cdc_router.outbox import write_event`.
"""

from cdc_router.errors import InvalidEventError
from cdc_router.outbox.relay_columns import relay_columns_ddl, render_ddl
from cdc_router.outbox.setup import (
    DEFAULT_HEARTBEAT_TABLE,
    DEFAULT_PUBLICATION,
    CaptureSetup,
    InitReport,
    Step,
    init_outbox,
    init_steps,
    render_psql,
)
from cdc_router.outbox.table import (
    OPTIONAL_COLUMNS,
    PAYLOAD_TYPES,
    OutboxColumns,
    OutboxSchema,
    PayloadType,
)
from cdc_router.outbox.tools import OutboxStats, outbox_stats, purge, purge_cutoff
from cdc_router.outbox.writer import new_event_id, write_event, write_event_async

__all__ = [
    "DEFAULT_HEARTBEAT_TABLE",
    "DEFAULT_PUBLICATION",
    "OPTIONAL_COLUMNS",
    "PAYLOAD_TYPES",
    "CaptureSetup",
    "InitReport",
    "InvalidEventError",
    "OutboxColumns",
    "OutboxSchema",
    "OutboxStats",
    "PayloadType",
    "Step",
    "init_outbox",
    "init_steps",
    "new_event_id",
    "outbox_stats",
    "purge",
    "purge_cutoff",
    "relay_columns_ddl",
    "render_ddl",
    "render_psql",
    "write_event",
    "write_event_async",
]
