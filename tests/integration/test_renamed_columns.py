"""Columns renamed while rows written before the rename are still to route (QA 63-a F-1, F-7),
on the real stack: the router stopped over the deploy, rows, `ALTER TABLE ... RENAME COLUMN`
of an outbox column and of a route's key column, rows. Either name alone stalls (each stops
the router at the other's run, its batch aborted); both listed deliver every event once, with
no dead letter, and status and the cleanup find the table's names."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import yaml

from tests.integration.pipeline import Pipeline, pipeline
from tests.integration.relay_setup import relay_setup
from tests.integration.support import StackEndpoints, read_to_end, read_topic

ROWS = 150  # of each name: more than router/missing_columns.RUN_LIMIT (100)
# One batch for the runs that stall, as QA saw (commit_max_records 1000): nothing commits.
ONE_BATCH = {"commit_interval_ms": 6_000, "transaction_timeout_ms": 60_000}


def _insert(pipe: Pipeline, type_column: str, zone_column: str, zone: str) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(ROWS)]
    with psycopg.connect(pipe.stack.postgres_dsn) as conn, conn.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO public.{pipe.table} (id, {type_column}, aggregateid, type, payload, "
            f"{zone_column}) VALUES (%s, 'Order', %s, 'OrderPaid', %s::jsonb, %s)",
            [(event_id, f"o-{n % 5}", json.dumps({"n": n}), zone)
             for n, event_id in enumerate(ids)])
    return ids


def _configure(pipe: Pipeline, aggregatetype: Any, key: Any, **extra: Any) -> None:
    config = yaml.safe_load(pipe.config_path.read_text())
    config["source"]["outbox"] = {"aggregatetype": aggregatetype}
    config["routes"][0]["key"] = key
    config.update(extra)
    pipe.config_path.write_text(yaml.safe_dump(config))


def _rows_left(pipe: Pipeline) -> int:
    with psycopg.connect(pipe.stack.postgres_dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM public.{pipe.table}").fetchone()
    return int(row[0]) if row else -1


def test_columns_renamed_under_a_backlog_are_delivered_once_under_both_names_listed(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path) as pipe:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE public.{pipe.table} ADD COLUMN zone text")
        ids = _insert(pipe, "aggregatetype", "zone", "old")
        assert len(pipe.read(pipe.raw_topic, ROWS)) == ROWS
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE public.{pipe.table} RENAME COLUMN aggregatetype TO "
                         "aggregate_type")
            conn.execute(f"ALTER TABLE public.{pipe.table} RENAME COLUMN zone TO zone_id")
        ids += _insert(pipe, "aggregate_type", "zone_id", "new")
        assert len(pipe.read(pipe.raw_topic, 2 * ROWS)) == 2 * ROWS

        # Either name alone: the router stops at the other name's run, nothing committed.
        for instance, (names, missing) in enumerate([
                (("aggregatetype", "zone"), "no column 'aggregatetype'"),
                (("aggregate_type", "zone_id"), "no column 'aggregate_type'")]):
            _configure(pipe, *names, delivery=ONE_BATCH)
            pipe.start_router(f"single-{instance}")
            assert pipe.routers.pop(f"single-{instance}").wait(timeout=180) == 1
            log = " ".join(pipe.router_log(f"single-{instance}").split())
            assert missing in log, log[-3000:]
        assert pipe.read_all(pipe.orders_topic, settle_s=0) == []
        assert pipe.read_all(pipe.dlq_topic, settle_s=0) == []

        # Both names listed, as the stop's line advises: every event once, no letter; the
        # cleanup deletes by the table's id column, found through the listed names.
        _configure(pipe, ["aggregatetype", "aggregate_type"], ["zone", "zone_id"], delivery={},
                   cleanup={"mode": "delete", "dsn": stack.postgres_dsn, "interval_ms": 100,
                            "table": f"public.{pipe.table}"})
        status = pipe.status()
        assert "source.outbox.aggregatetype lists aggregatetype, aggregate_type: the table " \
            "has aggregate_type" in status.stdout, status.stdout + status.stderr
        pipe.start_router("listed")
        assert len(pipe.read(pipe.orders_topic, 2 * ROWS)) == 2 * ROWS
        deadline = time.monotonic() + 60
        while _rows_left(pipe) and time.monotonic() < deadline:
            time.sleep(0.2)
        orders = pipe.read_all(pipe.orders_topic)
        letters = pipe.read_all(pipe.dlq_topic, settle_s=0)
        left = _rows_left(pipe)
        assert pipe.routers["listed"].poll() is None, pipe.router_log("listed")[-3000:]
    by_id = Counter(dict(record.headers())["id"].decode() for record in orders)
    assert sorted(by_id) == sorted(ids) and set(by_id.values()) == {1}
    assert Counter(record.key().decode() for record in orders) == {"old": ROWS, "new": ROWS}
    assert {dict(record.headers())["aggregatetype"] for record in orders} == {b"Order"}
    assert letters == []
    assert left == 0


def test_the_relay_reads_a_column_renamed_while_it_runs_under_its_listed_names(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # The relay reads the table itself: a listed column is the first name the table has, read
    # again when its columns change (as after QA 33-c's DROP COLUMN).
    listed = {"source": {"outbox": {"aggregatetype": ["aggregatetype", "kind"]}}}
    with relay_setup(stack, tmp_path, config=listed) as setup:
        table = f"public.{setup.table}"
        setup.start("a")
        ids = [str(uuid.uuid4()), str(uuid.uuid4())]
        insert = ("INSERT INTO {} (id, {}, aggregateid, type, payload) VALUES (%s, 'Order', "
                  "'o-1', 'OrderPaid', '{{}}')")
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(insert.format(table, "aggregatetype"), (ids[0],))
        read_topic(stack.bootstrap_servers, setup.orders_topic, 1, 60)
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {table} RENAME COLUMN aggregatetype TO kind")
            conn.execute(insert.format(table, "kind"), (ids[1],))
        records = read_topic(stack.bootstrap_servers, setup.orders_topic, 2, 60)
        letters = read_to_end(stack.bootstrap_servers, setup.dlq_topic)
        running = setup.relays["a"].poll() is None
        log = setup.log("a")
    assert [record.key().decode() for record in records] == ids, log[-3000:]
    assert {dict(record.headers())["aggregatetype"] for record in records} == {b"Order"}
    assert letters == [] and running, log[-3000:]
    assert "event=relay_columns_changed" in log


def test_an_expand_and_contract_migration_is_delivered_under_both_names_listed(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # rv64: ADD COLUMN kind, then writers of either version: Debezium sends both columns in
    # every row, the one a writer left out null. Read as the first name a row has, the new
    # writers' rows were dead-lettered ("got null"); the first name with a value routes all.
    with pipeline(stack, tmp_path) as pipe:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE public.{pipe.table} ADD COLUMN zone text, "
                         "ADD COLUMN kind text, ALTER COLUMN aggregatetype DROP NOT NULL")
        ids = _insert(pipe, "aggregatetype", "zone", "z")  # the old writers: kind null
        ids += _insert(pipe, "kind", "zone", "z")  # the new ones: aggregatetype null
        _configure(pipe, ["aggregatetype", "kind"], "zone")
        pipe.start_router("listed")
        assert len(pipe.read(pipe.orders_topic, 2 * ROWS)) == 2 * ROWS
        orders = pipe.read_all(pipe.orders_topic)
        letters = pipe.read_all(pipe.dlq_topic, settle_s=0)
        assert pipe.routers["listed"].poll() is None, pipe.router_log("listed")[-3000:]
    by_id = Counter(dict(record.headers())["id"].decode() for record in orders)
    assert sorted(by_id) == sorted(ids) and set(by_id.values()) == {1}
    assert {dict(record.headers())["aggregatetype"] for record in orders} == {b"Order"}
    assert letters == []
