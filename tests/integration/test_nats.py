"""JetStream routes on the real stack and a real nats-server: exactly once across kill -9."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest
import yaml
from nats.js.api import DiscardPolicy, StreamConfig

from cdc_router.config.load import load_config
from cdc_router.errors import JetStreamError, JetStreamRefused
from cdc_router.nats.publisher import BatchAcks, JetStreamPublisher, NatsMessage
from cdc_router.router.loop import OutboxRouter
from tests.integration.nats_server import nats_server, read_stream
from tests.integration.pipeline import REPO, Pipeline, Row, pipeline
from tests.integration.relay_setup import relay_setup
from tests.integration.support import StackEndpoints, replay_seed

pytestmark = pytest.mark.integration

EVENTS = 10_000  # the acceptance size
KILLS = 5
HOSTILE_TYPES = ["Order Paid", "a.>", "*", "a.", "x\r\nPUB y 1", "..", "x" * 300]


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with nats_server(tmp_path_factory.mktemp("nats-home")) as server:
        yield server.url


def _use_jetstream(pipe: Pipeline, url: str) -> tuple[str, str]:
    """Route Order events to `<prefix>.<type>` in a stream of the test's; streams apply."""
    prefix = pipe.name.replace("_", "-")
    config = yaml.safe_load(pipe.config_path.read_text())
    config["routes"][0] = {"match": {"aggregate_type": "Order*"},
                           "nats": {"subject": prefix + ".{type}"}}
    return _apply_streams(pipe.config_path, config, url, prefix), prefix


def _apply_streams(path: Path, config: dict[str, Any], url: str, prefix: str) -> str:
    """Write `config` with a stream `<PREFIX>` capturing `<prefix>.>`; streams apply."""
    stream = prefix.upper()
    config["nats"] = {"url": url, "ack_timeout_ms": 5_000,
                      "streams": [{"name": stream, "subjects": [f"{prefix}.>"],
                                   "duplicate_window_ms": 3_600_000}]}
    path.write_text(yaml.safe_dump(config))
    applied = subprocess.run([sys.executable, "-m", "cdc_router", "streams", "apply", "-c",
                              str(path), "--yes"], capture_output=True, text=True,
                             cwd=REPO, check=False)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert f"create    {stream}" in applied.stdout
    return stream


def _insert_slowly(pipe: Pipeline, rows: list[Row], ids: list[str]) -> None:
    """Small transactions with pauses, so that the kills land while events flow."""
    for start in range(0, len(rows), 50):
        ids.extend(pipe.insert(rows[start:start + 50], 50))
        time.sleep(0.1)


def test_kill_9_of_a_router_publishing_to_jetstream_stores_each_event_once(
        stack: StackEndpoints, nats_url: str, tmp_path: Path) -> None:
    good: list[Row] = [("Order", f"order-{i % 50}", "OrderPaid", {"seq": i})
                       for i in range(EVENTS)]
    hostile: list[Row] = [("Order", f"bad-{i}", kind, {"i": i})
                          for i, kind in enumerate(HOSTILE_TYPES)]
    rows = good[:EVENTS // 2] + hostile + good[EVENTS // 2:]
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        stream, prefix = _use_jetstream(pipe, nats_url)
        pipe.start_router(wait=True)
        ids: list[str] = []
        writer = threading.Thread(target=_insert_slowly, args=(pipe, rows, ids))
        writer.start()
        seed = replay_seed(18)
        jitter = seed.random()
        # Each kill lands once the writer has passed its share of the rows (plus a seeded
        # jitter), so the kills fall while events flow however fast this machine is.
        for kill in range(1, KILLS + 1):
            mark = len(rows) * kill // (KILLS + 1) + jitter.randrange(0, 200)
            while len(ids) < mark and writer.is_alive():
                time.sleep(0.05)
            pipe.kill_router()
            pipe.start_router(wait=True)
        writer.join()
        letters = pipe.read(pipe.dlq_topic, len(HOSTILE_TYPES))
        bad_ids = {event_id for event_id, row in zip(ids, rows, strict=True)
                   if row[1].startswith("bad-")}
        good_ids = [event_id for event_id in ids if event_id not in bad_ids]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            messages = read_stream(nats_url, stream)
            if len(messages) >= len(good_ids):
                break
            time.sleep(1)
        time.sleep(3)  # anything late (a duplicate) lands before the final read
        messages = read_stream(nats_url, stream)
        log = pipe.router_log()
    assert len(ids) == len(rows)
    seen = Counter(message.headers["id"] for message in messages)
    assert seen == Counter(good_ids), f"each event id exactly once in the stream; {seed}\n" \
        f"{log[-3000:]}"
    for message in messages[:50]:
        assert message.headers["Nats-Msg-Id"] == message.headers["id"]
        assert message.subject == f"{prefix}.OrderPaid"
        assert message.headers["aggregatetype"] == "Order"
    letter_headers = [{name: value.decode(errors="replace") for name, value in letter.headers()}
                      for letter in letters]
    assert {h["dlq.event.id"] for h in letter_headers} == bad_ids
    assert {h["dlq.stage"] for h in letter_headers} == {"route"}
    assert all("nats.subject" in h["dlq.error.message"] for h in letter_headers)


class _Crash(BaseException):
    """Stands for a kill -9 at the worst moment: after JetStream's acks, before Kafka's commit."""


def test_a_crash_between_the_acks_and_the_kafka_commit_is_absorbed_by_the_duplicate_window(
        stack: StackEndpoints, nats_url: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    rows: list[Row] = [("Order", f"order-{i % 5}", "OrderPaid", {"seq": i}) for i in range(60)]
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        stream, _ = _use_jetstream(pipe, nats_url)
        ids = pipe.insert(rows)
        assert len(pipe.read(pipe.raw_topic, len(ids))) == len(ids)
        real_publish = JetStreamPublisher.publish_batch
        published: list[int] = []

        def publish_then_crash(self: JetStreamPublisher, messages: Any) -> BatchAcks:
            acks = real_publish(self, messages)
            published.append(acks.stored)
            raise _Crash

        monkeypatch.setattr(JetStreamPublisher, "publish_batch", publish_then_crash)
        with pytest.raises(_Crash):
            OutboxRouter(load_config(pipe.config_path),
                         instance_id=f"{pipe.name}-inproc").run()
        monkeypatch.setattr(JetStreamPublisher, "publish_batch", real_publish)
        assert published and published[0] > 0
        pipe.start_router()
        # The stream holds the crashed batch already: wait for the restarted router to
        # publish it again (JetStream acks those as duplicates), then read.
        absorbed = f"event=jetstream_duplicates count={published[0]}"
        deadline = time.monotonic() + 90
        while absorbed not in pipe.router_log() and time.monotonic() < deadline:
            time.sleep(0.5)
        while len(read_stream(nats_url, stream)) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.5)  # the batches after the crashed one
        time.sleep(2)  # a duplicate, if any, would land after them
        messages = read_stream(nats_url, stream)
        log = pipe.router_log()
    assert absorbed in log, log[-3000:]
    assert Counter(message.headers["id"] for message in messages) == Counter(ids)


def test_a_nats_outage_fails_batches_a_stop_meanwhile_is_quick_and_a_restart_catches_up(
        stack: StackEndpoints, tmp_path: Path) -> None:
    rows: list[Row] = [("Order", f"order-{i % 5}", "OrderPaid", {"seq": i}) for i in range(400)]
    with nats_server(tmp_path / "own-nats") as server, \
            pipeline(stack, tmp_path, partitions=2) as pipe:
        stream, _ = _use_jetstream(pipe, server.url)
        pipe.start_router(wait=True)
        ids = pipe.insert(rows[:200])
        deadline = time.monotonic() + 60
        while len(read_stream(server.url, stream)) < 200 and time.monotonic() < deadline:
            time.sleep(0.5)
        server.stop(signal.SIGKILL)
        ids += pipe.insert(rows[200:])
        deadline = time.monotonic() + 60
        while "event=batch_aborted" not in pipe.router_log() and time.monotonic() < deadline:
            time.sleep(0.5)
        # Stopped during the outage: it exits at once, without a traceback, and commits
        # nothing it has not published; a new instance delivers the rest when NATS is back.
        stopping = time.monotonic()
        exit_code = pipe.kill_router(sig=signal.SIGTERM)
        stop_s = time.monotonic() - stopping
        stopped_log = pipe.router_log()
        server.start()
        pipe.start_router(wait=True)
        deadline = time.monotonic() + 120
        while len(read_stream(server.url, stream)) < len(ids) and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(2)
        messages = read_stream(server.url, stream)
        letters = pipe.read_all(pipe.dlq_topic, settle_s=0)
        log = pipe.router_log()
    assert "event=batch_aborted cause=jetstream " in log, log[-3000:]
    assert exit_code == 0 and stop_s < 30, (exit_code, stop_s, stopped_log[-3000:])
    assert "Traceback" not in stopped_log, stopped_log[-3000:]
    assert letters == [], "an outage is no record's fault: nothing is dead-lettered"
    assert Counter(message.headers["id"] for message in messages) == Counter(ids), log[-3000:]


def _stream_ids(url: str, stream: str, expected: int) -> Counter[str]:
    """The `id` header of every message in `stream` once it holds `expected` (or 90 s
    passed). Call it with every writer of the stream stopped, or a late duplicate would be
    missed."""
    deadline = time.monotonic() + 90
    while len(read_stream(url, stream)) < expected and time.monotonic() < deadline:
        time.sleep(0.5)
    return Counter(message.headers["id"] for message in read_stream(url, stream))


def _dlq_replay(config: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "cdc_router", "dlq", "replay", "-c",
                           str(config), "-o", "json", "--yes"], capture_output=True, text=True,
                          cwd=REPO, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_dlq_replay_delivers_letters_to_a_jetstream_route_once(
        stack: StackEndpoints, nats_url: str, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path) as pipe:
        prefix = pipe.name.replace("_", "-")
        config = yaml.safe_load(pipe.config_path.read_text())
        # Customer events have no route yet: they are dead-lettered.
        config["routes"] = [{"match": {"aggregate_type": "Order*"},
                             "nats": {"subject": prefix + ".{type}"}}]
        stream = _apply_streams(pipe.config_path, config, nats_url, prefix)
        pipe.start_router(wait=True)
        rows: list[Row] = ([("Order", f"o-{i}", "OrderPaid", {"i": i}) for i in range(10)]
                           + [("Customer", f"c-{i}", "CustomerCreated", {"i": i})
                              for i in range(10)])
        ids = pipe.insert(rows)
        assert len(pipe.read(pipe.dlq_topic, 10)) == 10, pipe.router_log()[-3000:]
        # The orders went out with those letters' batches (published before the Kafka commit
        # that made the letters visible): stopped now, the router can add nothing later.
        pipe.kill_router(sig=signal.SIGTERM)
        config["routes"].append({"match": {"aggregate_type": "Customer"},
                                 "nats": {"subject": prefix + ".customers"}})
        fixed = tmp_path / "fixed.yaml"
        fixed.write_text(yaml.safe_dump(config))
        first = _dlq_replay(fixed)
        second = _dlq_replay(fixed)
        seen = _stream_ids(nats_url, stream, len(ids))
    assert first["committed"] == {"deliver": 10}
    assert second["planned"] == {"already_delivered": 10}
    assert seen == Counter(ids), "orders from the router, customers from one replay, each once"


def test_the_relay_publishes_to_jetstream_once_across_a_kill_9(
        stack: StackEndpoints, nats_url: str, tmp_path: Path) -> None:
    # Batches of 10 (100 of them): the kill below lands while relay a is still inside its
    # 1,000 rows, however loaded the machine.
    with relay_setup(stack, tmp_path, config={"relay": {"batch_rows": 10}}) as setup:
        prefix = setup.name.replace("_", "-")
        config = yaml.safe_load(setup.config_path.read_text())
        config["routes"] = [{"nats": {"subject": prefix + ".{type}"}}]
        stream = _apply_streams(setup.config_path, config, nats_url, prefix)
        ids = [str(uuid.uuid4()) for _ in range(2_000)]
        _insert_outbox(stack, setup.table, ids[:1_000])
        setup.start("a")
        deadline = time.monotonic() + 60
        while not read_stream(nats_url, stream) and time.monotonic() < deadline:
            time.sleep(0.05)
        setup.kill("a")  # SIGKILL, while its batches flow
        at_kill = len(read_stream(nats_url, stream))
        _insert_outbox(stack, setup.table, ids[1_000:])
        setup.start("b")
        deadline = time.monotonic() + 90
        while len(read_stream(nats_url, stream)) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.5)
        setup.kill("b", signal.SIGTERM)  # stopped: nothing can land after the read below
        seen = _stream_ids(nats_url, stream, len(ids))
        log = setup.log("a") + setup.log("b")
    assert 0 < at_kill < 1_000, f"the kill landed mid-stream: {at_kill} of 1,000 published"
    assert seen == Counter(ids), log[-3000:]


def _insert_outbox(stack: StackEndpoints, table: str, ids: list[str]) -> None:
    with psycopg.connect(stack.postgres_dsn) as conn, conn.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO public.{table} (id, aggregatetype, aggregateid, type, payload) "
            "VALUES (%s, 'Order', %s, 'OrderPaid', '{}'::jsonb)",
            [(event_id, f"order-{i % 9}") for i, event_id in enumerate(ids)])


def test_a_publish_no_stream_captures_names_the_fix(nats_url: str) -> None:
    # QA, session 25: with a stream deleted on the server, every batch failed with "nats: no
    # response from stream", naming neither the cause nor `streams apply`.
    publisher = JetStreamPublisher(nats_url, ack_timeout_s=5, connect_timeout_s=5)
    try:
        with pytest.raises(JetStreamError, match=r"subject 'nowhere\.x'.*no stream captures "
                           r"this subject now.*streams apply"):
            publisher.publish_batch([NatsMessage("nowhere.x", b"{}", {}, "id-1")])
    finally:
        publisher.close()


@pytest.mark.parametrize("command", ["run", "relay"])
def test_a_declared_stream_the_server_lacks_stops_the_start_with_one_line(
        nats_url: str, tmp_path: Path, command: str) -> None:
    # QA 47-c F2: `streams apply` never run, the router retried every batch for ever.
    config = {"source": {"topics": ["qamiss.public.outbox"]},
              "routes": [{"nats": {"subject": "qamiss.{type}"}}],
              "nats": {"url": nats_url, "streams": [{"name": "QAMISS",
                                                     "subjects": ["qamiss.>"]}]},
              "relay": {"table": "public.outbox", "dsn": "postgresql://u@127.0.0.1:1/db"}}
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(config))
    line = _refused_start(path, command)
    assert "field 'nats.streams[0]': the JetStream stream QAMISS does not exist on the " \
           "server" in line and "`cdc-router streams apply -c <config>`" in line, line


def _refused_start(path: Path, command: str = "run") -> str:
    """The one line `command` (run or relay) stops with at start, exit 1."""
    started = subprocess.run([sys.executable, "-m", "cdc_router", command, "-c", str(path),
                              "--metrics-port", "0"], capture_output=True, text=True,
                             cwd=REPO, timeout=60, check=False)
    assert started.returncode == 1, started.stderr
    assert "Traceback" not in started.stderr
    return started.stderr.strip().splitlines()[-1]


def _edit_stream(url: str, stream: str, **changes: Any) -> None:
    """Change the live stream outside the config, as Terraform or `nats stream edit` would."""
    async def edit() -> None:
        client = await nats.connect(url)
        try:
            js = client.jetstream()
            config = (await js.stream_info(stream)).config
            for key, value in changes.items():
                setattr(config, key, value)
            await js.update_stream(config)
        finally:
            await client.close()

    asyncio.run(edit())


@pytest.mark.parametrize(("prefix", "edit", "refusal"), [
    # QA 49-a F5: the live window was 3 s, the config's 1 h; `run` started without a word, and
    # a batch re-published after a crash was stored twice (1,000 ids).
    ("qawin", {"duplicate_window": 3.0},
     "field 'nats.streams[0].duplicate_window_ms': stream QAWIN detects duplicates for 3000 ms "
     "on the server, shorter than the config's 3600000 ms: a batch re-published after a crash "
     "would be stored twice once the server's window has passed; set the server's window with "
     "`cdc-router streams apply -c <config>` (a longer one there is fine)"),
    # QA 49-a F7: the live subjects changed; `run` started, and every batch failed for ever
    # with "no stream captures this subject now".
    ("qasub", {"subjects": ["qasub2.>"]},
     "field 'nats.streams[0].subjects': stream QASUB on the server captures qasub2.>, not the "
     "config's qasub.>: no stream would store those events; give it the config's subjects "
     "with `cdc-router streams apply -c <config>`")])
def test_a_live_stream_changed_outside_the_config_stops_the_start(
        nats_url: str, tmp_path: Path, prefix: str, edit: dict[str, Any], refusal: str) -> None:
    config: dict[str, Any] = {"source": {"topics": [f"{prefix}.public.outbox"]},
                              "routes": [{"nats": {"subject": f"{prefix}.{{type}}"}}]}
    path = tmp_path / "router.yaml"
    stream = _apply_streams(path, config, nats_url, prefix)
    _edit_stream(nats_url, stream, **edit)
    line = _refused_start(path)
    assert line.endswith(refusal), line


def test_a_comma_separated_nats_url_reaches_the_server_that_is_up(nats_url: str,
                                                                  tmp_path: Path) -> None:
    # Review 31: nats.url is documented and validated as comma-separated servers, and nats-py
    # refused the string whole ("invalid connect url option"): streams apply said "is
    # nats-server running?" and the router's JetStream routes retried for ever.
    url = f"nats://127.0.0.1:1,{nats_url}"
    config = {"source": {"topics": ["outbox.public.outbox"]},
              "routes": [{"nats": {"subject": "commasep.{type}"}}]}
    stream = _apply_streams(tmp_path / "router.yaml", config, url, "commasep")
    publisher = JetStreamPublisher(url, ack_timeout_s=5, connect_timeout_s=5)
    try:
        acks = publisher.publish_batch([NatsMessage("commasep.x", b"{}", {}, "comma-1")])
    finally:
        publisher.close()
    assert acks == BatchAcks(stored=1, duplicates=0)
    assert [m.headers["Nats-Msg-Id"] for m in read_stream(nats_url, stream)] == ["comma-1"]


def test_streams_apply_says_what_lowering_max_msgs_deletes_before_it_does(
        nats_url: str, tmp_path: Path) -> None:
    # QA 49-a F9: `max_msgs: 50 -> 10` deleted 40 stored events behind a one-line diff.
    config: dict[str, Any] = {"source": {"topics": ["qashrink.public.outbox"]},
                              "routes": [{"nats": {"subject": "qashrink.{type}"}}]}
    path = tmp_path / "router.yaml"
    stream = _apply_streams(path, config, nats_url, "qashrink")
    publisher = JetStreamPublisher(nats_url, ack_timeout_s=5, connect_timeout_s=5)
    try:
        publisher.publish_batch([NatsMessage("qashrink.x", b"{}", {}, f"shrink-{i}")
                                 for i in range(50)])
    finally:
        publisher.close()
    config["nats"]["streams"][0]["max_msgs"] = 10
    path.write_text(yaml.safe_dump(config))
    planned = subprocess.run([sys.executable, "-m", "cdc_router", "streams", "apply", "-c",
                              str(path), "--dry-run"], capture_output=True, text=True,
                             cwd=REPO, check=False)
    assert planned.returncode == 0, planned.stderr
    assert ("  warning: lowers max_msgs -1 -> 10: JetStream deletes the oldest messages beyond "
            "it at once, consumed or not (50 messages stored now)") in planned.stdout, \
        planned.stdout
    assert len(read_stream(nats_url, stream)) == 50  # a dry run deletes nothing


def test_streams_apply_names_the_server_stream_that_holds_its_subjects(
        nats_url: str, tmp_path: Path) -> None:
    # QA 49-a F4: the refusal said only "subjects overlap with an existing stream".
    async def other() -> None:
        client = await nats.connect(nats_url)
        try:
            await client.jetstream().add_stream(name="QAOTHER", subjects=["qaover.>"])
        finally:
            await client.close()

    asyncio.run(other())
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({
        "source": {"topics": ["qaover.public.outbox"]},
        "routes": [{"nats": {"subject": "qaover.{type}"}}],
        "nats": {"url": nats_url, "streams": [{"name": "QAOVER", "subjects": ["qaover.>"]}]}}))
    applied = subprocess.run([sys.executable, "-m", "cdc_router", "streams", "apply", "-c",
                              str(path), "--yes"], capture_output=True, text=True, cwd=REPO,
                             check=False)
    assert applied.returncode == 1, applied.stdout + applied.stderr
    assert ("field 'nats.streams[0].subjects': JetStream refused stream QAOVER: 'qaover.>' "
            "overlaps 'qaover.>' of stream QAOTHER") in applied.stderr, applied.stderr


def test_a_message_over_the_streams_max_msg_size_is_refused_alone(nats_url: str) -> None:
    # QA session 27-b: the stream's refusal (err_code 10054) failed the whole batch like an
    # outage, for ever; it names its message, which is poison.
    async def add_stream() -> None:
        client = await nats.connect(nats_url)
        try:
            await client.jetstream().add_stream(StreamConfig(
                name="SMALLMSG", subjects=["smallmsg.>"], max_msg_size=512))
        finally:
            await client.close()

    asyncio.run(add_stream())
    publisher = JetStreamPublisher(nats_url, ack_timeout_s=5, connect_timeout_s=5)
    batch = [NatsMessage("smallmsg.x", b"{}", {}, "small-1"),
             NatsMessage("smallmsg.x", b'"' + b"x" * 2000 + b'"', {}, "big-1"),
             NatsMessage("smallmsg.x", b"{}", {}, "small-2")]
    try:
        with pytest.raises(JetStreamRefused) as refused:
            publisher.publish_batch(batch)
        # Over the server's max_payload (1 MiB; nats.max_payload_bytes set above it): refused
        # before sending, and QA session 27-b saw it retried for ever too.
        with pytest.raises(JetStreamRefused) as too_big:
            publisher.publish_batch([NatsMessage("smallmsg.x", b"x" * (2 << 20), {}, "big-2")])
    finally:
        publisher.close()
    assert list(refused.value.refused) == [1]
    assert "smallmsg.x" in refused.value.refused[1]
    assert "exceeds maximum" in refused.value.refused[1]
    assert "over the server's max_payload (1048576)" in too_big.value.refused[0]
    assert [m.headers["Nats-Msg-Id"] for m in read_stream(nats_url, "SMALLMSG")] == [
        "small-1", "small-2"]


def test_a_full_stream_that_discards_new_messages_names_the_fix(nats_url: str) -> None:
    # QA 34-d: every batch waited with "maximum messages exceeded", naming neither the stream's
    # discard policy nor `streams apply`.
    stream = f"FULLNEW{uuid.uuid4().hex[:8].upper()}"
    subject = f"{stream.lower()}.x"

    async def stream_admin(add: bool) -> None:
        client = await nats.connect(nats_url)
        try:
            if add:
                await client.jetstream().add_stream(StreamConfig(
                    name=stream, subjects=[f"{stream.lower()}.>"], max_msgs=1,
                    discard=DiscardPolicy.NEW))
            else:
                await client.jetstream().delete_stream(stream)
        finally:
            await client.close()

    asyncio.run(stream_admin(True))
    publisher = JetStreamPublisher(nats_url, ack_timeout_s=5, connect_timeout_s=5)
    try:
        publisher.publish_batch([NatsMessage(subject, b"{}", {}, "full-1")])
        with pytest.raises(JetStreamError) as failed:
            publisher.publish_batch([NatsMessage(subject, b"{}", {}, "full-2")])
    finally:
        publisher.close()
        asyncio.run(stream_admin(False))
    assert not isinstance(failed.value, JetStreamRefused), "the stream's limit, no poison"
    assert f"the stream that captures '{subject}' is full and set to discard new messages" \
        in str(failed.value) and "streams apply" in str(failed.value)


def test_closing_the_publisher_while_nats_is_down_returns_quietly(tmp_path: Path) -> None:
    # QA session 27-b: SIGTERM to a router while nats-server was down ended in a traceback
    # from drain() (ConnectionReconnectingError) and exit 1.
    with nats_server(tmp_path / "own-nats") as server:
        stream = _apply_streams(tmp_path / "r.yaml", {"source": {"topics": ["t"]},
                                                      "routes": [{"topic": "x"}]},
                                server.url, "closing")
        publisher = JetStreamPublisher(server.url, ack_timeout_s=2, connect_timeout_s=2)
        publisher.publish_batch([NatsMessage("closing.x", b"{}", {}, "c-1")])
        server.stop(signal.SIGKILL)
        with pytest.raises(JetStreamError):
            publisher.publish_batch([NatsMessage("closing.x", b"{}", {}, "c-2")])
        publisher.close()  # raises nothing
        publisher.close()
    assert stream == "CLOSING"


def test_ids_the_nats_client_would_strip_are_dead_letters_not_duplicates_of_another(
        stack: StackEndpoints, nats_url: str, tmp_path: Path) -> None:
    # QA 32-a: nats-py strips header values, Nats-Msg-Id's too: "  x" and "\u2028x" were
    # acked as duplicates of "x" and dropped, and the cleanup deleted all three rows.
    base = f"ws-{uuid.uuid4()}"
    spaced = [f"  {base}", f"\u2028{base}", f"{base}\t"]
    with pipeline(stack, tmp_path, partitions=1) as pipe:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE public.{pipe.table} ALTER COLUMN id TYPE text")
        stream, _ = _use_jetstream(pipe, nats_url)
        pipe.start_router(wait=True)
        with psycopg.connect(stack.postgres_dsn) as conn:
            for event_id in [base, *spaced]:
                conn.execute(f"INSERT INTO public.{pipe.table} (id, aggregatetype, aggregateid,"
                             " type, payload) VALUES (%s, 'Order', 'o-1', 'OrderPaid', '{}')",
                             (event_id,))
        letters = pipe.read(pipe.dlq_topic, len(spaced), timeout_s=120)
        deadline = time.monotonic() + 60
        while not read_stream(nats_url, stream) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2)  # a spaced id, were it published, lands with or after the first
        messages = read_stream(nats_url, stream)
        log = pipe.router_log()
    assert [message.headers["id"] for message in messages] == [base], log[-3000:]
    reasons = {dict(letter.headers())["dlq.event.id"].decode():
               dict(letter.headers())["dlq.error.message"].decode() for letter in letters}
    assert set(reasons) == set(spaced), reasons
    assert all("which the NATS client strips from Nats-Msg-Id" in reason
               for reason in reasons.values()), reasons
