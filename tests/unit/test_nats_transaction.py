"""JetStream records in the router's transaction: published and acked before any Kafka step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from cdc_router.config.delivery import DeliverySettings
from cdc_router.errors import BatchFailed, ConfigError, JetStreamError
from cdc_router.kafka.producer import LatchingProducer
from cdc_router.nats.publisher import BatchAcks, NatsMessage
from cdc_router.router.routing import OutboundRecord
from cdc_router.router.transaction import Transaction
from tests.unit.router_fakes import CHANGELOG, ORDERS, RAW, FakeCluster, FakeConsumer, FakeProducer


class FakePublisher:
    """Records each batch in the cluster's journal (to order it against the Kafka steps)."""

    def __init__(self, cluster: FakeCluster, fail: bool = False) -> None:
        self.cluster, self.fail = cluster, fail
        self.batches: list[list[NatsMessage]] = []

    def publish_batch(self, messages: Sequence[NatsMessage]) -> BatchAcks:
        self.cluster.journal.append("publish")
        if self.fail:
            raise JetStreamError("JetStream did not acknowledge 1 of 1 messages")
        self.batches.append(list(messages))
        return BatchAcks(len(messages), 0)


def transaction(cluster: FakeCluster, publisher: Any, guarantee: str = "exactly_once"
                ) -> Transaction:
    config: dict[str, Any] = {"bootstrap.servers": "x"}
    if guarantee == "exactly_once":
        config["transactional.id"] = "t-1"
    producer = LatchingProducer(config, lambda conf: FakeProducer(cluster, conf))
    consumer = FakeConsumer(cluster, {}, on_idle=lambda: None)
    txn = Transaction(producer, consumer, delivery=DeliverySettings(guarantee=guarantee),
                      mark_group="g",
                      changelog_topic=CHANGELOG, bootstrap="x", sleep=lambda s: None,
                      publisher=publisher)
    txn.init()
    return txn


def nats_record(event_id: str) -> OutboundRecord:
    return OutboundRecord(topic="orders.OrderPaid", key=event_id.encode(), value=b"{}",
                          partition=None, headers=(("id", event_id.encode()), ("t", b"a")),
                          timestamp_ms=1, event_id=event_id, route_index=0, format="json",
                          nats=True)


def add(txn: Transaction, offset: int, event_id: str) -> None:
    txn.begin()
    txn.consumed(RAW, 0, offset)
    txn.produce(nats_record(event_id), (RAW, 0, offset))
    txn.mark(event_id, 1000)


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_the_batch_is_published_and_acked_before_offsets_and_marks(guarantee: str) -> None:
    cluster = FakeCluster()
    publisher = FakePublisher(cluster)
    txn = transaction(cluster, publisher, guarantee)
    add(txn, 0, "e-0")
    add(txn, 1, "e-1")
    assert publisher.batches == []  # nothing leaves before the commit
    txn.commit()
    [batch] = publisher.batches
    assert [(m.subject, m.msg_id, dict(m.headers)) for m in batch] == [
        ("orders.OrderPaid", "e-0", {"id": "e-0", "t": "a"}),
        ("orders.OrderPaid", "e-1", {"id": "e-1", "t": "a"})]
    before = cluster.journal[:cluster.journal.index("publish")]
    assert not {f"acked {CHANGELOG}", "send_offsets", "commit_offsets", "commit"} & set(before)
    assert cluster.group_offsets == {(RAW, 0): 2}


def test_the_batch_s_kafka_records_are_acked_before_its_jetstream_records_go_out() -> None:
    # QA 36-d: published first, a refusal's abort purged the Kafka records still in flight;
    # the broker then refused the abort (INVALID_TXN_STATE): 5-15 s of renewals each time.
    cluster = FakeCluster()
    publisher = FakePublisher(cluster)
    txn = transaction(cluster, publisher)
    add(txn, 0, "e-0")
    txn.consumed(RAW, 0, 1)
    txn.produce(replace(nats_record("e-1"), topic=ORDERS, nats=False), (RAW, 0, 1))
    txn.commit()
    assert cluster.journal.index(f"acked {ORDERS}") < cluster.journal.index("publish")
    assert [s.key for s in cluster.committed(ORDERS)] == [b"e-1"]


def test_a_jetstream_failure_fails_the_batch_and_commits_no_offset() -> None:
    cluster = FakeCluster()
    txn = transaction(cluster, FakePublisher(cluster, fail=True))
    add(txn, 0, "e-0")
    with pytest.raises(BatchFailed, match="JetStream did not acknowledge"):
        txn.commit()
    txn.abort()
    assert cluster.group_offsets == {} and cluster.committed(CHANGELOG) == []
    assert "commit" not in cluster.journal and "send_offsets" not in cluster.journal


def test_a_jetstream_record_without_a_publisher_is_a_config_error() -> None:
    cluster = FakeCluster()
    txn = transaction(cluster, None)
    txn.begin()
    with pytest.raises(ConfigError, match="was given no JetStream publisher"):
        txn.produce(nats_record("e-0"), (RAW, 0, 0))
