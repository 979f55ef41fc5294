"""`cdc-router dlq replay` on the real stack: rules fixed, letters replayed exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from cdc_router.config.load import load_config
from cdc_router.dead_letter import REPLAY_OF
from cdc_router.ops.offsets import admin_client
from cdc_router.ops.topics import dead_letter_state
from cdc_router.router.dlq_letters import sources_of
from cdc_router.router.dlq_replay import replay_group
from tests.integration.pipeline import REPO, Pipeline, apply_topics, pipeline
from tests.integration.support import StackEndpoints, unique

pytestmark = pytest.mark.integration


def _replay(config: Path, *extra: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "cdc_router", "dlq", "replay", "-c",
                           str(config), "-o", "json", *extra], capture_output=True, text=True,
                          cwd=REPO, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _with_routes(pipe: Pipeline, path: Path, routes: list[dict[str, Any]]) -> Path:
    config = yaml.safe_load(pipe.config_path.read_text())
    config["routes"] = routes
    path.write_text(yaml.safe_dump(config))
    return path


def _committed(pipe: Pipeline, group: str) -> int:
    consumer = Consumer({"bootstrap.servers": pipe.stack.bootstrap_servers, "group.id": group})
    try:
        [found] = consumer.committed([TopicPartition(pipe.dlq_topic, 0)], timeout=30)
        return int(found.offset)
    finally:
        consumer.close()


def _undelivered_state(pipe: Pipeline, config_path: Path) -> tuple[int | None, int | None]:
    """`status`'s dead letters of the pipeline: on the topic, and not delivered since."""
    config = load_config(config_path, env=os.environ).config
    kafka = {"bootstrap.servers": pipe.stack.bootstrap_servers}
    state = dead_letter_state(admin_client(kafka), kafka, pipe.dlq_topic, 0,
                              sources_of(config), replay_group(config))
    return state.count, state.undelivered


def _route_orders_only(pipe: Pipeline) -> list[dict[str, Any]]:
    """The pipeline's router, started with one route (Order*): every other event a letter."""
    orders_only = [{"match": {"aggregate_type": "Order*"}, "topic": pipe.orders_topic}]
    _with_routes(pipe, pipe.config_path, orders_only)
    pipe.start_router(wait=True)
    return orders_only


def test_fixed_rules_replay_dead_letters_once_and_later_replays_skip_them(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        orders_only = _route_orders_only(pipe)
        rows = ([("Order", f"o-{i}", "OrderPaid", {"i": i}) for i in range(20)]
                + [("Customer", f"c-{i}", "CustomerCreated", {"i": i}) for i in range(10)]
                + [("Bad", f"b-{i}", "Broken", {"i": i}) for i in range(3)])
        ids = pipe.insert(rows)
        customer_ids = ids[20:30]
        assert len(pipe.read(pipe.orders_topic, 20)) == 20
        letters = pipe.read(pipe.dlq_topic, 13)
        assert len(letters) == 13, pipe.router_log()[-3000:]
        # The rules fixed: Customer events now have a route; Bad ones still have none.
        fixed = _with_routes(pipe, tmp_path / "fixed.yaml", [
            *orders_only,
            {"match": {"aggregate_type": "Customer"}, "topic": pipe.events_topic}])

        dry = _replay(fixed, "--dry-run")
        # The Bad letters fail again as they failed (QA 36-c F8): no new letter says it again.
        assert dry["planned"] == {"deliver": 10, "still_failing": 3}
        assert dry["committed"] is None
        assert {row["to"].split("[")[0] for row in dry["letters"]
                if row["action"] == "deliver"} == {pipe.events_topic}
        assert pipe.read_all(pipe.events_topic, settle_s=1) == [], "a dry run produces nothing"

        first = _replay(fixed, "--yes")
        assert first["committed"] == {"deliver": 10}
        events = pipe.read_all(pipe.events_topic, settle_s=1)
        assert Counter(r.key().decode() for r in events) == Counter(customer_ids)
        dlq = pipe.read_all(pipe.dlq_topic, settle_s=0)
        assert len(dlq) == 13, "the Bad letters stay as they are, not written again"
        group = first["group"]
        assert group == f"{pipe.name}.dlq-replay"
        assert _committed(pipe, group) == 13, "the replay group's offset is the end it read"
        # QA 52-b M1: the commit (a TxnOffsetCommit) says the 3 Bad letters are undelivered;
        # status counts those, not the 10 the replay delivered.
        assert _undelivered_state(pipe, fixed) == (13, 3)
        listed = subprocess.run([sys.executable, "-m", "cdc_router", "dlq", "list", "-c",
                                 str(fixed)], capture_output=True, text=True, cwd=REPO,
                                check=False)
        assert "read to offset 0:13: 3 of this pipeline's letters before it are not " \
            "delivered" in listed.stderr, listed.stderr

        second = _replay(fixed, "--yes")
        assert second["planned"] == {"already_delivered": 10, "still_failing": 3}
        only_customers = _replay(fixed, "--dry-run", "--id", customer_ids[0])
        assert only_customers["planned"] == {"already_delivered": 1}
        # A replay filter that keeps one id has forgotten nine of them: the changelog's
        # delivered ids still say so (review 43: it delivered them again).
        forgetful = yaml.safe_load(fixed.read_text())
        forgetful["dedup"]["max_ids"] = 1
        (tmp_path / "forgetful.yaml").write_text(yaml.safe_dump(forgetful))
        third = _replay(tmp_path / "forgetful.yaml", "--yes")
        assert third["planned"] == {"already_delivered": 10, "still_failing": 3}
        events = pipe.read_all(pipe.events_topic, settle_s=1)
    assert Counter(r.key().decode() for r in events) == Counter(customer_ids), \
        "each replayed event exactly once after three replays"


def _limit_message_bytes(pipe: Pipeline, topic: str, limit: int) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": pipe.stack.bootstrap_servers})
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(
        "max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def test_a_letter_the_destination_refuses_is_dead_lettered_again_and_the_replay_goes_on(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 33-c: the broker's refusal of one letter's record (over the destination's
    # max.message.bytes) stopped the replay at it, and every later replay there too.
    with pipeline(stack, tmp_path, partitions=1) as pipe:
        orders_only = _route_orders_only(pipe)
        rows = [("Customer", f"c-{i}", "CustomerCreated",
                 {"i": i, "pad": "x" * (50_000 if i % 3 == 1 else 10)}) for i in range(9)]
        ids = pipe.insert(rows)
        assert len(pipe.read(pipe.dlq_topic, 9)) == 9, pipe.router_log()[-3000:]
        fixed = _with_routes(pipe, tmp_path / "fixed.yaml", [
            *orders_only,
            {"match": {"aggregate_type": "Customer"}, "topic": pipe.events_topic}])
        _limit_message_bytes(pipe, pipe.events_topic, 20_000)

        first = _replay(fixed, "--yes")
        assert first["committed"] == {"deliver": 6, "dead_letter": 3}, first
        events = pipe.read_all(pipe.events_topic, settle_s=1)
        assert sorted(r.key().decode() for r in events) == sorted(
            ids[i] for i in range(9) if i % 3 != 1)
        again = [dict(r.headers() or []) for r in pipe.read_all(pipe.dlq_topic, settle_s=0)
                 if REPLAY_OF in dict(r.headers() or [])]
        assert sorted(h["dlq.event.id"].decode() for h in again) == sorted(
            [ids[1], ids[4], ids[7]])
        assert {h["dlq.stage"] for h in again} == {b"produce"}
        # Dead-lettered before producing, against the topic's limit (QA 53-b F2)
        assert all(b"over the topic's max.message.bytes (20000)" in h["dlq.error.message"]
                   for h in again), again

        second = _replay(fixed, "--yes")
        # The first letters are superseded by the refusals' letters, which are refused again
        # as before: no fourth letter of them (QA 36-c F8); the plan knows it now, from the
        # topic's max.message.bytes (QA 53-b F2), where it planned `deliver` before.
        assert second["planned"] == {"still_failing": 3, "superseded": 3,
                                     "already_delivered": 6}
        assert second["committed"] == {}, second  # nothing left to write
        assert len(pipe.read_all(pipe.dlq_topic, settle_s=0)) == 12
        events = pipe.read_all(pipe.events_topic, settle_s=1)
    assert len(events) == 6 and len({r.key() for r in events}) == 6, "each once"


def test_replay_refuses_a_config_without_dedup(stack: StackEndpoints, tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": stack.bootstrap_servers},
        "source": {"topics": [unique("raw")]}, "routes": [{"topic": "x"}],
        "dedup": {"enabled": False}}))
    done = subprocess.run([sys.executable, "-m", "cdc_router", "dlq", "replay", "-c",
                           str(config), "--dry-run"], capture_output=True, text=True, cwd=REPO,
                          check=False)
    assert done.returncode == 1
    assert "dedup" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_pipeline_on_the_same_raw_and_dead_letter_topics_replays_none_of_anothers_letters(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA, session 28: A delivered E, B (another group on the same raw topic, sharing the
    # dead-letter topic) dead-lettered it, and `dlq replay -c A` delivered E a second time.
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        pipe.start_router(wait=True)
        ids = pipe.insert([("Order", f"o-{i}", "OrderPaid", {"i": i}) for i in range(10)])
        assert len(pipe.read(pipe.orders_topic, 10)) == 10
        other = yaml.safe_load(pipe.config_path.read_text())
        other["source"]["group_id"] = f"{pipe.name}-b"
        other["routes"] = [{"topic": unique("missing").replace("_", "-")}]
        (tmp_path / "b.yaml").write_text(yaml.safe_dump(other))
        pipe.start_router("b", "-c", str(tmp_path / "b.yaml"), wait=True)
        letters = pipe.read(pipe.dlq_topic, 10)
        # Review 34-2: a spare instance of the new group (the raw topic has one partition)
        # asked Kafka about no partition in its rebalance callback, and exited 1.
        reassigned = pipe.router_log("b").count("event=assigned")
        pipe.start_router("c", "-c", str(tmp_path / "b.yaml"), wait=True)
        deadline = time.monotonic() + 60
        while pipe.router_log("b").count("event=assigned") == reassigned and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        spares_alive = [pipe.routers[name].poll() for name in ("b", "c")]
        pipe.kill_router("c")
        pipe.kill_router("b")
        warned = [line for line in pipe.router_log("b").splitlines()
                  if "event=new_group_reads_from_start" in line]
        assert "event=new_group_reads_from_start" not in pipe.router_log("a")
        assert "event=changelog_without_marks" not in pipe.router_log("a") + \
            pipe.router_log("b")
        dry = _replay(pipe.config_path, "--dry-run")
        replayed = _replay(pipe.config_path, "--yes")
        orders = pipe.read_all(pipe.orders_topic, settle_s=1)
        # QA 52-b M1: each pipeline's status counts its own letters, and A's replay (nothing
        # to deliver, --yes) committed that none of A's are undelivered.
        counts = [_undelivered_state(pipe, path)
                  for path in (pipe.config_path, tmp_path / "b.yaml")]
    assert len(letters) == 10 and {dict(r.headers())["dlq.source.group"] for r in letters} == \
        {f"{pipe.name}-b".encode()}
    # A second group on one raw topic is told that it delivers everything again, in case it
    # is a renamed one (stop 32's left-out), naming the group whose marks and offsets it saw.
    assert len(warned) == 1 and f"group={pipe.name}-b topics={pipe.raw_topic} " \
        f"other_groups={pipe.name} " in warned[0], warned
    assert spares_alive == [None, None]
    # QA F-9: left out of A's plan, as `dlq list` leaves them out, and counted.
    assert dry["planned"] == {} and dry["others"] == 10 and dry["letters"] == [], dry
    assert replayed["committed"] in (None, {}), replayed
    assert counts == [(0, 0), (10, 10)], counts
    assert Counter(r.key().decode() for r in orders) == Counter(ids), "each event once"


def test_a_renamed_changelog_topic_is_said_before_its_forgotten_ids_come_again(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 35-c: with dedup.changelog_topic renamed, `dlq replay` delivered 253 ids a second
    # time, and nothing had said that the delivered ids were forgotten.
    with pipeline(stack, tmp_path) as pipe:
        pipe.start_router(wait=True)
        pipe.insert([("Order", f"o-{i}", "OrderPaid", {"i": i}) for i in range(3)])
        assert len(pipe.read(pipe.orders_topic, 3)) == 3
        assert pipe.kill_router(sig=signal.SIGTERM) == 0
        renamed = yaml.safe_load(pipe.config_path.read_text())
        renamed["dedup"]["changelog_topic"] = f"{pipe.changelog_topic}-2"
        pipe.config_path.write_text(yaml.safe_dump(renamed))
        apply_topics(pipe)
        pipe.start_router("b", wait=True)
        warned = [line for line in pipe.router_log("b").splitlines()
                  if "event=changelog_without_marks" in line]
        pipe.kill_router("b")
    assert "event=changelog_without_marks" not in pipe.router_log("a")
    assert len(warned) == 1 and f"group={pipe.name} changelog={pipe.changelog_topic}-2 " \
        in warned[0] and "Renaming a pipeline" in warned[0], warned
