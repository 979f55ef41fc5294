"""The changelog restore from the window's first record (QA 65-b F-5), end to end: two
instances writing one changelog, one killed -9 under writes and started again, then every raw
record read again by both: each id within the window dropped as a replay (review 66)."""
from __future__ import annotations

import re
import signal
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from cdc_router.router.marks import changelog_records
from tests.integration.pipeline import pipeline
from tests.integration.support import StackEndpoints

pytestmark = pytest.mark.integration

WINDOW = 600_000


def _insert_ids(dsn: str, table: str, ids: list[str]) -> None:
    with psycopg.connect(dsn) as conn:
        conn.cursor().executemany(
            f"INSERT INTO public.{table} (id, aggregatetype, aggregateid, type, payload) "
            "VALUES (%s, 'Order', 'agg', 'OrderPaid', '{}'::jsonb)", [(i,) for i in ids])


def test_two_instances_restored_from_the_window_drop_every_replay_after_a_kill_and_a_rewind(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # A changelog kept a day: the marks older than the window stay on it.
    config = {"dedup": {"window_ms": WINDOW, "changelog_config": {"retention.ms": "86400000"}},
              "delivery": {"guarantee": "exactly_once"}}
    with pipeline(stack, tmp_path, partitions=2, raw_partitions=2, config=config) as pipe:
        now = int(time.time() * 1000)
        producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
        # 20,000 old marks (3 h: past window + margin), then marks inside the window (8 min old)
        # of ids X, and marks 2 h old of ids Y.
        for _ in range(200):
            for r in changelog_records([str(uuid.uuid4()) for _ in range(100)], now - 3 * 3600_000,
                                       group=pipe.name):
                producer.produce(pipe.changelog_topic, r.value, r.key, timestamp=now - 3 * 3600_000)
        inside = [str(uuid.uuid4()) for _ in range(5)]
        outside = [str(uuid.uuid4()) for _ in range(5)]
        for ids, ts in ((inside, now - 8 * 60_000), (outside, now - 2 * 3600_000)):
            for r in changelog_records(ids, ts, group=pipe.name):
                producer.produce(pipe.changelog_topic, r.value, r.key, timestamp=ts)
        assert producer.flush(30) == 0
        pipe.start_router("a", wait=True)
        pipe.start_router("b", wait=True)
        _insert_ids(stack.postgres_dsn, pipe.table, inside + outside)
        written: list[str] = []
        rows = [("Order", f"order-{i % 40}", "OrderPaid", {"seq": i}) for i in range(3000)]
        writer = threading.Thread(target=lambda: written.extend(pipe.insert(rows, 50)))
        writer.start()
        time.sleep(3)
        pipe.kill_router("a")  # kill -9 mid-stream
        time.sleep(1)
        pipe.start_router("a", wait=True)
        writer.join()
        pipe.read(pipe.orders_topic, 3000 + 5, timeout_s=240)
        time.sleep(5)
        assert pipe.kill_router("a", signal.SIGTERM) == 0
        assert pipe.kill_router("b", signal.SIGTERM) == 0
        # Every raw record read again: all are replays of ids inside the window.
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        deadline = time.monotonic() + 90
        while True:  # static members stay until their session times out: the group non-empty
            try:
                done = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
                    pipe.name, [TopicPartition(pipe.raw_topic, p, 0) for p in (0, 1)])])[
                    pipe.name].result(30)
                if all(tp.error is None for tp in done.topic_partitions):
                    break
            except Exception:  # asked again until the group is empty
                pass
            assert time.monotonic() < deadline
            time.sleep(2)
        pipe.start_router("a", wait=True)
        pipe.start_router("b", wait=True)
        # Until the replays' summary is logged (the run ended: all 3,010 read), not a fixed 30 s.
        summed = time.monotonic() + 180
        while "event=replays_dropped count=3010 " not in \
                pipe.router_log("a") + pipe.router_log("b") and time.monotonic() < summed:
            time.sleep(1)
        delivered = Counter(r.key().decode() for r in pipe.read_all(pipe.orders_topic))
        logs = pipe.router_log("a") + pipe.router_log("b")
    twice = {key: count for key, count in delivered.items() if count > 1}
    assert not twice, twice
    assert sum(delivered[i] for i in inside) == 0  # marked within the window: replays
    assert all(delivered[i] == 1 for i in outside)  # marked before it: delivered
    assert set(written) <= set(delivered)
    # The 20,000 old marks were never read: each start read the marks since the window's.
    restored = [int(n) for n in re.findall(r"event=assigned partitions=\S+ dedup_ids=\d+ "
                                           r"restored=(\d+)", logs)]
    assert restored and max(restored) < 4_000, restored
    assert "event=replays_dropped count=3010 " in logs, logs[-3000:]
