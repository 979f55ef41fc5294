"""The idempotent consumer on the real stack: Postgres dedup store, purge, and the acceptance
run (10,000 events, each delivered three times, 4 consumer processes, kill -9, injected
failures after the effect's write) proving every event took effect exactly once.
"""

from __future__ import annotations

import contextlib
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
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cdc_router.cli import main
from cdc_router.consumer import ConsumerSettings, IdempotentConsumer, RetryPolicy
from cdc_router.consumer.dedup import (
    DedupKey,
    DedupStoreError,
    DedupStoreRefused,
    EffectAborted,
    MemoryDedupStore,
    NestedEventBusy,
    Outcome,
)
from cdc_router.consumer.dedup.postgres import PostgresDedupStore, run_purge_loop
from cdc_router.errors import FatalKafkaError, RetriableError
from cdc_router.examples.fulfillment import create_shipments_table
from tests.integration.c_producer import produce_with_header
from tests.integration.support import StackEndpoints, read_topic, unique

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# Run as a module from the checkout (cwd=REPO), so that it imports this checkout's package,
# not whichever one an editable install points at.
EXAMPLE = "cdc_router.examples.fulfillment"


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
        row = conn.execute(query, params).fetchone()
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


def test_an_effect_that_returns_a_coroutine_rolls_back_and_is_never_reported_done(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    # Review 52-c F-HIGH-11: an `async def` effect's coroutine was never awaited, and the
    # store committed the dedup row: the event done, its effect lost, a retry a duplicate.
    effect_table(stack.postgres_dsn, schema)
    key = DedupKey("fulfillment", "evt-async")

    async def ship(conn: psycopg.Connection[Any]) -> None:
        raise AssertionError("never awaited, never run")

    def write_then_ship(conn: psycopg.Connection[Any]) -> Any:
        insert_effect(schema, key.event_id)(conn)
        return ship(conn)

    with pytest.raises(TypeError, match="returned coroutine"):
        store.run_once(key, write_then_ship)
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".dedup') == 0
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects') == 0


def test_an_effect_that_swallows_a_database_error_is_never_reported_done(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    # The common `except UniqueViolation: pass` leaves the dedup transaction aborted, and
    # Postgres answers its COMMIT with ROLLBACK: the effect and the dedup row are both gone.
    effect_table(stack.postgres_dsn, schema)
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE UNIQUE INDEX ON {} (event_id)").format(
            sql.Identifier(schema, "effects")))
        conn.execute(sql.SQL("INSERT INTO {} VALUES ('taken')").format(
            sql.Identifier(schema, "effects")))
    key = DedupKey("fulfillment", "evt-1")

    def write_and_swallow(conn: psycopg.Connection[Any]) -> None:
        insert_effect(schema, "evt-1")(conn)
        with contextlib.suppress(psycopg.errors.UniqueViolation):  # "harmless", it thinks
            insert_effect(schema, "taken")(conn)

    with pytest.raises(EffectAborted, match=r"evt-1.*savepoint"):
        store.run_once(key, write_and_swallow)
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".dedup') == 0
    # Not a duplicate on the retry: the key was never marked done.
    assert store.run_once(key, insert_effect(schema, "evt-1")) is Outcome.DONE
    assert count(stack.postgres_dsn,
                 f'SELECT count(*) FROM "{schema}".effects WHERE event_id = %s', "evt-1") == 1

    def write_and_swallow_in_a_savepoint(conn: psycopg.Connection[Any]) -> None:
        insert_effect(schema, "evt-2")(conn)
        try:
            with conn.transaction():  # a savepoint: its failure leaves the rest intact
                insert_effect(schema, "taken")(conn)
        except psycopg.errors.UniqueViolation:
            pass

    assert store.run_once(DedupKey("fulfillment", "evt-2"), write_and_swallow_in_a_savepoint) \
        is Outcome.DONE
    assert count(stack.postgres_dsn,
                 f'SELECT count(*) FROM "{schema}".effects WHERE event_id = %s', "evt-2") == 1


@contextlib.contextmanager
def effect_held_open(store: PostgresDedupStore, schema: str,
                     key: DedupKey) -> Iterator[list[Outcome]]:
    """`store` runs `key`'s effect in a thread and holds its dedup transaction open (the row
    locked) until the block ends; yields the list its outcome is appended to."""
    wrote, release = threading.Event(), threading.Event()
    outcomes: list[Outcome] = []

    def held(conn: psycopg.Connection[Any]) -> None:
        insert_effect(schema, key.event_id)(conn)
        wrote.set()
        assert release.wait(60)

    first = threading.Thread(target=lambda: outcomes.append(store.run_once(key, held)))
    first.start()
    try:
        assert wrote.wait(30)
        yield outcomes
    finally:
        release.set()
        first.join(30)


def test_concurrent_duplicates_wait_for_the_first_and_run_once(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    effect_table(stack.postgres_dsn, schema)
    other = PostgresDedupStore(stack.postgres_dsn, table=f"{schema}.dedup")
    key = DedupKey("fulfillment", "evt-1")
    with effect_held_open(store, schema, key) as outcomes:
        second = threading.Thread(
            target=lambda: outcomes.append(other.run_once(key, insert_effect(schema, "evt-1"))))
        second.start()
        # The second blocks on the first one's uncommitted dedup row until it commits.
        waiting = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                   " AND query LIKE %s")
        wait_until(lambda: count(stack.postgres_dsn, waiting, f"%{schema}%") > 0,
                   30, "second worker waiting on the row lock")
    second.join(30)
    other.close()
    assert sorted(outcome.value for outcome in outcomes) == ["done", "duplicate"]
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects') == 1


def test_a_duplicate_held_up_past_the_lock_timeout_is_busy_not_a_hang(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    # QA 35-b: a consumer frozen (SIGSTOP) inside its dedup transaction held the row lock;
    # the partition's new owner waited on the INSERT for the whole freeze and polled nothing.
    effect_table(stack.postgres_dsn, schema)
    other = PostgresDedupStore(stack.postgres_dsn, table=f"{schema}.dedup", lock_timeout_s=0.5)
    key = DedupKey("fulfillment", "evt-frozen")
    with effect_held_open(store, schema, key) as outcomes:
        assert other.run_once(key, insert_effect(schema, "evt-frozen")) is Outcome.BUSY
        # The effect's own statements keep the session's lock_timeout: only the INSERT waits.
        seen: list[Any] = []

        def setting(conn: psycopg.Connection[Any]) -> None:
            seen.append(conn.execute("SELECT current_setting('lock_timeout')").fetchone())

        assert other.run_once(DedupKey("fulfillment", "evt-other"), setting) is Outcome.DONE
        assert seen == [("0",)]
    assert outcomes == [Outcome.DONE]
    assert other.run_once(key, insert_effect(schema, "evt-frozen")) is Outcome.DUPLICATE
    other.close()
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


@pytest.mark.parametrize("handler", ["lets_it_through", "catches_it", "wraps_it"])
def test_a_connection_lost_under_the_effect_is_a_store_error_not_the_handlers_failure(
        stack: StackEndpoints, store: PostgresDedupStore, handler: str) -> None:
    # Review, session 26: the OperationalError of a connection terminated while the effect
    # ran was the handler's own failure, which counts toward retry.max_attempts and
    # dead-letters a good event after a failover; whatever the handler does with it.
    def effect_on_a_dying_connection(conn: psycopg.Connection[Any]) -> None:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        try:
            conn.execute("SELECT 1")  # the effect's own statement meets the lost connection
        except psycopg.OperationalError as error:
            if handler == "wraps_it":
                raise RuntimeError("could not record the shipment") from error
            if handler == "lets_it_through":
                raise

    with pytest.raises(DedupStoreError, match="dedup transaction failed for event e3"):
        store.run_once(DedupKey("g", "e3"), effect_on_a_dying_connection)
    assert store.run_once(DedupKey("g", "e3"), lambda conn: None) is Outcome.DONE


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


def test_one_store_shared_by_two_threads_commits_every_effect_it_reports_done(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    # Review 33: the consumer and run_purge_loop shared the store's one connection; their
    # transactions nested, and run_once returned DONE for effects that never committed.
    # Each thread now has a connection of its own: here one thread's effect waits inside its
    # transaction until the other's has run on the other connection, and ends last.
    effect_table(stack.postgres_dsn, schema)
    first_in, second_done = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}
    used: dict[str, psycopg.Connection[Any]] = {}

    def first(conn: psycopg.Connection[Any]) -> None:
        used["first"] = conn
        insert_effect(schema, "first")(conn)
        first_in.set()
        assert second_done.wait(30)  # two new connections and a commit, on a busy host

    def second(conn: psycopg.Connection[Any]) -> None:
        used["second"] = conn
        insert_effect(schema, "second")(conn)

    def run(event_id: str, effect: Callable[[psycopg.Connection[Any]], None]) -> None:
        try:
            outcomes[event_id] = store.run_once(DedupKey("g", event_id), effect)
        except Exception as error:  # shown in the assertion below
            outcomes[event_id] = error

    worker = threading.Thread(target=run, args=("first", first))
    worker.start()
    assert first_in.wait(10)
    run("second", second)
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects') == 1
    second_done.set()
    worker.join(10)
    assert used["first"] is not used["second"]
    assert outcomes == {"first": Outcome.DONE, "second": Outcome.DONE}
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects') == 2
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".dedup') == 2
    store.close()  # every thread's connection, this one's and the worker's
    assert used["first"].closed and used["second"].closed


def test_a_run_once_inside_an_effect_commits_with_it(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    # Review 33-2: a handler deduplicating sub-events through the same store (its nested
    # run_once a savepoint of the outer transaction) was refused by the first fix, for ever.
    effect_table(stack.postgres_dsn, schema)

    def with_parts(conn: psycopg.Connection[Any]) -> None:
        insert_effect(schema, "order")(conn)
        for part in ("part-1", "part-2", "part-1"):
            store.run_once(DedupKey("g", part), insert_effect(schema, part))

    assert store.run_once(DedupKey("g", "order"), with_parts) is Outcome.DONE
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects') == 3
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".dedup') == 3


def test_a_nested_run_once_held_elsewhere_rolls_the_outer_event_back(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    # Review 46 F2: the nested run_once answered BUSY, which the handler ignored (as the test
    # above does); the outer event committed DONE and the sub-event's effect was lost for good.
    effect_table(stack.postgres_dsn, schema)
    other = PostgresDedupStore(stack.postgres_dsn, table=f"{schema}.dedup", lock_timeout_s=0.5)

    def with_part(conn: psycopg.Connection[Any]) -> None:
        insert_effect(schema, "order")(conn)
        other.run_once(DedupKey("g", "part-1"), insert_effect(schema, "part-1"))

    def swallowing(conn: psycopg.Connection[Any]) -> None:
        with contextlib.suppress(NestedEventBusy):  # "it will come again", it thinks
            with_part(conn)

    with effect_held_open(store, schema, DedupKey("g", "part-1")):
        for effect in (with_part, swallowing):
            with pytest.raises(NestedEventBusy, match="part-1"):
                other.run_once(DedupKey("g", "order"), effect)
            assert count(stack.postgres_dsn,
                         f"SELECT count(*) FROM \"{schema}\".dedup WHERE event_id = 'order'") == 0
    # The retry, once the other worker committed part-1: part-1 a duplicate, order done.
    assert other.run_once(DedupKey("g", "order"), with_part) is Outcome.DONE
    other.close()
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects') == 2
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".dedup') == 2


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])
def test_a_deadlock_or_serialization_failure_in_the_effect_is_retried_not_counted(
        stack: StackEndpoints, store: PostgresDedupStore, sqlstate: str) -> None:
    # Review 46 F9: contention between two workers is not the record's fault; the same error
    # at COMMIT was already an outage, in the effect it dead-lettered the record.
    def contended(conn: psycopg.Connection[Any]) -> None:
        conn.execute(f"DO $$ BEGIN RAISE EXCEPTION 'contended' USING ERRCODE = '{sqlstate}';"
                     " END $$")

    with pytest.raises(DedupStoreError, match="contended") as raised:
        store.run_once(DedupKey("g", "e1"), contended)
    cause = raised.value.__cause__
    assert isinstance(cause, psycopg.Error) and cause.sqlstate == sqlstate
    assert store.run_once(DedupKey("g", "e1"), lambda conn: None) is Outcome.DONE
    with pytest.raises(psycopg.errors.RaiseException):  # any other error stays the handler's
        store.run_once(DedupKey("g", "e2"), lambda conn: conn.execute(
            "DO $$ BEGIN RAISE EXCEPTION 'bad row'; END $$"))


def test_an_effect_refused_at_commit_is_the_handlers_failure_not_an_outage(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    # Review 33: a deferred foreign key failing at COMMIT was a DedupStoreError, which the
    # consumer retries without limit: the record was never dead-lettered, its partition stuck.
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(
            sql.Identifier(schema, "orders")))
        conn.execute(sql.SQL("CREATE TABLE {} (order_id int REFERENCES {} DEFERRABLE "
                             "INITIALLY DEFERRED)").format(sql.Identifier(schema, "shipments"),
                                                           sql.Identifier(schema, "orders")))

    def ship(conn: psycopg.Connection[Any]) -> None:
        conn.execute(sql.SQL("INSERT INTO {} VALUES (42)").format(
            sql.Identifier(schema, "shipments")))

    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        store.run_once(DedupKey("g", "e1"), ship)
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".dedup') == 0
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {} VALUES (42)").format(
            sql.Identifier(schema, "orders")))
    assert store.run_once(DedupKey("g", "e1"), ship) is Outcome.DONE


def test_a_session_ended_for_idling_in_the_effect_is_the_handlers_failure_not_an_outage(
        stack: StackEndpoints, schema: str) -> None:
    # Review 47-e F2: a handler slower between its statements than the server's
    # idle_in_transaction_session_timeout was retried as an outage for ever (its calls
    # outside the database repeated each time); it is the handler's pace, met every time.
    dsn = make_conninfo(stack.postgres_dsn,
                        options="-c idle_in_transaction_session_timeout=200")
    store = PostgresDedupStore(dsn, table=f"{schema}.dedup")
    store.ensure_schema()

    def slow(conn: psycopg.Connection[Any]) -> None:
        time.sleep(1.0)  # an HTTP call, say, inside the transaction
        conn.execute("SELECT 1")

    def at_the_end(conn: psycopg.Connection[Any]) -> None:
        time.sleep(1.0)  # nothing after it but the COMMIT

    try:
        for effect in (slow, at_the_end):
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                store.run_once(DedupKey("g", "e1"), effect)
        assert store.run_once(DedupKey("g", "e1"), lambda conn: None) is Outcome.DONE
    finally:
        store.close()


def test_a_dedup_table_missing_or_not_granted_is_refused_for_good(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    # Review 47-e F7: retried as an outage for ever, every partition stalled.
    missing = PostgresDedupStore(stack.postgres_dsn, table=f"{schema}.never_created")
    role = unique("reader")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw'").format(
            sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(schema), sql.Identifier(role)))
    ungranted = PostgresDedupStore(make_conninfo(stack.postgres_dsn, user=role, password="pw"),
                                   table=f"{schema}.dedup")
    try:
        for refusing, words in ((missing, "does not exist"), (ungranted, "permission denied")):
            with pytest.raises(DedupStoreRefused, match=f"dedup table .*{words}.*"
                                                        "cdc-router dedup init"):
                refusing.run_once(DedupKey("g", "e1"), lambda conn: None)
            # QA 57-c F-2: the consumers' check at start says the same, writing nothing.
            with pytest.raises(DedupStoreRefused, match=f"dedup table .*{words}.*"
                                                        "cdc-router dedup init"):
                refusing.check_usable()
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:  # INSERT is enough
            conn.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(
                sql.Identifier(schema, "dedup"), sql.Identifier(role)))
        ungranted.check_usable()
        assert ungranted.run_once(DedupKey("g", "e0"), lambda conn: None) is Outcome.DONE
        wrong = PostgresDedupStore(make_conninfo(stack.postgres_dsn, user=role, password="no"),
                                   table=f"{schema}.dedup")
        with pytest.raises(DedupStoreRefused, match="password authentication failed"):
            wrong.check_usable()
        wrong.close()
    finally:
        missing.close()
        ungranted.close()
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    store.check_usable()
    # e0's row alone: the checks wrote none.
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".dedup') == 1
    assert store.run_once(DedupKey("g", "e1"), lambda conn: None) is Outcome.DONE


def test_an_event_id_the_databases_encoding_cannot_hold_is_the_records_failure(
        stack: StackEndpoints) -> None:
    # Review 47-e F3: in a LATIN1 database the dedup row's INSERT of 'order-注文-1' failed
    # with SQLSTATE 22P05, retried as an outage for ever: the partition stalled.
    name = unique("dedup_latin1")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'LATIN1' "
                     "LC_COLLATE 'C' LC_CTYPE 'C'")
    store = PostgresDedupStore(make_conninfo(stack.postgres_dsn, dbname=name,
                                             client_encoding="UTF8"))
    try:
        store.ensure_schema()
        with pytest.raises(psycopg.errors.UntranslatableCharacter):
            store.run_once(DedupKey("g", "order-注文-1"), lambda conn: None)
        assert store.run_once(DedupKey("g", "order-1"), lambda conn: None) is Outcome.DONE
    finally:
        store.close()
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


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


def test_purge_of_a_partitioned_dedup_table_keeps_every_mark_inside_the_window(
        stack: StackEndpoints, schema: str) -> None:
    # QA 53-h F2: the chunked delete matched ctids alone, unique only within one partition: on
    # a table partitioned by consumer group, purging g1's old marks deleted g2's live marks at
    # the same places, and their events were processed again.
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (consumer_group text NOT NULL, event_id text NOT "
                             "NULL, processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY "
                             "(consumer_group, event_id)) PARTITION BY LIST (consumer_group)"
                             ).format(sql.Identifier(schema, "dedup")))
        for group in ("g1", "g2"):
            conn.execute(sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES IN ({})").format(
                sql.Identifier(schema, f"dedup_{group}"), sql.Identifier(schema, "dedup"),
                sql.Literal(group)))
    store = PostgresDedupStore(stack.postgres_dsn, table=f"{schema}.dedup")
    try:
        for group in ("g1", "g2"):
            for i in range(3):
                store.run_once(DedupKey(group, f"{group}-{i}"), lambda conn: None)
        # Both partitions' rows move to the same places, ctids (0,4) to (0,6).
        age_rows(stack.postgres_dsn, schema, {f"g1-{i}": timedelta(days=10) for i in range(3)}
                 | {f"g2-{i}": timedelta(hours=1) for i in range(3)})
        assert store.purge(timedelta(days=7), batch_size=2) == 3
        assert remaining(stack.postgres_dsn, schema) == {("g2", f"g2-{i}") for i in range(3)}
        assert store.run_once(DedupKey("g2", "g2-0"), lambda conn: None) is Outcome.DUPLICATE
    finally:
        store.close()


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


# --- the loop on a real broker -------------------------------------------------------------


def create_topics(bootstrap: str, partitions: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=count, replication_factor=1)
                                   for name, count in partitions.items()])
    for future in futures.values():
        future.result(60)


def delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(names).values():
        future.result(60)


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, int]]) -> None:
    """Produce (key, value, partition) records in this order and wait for every ack."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20})
    for key, value, partition in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=partition)
                break
            except BufferError:
                producer.poll(0.1)  # local queue full: let deliveries drain
    assert producer.flush(120) == 0


def offsets(bootstrap: str, group: str, topic: str, partitions: int) -> tuple[list[int], list[int]]:
    """(committed offsets of `group`, end offsets) per partition; -1001 for none committed."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                       "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        committed = [tp.offset for tp in reader.committed(tps, timeout=30)]
        ends = [reader.get_watermark_offsets(tp, timeout=30)[1] for tp in tps]
    finally:
        reader.close()
    return committed, ends


@contextlib.contextmanager
def topic_and_dead_letter_topic(bootstrap: str, prefix: str,
                                partitions: int) -> Iterator[tuple[str, str]]:
    """A unique input topic and its 1-partition dead-letter topic, deleted afterwards."""
    topic = unique(prefix)
    dead_letter = f"{topic}.dlq"
    create_topics(bootstrap, {topic: partitions, dead_letter: 1})
    try:
        yield topic, dead_letter
    finally:
        delete_topics(bootstrap, [topic, dead_letter])


@pytest.fixture
def topics(stack: StackEndpoints) -> Iterator[tuple[str, str]]:
    """A unique 4-partition input topic and its dead-letter topic, deleted afterwards."""
    with topic_and_dead_letter_topic(stack.bootstrap_servers, "payments_confirmed", 4) as pair:
        yield pair


def run_until(consumer: IdempotentConsumer[Any], done: Callable[[], bool], what: str) -> None:
    """Run `consumer` in a thread until `done()`, then stop it."""
    runner = threading.Thread(target=consumer.run)
    runner.start()
    try:
        wait_until(done, 120, what)
    finally:
        consumer.stop()
        runner.join(60)


def run_to(stack: StackEndpoints, store: PostgresDedupStore, handler: Any,
           topics: tuple[str, str], committed: list[int]) -> IdempotentConsumer[Any]:
    """Run a consumer of topics[0] (3 attempts, short backoffs) until its group has committed
    `committed` on its first partitions, then stop it."""
    topic, dead_letter = topics
    settings = ConsumerSettings(
        bootstrap_servers=stack.bootstrap_servers, group_id=unique("fulfillment"),
        topics=(topic,), dead_letter_topic=dead_letter,
        retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.05, max_backoff_s=0.2))
    consumer = IdempotentConsumer(settings, store, handler)
    run_until(consumer, lambda: offsets(stack.bootstrap_servers, settings.group_id, topic, 4)[0][
        :len(committed)] == committed, f"offsets {committed} committed")
    return consumer


def test_poison_and_malformed_records_reach_the_dead_letter_topic_and_the_rest_goes_on(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        topics: tuple[str, str]) -> None:
    topic, dead_letter = topics
    effect_table(stack.postgres_dsn, schema)
    produce(stack.bootstrap_servers, topic, [
        (None, b'{"order_id": "1"}', 0),  # no event id
        (b"poison", b'{"order_id": "2"}', 0),
        (b"good", b'{"order_id": "3"}', 0)])

    def handler(event: Any, conn: psycopg.Connection[Any]) -> None:
        insert_effect(schema, event.event_id)(conn)
        if event.event_id == "poison":
            raise LookupError("order 2 is unknown")

    run_to(stack, store, handler, topics, [3])
    effects = count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects')
    assert effects == 1  # "good"; the poison's write rolled back on every attempt
    dead = read_topic(stack.bootstrap_servers, dead_letter, 2)
    headers = [{k: v.decode() for k, v in m.headers()} for m in dead]
    assert [(h["dlq.stage"], h["dlq.source.offset"]) for h in headers] == [
        ("decode", "0"), ("handle", "1")]
    assert headers[1]["dlq.error.class"] == "LookupError"
    assert headers[1]["dlq.attempts"] == "3"
    assert all(h["dlq.source.topic"] == topic and h["dlq.source.partition"] == "0"
               for h in headers)
    assert [m.value() for m in dead] == [b'{"order_id": "1"}', b'{"order_id": "2"}']


class Unprintable(LookupError):
    """An exception class with a bug in its __str__ and __repr__ (review 52-c F-HIGH-13)."""

    def __str__(self) -> str:
        raise KeyError("id")

    def __repr__(self) -> str:
        raise KeyError("id")


def test_a_handler_exception_that_cannot_be_printed_is_dead_lettered_not_a_crash(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        topics: tuple[str, str]) -> None:
    # Review 52-c F-HIGH-13: run() raised KeyError at the retry's log line or the dead letter,
    # nothing behind the record was handled, and every restart crashed the same way.
    topic, dead_letter = topics
    effect_table(stack.postgres_dsn, schema)
    produce(stack.bootstrap_servers, topic, [(b"poison", b"{}", 0), (b"good", b"{}", 0)])

    def handler(event: Any, conn: psycopg.Connection[Any]) -> None:
        insert_effect(schema, event.event_id)(conn)
        if event.event_id == "poison":
            raise Unprintable()

    run_to(stack, store, handler, topics, [2])
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects') == 1
    [dead] = read_topic(stack.bootstrap_servers, dead_letter, 1)
    headers = {k: v.decode() for k, v in dead.headers()}
    assert (headers["dlq.error.class"], headers["dlq.error.message"], headers["dlq.attempts"]) \
        == ("Unprintable", "<unprintable Unprintable>", "3")


def test_a_handler_that_returns_a_coroutine_is_dead_lettered_never_marked_done(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        topics: tuple[str, str]) -> None:
    # Review 52-c F-HIGH-11: an async effect behind a plain def (an `async def` handler is
    # refused at construction) ran nowhere, and each event was marked done and committed.
    topic, dead_letter = topics
    effect_table(stack.postgres_dsn, schema)
    produce(stack.bootstrap_servers, topic, [(b"async", b"{}", 0), (b"good", b"{}", 0)])

    async def ship(event: Any, conn: psycopg.Connection[Any]) -> None:
        insert_effect(schema, event.event_id)(conn)

    def handler(event: Any, conn: psycopg.Connection[Any]) -> Any:
        if event.event_id == "async":
            return ship(event, conn)
        insert_effect(schema, event.event_id)(conn)
        return None

    consumer = run_to(stack, store, handler, topics, [2])
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects') == 1
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".dedup') == 1  # good
    [dead] = read_topic(stack.bootstrap_servers, dead_letter, 1)
    headers = {k: v.decode() for k, v in dead.headers()}
    assert (headers["dlq.error.class"], headers["dlq.attempts"]) == ("TypeError", "3")
    assert "returned coroutine" in headers["dlq.error.message"]
    assert consumer.stats.processed == 1 and consumer.stats.dead_lettered == 1


def test_a_handler_s_retriable_error_outlasts_max_attempts_and_nothing_is_dead_lettered(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        topics: tuple[str, str]) -> None:
    # QA 35-b: an outage of what the handler calls is no record's fault.
    topic, dead_letter = topics
    effect_table(stack.postgres_dsn, schema)
    produce(stack.bootstrap_servers, topic, [(b"a", b'{"order_id": "1"}', 0),
                                              (b"b", b'{"order_id": "2"}', 1)])
    outage = iter(range(8))  # outlasts max_attempts=3 twice over

    def handler(event: Any, conn: psycopg.Connection[Any]) -> None:
        insert_effect(schema, event.event_id)(conn)
        if next(outage, None) is not None:
            try:
                raise ConnectionRefusedError("payments service: connection refused")
            except ConnectionRefusedError as error:
                raise RetriableError(f"payments service away: {error}") from error

    consumer = run_to(stack, store, handler, topics, [1, 1])
    rows = count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects')
    assert rows == 2  # each once; the failed attempts' writes rolled back
    assert consumer.stats.retries >= 8 and consumer.stats.dead_lettered == 0
    assert offsets(stack.bootstrap_servers, unique("reader"), dead_letter, 1)[1] == [0]


def test_the_group_commits_past_the_commit_markers_of_a_transactional_topic(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        topics: tuple[str, str]) -> None:
    # QA 35-b: the router writes in transactions; each partition's last offset is a commit
    # marker a read_committed consumer never gets, and the group lagged 1 a partition for ever.
    topic, dead_letter = topics
    effect_table(stack.postgres_dsn, schema)
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers,
                         "transactional.id": unique("txn")})
    producer.init_transactions(30)
    for batch in range(2):
        producer.begin_transaction()
        for partition in range(2):
            producer.produce(topic, key=f"e-{batch}-{partition}".encode(), value=b"{}",
                             partition=partition)
        producer.commit_transaction(30)
    settings = ConsumerSettings(bootstrap_servers=stack.bootstrap_servers,
                                group_id=unique("fulfillment"), topics=(topic,),
                                dead_letter_topic=dead_letter)
    consumer = IdempotentConsumer(settings, store, lambda event, conn: insert_effect(
        schema, event.event_id)(conn))

    def at_the_end() -> bool:
        committed, ends = offsets(stack.bootstrap_servers, settings.group_id, topic, 4)
        return committed[:2] == ends[:2] == [4, 4]  # 2 records and 2 markers each

    run_until(consumer, at_the_end, "offsets committed at the log end, past the markers")
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects') == 4


def test_a_record_whose_header_name_is_not_utf8_is_dead_lettered_and_the_rest_goes_on(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        topics: tuple[str, str]) -> None:
    # Review, session 30: confluent-kafka cannot read such a header name (a SystemError), and
    # a second read of the record's headers returns a NULL that crashes the interpreter.
    # After 20 records: once CPython has specialized the call site of headers() it no longer
    # raises there, and the NULL came back unnoticed (the full suite segfaulted on it).
    topic, dead_letter = topics
    effect_table(stack.postgres_dsn, schema)
    produce(stack.bootstrap_servers, topic, [(f"warm-{n}".encode(), b"{}", 0) for n in range(20)])
    produce_with_header(stack.bootstrap_servers, topic, key=b"odd", value=b'{"order_id": "1"}',
                        header_name=b"id\xff", header_value=b"forged", partition=0)
    produce(stack.bootstrap_servers, topic, [(b"good", b'{"order_id": "2"}', 0)])
    settings = ConsumerSettings(
        bootstrap_servers=stack.bootstrap_servers, group_id=unique("fulfillment"),
        topics=(topic,), dead_letter_topic=dead_letter)
    run_until(IdempotentConsumer(settings, store,
                                 lambda event, conn: insert_effect(schema, event.event_id)(conn)),
              lambda: offsets(stack.bootstrap_servers, settings.group_id, topic, 4)[0][0] == 22,
              "every record committed")
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".effects') == 21
    [letter] = read_topic(stack.bootstrap_servers, dead_letter, 1)
    headers = {name: value.decode() for name, value in letter.headers()}
    assert headers["dlq.stage"] == "decode" and "not UTF-8" in headers["dlq.error.message"]
    assert headers["dlq.headers.dropped"] == "a header name is not UTF-8"
    assert letter.key() == b"odd" and letter.value() == b'{"order_id": "1"}'


def test_a_dead_letter_topic_that_does_not_exist_stops_the_start(
        stack: StackEndpoints, store: PostgresDedupStore, topics: tuple[str, str]) -> None:
    # QA, session 30: the consumer started, and its first poison record then held its
    # partition for 4.5 minutes, running the handler at every try of its letter.
    topic, _ = topics
    missing = unique("nosuch.dlq")
    settings = ConsumerSettings(bootstrap_servers=stack.bootstrap_servers,
                                group_id=unique("fulfillment"), topics=(topic,),
                                dead_letter_topic=missing)
    consumer = IdempotentConsumer(settings, store, lambda event, conn: None)
    with pytest.raises(FatalKafkaError, match=f"dead-letter topic '{missing}' does not exist"):
        consumer.run()


def test_a_poison_record_near_message_max_bytes_is_dead_lettered_without_its_value(
        stack: StackEndpoints, topics: tuple[str, str]) -> None:
    # 999,000 bytes fit the producer's message.max.bytes (1,000,000) alone, not with the
    # dlq.* headers and a long reason: the dead letter must leave the value behind.
    topic, dead_letter = topics
    big = bytes(random.Random(5).getrandbits(8) for _ in range(999_000))
    produce(stack.bootstrap_servers, topic, [(b"big", big, 0), (b"next", b"{}", 0)])
    done: list[str] = []

    def handler(event: Any, _: None) -> None:
        if event.event_id == "big":
            raise ValueError("order 42 is unknown; " + "details " * 300)
        done.append(event.event_id)

    settings = ConsumerSettings(
        bootstrap_servers=stack.bootstrap_servers, group_id=unique("fulfillment"),
        topics=(topic,), dead_letter_topic=dead_letter,
        retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.05, max_backoff_s=0.2))
    run_until(IdempotentConsumer(settings, MemoryDedupStore(), handler),
              lambda: offsets(stack.bootstrap_servers, settings.group_id, topic, 4)[0][0] == 2,
              "both records committed")
    assert done == ["next"]
    [message] = read_topic(stack.bootstrap_servers, dead_letter, 1)
    headers = {k: v.decode() for k, v in message.headers()}
    assert message.key() == b"big" and not message.value()
    assert headers["dlq.value.dropped.bytes"] == "999000"
    assert (headers["dlq.source.topic"], headers["dlq.source.partition"],
            headers["dlq.source.offset"]) == (topic, "0", "0")
    assert headers["dlq.stage"] == "handle" and headers["dlq.error.class"] == "ValueError"
    assert headers["dlq.error.message"].startswith("order 42 is unknown")


class Worker:
    """One fulfillment process (cdc_router/examples/fulfillment.py) we started; stopped by pid."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", EXAMPLE, *args], cwd=REPO,
                                            stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT)

    def kill_9(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def terminate(self) -> int:
        """SIGTERM, the graceful stop; kill -9 only if it hangs (then the code is -9)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.kill_9()
            return -9

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class Crew:
    """`size` fulfillment processes with `args`; kill_mid_run() kill -9s and replaces them."""

    def __init__(self, args: list[str], log_dir: Path, size: int) -> None:
        self._args, self._log_dir = args, log_dir
        self._spawned = 0
        self.workers = [self._spawn() for _ in range(size)]
        self.killed: list[Worker] = []
        self.shipped_at_kill: list[int] = []

    def _spawn(self) -> Worker:
        self._spawned += 1
        return Worker(self._args, self._log_dir / f"worker-{self._spawned}.log")

    def run_with_kills(self, thresholds: tuple[int, ...], shipped: Callable[[], int],
                       events: int, done: Callable[[], bool], what: str,
                       timeout_s: float) -> str:
        """Each time shipped() reaches a threshold, kill -9 the oldest worker and start
        another; then wait for done() and stop the rest gracefully. Asserts that every kill
        landed mid-run and that every live worker exited 0; returns all the workers' logs."""
        try:
            for threshold in thresholds:
                wait_until(lambda: shipped() >= threshold,  # noqa: B023 (used at once)
                           timeout_s, f"{threshold} shipments")
                victim = self.workers.pop(0)
                victim.kill_9()
                self.killed.append(victim)
                self.shipped_at_kill.append(shipped())
                self.workers.append(self._spawn())
            wait_until(done, timeout_s, what)
        finally:
            exit_codes = [worker.terminate() for worker in self.workers]
        logs = "".join(worker.log() for worker in self.killed + self.workers)
        assert exit_codes == [0] * len(self.workers), logs[-5000:]
        assert len(self.killed) == len(thresholds)
        assert all(n < events for n in self.shipped_at_kill), self.shipped_at_kill  # mid-run
        return logs


def shipped_event_ids(dsn: str, schema: str) -> list[str]:
    """The event id of every row of `schema`.shipments, duplicates included."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [row[0] for row in conn.execute(sql.SQL("SELECT event_id FROM {}").format(
            sql.Identifier(schema, "shipments")))]


EVENTS = 10_000
COPIES = 3
PARTITIONS = 4
PROCESSES = 4
# kill -9 one consumer each time the shipments table passes one of these counts.
KILL_AT = (1_500, 4_000, 6_500, 8_500)


def test_each_event_takes_effect_once_across_crashes_retries_and_redeliveries(
        stack: StackEndpoints, schema: str, topics: tuple[str, str], tmp_path: Path) -> None:
    topic, dead_letter = topics
    dsn = stack.postgres_dsn
    rng = random.Random(20240607)
    event_ids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(EVENTS)]
    deliveries = [event_id for event_id in event_ids for _ in range(COPIES)]
    rng.shuffle(deliveries)
    # Random partitions put copies of one event in different partitions, so different
    # processes race on the same event id.
    produce(stack.bootstrap_servers, topic, [
        (event_id.encode(), json.dumps({"order_id": f"order-{event_id[:8]}",
                                        "amount": "19.90"}).encode(), rng.randrange(PARTITIONS))
        for event_id in deliveries])
    group = unique("fulfillment")
    shipments = f"{schema}.shipments"
    args = ["--bootstrap", stack.bootstrap_servers, "--dsn", dsn, "--topic", topic,
            "--group", group, "--dead-letter-topic", dead_letter,
            "--shipments-table", shipments, "--dedup-table", f"{schema}.dedup",
            "--commit-interval", "0.5", "--fail-after-write", "0.03", "--seed", "20240607",
            # A killed member is noticed after session.timeout.ms (6 s is the broker's
            # group.min.session.timeout.ms), not the 45 s default.
            "--consumer-config", "session.timeout.ms=6000",
            "--consumer-config", "heartbeat.interval.ms=1000"]
    # Tables exist before the workers start, so the run is about consuming, not DDL races.
    PostgresDedupStore(dsn, table=f"{schema}.dedup").ensure_schema()
    create_shipments_table(dsn, shipments)
    shipped = f'SELECT count(*) FROM "{schema}".shipments'

    def all_committed() -> bool:
        committed, ends = offsets(stack.bootstrap_servers, group, topic, PARTITIONS)
        return committed == ends

    logs = Crew(args, tmp_path, PROCESSES).run_with_kills(
        KILL_AT, lambda: count(dsn, shipped), EVENTS, all_committed,
        "every partition committed to its end", 240)

    assert count(dsn, shipped) == EVENTS
    assert count(dsn, f'SELECT count(DISTINCT event_id) FROM "{schema}".shipments') == EVENTS
    assert set(shipped_event_ids(dsn, schema)) == set(event_ids)
    assert count(dsn, f'SELECT count(*) FROM "{schema}".dedup WHERE consumer_group = %s',
                 group) == EVENTS
    committed, ends = offsets(stack.bootstrap_servers, group, topic, PARTITIONS)
    assert committed == ends and sum(ends) == EVENTS * COPIES
    assert offsets(stack.bootstrap_servers, group, dead_letter, 1)[1] == [0]  # nothing dead
    # The faults really happened: injected failures were rolled back and retried.
    assert logs.count("reason=handler_failed") > 0


def test_the_purge_command_plans_then_deletes_only_rows_older_than_the_window(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    for event_id in ("old-1", "old-2", "new"):
        store.run_once(DedupKey("fulfillment", event_id), lambda conn: None)
    age_rows(stack.postgres_dsn, schema, {"old-1": timedelta(days=10),
                                          "old-2": timedelta(days=8)})
    base = ["dedup", "purge", "--dsn", stack.postgres_dsn, "--table", f"{schema}.dedup",
            "--older-than", "7d", "-o", "json"]
    planned = CliRunner().invoke(main, [*base, "--dry-run"])
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.output)["would_delete"] == 2
    assert len(remaining(stack.postgres_dsn, schema)) == 3
    # QA, session 30: it deleted unasked; without a terminal it needs --yes.
    unasked = CliRunner().invoke(main, [*base, "--batch-size", "1"])
    assert unasked.exit_code != 0 and "--yes" in unasked.output
    assert len(remaining(stack.postgres_dsn, schema)) == 3
    done = CliRunner().invoke(main, [*base, "--batch-size", "1", "--yes"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["deleted"] == 2
    assert remaining(stack.postgres_dsn, schema) == {("fulfillment", "new")}


def test_the_purge_command_deletes_only_the_rows_it_counted_before_asking(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Review, session 30: the count was taken before the question and the delete's cutoff
    after the answer, so rows processed while the person read the question went too."""
    store.run_once(DedupKey("fulfillment", "counted"), lambda conn: None)
    time.sleep(1.2)  # older than the 1 s window

    def answer_slowly(question: str, yes: bool) -> None:
        assert "delete 1 rows" in question
        store.run_once(DedupKey("fulfillment", "while-asking"), lambda conn: None)
        time.sleep(1.2)  # the new row is older than the window too by the time of the answer

    monkeypatch.setattr("cdc_router.cli.dedup.confirm", answer_slowly)
    done = CliRunner().invoke(main, ["dedup", "purge", "--dsn", stack.postgres_dsn, "--table",
                                     f"{schema}.dedup", "--older-than", "1s", "-o", "json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["deleted"] == 1
    assert remaining(stack.postgres_dsn, schema) == {("fulfillment", "while-asking")}


def two_groups_with_old_rows(dsn: str, schema: str, store: PostgresDedupStore) -> None:
    """Groups A and B each with an expired row and a fresh one."""
    for group in ("A", "B"):
        for event_id in ("old", "new"):
            store.run_once(DedupKey(group, event_id), lambda conn: None)
    age_rows(dsn, schema, {"old": timedelta(days=10)})


def test_the_purge_command_with_a_group_purges_only_that_groups_rows(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    two_groups_with_old_rows(stack.postgres_dsn, schema, store)
    base = ["dedup", "purge", "--dsn", stack.postgres_dsn, "--table", f"{schema}.dedup",
            "--older-than", "7d", "--group", "A", "-o", "json"]
    planned = CliRunner().invoke(main, [*base, "--dry-run"])
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.output)["would_delete"] == 1
    done = CliRunner().invoke(main, [*base, "--yes"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["deleted"] == 1
    assert remaining(stack.postgres_dsn, schema) == {("A", "new"), ("B", "old"), ("B", "new")}


def test_the_periodic_purge_command_with_a_group_purges_only_that_groups_rows(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore, tmp_path: Path) -> None:
    two_groups_with_old_rows(stack.postgres_dsn, schema, store)
    log_path = tmp_path / "purge.log"
    with log_path.open("wb") as log:
        purger = subprocess.Popen(
            [sys.executable, "-m", "cdc_router", "dedup", "purge", "--dsn", stack.postgres_dsn,
             "--table", f"{schema}.dedup", "--older-than", "7d", "--group", "A",
             "--every", "1s"], cwd=REPO, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: ("A", "old") not in remaining(stack.postgres_dsn, schema), 60,
                   "A's expired row purged")
        # A's row and B's would go in the same DELETE: B's surviving it is the proof.
        assert remaining(stack.postgres_dsn, schema) == {("A", "new"), ("B", "old"),
                                                         ("B", "new")}
    finally:
        if purger.poll() is None:
            os.kill(purger.pid, signal.SIGTERM)
        code = purger.wait(60)
    assert code == 0, log_path.read_text()
    # QA 35-b: the durations were Python's text (`7 days, 0:00:00 every 0:00:01`).
    assert "purging group A's rows older than 7d every 1s; SIGTERM to stop" in \
        log_path.read_text()


def test_the_init_command_creates_the_table(stack: StackEndpoints, schema: str) -> None:
    result = CliRunner().invoke(main, ["dedup", "init", "--dsn", stack.postgres_dsn,
                                       "--table", f"{schema}.dedup"])
    assert result.exit_code == 0, result.output
    assert count(stack.postgres_dsn, f'SELECT count(*) FROM "{schema}".dedup') == 0
