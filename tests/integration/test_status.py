"""`cdc-router status` on the real stack: a healthy pipeline exits 0 and shows every part; a
paused connector makes it exit non-zero with the reason on one line."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from cdc_router.connect.client import ConnectClient
from cdc_router.router.marks import changelog_records
from tests.integration.pipeline import REPO, Pipeline, pipeline
from tests.integration.support import StackEndpoints, drop_slot, free_port

# Its module fixture's state grows test by test (records, letters): under `pytest -n` the
# module's tests stay on one worker, in file order (make test: --dist loadgroup).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("status")]

# Deeper than the router's JSON depth limit (MAX_JSON_DEPTH): this row is dead-lettered.
_POISON = "[" * 3000 + "]" * 3000


def _json_status(pipe: Pipeline) -> tuple[int, dict[str, Any]]:
    done = pipe.status("-o", "json")
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def routed(stack: StackEndpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """A pipeline whose router has delivered 5 events and dead-lettered one."""
    with pipeline(stack, tmp_path_factory.mktemp("status"), partitions=2) as pipe:
        pipe.start_router(wait=True)
        pipe.insert([("Order", f"o-{i}", "OrderPaid", {"n": i}) for i in range(5)])
        pipe.insert([("Order", "o-poison", "OrderPaid", _POISON)])
        assert len(pipe.read(pipe.orders_topic, 5, timeout_s=120)) == 5
        assert len(pipe.read(pipe.dlq_topic, 1, timeout_s=60)) == 1, pipe.router_log()[-3000:]
        yield pipe


def test_a_healthy_pipeline_exits_0_and_shows_every_part(routed: Pipeline) -> None:
    pipe = routed
    deadline = time.monotonic() + 60
    while True:  # the router's last commit and Connect's offsets may trail the records
        code, report = _json_status(pipe)
        if code == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert code == 0 and report["status"] == "ok", report["problems"]
    assert report["problems"] == []
    (slot,) = report["wal"]["slots"]
    assert slot["name"] == pipe.name and slot["exists"] and slot["active"]
    assert slot["wal_status"] in ("reserved", "extended")
    assert slot["retained_wal_bytes"] >= 0 and slot["flush_lag_bytes"] >= 0
    assert report["wal"]["max_slot_wal_keep_size_bytes"] is not None
    assert report["publication"] == {"error": None, "answered": True, "name": pipe.name,
                                     "exists": True,
                                     "tables": [f"public.{pipe.name}"],
                                     "operations": ["insert"], "via_root": False,
                                     "signal_table": None, "signal_table_exists": None,
                                     "row_filter_problem": None, "column_list_problem": None}
    outbox = report["outbox"]
    assert outbox["table"] == f"public.{pipe.name}" and outbox["rows"] == 6
    assert (outbox["partitioned"], outbox["reader_may_select"]) == (False, True)
    assert outbox["oldest_age_s"] >= 0 and outbox["size_bytes"] > 0
    connector = report["connector"]
    assert connector["state"] == "RUNNING" and [t["state"] for t in connector["tasks"]] == [
        "RUNNING"]
    router = report["router"]
    assert router["group"] == pipe.name and router["lag"] == 0
    (partition,) = router["partitions"]
    assert partition["topic"] == pipe.raw_topic and partition["committed"] >= 6
    # The commit stamp went through send_offsets_to_transaction into the group's offsets.
    assert partition["last_commit_age_s"] is not None and partition["last_commit_age_s"] < 300
    (member,) = router["members"]
    assert member["instance_id"].startswith(f"{pipe.name}-a.")  # and its topics' digest
    assert member["partitions"] == [f"{pipe.raw_topic}[0]"]
    letters = report["dead_letters"]
    assert letters["topic"] == pipe.dlq_topic and letters["count"] == 1 and letters["count_exact"]
    assert letters["newest"]["stage"] in ("decode", "serialize")  # JSON too deep: either
    assert "deep" in letters["newest"]["reason"] and letters["newest"]["age_s"] < 600
    changelog = report["dedup_changelog"]
    assert changelog["topic"] == pipe.changelog_topic and changelog["retained_offsets"] > 0
    text = pipe.status()
    assert text.returncode == 0 and text.stdout.rstrip().endswith("status: ok"), text.stdout



def test_watch_warns_of_new_dead_letters_and_serve_exports_the_gauges(routed: Pipeline) -> None:
    pipe, port = routed, free_port()
    connector = pipe.name.replace("_", "-")
    process = subprocess.Popen(
        [sys.executable, "-m", "cdc_router", "status", "-c", str(pipe.config_path),
         "--connector", connector, "--connect-url", pipe.stack.connect_url, "--dsn",
         pipe.stack.postgres_dsn, "--bootstrap-servers", pipe.stack.bootstrap_servers,
         "--watch", "2", "--serve", str(port), "-o", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    ticks: queue.Queue[dict[str, Any]] = queue.Queue()
    threading.Thread(target=lambda: [ticks.put(json.loads(line)) for line in process.stdout
                                     or []], daemon=True).start()
    try:
        first = ticks.get(timeout=60)
        assert first["dead_letters"]["count"] == 1
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert f'cdc_router_connector_state{{connector="{connector}",state="RUNNING"}} 1.0' \
            in metrics
        assert f'cdc_router_slot_active{{slot="{pipe.name}"}} 1.0' in metrics
        assert f'cdc_router_info{{connector="{connector}",group="{pipe.name}",' \
               'process="status",version="' in metrics  # QA 63-b L-1
        assert f'cdc_router_dlq_records{{topic="{pipe.dlq_topic}"}} 1.0' in metrics
        pipe.insert([("Order", "o-poison-2", "OrderPaid", _POISON)])
        deadline = time.monotonic() + 90
        while True:
            tick = ticks.get(timeout=60)
            grew = [p["message"] for p in tick["problems"] if p["component"] == "dead_letters"]
            if grew or time.monotonic() > deadline:
                break
        assert tick["exit_code"] == 1 and grew and grew[0].startswith(
            f"1 new dead letter on {pipe.dlq_topic} since the last check; newest: stage "), grew
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert f'cdc_router_dlq_records{{topic="{pipe.dlq_topic}"}} 2.0' in metrics
    finally:
        # --watch stops on SIGTERM (and Ctrl-C), with the last verdict. Not SIGINT here: a
        # pytest started in the background by a non-interactive shell ignores SIGINT, and its
        # children inherit that (the cause of this test's hang in such runs).
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail(f"status --watch did not stop on SIGTERM: {process.communicate()[1]}")
    assert process.returncode in (0, 1)


def test_a_paused_connector_exits_non_zero_and_says_why(routed: Pipeline) -> None:
    pipe = routed
    name = pipe.name.replace("_", "-")
    connect = ConnectClient(pipe.stack.connect_url)  # a call again on a 409
    connect.pause(name)  # raises with Connect's message when refused
    try:
        deadline = time.monotonic() + 60
        while True:
            done = pipe.status()
            if "is PAUSED" in done.stdout or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert done.returncode in (1, 2), done.stdout
        reasons = [line for line in done.stdout.splitlines() if "is PAUSED" in line]
        assert reasons == [f"warning: connector: connector {name} is PAUSED: no event is "
                           f"captured and its slot retains WAL; `cdc-router connectors resume "
                           f"{name}`"], done.stdout
    finally:
        connect.resume(name)
        connect.close()


def test_an_unreachable_connect_is_one_critical_line_not_a_traceback(routed: Pipeline) -> None:
    done = routed.status("--connect-url", "http://127.0.0.1:1")
    assert done.returncode == 2 and "Traceback" not in done.stdout + done.stderr
    # Without the connector's config the publication is not checked either. Before, Debezium's
    # default slot and publication names were reported missing, two false critical lines
    # pointing at the lost-slot runbook (QA, session 25); then the unchecked publication was
    # named in the critical line, though Postgres answered (QA 57-b F-6).
    assert "critical: connector: cannot check it: Kafka Connect unreachable at " \
           "http://127.0.0.1:1" in done.stdout
    assert "publication: not checked (the connector's config names it, and Kafka Connect did " \
           "not give it: see the connector line)" in done.stdout
    assert "publication: NOT CHECKED" not in done.stdout
    # (The outbox line may say public.outbox does not exist: this pipeline's table is its own,
    # and a stack where no test made public.outbox has none.)
    assert not [line for line in done.stdout.splitlines() if "does not exist" in line
                and '"public.outbox" does not exist' not in line], done.stdout
    assert "dbz_publication" not in done.stdout
    # Every logical slot is shown instead, this pipeline's among them.
    assert routed.name in done.stdout, done.stdout


def test_a_connector_connect_does_not_have_is_named_with_those_it_has(
        routed: Pipeline) -> None:
    # Review 49-b F6: `--connector nosuch` showed "publication: UNREACHABLE" and a second
    # critical line, "cannot check it", for the one cause, and not which connectors Connect has.
    done = routed.status("--connector", "nosuch")
    assert done.returncode == 2, done.stdout + done.stderr
    ours = routed.name.replace("_", "-")
    # (The outbox line may say public.outbox does not exist, as in the test above.)
    critical = [line for line in done.stdout.splitlines() if line.startswith("critical:")]
    [line] = [line for line in critical if line.startswith("critical: connector:")]
    assert line.startswith("critical: connector: connector nosuch is not deployed: Kafka "
                           "Connect has no connector of that name (it has: "), line
    assert ours in line.split("(it has: ")[1].split(")")[0].split(", "), line
    assert "publication: not checked (connector nosuch is not deployed" in done.stdout
    assert "publication: NOT CHECKED" not in done.stdout, done.stdout
    unchecked = [line for line in critical if "cannot check it" in line]
    assert not [line for line in unchecked if "publication" in line], done.stdout


def test_a_stopped_connector_whose_slot_was_dropped_does_not_say_it_retains_wal(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # Review 49-b F6: the lost-slot runbook's step 2 stops the connector and drops its slot;
    # the connector line went on saying "its slot retains WAL" beside the wal line.
    with pipeline(stack, tmp_path, partitions=1) as pipe:
        name = pipe.name.replace("_", "-")
        with ConnectClient(stack.connect_url) as connect:
            connect.stop(name)
            connect.wait_for_state(name, "STOPPED", 60)
        drop_slot(stack.postgres_dsn, pipe.name)
        done = pipe.status()
        assert done.returncode == 2, done.stdout + done.stderr
        [line] = [line for line in done.stdout.splitlines() if line.startswith(
            f"warning: connector: connector {name} is STOPPED")]
        assert line == (f"warning: connector: connector {name} is STOPPED: no event is "
                        f"captured, and its slot {pipe.name} does not exist (see the wal "
                        "line); follow README runbook 'the slot was dropped or its WAL "
                        "removed' from its step 3: `cdc-router connectors reset-offsets "
                        f"{name}` (while STOPPED), then `cdc-router connectors resume {name}`")
        assert "retains WAL" not in done.stdout


def test_a_signal_table_outside_the_publication_is_a_warning(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # Left out at stop 32 (QA 32-e): an execute-snapshot row in a signal table the publication
    # does not publish was ignored without a line, and `status` said nothing of it.
    with pipeline(stack, tmp_path, partitions=1, connector={
            "signal.data.collection": "public.{table}_signal"}) as pipe:
        signals = f"public.{pipe.name}_signal"

        def signal_problems() -> list[str]:
            _, report = _json_status(pipe)
            assert report["publication"]["signal_table"] == signals, report["publication"]
            return [f"{problem['level']}: {problem['component']}: {problem['message']}"
                    for problem in report["problems"] if "signal" in problem["message"]]

        def run_sql(statement: str) -> None:
            with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
                conn.execute(statement)

        quoted = f'"public"."{pipe.name}_signal"'
        prefix = f"warning: publication: the connector's signal table {signals} " \
            "(signal.data.collection) "
        [missing] = signal_problems()
        assert missing.startswith(f"{prefix}does not exist: Debezium never sees a signal "
                                  f"written there; create it (`CREATE TABLE {quoted} (id "
                                  "varchar(42) PRIMARY KEY"), missing
        run_sql(f"CREATE TABLE {signals} (id text PRIMARY KEY, type text, data text)")
        [left_out] = signal_problems()
        assert left_out.startswith(f"{prefix}is not in publication {pipe.name}: Debezium "
                                   "never sees a signal written there; run `ALTER "
                                   f'PUBLICATION "{pipe.name}" ADD TABLE {quoted}`'), left_out
        run_sql(f'ALTER PUBLICATION "{pipe.name}" ADD TABLE {quoted}')
        try:
            assert signal_problems() == []
        finally:
            run_sql(f"DROP TABLE {signals}")


def test_another_pipeline_s_letters_on_a_shared_topic_are_told_apart(routed: Pipeline) -> None:
    # QA 35-c: status and `dlq list` counted and showed another pipeline's letters as ours.
    # Last in the module: its foreign letters stay on the module's dead-letter topic.
    pipe = routed
    before = _json_status(pipe)[1]["dead_letters"]["count"]  # 1, or 2 after the watch test's
    producer = Producer({"bootstrap.servers": pipe.stack.bootstrap_servers})
    for offset, group in ((7, "billing-router"), (8, None)):
        headers = [("dlq.stage", b"route"), ("dlq.source.topic", b"raw2.billing.outbox"),
                   ("dlq.source.partition", b"0"), ("dlq.source.offset", str(offset).encode()),
                   ("dlq.error.class", b"RouteError"), ("dlq.error.message", b"no route")]
        if group is not None:
            headers.append(("dlq.source.group", group.encode()))
        producer.produce(pipe.dlq_topic, value=b"{}", headers=headers)
    assert producer.flush(30) == 0
    _, report = _json_status(pipe)
    letters = report["dead_letters"]
    assert (letters["count"], letters["others"]) == (before, 2), letters
    assert letters["newest"]["source"].startswith(pipe.raw_topic), letters  # ours, not theirs
    text = pipe.status().stdout
    assert f"dead letters on {pipe.dlq_topic}: {before} of this pipeline (2 of other " \
        "pipelines: `dlq list --all`)" in text, text

    def listed(*more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cdc_router", "dlq", "list", "-c", str(pipe.config_path),
             "-o", "json", *more], capture_output=True, text=True, cwd=REPO, check=False,
            timeout=120)
    ours, everyone = listed(), listed("--all")
    assert [letter["source"].split("[")[0] for letter in json.loads(ours.stdout)] == [
        pipe.raw_topic] * before, ours.stderr
    assert "2 letters of other pipelines left out (--all lists them)" in ours.stderr
    assert len(json.loads(everyone.stdout)) == before + 2 and "left out" not in everyone.stderr


def test_another_pipeline_s_marks_on_a_shared_changelog_are_said(routed: Pipeline) -> None:
    # QA 63-b L-2: "dedup changelog T: N offsets retained" counted every pipeline's marks on a
    # shared changelog without a word; now the line names the other groups found there.
    pipe = routed
    assert _json_status(pipe)[1]["dedup_changelog"]["other_groups"] == []
    assert "shared with" not in pipe.status().stdout
    producer = Producer({"bootstrap.servers": pipe.stack.bootstrap_servers})
    for mark in changelog_records(["b-1", "b-2"], int(time.time() * 1000),
                                  group="billing-router"):
        producer.produce(pipe.changelog_topic, key=mark.key, value=mark.value)
    assert producer.flush(30) == 0
    assert _json_status(pipe)[1]["dedup_changelog"]["other_groups"] == ["billing-router"]
    text = pipe.status().stdout
    assert "partition, every pipeline's: shared with group billing-router (among its newest " \
        "marks; each pipeline reads only its own group's)" in text, text


def test_a_lock_held_on_the_outbox_is_said_within_seconds_not_waited_for(
        routed: Pipeline) -> None:
    # Review 49-b F1: with an ACCESS EXCLUSIVE lock held on the outbox (an ALTER TABLE, a
    # VACUUM FULL), status hung for as long as the lock was held (killed at 120 s, no line).
    connector = routed.name.replace("_", "-")
    names: set[str] = set()
    with psycopg.connect(routed.stack.postgres_dsn) as holder, \
            psycopg.connect(routed.stack.postgres_dsn, autocommit=True) as watcher:
        holder.execute(f"LOCK TABLE public.{routed.table} IN ACCESS EXCLUSIVE MODE")
        with subprocess.Popen(
                [sys.executable, "-m", "cdc_router", "status", "-c", str(routed.config_path),
                 "--connector", connector, "--connect-url", routed.stack.connect_url,
                 "--dsn", routed.stack.postgres_dsn,
                 "--bootstrap-servers", routed.stack.bootstrap_servers],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO) as status:
            while status.poll() is None:  # its query waits 5 s for the lock: seen meanwhile
                names |= {row[0] for row in watcher.execute(
                    "SELECT application_name FROM pg_stat_activity WHERE wait_event_type = "
                    "'Lock' AND query LIKE %s", (f"%{routed.table}%",))}
                time.sleep(0.2)
            stdout, stderr = status.communicate(timeout=120)
    done = subprocess.CompletedProcess(status.args, status.returncode, stdout, stderr)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cdc-router-status" in names  # review 49-b F6: it was anonymous there
    assert [line for line in done.stdout.splitlines()
            if "lock timeout" in line and line.startswith("critical")] == [
        "critical: outbox: cannot check it: Postgres: canceling statement due to lock timeout "
        "(another session holds a lock on a table this check reads, over 5 s: see pg_locks "
        "and pg_stat_activity, and pg_prepared_xacts for a prepared transaction (two-phase "
        "commit), whose lock has no pid: COMMIT PREPARED or ROLLBACK PREPARED its gid)"
    ], done.stdout


@contextmanager
def _offsets_held_open(pipe: Pipeline) -> Iterator[None]:
    """One event on the raw topic, and a transaction of our own holding the group's committed
    offset of it open (as one Kafka left hanging would) until the block ends."""
    pipe.insert([("Order", "o-1", "OrderPaid", {"n": 1})])
    assert len(pipe.read(pipe.raw_topic, 1, timeout_s=120)) == 1
    producer = Producer({"bootstrap.servers": pipe.stack.bootstrap_servers,
                         "transactional.id": f"{pipe.name}-held",
                         "transaction.timeout.ms": 120_000})
    group = Consumer({"bootstrap.servers": pipe.stack.bootstrap_servers, "group.id": pipe.name})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition(pipe.raw_topic, 0, 0)],
                                         group.consumer_group_metadata(), 30)
    try:
        yield
    finally:
        producer.abort_transaction(30)
        group.close()


def test_no_instance_and_a_transaction_holding_the_group_s_offsets_is_said_so(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 52-b L2: a transaction Kafka left hanging on __consumer_offsets made every start of
    # the router exit 75, and status said to start `cdc-router run`. An open transaction of
    # our own on the group's offsets stands in for the hanging one.
    with pipeline(stack, tmp_path, partitions=1) as pipe:
        with _offsets_held_open(pipe):
            held = pipe.status()
        after = pipe.status()
    said = [line for line in held.stdout.splitlines() if "no running instance" in line]
    assert len(said) == 1, held.stdout
    assert said[0].startswith(f"critical: router: router group {pipe.name} has no running "
                              "instance, "), said
    assert said[0].endswith(
        f"and a transaction holds the group's committed offsets of {pipe.raw_topic}[0] open: "
        "a router's start waits for it (exit 75, `could not read the group's committed "
        "offsets`); one that lasts longer than delivery.transaction_timeout_ms was left "
        "hanging by Kafka: find and abort it (README, Operations: every start of the router "
        "exits 75)"), said
    assert held.returncode == 2
    # Aborted: the line says to start the router again.
    again = [line for line in after.stdout.splitlines() if "no running instance" in line]
    assert len(again) == 1 and again[0].endswith(
        "wait on the raw topic: start it (`cdc-router run`), or restart a hung one"), \
        after.stdout



def test_a_member_waiting_on_a_transaction_holding_the_group_s_offsets_is_said_so(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # Review 52-j F6: under a supervisor the restarting router is a static member of the group
    # while its start waits (require_stable) for the transaction, so the no-instance line
    # never came; the stall line said "stuck or down ... batch_aborted" only.
    with pipeline(stack, tmp_path, partitions=1) as pipe, _offsets_held_open(pipe):
        pipe.start_router("a")
        deadline, held = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            held = pipe.status("--threshold", "stalled_warning_s=5")
            if "router instances: 1" in held.stdout and "has not committed" in held.stdout:
                break
            time.sleep(2)
    assert held is not None
    assert "router instances: 1" in held.stdout, held.stdout
    assert "no running instance" not in held.stdout, held.stdout
    said = [line for line in held.stdout.splitlines() if "has not committed" in line]
    assert len(said) == 1 and said[0].startswith(
        f"warning: router: router group {pipe.name} has not committed {pipe.raw_topic}[0] "), \
        held.stdout
    assert said[0].endswith(
        f"and a transaction holds the group's committed offsets of {pipe.raw_topic}[0] open: "
        "an instance's start waits for it (exit 75, `could not read the group's committed "
        "offsets`), so a restarted one stays stuck; one that lasts longer than "
        "delivery.transaction_timeout_ms was left hanging by Kafka: find and abort it "
        "(README, Operations: every start of the router exits 75)"), said


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("CDC_ROUTER__SOURCE__OUTBOX__CREATED_AT", "occurred_at",
     'column "occurred_at" does not exist in public.{table} (renamed?): set '
     "source.outbox.created_at to the column's name"),
    ("CDC_ROUTER__STATUS__OUTBOX_TABLE", "public.renamed_away",
     'relation "public.renamed_away" does not exist (renamed?): fix status.outbox_table, '
     "which names public.renamed_away"),
])
def test_a_column_or_table_the_config_names_and_postgres_lacks_is_named_not_unreachable(
        routed: Pipeline, variable: str, value: str, expected: str) -> None:
    # QA 54-a F-1: after `ALTER TABLE outbox RENAME COLUMN created_at TO ...` status said
    # "outbox: UNREACHABLE: Postgres: column ... does not exist", naming no setting to change.
    done = subprocess.run(
        [sys.executable, "-m", "cdc_router", "status", "-c", str(routed.config_path),
         "--connector", routed.name.replace("_", "-"), "--connect-url", routed.stack.connect_url,
         "--dsn", routed.stack.postgres_dsn,
         "--bootstrap-servers", routed.stack.bootstrap_servers],
        capture_output=True, text=True, cwd=REPO, check=False, timeout=120,
        env={**os.environ, variable: value})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "UNREACHABLE" not in done.stdout
    outbox = [line for line in done.stdout.splitlines() if line.startswith("outbox")]
    assert "NOT CHECKED: Postgres: " in outbox[0], done.stdout
    assert expected.format(table=routed.table) in outbox[0], outbox
    # The table the connector captures is checked too, when status.outbox_table names another.
    others = [line.split(":")[0] for line in outbox[1:]]
    assert others == ([f"outbox public.{routed.table}"] if "OUTBOX_TABLE" in variable else []), \
        done.stdout
