"""ensure_schema() of a replica starting beside running workers, on the real stack: with the
table and its index there it runs no DDL, so it neither waits for a slow handler's open dedup
transaction nor queues the workers' claims behind it (QA 67-b F-2: CREATE INDEX IF NOT EXISTS
took its SHARE lock first; a replica started beside a 55 s handler waited 45 s, and a running
worker's claim answered BUSY after its 5 s lock_timeout meanwhile)."""

from __future__ import annotations

import contextlib
import time

import psycopg
import pytest
from psycopg import sql

from cdc_router.consumer.dedup.postgres import PostgresDedupStore
from cdc_router.consumer.dedup.store import DedupKey, Outcome
from tests.integration.support import StackEndpoints
from tests.integration.test_idempotent_consumer import schema  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration


def test_a_starting_replica_neither_waits_for_nor_blocks_an_open_effect(
        stack: StackEndpoints, schema: str) -> None:  # noqa: F811 (fixture)
    table = f"{schema}.dedup"
    PostgresDedupStore(stack.postgres_dsn, table=table).ensure_schema()
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as slow_handler:
        # Its transaction stays open; Postgres ends it after 20 s, so the old code's wait
        # ends too.
        slow_handler.execute("SET idle_in_transaction_session_timeout = '20s'")
        slow_handler.execute("BEGIN")
        slow_handler.execute(sql.SQL("INSERT INTO {} (consumer_group, event_id) VALUES "
                                     "('g', 'slow')").format(sql.Identifier(schema, "dedup")))
        replica = PostgresDedupStore(stack.postgres_dsn, table=table, lock_timeout_s=5)
        started = time.monotonic()
        replica.ensure_schema()
        took_s = time.monotonic() - started
        worker = PostgresDedupStore(stack.postgres_dsn, table=table, lock_timeout_s=5)
        claimed = worker.run_once(DedupKey("g", "other"), lambda conn: None)
        replica.close()
        worker.close()
        with contextlib.suppress(psycopg.Error):  # ended by the server on the old code
            slow_handler.execute("ROLLBACK")
    assert took_s < 3, f"ensure_schema waited {took_s:.1f} s for the open dedup transaction"
    assert claimed is Outcome.DONE


def test_a_missing_index_is_still_created(stack: StackEndpoints,
                                         schema: str) -> None:  # noqa: F811 (fixture)
    store = PostgresDedupStore(stack.postgres_dsn, table=f"{schema}.dedup")
    store.ensure_schema()
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP INDEX {}").format(
            sql.Identifier(schema, "dedup_processed_at_idx")))
    store.ensure_schema()
    with psycopg.connect(stack.postgres_dsn) as conn:
        found = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                             (f"{schema}.dedup_processed_at_idx",)).fetchone()
    store.close()
    assert found == (True,)
