"""`status` on a real Postgres: the database's other inactive logical slots beside the
connector's (fixer 63: one left behind by a slot.name change kept its WAL, unsaid)."""

from __future__ import annotations

import psycopg
import pytest

from cdc_router.ops.database import probe_database
from cdc_router.outbox import OutboxSchema
from tests.integration.support import StackEndpoints, unique

# Another test's status sees these two slots for the moment they live, as rows of its WAL
# table only: 100 kB is far under any threshold that makes another database's slot a problem.
pytestmark = pytest.mark.integration


def test_an_inactive_slot_left_by_a_slot_name_change_is_listed_with_its_wal(
        stack: StackEndpoints) -> None:
    old, new = unique("fx_slot_old"), unique("fx_slot_new")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        for name in (old, new):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
        try:
            # WAL written after the slots: the old one holds it back from now on. Transactional,
            # so that its commit flushes it: retained WAL is measured to pg_current_wal_lsn(),
            # the write position, which a message without a commit may not have passed yet
            # (98,536 bytes seen once, under another worker's load).
            conn.execute("SELECT pg_logical_emit_message(true, 'fx63', repeat('x', 100000))")
            wal, _, _ = probe_database(stack.postgres_dsn, [new], None,
                                       OutboxSchema(table="public.outbox"))
        finally:
            for name in (old, new):
                conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    assert wal.error is None, wal.error
    assert [slot.name for slot in wal.slots] == [new]
    [left] = [slot for slot in wal.other_inactive_slots if slot.name == old]
    assert left.active is False and left.exists
    assert left.retained_wal_bytes is not None and left.retained_wal_bytes >= 100_000, left
    assert new not in [slot.name for slot in wal.other_inactive_slots]
