"""JetStream at the edges, on a real nats-server: a message whose data fits the server's
max_payload but whose headers and data do not is a dead letter of its own, never an outage of
every batch (QA 54-d F-1); streams set by hand to lose events or stall every batch stop the
start, and `streams apply` sets back what JetStream lets it (QA 54-d F-2, F-3, F-9)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from nats.js.api import DiscardPolicy, RetentionPolicy, StreamConfig

from cdc_router.config.nats import StreamSpec
from cdc_router.errors import JetStreamError, JetStreamRefused
from cdc_router.nats.publisher import JetStreamPublisher, NatsMessage
from cdc_router.nats.streams import StreamAdmin, start_problem
from tests.integration.nats_server import nats_server, read_stream
from tests.integration.test_nats_auth import _nats_with

pytestmark = pytest.mark.integration

MAX_PAYLOAD = 65536


def _add_stream(url: str, name: str, subjects: list[str]) -> None:
    async def add() -> None:
        client = await nats.connect(url)
        try:
            await client.jetstream().add_stream(StreamConfig(name=name, subjects=subjects))
        finally:
            await client.close()

    asyncio.run(add())


def test_a_message_over_max_payload_by_its_headers_is_refused_alone(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # QA 54-d F-1: data 65,439 bytes, a 65,603-byte message with its headers: nats-py sent it,
    # the server closed the connection, and every batch timed out for ever.
    with _nats_with(tmp_path, f"max_payload: {MAX_PAYLOAD}") as port:
        url = f"nats://127.0.0.1:{port}"
        _add_stream(url, "EDGE", ["edge.>"])
        publisher = JetStreamPublisher(url, ack_timeout_s=3, connect_timeout_s=3,
                                       max_payload_bytes=1024 * 1024)
        big = NatsMessage("edge.x", b"x" * (MAX_PAYLOAD - 100),
                          {"event-type": "x" * 200}, "big-1")
        small = NatsMessage("edge.x", b"{}", {"event-type": "small"}, "small-1")
        try:
            with caplog.at_level(logging.WARNING, logger="cdc_router.nats"), \
                    pytest.raises(JetStreamRefused) as refused:
                publisher.publish_batch([small, big])
            acks = publisher.publish_batch([small])
        finally:
            publisher.close()
        assert list(refused.value.refused) == [1]
        assert f"over the server's max_payload ({MAX_PAYLOAD})" in refused.value.refused[1]
        assert acks.stored == 1
        assert [m.headers["Nats-Msg-Id"] for m in read_stream(url, "EDGE")] == ["small-1"]
        assert f"nats.max_payload_bytes (1048576) is above the max_payload of the NATS " \
               f"server at {url} ({MAX_PAYLOAD})" in caplog.text


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with nats_server(tmp_path_factory.mktemp("nats-home")) as server:
        yield server.url


def _edit(url: str, name: str, **settings: Any) -> None:
    """`nats stream edit` by hand: the live config with `settings` set."""
    async def edit() -> None:
        client = await nats.connect(url)
        try:
            js = client.jetstream()
            current = (await js.stream_info(name)).config
            await js.update_stream(dataclasses.replace(current, **settings))
        finally:
            await client.close()

    asyncio.run(edit())


def _spec(name: str) -> StreamSpec:
    return StreamSpec(name=name, subjects=[f"{name.lower()}.>"], duplicate_window_ms=60_000)


def test_streams_set_by_hand_to_lose_or_stall_events_stop_the_start(nats_url: str) -> None:
    # QA 54-d F-2: `streams apply` said `unchanged` and the router started on each of them:
    # 30 events acked and lost (interest), every batch stalled (no_ack, sealed).
    async def add() -> None:
        client = await nats.connect(nats_url)
        try:
            js = client.jetstream()
            await js.add_stream(StreamConfig(name="INTEREST", subjects=["interest.>"],
                                             retention=RetentionPolicy.INTEREST,
                                             duplicate_window=60))
            for name in ("NOACK", "SEALED"):
                await js.add_stream(StreamConfig(name=name, subjects=[f"{name.lower()}.>"],
                                                 duplicate_window=60, no_ack=name == "NOACK"))
        finally:
            await client.close()

    asyncio.run(add())
    _edit(nats_url, "SEALED", sealed=True)
    specs = [_spec("INTEREST"), _spec("NOACK"), _spec("SEALED")]
    admin = StreamAdmin(nats_url)
    plans = admin.plan(specs)
    problems = [str(start_problem(index, plan)) for index, plan in enumerate(plans)]
    assert problems[0].startswith("field 'nats.streams[0]': stream INTEREST on the server has "
                                  "retention interest: JetStream drops each message")
    assert problems[1].startswith("field 'nats.streams[1]': stream NOACK on the server has "
                                  "no_ack true")
    assert problems[2].startswith("field 'nats.streams[2]': stream SEALED on the server has "
                                  "sealed True")
    assert [plan.action for plan in plans] == ["unchanged", "update", "unchanged"]
    admin.apply(specs, [plans[1]])
    assert [start_problem(i, p) for i, p in enumerate(admin.plan(specs))][1] is None


def test_streams_apply_sets_discard_new_per_subject_back_with_discard_new(nats_url: str) -> None:
    # QA 54-d F-3: the plan set discard back to old alone; the server refused the update:
    # 'discard new per subject requires discard new policy to be set'.
    _add_stream(nats_url, "PERSUBJ", ["persubj.>"])
    _edit(nats_url, "PERSUBJ", discard=DiscardPolicy.NEW, max_msgs_per_subject=6,
          discard_new_per_subject=True, duplicate_window=60)
    admin = StreamAdmin(nats_url)
    [plan] = admin.plan([_spec("PERSUBJ")])
    assert plan.changes == {"discard": ("new", "old"), "discard_new_per_subject": (True, False)}
    admin.apply([_spec("PERSUBJ")], [plan])
    [after] = admin.plan([_spec("PERSUBJ")])
    assert after.action == "unchanged"
    assert any(w.startswith("max_msgs_per_subject is 6") for w in after.warnings)


def test_an_ack_from_another_stream_than_the_configs_fails_the_batch(nats_url: str) -> None:
    # QA 54-d F-4: ORDERS' subject moved to a stream STRAY while the router ran: 30 events
    # stored in STRAY, acked, committed, unseen by ORDERS' consumers, no word.
    _add_stream(nats_url, "STRAY", ["moved.x"])
    publisher = JetStreamPublisher(nats_url, ack_timeout_s=3, connect_timeout_s=3,
                                   stream_of=lambda subject: "MOVED")
    try:
        with pytest.raises(JetStreamError) as failed:
            publisher.publish_batch([NatsMessage("moved.x", b"{}", {}, "moved-1")])
    finally:
        publisher.close()
    assert str(failed.value).startswith(
        "JetStream stored 'moved.x' (id moved-1) in stream STRAY, not in MOVED as nats.streams "
        "says: a stream was changed on the server to capture it")


def test_a_stream_full_per_subject_names_max_msgs_per_subject(nats_url: str) -> None:
    # QA 54-d F-3: 'maximum messages per subject exceeded' was told to raise max_msgs/max_bytes.
    _add_stream(nats_url, "PERFULL", ["perfull.>"])
    _edit(nats_url, "PERFULL", discard=DiscardPolicy.NEW, max_msgs_per_subject=1,
          discard_new_per_subject=True)
    publisher = JetStreamPublisher(nats_url, ack_timeout_s=3, connect_timeout_s=3)
    try:
        publisher.publish_batch([NatsMessage("perfull.x", b"{}", {}, "pf-1")])
        with pytest.raises(JetStreamError) as failed:
            publisher.publish_batch([NatsMessage("perfull.x", b"{}", {}, "pf-2")])
    finally:
        publisher.close()
    assert "is full per subject (max_msgs_per_subject, set outside the config) and set to " \
           "discard new messages: first lift that limit" in str(failed.value)
    assert "max_msgs/max_bytes" not in str(failed.value)


def test_streams_apply_warns_of_memory_storage_and_a_window_it_lowers_under_the_bound(
        nats_url: str, tmp_path: Path) -> None:
    # QA 54-d F-5: a memory stream was created without a word (40 acked events lost at a
    # server restart); F-7: `duplicate_window: 86400.0 -> 2.0` planned without the warning
    # rules check gives, though apply is where the window changes.
    _add_stream(nats_url, "LOWWIN", ["lowwin.>"])
    _edit(nats_url, "LOWWIN", duplicate_window=86400)
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({
        "source": {"topics": ["raw"]}, "routes": [{"nats": {"subject": "lowwin.x"}}],
        "nats": {"url": nats_url, "ack_timeout_ms": 3000, "streams": [
            {"name": "LOWWIN", "subjects": ["lowwin.>"], "duplicate_window_ms": 2000},
            {"name": "MEMWIN", "subjects": ["memwin.>"], "storage": "memory"}]}}))
    planned = subprocess.run([sys.executable, "-m", "cdc_router", "streams", "apply", "-c",
                              str(path), "--dry-run"], capture_output=True, text=True,
                             check=False)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    # QA 62-b F-6: in the config's name and unit, not `duplicate_window: 86400.0 -> 2.0`.
    assert "            duplicate_window_ms: 86400000 -> 2000\n" in planned.stdout
    assert "  warning: nats.streams[0].duplicate_window_ms 2000 is under 36000 (twice " \
           "nats.ack_timeout_ms, plus the router's 30 s backoff)" in planned.stdout
    assert "  warning: nats.streams[1].storage memory: nats-server keeps the stream in " \
           "memory only, so a restart of the server loses the stream" in planned.stdout


def test_lowering_max_msgs_names_the_durables_it_cuts_unread(nats_url: str) -> None:
    # QA 65-b F-7: the plan said the messages stored, not that a durable had 500 unread.
    async def fill() -> None:
        client = await nats.connect(nats_url)
        try:
            js = client.jetstream()
            await js.add_stream(StreamConfig(name="LOWER", subjects=["lower.>"],
                                             duplicate_window=60))
            for n in range(30):
                await js.publish(f"lower.{n}", b"{}")
            for durable, read in (("svc", 10), ("done", 30)):
                subscription = await js.pull_subscribe("lower.>", durable=durable,
                                                       stream="LOWER")
                for message in await subscription.fetch(read, timeout=5):
                    await message.ack_sync()
        finally:
            await client.close()

    asyncio.run(fill())
    lower = StreamSpec(name="LOWER", subjects=["lower.>"], duplicate_window_ms=60_000,
                       max_msgs=5)
    [plan] = StreamAdmin(nats_url).plan([lower])
    assert "lowers max_msgs -1 -> 5: JetStream deletes the oldest messages beyond it at once, " \
        "consumed or not (30 messages stored now); consumers that lose messages not yet " \
        "acked: svc 15 of its 20" in plan.warnings, plan.warnings
