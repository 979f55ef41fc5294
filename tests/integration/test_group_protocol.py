"""A member its group refuses for its assignors (INCONSISTENT_GROUP_PROTOCOL) stops, on the real
stack: the idempotent consumer's run() and the router's `run` (fixer 57-y N-3: each was refused
every 2 s for ever and read nothing). The unit tests are tests/unit/test_consumer_group_protocol.py.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_router.consumer import ConsumerSettings, IdempotentConsumer
from cdc_router.consumer.dedup import MemoryDedupStore
from cdc_router.errors import FatalKafkaError
from tests.integration.pipeline import pipeline
from tests.integration.support import StackEndpoints, unique

pytestmark = pytest.mark.integration

# Bounds a hang only: the refusal comes with the first JoinGroup answer (about 1 s here).
STOP_WITHIN_S = 90.0


@contextmanager
def member_of(bootstrap: str, group: str, topic: str, strategy: str) -> Iterator[None]:
    """A plain consumer of `group` with assignor `strategy`, polled in a thread from the time
    it has its partitions (returns then) until the block ends: the group's other member."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "partition.assignment.strategy": strategy,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    assigned, stop = threading.Event(), threading.Event()
    consumer.subscribe([topic], on_assign=lambda c, partitions: assigned.set())

    def poll() -> None:
        while not stop.is_set():
            consumer.poll(0.2)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        assert assigned.wait(60), f"the {strategy} member of {group} got no partitions"
        yield
    finally:
        stop.set()
        poller.join(30)
        consumer.close()


@contextmanager
def topics_of(bootstrap: str, *names: str) -> Iterator[None]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, 2, 1) for name in names]).values():
        future.result(timeout=30)
    try:
        yield
    finally:
        for future in admin.delete_topics(list(names)).values():
            future.result(timeout=30)


def test_a_cooperative_consumer_joining_an_eager_group_stops_naming_the_setting(
        stack: StackEndpoints) -> None:
    topic = unique("payments").replace("_", "-")
    dead_letter, group = f"{topic}.dlq", unique("fulfillment")
    settings = ConsumerSettings(
        bootstrap_servers=stack.bootstrap_servers, group_id=group, topics=(topic,),
        dead_letter_topic=dead_letter,
        consumer_config={"partition.assignment.strategy": "cooperative-sticky"})
    loop: IdempotentConsumer[Any] = IdempotentConsumer(
        settings, MemoryDedupStore(), lambda event, context: None)
    with topics_of(stack.bootstrap_servers, topic, dead_letter), \
            member_of(stack.bootstrap_servers, group, topic, "range,roundrobin"), \
            ThreadPoolExecutor(1) as worker:
        running = worker.submit(loop.run)
        try:
            stopped = running.exception(timeout=STOP_WITHIN_S)
        except TimeoutError:  # the old code: refused every 2 s, warned, and ran on
            loop.stop()
            stopped = None
    assert isinstance(stopped, FatalKafkaError), f"run() did not stop so: {stopped!r}"
    line = str(stopped)
    assert line.startswith(f"the consumer group {group!r} refused this member: "
                           "INCONSISTENT_GROUP_PROTOCOL: "), line
    assert "its consumer_config partition.assignment.strategy is not of the kind" in line, line


def test_the_router_in_a_group_whose_member_is_cooperative_exits_1_saying_so(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # Another application's cooperative-sticky consumer in the router's group (source.group_id):
    # the router's pinned eager assignors (roundrobin,range) share none with it.
    with pipeline(stack, tmp_path, partitions=1) as pipe, \
            member_of(stack.bootstrap_servers, pipe.name, pipe.raw_topic, "cooperative-sticky"):
        pipe.start_router("a")
        router = pipe.routers["a"]
        try:
            code = router.wait(timeout=STOP_WITHIN_S)
        except subprocess.TimeoutExpired:  # the old code: warned every 2 s, read nothing
            code = None
        log = pipe.router_log()
    assert code == 1, f"exit {code}; the router's log:\n{log[-3000:]}"
    last = log.strip().splitlines()[-1]
    assert last.startswith(f"error: the consumer group {pipe.name!r} refused this router: "
                           "INCONSISTENT_GROUP_PROTOCOL: "), log[-3000:]
    assert "source.group_id" in last and "give it a group of its own" in last, last
    assert "Traceback" not in log, log[-3000:]
