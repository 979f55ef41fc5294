"""Cleanup of delivered outbox rows on the real stack: delete, retention, crashes, outages."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from cdc_router.local import process
from cdc_router.local.config import load_saved
from tests.integration.pipeline import REPO, Pipeline, pipeline
from tests.integration.support import StackEndpoints, replay_seed

pytestmark = pytest.mark.integration


def _orders(count: int) -> list[tuple[str, str, str, dict[str, int]]]:
    return [("Order", f"order-{i % 50}", "OrderPaid", {"seq": i}) for i in range(count)]


def _cleanup(stack: StackEndpoints, **extra: object) -> dict[str, object]:
    return {"cleanup": {"dsn": stack.postgres_dsn, "interval_ms": 100, **extra}}


def _remaining(pipe: Pipeline) -> set[str]:
    with psycopg.connect(pipe.stack.postgres_dsn) as conn:
        rows = conn.execute(f"SELECT id::text FROM public.{pipe.table}").fetchall()
    return {row[0] for row in rows}


def _wait_until_empty(pipe: Pipeline, timeout_s: float = 60) -> set[str]:
    deadline = time.monotonic() + timeout_s
    left = _remaining(pipe)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _remaining(pipe)
    return left


def test_delete_empties_the_table_and_deletes_never_reach_kafka(stack: StackEndpoints,
                                                                tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, config=_cleanup(stack, mode="delete")) as pipe:
        _point_cleanup_at(pipe)
        pipe.start_router()
        ids = pipe.insert(_orders(10_000))
        assert len(pipe.read(pipe.orders_topic, 10_000)) == 10_000
        left = _wait_until_empty(pipe)
        raw = pipe.read_all(pipe.raw_topic, settle_s=3)
    assert left == set(), f"{len(left)} rows left; router log:\n{pipe.router_log()[-2000:]}"
    assert len(raw) == len(ids), "the deletes appeared on the raw topic"
    assert {json.loads(r.value())["op"] for r in raw} == {"c"}


def test_retention_removes_rows_after_it_and_not_before(stack: StackEndpoints,
                                                        tmp_path: Path) -> None:
    config = _cleanup(stack, mode="retention", retention_ms=2_000, batch_size=50)
    with pipeline(stack, tmp_path, config=config) as pipe:
        _point_cleanup_at(pipe)
        pipe.start_router()
        pipe.insert(_orders(300), per_transaction=10)
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            created = dict(conn.execute(
                f"SELECT id::text, created_at FROM public.{pipe.table}").fetchall())
            gone_at = {}
            deadline = time.monotonic() + 60
            while len(gone_at) < len(created) and time.monotonic() < deadline:
                now, = conn.execute("SELECT now() AT TIME ZONE 'UTC'").fetchone()
                present = {row[0] for row in conn.execute(
                    f"SELECT id::text FROM public.{pipe.table}").fetchall()}
                for event_id in created.keys() - present - gone_at.keys():
                    gone_at[event_id] = now
                time.sleep(0.1)
    assert len(gone_at) == len(created), "rows older than the retention were not removed"
    early = [i for i, t in gone_at.items() if (t - created[i]).total_seconds() < 2.0]
    assert early == [], f"{len(early)} rows removed before 2 s"


def test_kill_9_during_delete_never_removes_an_undelivered_row(stack: StackEndpoints,
                                                               tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, config=_cleanup(stack, mode="delete")) as pipe:
        _point_cleanup_at(pipe)
        pipe.start_router(wait=True)
        ids: list[str] = []
        rows = _orders(10_000)

        def write() -> None:  # ids published per committed transaction, not all at the end
            for start in range(0, len(rows), 100):
                ids.extend(pipe.insert(rows[start:start + 100]))

        writer = threading.Thread(target=write)
        writer.start()
        seed = replay_seed(912)
        pauses = seed.random()
        for _ in range(5):
            time.sleep(pauses.uniform(0.5, 2.0))
            pipe.kill_router()
            inserted = set(ids)  # before looking at the table: rows inserted later are not gone
            left = _remaining(pipe)
            delivered = {r.key().decode() for r in pipe.read_all(pipe.orders_topic, 2)}
            gone = inserted - left
            assert gone <= delivered, \
                f"{len(gone - delivered)} rows deleted before delivery; {seed}"
            pipe.start_router(wait=True)
        writer.join()
        assert len(pipe.read(pipe.orders_topic, 10_000)) == 10_000
        left = _remaining(pipe)
        delivered = {r.key().decode() for r in pipe.read_all(pipe.orders_topic, 3)}
    assert set(ids) - left <= delivered


def test_postgres_outage_routing_goes_on_and_cleanup_catches_up(stack: StackEndpoints,
                                                                tmp_path: Path) -> None:
    home = Path(os.environ.get("CDC_ROUTER_HOME", REPO / ".cdc-router")).resolve()
    local = load_saved(home)
    if local is None or local.postgres_dsn != stack.postgres_dsn:
        pytest.skip("needs the local stack, whose Postgres this test stops")
    with pipeline(stack, tmp_path, config=_cleanup(stack, mode="delete")) as pipe:
        _point_cleanup_at(pipe)
        ids = pipe.insert(_orders(5_000))
        assert len(pipe.read(pipe.raw_topic, 5_000)) == 5_000  # captured before the outage
        pid = process.read_pid(local.pid_path("postgres"))
        assert pid is not None
        process.stop(pid, str(local.home), sig=signal.SIGINT)
        stopped_at = time.monotonic()
        try:
            pipe.start_router()
            routed = pipe.read(pipe.orders_topic, 5_000, timeout_s=25)
            time.sleep(max(0.0, 30 - (time.monotonic() - stopped_at)))
        finally:
            subprocess.run([sys.executable, "-m", "cdc_router", "local", "up", "--home",
                            str(home)], check=True, capture_output=True, cwd=REPO)
        assert len(routed) == 5_000, "routing stopped while Postgres was down"
        left = _wait_until_empty(pipe, timeout_s=90)
        log = pipe.router_log()
    assert left == set(), f"{len(left)} of {len(ids)} rows left after Postgres came back"
    assert "event=cleanup_failed" in log


def _point_cleanup_at(pipe: Pipeline) -> None:
    import yaml

    config = yaml.safe_load(pipe.config_path.read_text())
    config["cleanup"]["table"] = f"public.{pipe.table}"
    pipe.config_path.write_text(yaml.safe_dump(config))


def test_outbox_stats_and_purge_remove_only_older_rows(stack: StackEndpoints) -> None:
    table = f"purge_{os.getpid()}_{random.randrange(10**6)}"
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE public.{table} (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),"
                     " created_at timestamp(6) NOT NULL)")
        conn.execute(f"INSERT INTO public.{table} (created_at) SELECT (now() AT TIME ZONE 'UTC')"
                     " - make_interval(hours => g) FROM generate_series(1, 30) g")
        conn.execute(f"INSERT INTO public.{table} (created_at) SELECT now() AT TIME ZONE 'UTC'"
                     " FROM generate_series(1, 5)")
    env = {**os.environ, "CDC_ROUTER_PG_DSN": stack.postgres_dsn}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cdc_router", "outbox", *args, "--table",
                               f"public.{table}"], capture_output=True, text=True, env=env,
                              cwd=REPO, check=False)

    try:
        before = json.loads(cli("stats", "-o", "json").stdout)
        dry = cli("purge", "--older-than", "630m", "--dry-run")
        purged = cli("purge", "--older-than", "630m", "--batch-size", "7", "--yes")
        after = json.loads(cli("stats", "-o", "json").stdout)
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE public.{table}")
    assert before["rows"] == 35 and before["oldest_age_s"] > 29 * 3600
    assert "20 rows" in dry.stdout, dry.stdout + dry.stderr
    assert "deleted 20 rows" in purged.stdout, purged.stdout + purged.stderr
    assert after["rows"] == 15 and after["oldest_age_s"] < 10.5 * 3600
