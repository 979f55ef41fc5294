"""The router's consumer out of its group while the cluster answers, on the real stack
(router/membership.py, QA 39-c F1)."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from cdc_router.config.load import load_config
from cdc_router.router import membership
from cdc_router.router.loop import OutboxRouter
from tests.integration.pipeline import pipeline
from tests.integration.support import StackEndpoints

pytestmark = pytest.mark.integration

# The broker's group.min.session.timeout.ms: the watch renews after three of them.
SESSION_TIMEOUT_MS = 6000


class LeavesWhenTold:
    """A real consumer that, once `leave` is set, unsubscribes at its next poll and stays so:
    no partition, and (a static member sends no LeaveGroup) dropped by the group when its
    session times out. What QA 39-c saw librdkafka do after a broker's outage, on purpose."""

    def __init__(self, consumer: Consumer, leave: threading.Event) -> None:
        self._consumer, self._leave, self.left = consumer, leave, threading.Event()

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        if self._leave.is_set() and not self.left.is_set():
            self._consumer.unsubscribe()
            self.left.set()
        return self._consumer.consume(num_messages, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def _listed(bootstrap: str, group: str) -> set[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([group], request_timeout=10)[group].result(10)
    return {m.group_instance_id for m in described.members}


def test_a_consumer_out_of_its_group_is_replaced_and_every_event_arrives_once(
        stack: StackEndpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(membership, "CHECK_EVERY_S", 2.0)
    caplog.set_level(logging.INFO, logger="cdc_router")
    settings = {"kafka": {"consumer": {"session.timeout.ms": SESSION_TIMEOUT_MS}}}
    with pipeline(stack, tmp_path, partitions=2, config=settings) as pipe:
        leave = threading.Event()
        built: list[Any] = []

        def consumers(conf: dict[str, Any]) -> Any:
            made = Consumer(conf)
            built.append(made if built else LeavesWhenTold(made, leave))
            return built[-1]

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
    assert instance in listed
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("event=member_missing") for line in lines)
    assert any("event=consumer_renewed" in line and f"did not list instance {instance}" in line
               for line in lines)
