"""`dlq replay` reads a raw record again by its offset (router/dlq_raw.py, QA 57-b F-1), on the
real Kafka: the record's value while the topic keeps it, None once retention deleted it."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_router.config.model import RouterConfig
from cdc_router.router import dlq_raw
from cdc_router.router.dlq_raw import RawRecords
from tests.integration.support import StackEndpoints


def test_a_raw_record_is_read_by_its_offset_and_none_once_deleted(
        stack: StackEndpoints, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fetch timeout far above the bound below: a read that waited for it cannot pass, while
    # a loaded machine's slowness (pytest-xdist beside other stacks) cannot fail the test.
    monkeypatch.setattr(dlq_raw, "FETCH_TIMEOUT_S", 300.0)
    topic = f"fx-raw-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
    for n in range(4):
        producer.produce(topic, key=f"k{n}".encode(), value=f"v{n}".encode() * 1000)
    assert producer.flush(30) == 0
    config = RouterConfig.model_validate({
        "kafka": {"bootstrap_servers": stack.bootstrap_servers},
        "source": {"topics": [topic], "group_id": "fx-raw"}, "routes": [{"topic": "out"}]})
    read = RawRecords(config)
    try:
        assert read(topic, 0, 1) == b"v1" * 1000
        assert read(topic, 0, 3) == b"v3" * 1000
        # Retention (here: records deleted below offset 2): gone, said at once, not waited on.
        admin.delete_records([TopicPartition(topic, 0, 2)])[TopicPartition(topic, 0, 2)] \
            .result(30)
        started = time.monotonic()
        assert read(topic, 0, 1) is None
        assert time.monotonic() - started < 150
        assert read(topic, 0, 2) == b"v2" * 1000
    finally:
        read.close()
        admin.delete_topics([topic])
