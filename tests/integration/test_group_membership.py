"""The router's consumer out of its group while the cluster answers, on the real stack
(kafka/membership.py, QA 39-c F1)."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_router.config.load import load_config
from cdc_router.consumer import ConsumedEvent, ConsumerSettings, IdempotentConsumer
from cdc_router.consumer.dedup import MemoryDedupStore
from cdc_router.kafka import membership
from cdc_router.router.loop import OutboxRouter
from tests.integration.pipeline import pipeline
from tests.integration.support import StackEndpoints, unique

pytestmark = pytest.mark.integration

# The broker's group.min.session.timeout.ms; the watch checks every CHECK_S and renews after one
# session timeout (6 s), not three, to keep the tests short.
SESSION_TIMEOUT_MS = 6000
CHECK_S = 2.0
OUT_FOR_S = 6.0


class LeavesWhenTold:
    """A real consumer that, once `leave` is set, unsubscribes at its next poll and stays so:
    no partition, out of the group (unsubscribe leaves it, a static member too), polling on.
    The state QA 39-c saw librdkafka left in after a broker's outage, made on purpose."""

    def __init__(self, consumer: Consumer, leave: threading.Event) -> None:
        self._consumer, self._leave, self.left = consumer, leave, threading.Event()

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        if self._leave.is_set() and not self.left.is_set():
            self._consumer.unsubscribe()
            self.left.set()
        return self._consumer.consume(num_messages, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


class Consumers:
    """A consumer factory: the first one built leaves its group once `leave` is set."""

    def __init__(self) -> None:
        self.leave = threading.Event()
        self.built: list[Any] = []

    def __call__(self, conf: dict[str, Any]) -> Any:
        made = Consumer(conf)
        self.built.append(made if self.built else LeavesWhenTold(made, self.leave))
        return self.built[-1]


def _listed(bootstrap: str, group: str) -> set[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([group], request_timeout=10)[group].result(10)
    return {m.group_instance_id for m in described.members}


def _quick_watch(monkeypatch: pytest.MonkeyPatch,
                 caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    """The watch checks every CHECK_S and renews after OUT_FOR_S, its lines are captured; the
    router's settings for it."""
    monkeypatch.setattr(membership, "CHECK_EVERY_S", CHECK_S)
    monkeypatch.setattr(membership, "SESSIONS_OUT", 1)
    caplog.set_level(logging.INFO, logger="cdc_router")
    return {"kafka": {"consumer": {"session.timeout.ms": SESSION_TIMEOUT_MS}}}


def test_a_consumer_out_of_its_group_is_replaced_and_every_event_arrives_once(
        stack: StackEndpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    settings = _quick_watch(monkeypatch, caplog)
    with pipeline(stack, tmp_path, partitions=2, config=settings) as pipe:
        consumers = Consumers()
        leave, built = consumers.leave, consumers.built
        instance = f"{pipe.name}-a"
        router = OutboxRouter(load_config(pipe.config_path), instance_id=instance,
                              consumer_factory=consumers)
        failures: list[BaseException] = []

        def run() -> None:
            try:
                router.run()
            except BaseException as failure:  # the test reports it
                failures.append(failure)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        try:
            before = pipe.insert([("Order", f"order-{i % 3}", "OrderPaid", {"seq": i})
                                  for i in range(30)])
            assert len(pipe.read(pipe.orders_topic, 30)) == 30
            leave.set()
            assert built[0].left.wait(30)
            after = pipe.insert([("Order", f"order-{i % 3}", "OrderPaid", {"seq": i})
                                 for i in range(30, 60)])
            delivered = pipe.read(pipe.orders_topic, 60, timeout_s=120)
            settled = pipe.read_all(pipe.orders_topic, settle_s=3)
            listed = _listed(stack.bootstrap_servers, pipe.name)
        finally:
            router.stop()
            worker.join(60)
    assert not failures and not worker.is_alive()
    assert len(built) == 2  # the stranded consumer, and the one that replaced it
    assert Counter(r.key().decode() for r in delivered) == Counter(before + after)
    assert len(settled) == 60
    assert any(member.startswith(f"{instance}.") for member in listed), listed
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("event=member_missing") for line in lines)
    assert any("event=consumer_renewed" in line and f"did not list member {instance}" in line
               for line in lines)


def test_a_router_waiting_for_its_source_topic_is_not_renewed(
        stack: StackEndpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 40-1 F1: librdkafka joins no group while no subscribed topic exists (the raw
    # topic comes with Debezium's first event): the router waits, and is not renewed for it.
    settings = _quick_watch(monkeypatch, caplog)
    with pipeline(stack, tmp_path, partitions=1, config=settings) as pipe:
        config = yaml.safe_load(pipe.config_path.read_text())
        config["source"]["topics"] = [f"^{pipe.raw_topic}-not-yet.*"]
        pipe.config_path.write_text(yaml.safe_dump(config))
        answers: list[bool] = []

        def recorded(admin_config: Any, group: str, topics: Any) -> Any:
            listed = membership.admin_listed(admin_config, group, topics)

            def answer(name: str | None, timeout_s: float) -> bool:
                answers.append(listed(name, timeout_s))  # raises when no answer came
                return answers[-1]
            return answer

        router = OutboxRouter(load_config(pipe.config_path), instance_id=f"{pipe.name}-a",
                              members_factory=recorded)
        worker = threading.Thread(target=router.run, daemon=True)
        worker.start()
        deadline = time.monotonic() + 120
        time.sleep(OUT_FOR_S + 6 * CHECK_S)  # well past the renewal of a stranded one
        while len(answers) < 5 and time.monotonic() < deadline:  # a busy host's lookups lag
            time.sleep(0.2)
        router.stop()
        worker.join(60)
    assert not worker.is_alive()
    assert len(answers) >= 5 and all(answers)  # the group answered: no member, and no topic
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("event=started") for line in lines)
    assert not [line for line in lines if "member_missing" in line or "renewed" in line]


def _produce(bootstrap: str, topic: str, ids: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for event_id in ids:
        producer.produce(topic, key=event_id.encode(), value=json.dumps({"id": event_id}))
    assert producer.flush(30) == 0


def test_the_idempotent_consumer_replaces_a_consumer_out_of_its_group(
        stack: StackEndpoints, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    _quick_watch(monkeypatch, caplog)
    topic, dead_letter = unique("payments").replace("_", "-"), unique("dlq").replace("_", "-")
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, 2, 1), NewTopic(dead_letter, 1, 1)]
                                      ).values():
        future.result(timeout=30)
    settings = ConsumerSettings(
        bootstrap_servers=stack.bootstrap_servers, group_id=unique("fulfillment"),
        topics=(topic,), dead_letter_topic=dead_letter,
        consumer_config={"session.timeout.ms": str(SESSION_TIMEOUT_MS)})
    consumers = Consumers()
    leave, built = consumers.leave, consumers.built
    handled: list[ConsumedEvent] = []
    loop: IdempotentConsumer[Any] = IdempotentConsumer(
        settings, MemoryDedupStore(), lambda event, context: handled.append(event),
        consumer_factory=consumers)
    worker = threading.Thread(target=loop.run, daemon=True)
    worker.start()
    try:
        _produce(stack.bootstrap_servers, topic, [f"before-{i}" for i in range(10)])
        deadline = time.monotonic() + 60
        while len(handled) < 10 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(handled) == 10
        leave.set()
        assert built[0].left.wait(30)
        _produce(stack.bootstrap_servers, topic, [f"after-{i}" for i in range(10)])
        deadline = time.monotonic() + 120
        while len(handled) < 20 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        loop.stop()
        worker.join(60)
    assert not worker.is_alive() and len(built) == 2
    assert Counter(e.event_id for e in handled) == Counter(
        [f"before-{i}" for i in range(10)] + [f"after-{i}" for i in range(10)])
    assert any("event=consumer_renewed" in r.getMessage() and "did not list member" in
               r.getMessage() for r in caplog.records)


def test_a_source_topic_added_and_the_router_restarted_at_once_is_read(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 44-a (high): the router is a static member; restarted within its session timeout with
    # one more source topic, it got its old assignment back and the new topic was never read.
    with pipeline(stack, tmp_path) as pipe:
        pipe.start_router(wait=True)
        first = pipe.insert([("Order", f"o-{i}", "OrderPaid", {"i": i}) for i in range(5)])
        assert len(pipe.read(pipe.orders_topic, 5)) == 5
        # A second raw topic with change events of new ids, as another connector would write.
        extra = f"{pipe.raw_topic}-extra"
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        for future in admin.create_topics([NewTopic(extra, 1, 1)]).values():
            future.result(timeout=30)
        try:
            producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
            added = []
            for record in pipe.read(pipe.raw_topic, 5):
                change = json.loads(record.value())
                after = change.get("payload", change)["after"]
                after["id"] = f"{after['id']}-extra"
                added.append(after["id"])
                producer.produce(extra, key=json.dumps({"id": after["id"]}).encode(),
                                 value=json.dumps(change).encode())
            assert producer.flush(30) == 0
            config = yaml.safe_load(pipe.config_path.read_text())
            config["source"]["topics"] = [pipe.raw_topic, extra]
            pipe.config_path.write_text(yaml.safe_dump(config))
            pipe.kill_router("a", signal.SIGTERM)
            pipe.start_router(wait=True)  # at once: well within the 10 s session timeout
            delivered = pipe.read(pipe.orders_topic, 10, timeout_s=120)
            log = pipe.router_log()
        finally:
            for future in admin.delete_topics([extra]).values():
                future.result(timeout=30)
    assert Counter(r.key().decode() for r in delivered) == Counter(first + added), log[-3000:]
