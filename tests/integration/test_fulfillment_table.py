"""The fulfillment example's effect table on the real Postgres: one it cannot insert into is
refused at start, naming the table and the missing columns (review 50-b F5)."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from cdc_router.errors import CdcRouterError
from cdc_router.examples.fulfillment import create_shipments_table
from tests.integration.support import StackEndpoints

pytestmark = pytest.mark.integration


def test_a_shipments_table_of_another_shape_is_refused_and_its_own_taken(
        stack: StackEndpoints) -> None:
    # Review 50-b F5: a `shipments (order_id int, event_id text)` made by the consumer README's
    # example was kept by CREATE TABLE IF NOT EXISTS; every insert failed on `amount`, each
    # payment was dead-lettered, and `cdc-router demo` said "0 shipment" and exited 0.
    other, own = (f"public.shipments_{uuid.uuid4().hex[:8]}" for _ in range(2))
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {other} (order_id int, event_id text)")
    try:
        with pytest.raises(CdcRouterError, match=rf"fulfillment: table {other} exists without "
                           r"column\(s\) amount, which the service inserts \(order_id, "
                           r"event_id, amount\).*give another --shipments-table"):
            create_shipments_table(stack.postgres_dsn, other)
        create_shipments_table(stack.postgres_dsn, own)
        create_shipments_table(stack.postgres_dsn, own)  # idempotent: its own shape passes
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {other}, {own}")
