"""Recovery from a lost replication slot on the real stack: `outbox republish` fills the gap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from cdc_router.outbox.republish import CONNECTOR_NAME, RowSelection, count_rows, outbox_rows
from cdc_router.outbox.table import OutboxSchema
from tests.integration.pipeline import REPO, Pipeline, pipeline
from tests.integration.support import StackEndpoints, drop_slot

pytestmark = pytest.mark.integration


def _orders(start: int, count: int) -> list[tuple[str, str, str, dict[str, int]]]:
    return [("Order", f"order-{i % 20}", "OrderPaid", {"seq": i})
            for i in range(start, start + count)]


def _cli(stack: StackEndpoints, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "cdc_router", *args], capture_output=True,
                          text=True, cwd=REPO, check=False,
                          env={**os.environ, "CDC_ROUTER_PG_DSN": stack.postgres_dsn,
                               "CDC_ROUTER_CONNECT_URL": stack.connect_url})
    assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    return done.stdout


def _republish(pipe: Pipeline, *args: str) -> str:
    return _cli(pipe.stack, "outbox", "republish", "-c", str(pipe.config_path), "--yes", *args)


def _lose_the_slot_and_resume(pipe: Pipeline) -> list[str]:
    """README's runbook, steps 2 to 4: stop the connector, drop its slot, forget its offsets
    (they name WAL that is gone), resume. Returns the ids of rows written with no slot."""
    stack, connector = pipe.stack, pipe.name.replace("_", "-")
    _cli(stack, "connectors", "stop", connector)
    _cli(stack, "connectors", "wait", connector, "--state", "STOPPED")
    drop_slot(stack.postgres_dsn, pipe.table)
    lost = pipe.insert(_orders(1_000_000, 100))  # no slot at all: certainly not captured
    _cli(stack, "connectors", "reset-offsets", connector, "--yes")
    _cli(stack, "connectors", "resume", connector)
    _cli(stack, "connectors", "wait", connector, "--state", "RUNNING", "--timeout", "90")
    return lost


def _assert_each_once(pipe: Pipeline, ids: list[str]) -> None:
    """Every id exactly once on the destination (read_committed): 0 lost, 0 duplicates."""
    records = pipe.read(pipe.orders_topic, len(ids))
    settled = pipe.read_all(pipe.orders_topic, settle_s=5)
    assert len(settled) == len(ids), pipe.router_log()[-3000:]
    assert Counter(record.key().decode() for record in records) == Counter(ids)


def test_a_slot_dropped_while_rows_flow_loses_nothing_and_doubles_nothing_after_republish(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        config = yaml.safe_load(pipe.config_path.read_text())
        config["cleanup"] = {"mode": "none", "table": f"public.{pipe.table}"}
        pipe.config_path.write_text(yaml.safe_dump(config))
        since = datetime.now(UTC).isoformat()
        pipe.start_router(wait=True)
        ids: list[str] = []
        stop = threading.Event()

        def write() -> None:
            batch = 0
            while not stop.is_set():
                ids.extend(pipe.insert(_orders(batch * 20, 20)))
                batch += 1
                time.sleep(0.05)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            assert len(pipe.read(pipe.orders_topic, 200, timeout_s=120)) == 200
            # The slot goes while the writer goes on.
            lost = _lose_the_slot_and_resume(pipe)
            time.sleep(3)
        finally:
            stop.set()
            writer.join()
        after = pipe.insert(_orders(2_000_000, 50))  # captured by the new slot
        every = ids + lost + after
        before = pipe.read(pipe.orders_topic, len(every), timeout_s=30)
        delivered = Counter(record.key().decode() for record in before)
        assert set(after) <= set(delivered), "the new slot captures new rows"
        assert not set(lost) & set(delivered), "rows written without a slot never arrive"
        assert max(delivered.values()) == 1

        out = _republish(pipe, "--since", since)
        assert f"republished {len(every)} change events" in out, out
        _assert_each_once(pipe, every)


def test_with_when_needed_the_resumed_connector_snapshots_the_gap_back(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, partitions=2,
                  connector={"snapshot.mode": "when_needed"}) as pipe:
        pipe.start_router(wait=True)
        ids = pipe.insert(_orders(0, 100))
        assert len(pipe.read(pipe.orders_topic, 100)) == 100
        lost = _lose_the_slot_and_resume(pipe)
        after = pipe.insert(_orders(2_000_000, 50))
        every = ids + lost + after
        # The snapshot brings the gap back; the replay filter drops the rows delivered before.
        _assert_each_once(pipe, every)


def test_republish_by_ids_reemits_only_those_rows(stack: StackEndpoints, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        config = yaml.safe_load(pipe.config_path.read_text())
        config["cleanup"] = {"table": f"public.{pipe.table}"}
        pipe.config_path.write_text(yaml.safe_dump(config))
        ids = pipe.insert(_orders(0, 5))
        def dry_run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "cdc_router", "outbox", "republish",
                                   "-c", str(pipe.config_path), *args, "--dry-run"],
                                  capture_output=True, text=True, cwd=REPO, check=False,
                                  env={**os.environ, "CDC_ROUTER_PG_DSN": stack.postgres_dsn})
        # Review 53-c F13: a uuid id column compares as uuid (upper case, braces).
        out = dry_run("--ids", f"{ids[0]},{ids[1].upper()}", "--id", f"{{{ids[2]}}}")
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"3 rows of public.{pipe.table} to republish onto "
                                     f"{pipe.raw_topic}")
        # QA 47-d F3: which of the ids given no row has (purged, or mistyped): exit 1 (53-c F13).
        gone = str(uuid.uuid4())
        out = dry_run("--ids", f"{ids[0]},{gone}")
        assert out.returncode == 1 and out.stderr == (
            f"error: field '--ids': not in public.{pipe.table}: '{gone}'; nothing was "
            "republished; a delivered row may have been deleted by the cleanup: leave those "
            "ids out\n"), out.stderr
        out = dry_run("--ids", "nosuch-id")
        assert out.returncode == 1 and "field '--ids': not a UUID" in out.stderr, out.stderr
        captured = pipe.read(pipe.raw_topic, 5, timeout_s=60)
        assert len(captured) == 5
        _republish(pipe, "--ids", ids[2])
        raw = pipe.read_all(pipe.raw_topic, settle_s=0)
    [debezium] = [r for r in captured if ids[2].encode() in r.value()]
    assert len(raw) == 6
    assert raw[-1].key() == debezium.key(), "the same key bytes, so the same raw partition"


def test_republish_keys_rows_as_a_connector_keyed_by_aggregate_does_and_doubles_none(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 45-a F3: on the README's scale-out setting (message.key.columns: aggregateid) a row
    # was republished under the key {"id": ...}: onto another raw partition, so another
    # instance, whose replay filter had not seen its delivery, and it was delivered again.
    with pipeline(stack, tmp_path, partitions=2, raw_partitions=3,
                  connector={"message.key.columns": "public.{table}:aggregateid"}) as pipe:
        config = yaml.safe_load(pipe.config_path.read_text())
        config["cleanup"] = {"table": f"public.{pipe.table}"}
        pipe.config_path.write_text(yaml.safe_dump(config))
        pipe.start_router("a", wait=True)
        pipe.start_router("b", wait=True)
        ids = pipe.insert(_orders(0, 40))
        pipe.read(pipe.orders_topic, 40)
        captured = pipe.read(pipe.raw_topic, 40, timeout_s=60)
        _republish(pipe, "--ids", ",".join(ids),
                   "--key-columns", f"public.other:id;public.{pipe.table}:aggregateid")
        raw = pipe.read(pipe.raw_topic, 80, timeout_s=60)
        settled = pipe.read_all(pipe.orders_topic, settle_s=5)
        log = pipe.router_log("a") + pipe.router_log("b")
    def placed(records: list[Any], republished: bool) -> set[tuple[str, bytes, int]]:
        return {(json.loads(r.value())["after"]["id"], r.key(), r.partition()) for r in records
                if (json.loads(r.value())["source"]["connector"] == CONNECTOR_NAME)
                == republished}

    assert placed(raw, True) == placed(captured, False), "Debezium's key bytes and partition"
    assert len(placed(raw, True)) == 40
    assert len({partition for _, _, partition in placed(raw, True)}) > 1
    assert Counter(record.key().decode() for record in settled) == Counter(ids), log[-3000:]
    assert log.count("event=replay_dropped") == 40


def test_timestamps_python_cannot_hold_are_republished_as_debezium_sends_them(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # Before, one such row failed the whole command (timestamp too large (after year 10K)).
    created = ["infinity", "-infinity", "20000-01-01 00:00:00", "0044-03-15 10:00:00 BC",
               "2026-01-01 00:00:00.5"]
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        config = yaml.safe_load(pipe.config_path.read_text())
        config["cleanup"] = {"table": f"public.{pipe.table}"}
        pipe.config_path.write_text(yaml.safe_dump(config))
        with psycopg.connect(stack.postgres_dsn) as conn:
            ids = [str(conn.execute(
                f"INSERT INTO public.{pipe.table} (id, aggregatetype, aggregateid, type, "
                "payload, created_at) VALUES (gen_random_uuid(), 'Order', 'o-1', 'OrderPaid', "
                "'{}', %s) RETURNING id", (text,)).fetchone()[0])  # type: ignore[index]
                   for text in created]
        captured = pipe.read(pipe.raw_topic, len(ids), timeout_s=60)
        out = _republish(pipe, "--ids", ",".join(ids))
        raw = pipe.read(pipe.raw_topic, 2 * len(ids), timeout_s=60)
    assert f"republished {len(ids)} change events" in out

    def created_at(records: list[Any]) -> dict[str, Any]:
        return {after["id"]: after["created_at"] for after in (
            json.loads(record.value())["after"] for record in records)}

    debezium, ours = created_at(captured), created_at(raw[len(ids):])
    assert ours == debezium
    assert debezium[ids[0]] == 9223372036825200000  # 'infinity', as Debezium 3 sends it


def _outbox_table(stack: StackEndpoints, prefix: str, created_at: str) -> str:
    """A new outbox table in public (the caller drops it): its name."""
    name = f"{prefix}_{os.getpid()}_{time.monotonic_ns() % 10**6}"
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE public.{name} (id uuid PRIMARY KEY, aggregatetype text, "
                     "aggregateid text, type text, payload jsonb, headers jsonb, "
                     f"created_at {created_at})")
    return name


def test_rows_of_a_timestamptz_outbox_are_counted_and_read(stack: StackEndpoints) -> None:
    # count_rows's oldest is epoch micros whatever created_at's type; a timestamptz Python
    # cannot hold is read as Postgres's text (the router dead-letters it) instead of failing.
    name = f"tz_{os.getpid()}_{time.monotonic_ns() % 10**6}"
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE public.{name} (id uuid PRIMARY KEY, aggregatetype text, "
                     "aggregateid text, type text, payload jsonb, headers jsonb, "
                     "created_at timestamptz)")
        for created in ("2026-01-01 00:00:00+00", "20000-01-01 00:00:00+00", "infinity"):
            conn.execute(f"INSERT INTO public.{name} VALUES (gen_random_uuid(), 'A', '1', 'T', "
                         "'{}', NULL, %s)", (created,))
    schema = OutboxSchema(table=f"public.{name}")
    try:
        with psycopg.connect(stack.postgres_dsn) as conn:
            count, oldest, _ = count_rows(conn, schema, RowSelection(since_ms=0))
            conn.commit()
            created_at = [row["created_at"] for row in outbox_rows(conn, schema,
                                                                   RowSelection(since_ms=0))]
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE public.{name}")
    assert (count, oldest) == (3, 1_767_225_600_000_000)
    assert created_at == [datetime(2026, 1, 1, tzinfo=UTC), "20000-01-01 00:00:00+00",
                          "infinity"]


def test_rows_are_read_in_insert_order_as_debezium_streamed_them(stack: StackEndpoints) -> None:
    # Review 44 M2: by created_at then id, the rows of one transaction (one now()) came in
    # their random ids' order, so one aggregate's events were republished out of order. Space
    # freed by a delete and VACUUM is reused by later rows: the heap's order is no answer.
    name = _outbox_table(stack, "order", "timestamptz DEFAULT now()")
    insert = (f"INSERT INTO public.{name} (id, aggregatetype, aggregateid, type, payload) "
              "VALUES (gen_random_uuid(), 'Order', '1', 'T', jsonb_build_object('n', %s::int))")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        for first in (0, 20):
            with conn.transaction():
                for n in range(first, first + 20):
                    conn.execute(insert, (n,))
            if first == 0:
                conn.execute(f"DELETE FROM public.{name} WHERE (payload->>'n')::int < 10")
                conn.execute(f"VACUUM public.{name}")
    schema = OutboxSchema(table=f"public.{name}")
    try:
        with psycopg.connect(stack.postgres_dsn) as conn:
            read = [json.loads(row["payload"])["n"]
                    for row in outbox_rows(conn, schema, RowSelection(since_ms=0))]
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE public.{name}")
    assert read == list(range(10, 40))


def test_with_yes_rows_written_after_the_count_are_not_republished(
        stack: StackEndpoints, monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 67-b F-5: "50950 rows ... to republish", then "republished 50960": rows written
    # between the count and the stream's query went too. With --yes both read one snapshot.
    from click.testing import CliRunner

    from cdc_router.cli import main
    from cdc_router.cli import outbox as outbox_cli

    name = _outbox_table(stack, "rr", "timestamp(6)")
    insert = (f"INSERT INTO public.{name} VALUES (gen_random_uuid(), 'A', '1', 'T', '{{}}', "
              "NULL, now() AT TIME ZONE 'utc')")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        for _ in range(3):
            conn.execute(insert)
    counted = count_rows

    def count_then_write(*args: Any) -> Any:
        found = counted(*args)
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as writer:
            for _ in range(2):  # a live writer, between the count and the stream
                writer.execute(insert)
        return found

    streamed: list[str] = []
    monkeypatch.setattr(outbox_cli, "count_rows", count_then_write)
    monkeypatch.setattr(outbox_cli, "republish_events", lambda config, topic, events: len(
        [streamed.append(event.event_id) for event in events]))
    monkeypatch.setenv("CDC_ROUTER__CLEANUP__TABLE", f"public.{name}")
    try:
        result = CliRunner().invoke(main, [
            "outbox", "republish", "-c", str(REPO / "cdc_router/examples/router.yaml"),
            "--dsn", stack.postgres_dsn, "--since", "1h", "--yes"])
        with psycopg.connect(stack.postgres_dsn) as conn:
            rows = conn.execute(f"SELECT count(*) FROM public.{name}").fetchone()
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE public.{name}")
    assert result.exit_code == 0, result.output
    assert f"3 rows of public.{name} to republish" in result.output
    assert len(streamed) == 3 and rows == (5,), result.output
    assert "republished 3 change events onto" in result.output
    assert "than counted" not in result.output
