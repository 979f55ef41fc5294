"""The topic readers every integration test relies on: deterministic, whatever the timing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.support import StackEndpoints, read_to_end, read_topic, unique

pytestmark = pytest.mark.integration


@pytest.fixture
def topic(stack: StackEndpoints) -> Iterator[str]:
    name = unique("readers").replace("_", "-")
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for future in admin.create_topics([NewTopic(name, 3, 1)]).values():
        future.result(timeout=30)
    yield name
    for future in admin.delete_topics([name]).values():
        future.result(timeout=30)


def _transactional(stack: StackEndpoints, topic: str) -> Producer:
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers,
                         "transactional.id": unique(topic)})
    producer.init_transactions(30)
    return producer


def _values(records: list[Message]) -> list[bytes]:
    return sorted(record.value() for record in records)


def test_read_to_end_returns_exactly_the_committed_records_without_waiting(
        stack: StackEndpoints, topic: str) -> None:
    writer, other = _transactional(stack, topic), _transactional(stack, topic)
    committed = [f"c{i}".encode() for i in range(30)]
    writer.begin_transaction()
    for i, value in enumerate(committed):
        writer.produce(topic, value=value, partition=i % 3)
    writer.commit_transaction(30)
    writer.begin_transaction()
    writer.produce(topic, value=b"aborted", partition=1)
    writer.flush(30)  # on the broker, then aborted
    writer.abort_transaction(30)
    other.begin_transaction()
    other.produce(topic, value=b"open", partition=0)
    other.flush(30)  # left open while we read: it must not hold the reader up
    try:
        started = time.monotonic()
        records = read_to_end(stack.bootstrap_servers, topic)
        took = time.monotonic() - started
        uncommitted = read_to_end(stack.bootstrap_servers, topic, isolation="read_uncommitted")
    finally:
        other.abort_transaction(30)
    assert _values(records) == sorted(committed)
    assert _values(uncommitted) == sorted([*committed, b"aborted", b"open"])
    assert took < 15, f"reading to the end took {took:.1f}s"


def test_read_to_end_of_an_empty_topic_is_empty_at_once(stack: StackEndpoints,
                                                        topic: str) -> None:
    started = time.monotonic()
    assert read_to_end(stack.bootstrap_servers, topic) == []
    assert time.monotonic() - started < 15


def test_read_topic_waits_for_a_topic_that_does_not_exist_yet(stack: StackEndpoints) -> None:
    name = unique("readers_late").replace("_", "-")
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})

    def create_and_write() -> None:
        time.sleep(2)
        for future in admin.create_topics([NewTopic(name, 2, 1)]).values():
            future.result(timeout=30)
        producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
        for i in range(10):
            producer.produce(name, value=f"v{i}".encode(), partition=i % 2)
        assert producer.flush(30) == 0

    late = threading.Thread(target=create_and_write)
    late.start()
    try:
        records = read_topic(stack.bootstrap_servers, name, 10, timeout_s=60)
        until = read_topic(stack.bootstrap_servers, name, 100, timeout_s=60,
                           until=lambda record: record.value() == b"v4")
    finally:
        late.join()
        for future in admin.delete_topics([name]).values():
            future.result(timeout=30)
    assert _values(records) == sorted(f"v{i}".encode() for i in range(10))
    assert until[-1].value() == b"v4" and len(until) <= 10
