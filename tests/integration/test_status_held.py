"""A raw partition held by an open transaction, on the real stack (QA 54-b F-1): `status`
measured the lag to the last stable offset and said ok (exit 0) while 19,250 records waited
behind a transaction left open; the router logged nothing."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.integration.pipeline import pipeline
from tests.integration.support import StackEndpoints

pytestmark = [pytest.mark.integration]

# source.held_partition_warning_s (60 s by default): the router's line comes without a minute's
# wait, and well after the moment a transaction of Debezium's own holds the partition.
HELD_S = 10


def test_a_raw_partition_held_by_an_open_transaction_is_said_by_status_and_the_router(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, partitions=1,
                  config={"source": {"held_partition_warning_s": HELD_S}}) as pipe:
        pipe.start_router(wait=True)
        pipe.insert([("Order", "o-0", "OrderPaid", {"n": 0})])
        assert len(pipe.read(pipe.orders_topic, 1, timeout_s=120)) == 1
        # A raw transactional producer leaves a transaction open on the raw partition, as a
        # producer Kafka left hanging would.
        producer = Producer({"bootstrap.servers": pipe.stack.bootstrap_servers,
                             "transactional.id": f"{pipe.name}-hang",
                             "transaction.timeout.ms": 600_000})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(pipe.raw_topic, key=b"hang", value=b"{}", partition=0)
        producer.flush(30)
        try:
            pipe.insert([("Order", f"o-{i}", "OrderPaid", {"n": i}) for i in range(1, 21)])
            deadline, report, done = time.monotonic() + 120, None, None
            while time.monotonic() < deadline:
                done = pipe.status("--threshold", "stalled_warning_s=5", "-o", "json")
                report = json.loads(done.stdout)
                partition = report["router"]["partitions"][0]
                if partition["high_watermark"] is not None and \
                        partition["high_watermark"] >= partition["end"] + 21 and \
                        any("holds raw partition" in p["message"] for p in report["problems"]):
                    break
                time.sleep(2)
            assert done is not None and report is not None
            partition = report["router"]["partitions"][0]
            assert partition["lag"] == 0, partition  # to the last stable offset: it says 0
            said = [p for p in report["problems"] if "holds raw partition" in p["message"]]
            assert len(said) == 1, report["problems"]
            assert said[0]["level"] == "warning" and said[0]["component"] == "router"
            lso, high = partition["end"], partition["high_watermark"]
            assert said[0]["message"].startswith(
                "a transaction open for ")
            assert (f"holds raw partition {pipe.raw_topic}[0] at its last stable offset {lso}, "
                    f"{high - lso} offsets behind it up to the high watermark {high}") \
                in said[0]["message"]
            assert f"--start-offset {lso}`" in said[0]["message"]
            assert report["status"] == "warning" and done.returncode == 1
            # The router's own line, once, from its periodic lag update.
            deadline = time.monotonic() + HELD_S + 60
            while "event=raw_partition_held" not in pipe.router_log() and \
                    time.monotonic() < deadline:
                time.sleep(2)
            log = pipe.router_log()
            assert log.count("event=raw_partition_held") == 1, log[-3000:]
            assert f"topic={pipe.raw_topic} partition=0 position=" in log
        finally:
            producer.abort_transaction(30)
        # Aborted: the records behind it are delivered, and the router says so.
        assert len(pipe.read(pipe.orders_topic, 21, timeout_s=120)) == 21
        deadline = time.monotonic() + 30
        while "event=raw_partition_released" not in pipe.router_log() and \
                time.monotonic() < deadline:
            time.sleep(1)
        assert "event=raw_partition_released" in pipe.router_log()
