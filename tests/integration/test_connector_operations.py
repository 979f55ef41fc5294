"""Connect-side operations on a live pipeline through the real CLI (QA 64-a): a table added to
the connector's include list, `status` of its unread raw topic, restart/pause/wait of a STOPPED
connector, reset-offsets and the re-snapshot it leads to, `wait` through a worker restart."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import yaml
from click.testing import Result
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_router.local import process
from cdc_router.local.stack import process_marker
from tests.integration.pipeline import REPO, Pipeline, pipeline
from tests.integration.support import (
    StackEndpoints,
    connector,
    create_outbox_table,
    debezium_config,
    drop_outbox_table,
    local_stack,
    read_to_end,
    unique,
)

# The module's pipeline goes through stop, reset and resume test by test: under `pytest -n`
# its tests stay on one worker, in file order (make test: --dist loadgroup).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("connector_operations")]

# Rows: of the added table before the apply, of the first table (more than the replay lines'
# cap of 100 a minute, so that its re-snapshot is summed up), of the added table after.
SKIPPED, BEFORE, AFTER = 30, 150, 10


@dataclass
class Added:
    """The module's pipeline after `connectors apply` added a second table to its connector."""

    pipe: Pipeline
    table: str  # the added table, public.<name>
    raw_topic: str  # its raw topic, which the router reads
    connector_file: Path
    diff: Result  # `connectors diff` of the file, before the apply
    apply: Result
    ids: dict[str, list[str]]  # SKIPPED, BEFORE, AFTER rows' ids
    undelivered: list[str]  # SKIPPED's ids found on the orders topic once AFTER's were there

    @property
    def name(self) -> str:
        return self.pipe.name.replace("_", "-")


def _connect_log(stack: StackEndpoints) -> Path | None:
    """The local stack's Connect log (it logs each REST request), None for another stack."""
    local = local_stack(stack)
    return None if local is None else local.home / "connect" / "connect.log"


def _insert(pipe: Pipeline, table: str, count: int) -> list[str]:
    """`count` Order rows in public.`table`, one transaction; their ids."""
    return pipe.insert([("Order", f"o-{n}", "OrderPaid", {"n": n}) for n in range(count)],
                       table=table)


def _delivered(pipe: Pipeline, wanted: list[str], timeout_s: float = 120) -> list[str]:
    """The ids on the orders topic, committed, read to its end until `wanted` are all there."""
    deadline = time.monotonic() + timeout_s
    while True:
        ids = [dict(record.headers())["id"].decode()
               for record in read_to_end(pipe.stack.bootstrap_servers, pipe.orders_topic)]
        if set(wanted) <= set(ids) or time.monotonic() > deadline:
            return ids
        time.sleep(1)


def _records(pipe: Pipeline, topic: str, count: int, timeout_s: float = 120) -> None:
    """Wait until `topic` holds `count` committed records."""
    deadline = time.monotonic() + timeout_s
    while len(read_to_end(pipe.stack.bootstrap_servers, topic)) < count:
        assert time.monotonic() < deadline, f"{topic}: not {count} records in {timeout_s}s"
        time.sleep(1)


@pytest.fixture(scope="module")
def added(stack: StackEndpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Added]:
    workdir = tmp_path_factory.mktemp("connector_operations")
    # snapshot.mode initial: the way back the plan's note gives (stop, reset-offsets, resume)
    # snapshots again; no_data would not.
    with pipeline(stack, workdir, partitions=1, connector={"snapshot.mode": "initial"}) as pipe:
        second = f"{pipe.table}_b"
        raw_topic = f"{pipe.name.replace('_', '-')}.public.{second}"
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE public.{second} (LIKE public.{pipe.table} INCLUDING ALL)")
            conn.execute(f'ALTER PUBLICATION "{pipe.name}" ADD TABLE public.{second}')
        try:
            for future in admin.create_topics([NewTopic(raw_topic, 1, 1)]).values():
                future.result(timeout=30)
            config = yaml.safe_load(pipe.config_path.read_text())
            config["source"]["topics"] = [pipe.raw_topic, raw_topic]
            pipe.config_path.write_text(yaml.safe_dump(config))
            pipe.start_router(wait=True)
            ids = {"skipped": _insert(pipe, second, SKIPPED)}  # published, not captured yet
            ids["before"] = _insert(pipe, pipe.table, BEFORE)
            assert len(_delivered(pipe, ids["before"])) == BEFORE
            document = {"name": pipe.name.replace("_", "-"), "config": debezium_config(
                stack, name=pipe.name, prefix=pipe.name.replace("_", "-"),
                **{"snapshot.mode": "initial",
                   "table.include.list": f"public.{pipe.table},public.{second}"})}
            connector_file = workdir / "connector.json"
            connector_file.write_text(json.dumps(document))
            diffed = pipe.cli("connectors", "diff", "-f", str(connector_file))
            applied = pipe.cli("connectors", "apply", "-f", str(connector_file), "--yes")
            assert applied.exit_code == 0, applied.output
            ids["after"] = _insert(pipe, second, AFTER)
            delivered = _delivered(pipe, ids["after"])
            yield Added(pipe, f"public.{second}", raw_topic, connector_file, diffed, applied,
                        ids, [event for event in ids["skipped"] if event in delivered])
        finally:
            drop_outbox_table(stack.postgres_dsn, second)
            for future in admin.delete_topics([raw_topic]).values():
                with suppress(Exception):
                    future.result(timeout=30)


def test_the_plan_notes_a_table_added_to_the_include_list(added: Added) -> None:
    # QA 64-a F-2: the plan said only '~ table.include.list'; 113 of 1,092 rows never came.
    # The pipeline's connector leaves its publication to the user (autocreate disabled), as
    # the shipped file does: the note names the ALTER PUBLICATION, done above (review 65).
    publication = added.pipe.name
    note = (f"  ! table.include.list adds {added.table}: Debezium streams none of its rows "
            f"until publication {publication} publishes it (publication.autocreate.mode "
            f'disabled): before this update, `ALTER PUBLICATION "{publication}" ADD TABLE '
            f'"public"."{added.table.removeprefix("public.")}"`')
    way_back = ("so its rows committed before this update are not delivered; afterwards "
                "snapshot just the added table with Debezium's incremental snapshot")
    full = "`cdc-router connectors stop`, `reset-offsets`, `resume` snapshots every table again"
    assert added.diff.exit_code == 2, added.diff.output
    assert "  ~ table.include.list: " in added.diff.stdout
    for result in (added.diff, added.apply):
        assert note in result.stdout and way_back in result.stdout and full in result.stdout, \
            result.stdout
    assert "its raw topic must be in the router's source.topics" in added.apply.stdout
    # What the note is about: the rows written before the apply are not delivered.
    assert added.undelivered == []


def test_a_new_connector_with_no_data_is_planned_with_the_rows_it_skips(added: Added) -> None:
    # QA 64-a F-3: 100 rows already in the outbox never reached Kafka, not a word.
    document = json.loads(added.connector_file.read_text())
    document["name"] = f"{added.name}-nodata"
    document["config"]["snapshot.mode"] = "no_data"
    nodata = added.connector_file.with_name("nodata.json")
    nodata.write_text(json.dumps(document))

    diffed = added.pipe.cli("connectors", "diff", "-f", str(nodata))

    assert diffed.exit_code == 2, diffed.output
    assert f"{added.name}-nodata ({nodata}): create" in diffed.stdout
    assert (f"  ! snapshot.mode no_data: a new connector delivers none of the rows already "
            f"in public.{added.pipe.table}, {added.table}, only those committed once its "
            "slot exists (") in diffed.stdout, diffed.stdout
    assert "; snapshot.mode when_needed (the shipped file's) delivers them too" in diffed.stdout


def test_status_warns_of_a_captured_tables_raw_topic_no_router_reads(added: Added) -> None:
    # QA 64-a F-1: 463 events on a raw topic source.topics did not name, and status ok.
    config = yaml.safe_load(added.pipe.config_path.read_text())
    one_topic = added.pipe.config_path.with_name("one-topic.yaml")
    one_topic.write_text(yaml.safe_dump(
        {**config, "source": {**config["source"], "topics": [added.pipe.raw_topic]}}))

    unread = json.loads(added.pipe.status("-o", "json", "-c", str(one_topic)).stdout)
    read = json.loads(added.pipe.status("-o", "json").stdout)

    assert unread["connector"]["unread_topics"] == [added.raw_topic]
    assert {"level": "warning", "component": "connector", "message": (
        f"connector {added.name} writes the change events of one of its tables to "
        f"{added.raw_topic}, which source.topics neither names nor matches: unless another "
        "pipeline's router reads it, that table's events are never delivered; add "
        f"{added.raw_topic} to source.topics and restart the router, or take the table out of "
        "the connector's table.include.list (another pipeline's on purpose: name it in "
        "status.read_elsewhere)")
    } in unread["problems"], unread["problems"]
    assert read["connector"]["unread_topics"] == []
    assert [problem for problem in read["problems"]
            if problem["component"] == "connector"] == [], read["problems"]


def test_a_stopped_connector_is_not_restarted_and_waits_paused(added: Added) -> None:
    name, cli = added.name, added.pipe.cli
    assert cli("connectors", "stop", name).exit_code == 0
    stopped = cli("connectors", "wait", name, "--state", "STOPPED", "--timeout", "60")
    assert stopped.exit_code == 0, stopped.output
    # it65: right after the wait, `status` once listed the old task RUNNING.
    listed = json.loads(cli("connectors", "status", name, "-o", "json").stdout)
    assert not [task for task in listed["tasks"] if task["state"] == "RUNNING"], listed
    log = _connect_log(added.pipe.stack)
    before = log.read_text(errors="replace").count(f"/connectors/{name}/restart") if log else 0

    # QA 64-a F-4: 'restart requested', exit 0, and the connector stayed STOPPED.
    restarted = cli("connectors", "restart", name, "--tasks", "all")
    state = json.loads(cli("connectors", "status", name, "-o", "json").stdout)
    # QA 64-a F-5: a connector paused from STOPPED has no task; the wait never ended.
    paused = cli("connectors", "pause", name)
    waited = cli("connectors", "wait", name, "--state", "PAUSED", "--timeout", "20")

    assert restarted.exit_code == 1, restarted.output
    assert restarted.stderr == (f"error: connector '{name}' is STOPPED: a restart leaves it "
                                "STOPPED, with no task; `cdc-router connectors resume "
                                f"{name}` starts it\n"), restarted.output
    assert "restart requested" not in restarted.stdout
    if log is not None:  # nothing sent: Connect logs each request it serves
        assert log.read_text(errors="replace").count(f"/connectors/{name}/restart") == before
    assert state["state"] == "STOPPED", state
    assert paused.exit_code == 0, paused.output
    assert waited.exit_code == 0, waited.output
    assert waited.stdout == f"{name}: PAUSED (0 task(s))\n"


def test_reset_offsets_says_the_resume_snapshots_and_it_delivers_what_was_skipped(
        added: Added) -> None:
    name, cli, pipe = added.name, added.pipe.cli, added.pipe
    assert cli("connectors", "stop", name).exit_code == 0
    assert cli("connectors", "wait", name, "--state", "STOPPED", "--timeout", "60").exit_code == 0

    reset = cli("connectors", "reset-offsets", name, "--yes")  # QA 64-a F-10
    resumed = cli("connectors", "resume", name)
    running = cli("connectors", "wait", name, "--timeout", "120")
    # Once the snapshot is on both raw topics (each row's second record), a row in each table:
    # no replay, read after every replay of its partition, so the last run of replays ends.
    _records(pipe, pipe.raw_topic, 2 * BEFORE)
    _records(pipe, added.raw_topic, SKIPPED + 2 * AFTER)
    # Review 65: the last run is summed up once the router reads nothing (5 s), before any
    # new record comes (it was said only at the next record).
    idle = _replays_said(pipe, BEFORE + AFTER)
    written = [event for rows in added.ids.values() for event in rows] + _insert(
        pipe, pipe.table, 1) + _insert(pipe, added.table.removeprefix("public."), 1)
    delivered = _delivered(pipe, written)
    log = pipe.router_log()

    assert reset.exit_code == 0, reset.output
    assert reset.stdout.startswith(
        f"on resume, Debezium snapshots public.{pipe.table}, {added.table} again "
        "(snapshot.mode initial), then streams: the router drops the rows it delivered within "
        "dedup.window_ms"), reset.stdout
    assert f"{name}: offsets reset; it stays STOPPED" in reset.stdout
    assert resumed.exit_code == 0 and running.exit_code == 0, resumed.output + running.output
    # The note's way back: the skipped rows came, none twice (the snapshot's replays dropped).
    lost = set(written) - set(delivered)
    twice = len(delivered) - len(set(delivered))
    assert (len(written), len(lost), twice) == (SKIPPED + BEFORE + AFTER + 2, 0, 0), \
        (sorted(lost)[:5], log[-2000:])
    # QA 64-a F-9: each replay (a delivered row snapshotted again) is said by its line or,
    # past the cap of 100 lines a minute, counted in a summary line once its run ends.
    said, summed = _replay_lines(log)
    assert summed and said + sum(summed) == BEFORE + AFTER, (said, summed)
    assert idle == BEFORE + AFTER, idle


def _replay_lines(log: str) -> tuple[int, list[int]]:
    """The replays said one by one, and each summary's count of those unsaid."""
    return log.count("event=replay_dropped "), [
        int(line.split(" unsaid=")[1].split()[0]) for line in log.splitlines()
        if "event=replays_dropped " in line]


def _replays_said(pipe: Pipeline, wanted: int, timeout_s: float = 60) -> int:
    """The replays the router's log said or summed up, once `wanted` or at `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        said, summed = _replay_lines(pipe.router_log())
        if said + sum(summed) >= wanted or time.monotonic() > deadline:
            return said + sum(summed)
        time.sleep(1)


def test_wait_fails_after_a_grace_on_a_host_no_resolver_knows(added: Added) -> None:
    # Review 64: since wait polls through an unreachable worker, a mistyped host ran out the
    # whole --timeout. A resolver that cannot be asked answers EAI_AGAIN, waited through.
    # Review 65: Docker's DNS drops a restarting worker's name: 30 s of grace, said at once.
    try:
        socket.getaddrinfo("no-such-host.invalid", 8083)
    except socket.gaierror as error:
        if error.errno != socket.EAI_NONAME:
            pytest.skip(f"the resolver does not say the name is unknown here: {error}")
    started = time.monotonic()
    # Review 66: a Connect pod starts in 40-90 s: --name-grace sets the 30 s (here shorter).
    done = added.pipe.cli("connectors", "--url", "http://no-such-host.invalid:8083", "wait",
                          added.name, "--timeout", "60", "--name-grace", "8")
    took = time.monotonic() - started
    assert done.exit_code == 1, done.output
    first, *_, last = done.stderr.splitlines()
    assert first.startswith("waiting: Kafka Connect unreachable at "
                            "http://no-such-host.invalid:8083: ") and first.endswith(
        "asked again for 8s (a worker's name is gone while its container or pod restarts: "
        "--name-grace; check --url if it is not one)"), done.stderr
    assert last.startswith("error: Kafka Connect unreachable at "
                           "http://no-such-host.invalid:8083: "), done.stderr
    assert 8 <= took < 28, took


@pytest.mark.exclusive  # it stops the shared Connect worker
def test_wait_polls_through_a_connect_worker_restart(stack: StackEndpoints,
                                                     tmp_path: Path) -> None:
    # QA 64-a F-8: `connectors wait` right after a worker's restart failed in 4 s.
    local = local_stack(stack)
    if local is None:
        pytest.skip("needs the local stack, whose Connect worker this test restarts")
    name = unique("wr")
    create_outbox_table(stack.postgres_dsn, name)
    try:
        with connector(stack, name.replace("_", "-"),
                       debezium_config(stack, name=name, prefix=name.replace("_", "-"))):
            pid = process.read_pid(local.pid_path("connect"))
            assert pid is not None
            assert process.stop(pid, process_marker(local, "connect"))
            try:
                waiting = subprocess.Popen(
                    [sys.executable, "-m", "cdc_router", "connectors", "--url",
                     stack.connect_url, "wait", name.replace("_", "-"), "--timeout", "180"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
            finally:
                up = subprocess.run([sys.executable, "-m", "cdc_router", "local", "up",
                                     "--home", str(local.home)], capture_output=True, text=True,
                                    cwd=REPO, check=False)
            out, err = waiting.communicate(timeout=200)
    finally:
        drop_outbox_table(stack.postgres_dsn, name)
    assert up.returncode == 0, up.stdout + up.stderr
    assert waiting.returncode == 0, out + err
    assert out == f"{name.replace('_', '-')}: RUNNING (1 task(s))\n", out + err
