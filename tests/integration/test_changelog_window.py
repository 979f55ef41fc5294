"""The dedup changelog's restore reads only the marks within the window (QA 65-b F-5), on the
real stack: marks timestamped before it are never read, those within it still drop replays."""

from __future__ import annotations

import re
import signal
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_router.kafka.changelog_reader import ChangelogReader
from cdc_router.router.replay import changelog_records
from tests.integration.pipeline import pipeline
from tests.integration.support import StackEndpoints

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


def _restores(log: str) -> list[tuple[int, int]]:
    """(dedup_ids, restored) of each `event=assigned` line that read the changelog."""
    return [(int(ids), int(restored)) for ids, restored in re.findall(
        r"event=assigned partitions=\S+ dedup_ids=(\d+) restored=(\d+)", log)]


def test_a_restart_restores_the_marks_within_the_window_only_and_drops_their_replays(
        stack: StackEndpoints, tmp_path: Path) -> None:
    events, old = 40, 500
    # A changelog kept a day: the marks older than the one-hour window stay on it.
    config = {"dedup": {"window_ms": HOUR_MS, "changelog_config": {"retention.ms": "86400000"}}}
    with pipeline(stack, tmp_path, partitions=2, config=config) as pipe:
        now_ms = int(time.time() * 1000)
        producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
        # Marks of this group written 3 h ago and 30 min ago (an explicit record timestamp),
        # before any delivery: at the changelog's start.
        for n in range(old):
            for record in changelog_records([str(uuid.uuid4())], now_ms - 3 * HOUR_MS,
                                            group=pipe.name):
                producer.produce(pipe.changelog_topic, key=record.key, value=record.value,
                                 timestamp=now_ms - 3 * HOUR_MS + n)
        [recent] = changelog_records([str(uuid.uuid4())], now_ms - HOUR_MS // 2,
                                     group=pipe.name)
        producer.produce(pipe.changelog_topic, key=recent.key, value=recent.value,
                         timestamp=now_ms - HOUR_MS // 2)
        assert producer.flush(30) == 0

        pipe.start_router("first", wait=True)
        ids = pipe.insert([("Order", str(n % 4), "OrderPlaced", {"n": n})
                           for n in range(events)])
        assert len(pipe.read(pipe.orders_topic, events)) == events
        raw = pipe.read(pipe.raw_topic, events)
        assert pipe.kill_router("first", signal.SIGTERM) == 0
        # Its start read the recent mark only: none of the 500 old ones.
        assert _restores(pipe.router_log("first")) == [(1, 1)]

        pipe.start_router("again", wait=True)
        # The 40 delivered and the recent mark; the old ones neither read nor held.
        assert _restores(pipe.router_log("again")) == [(events + 1, events + 1)]
        for record in raw:  # Debezium's replays of every delivered event
            producer.produce(pipe.raw_topic, key=record.key(), value=record.value(),
                             partition=record.partition())
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 120
        while pipe.router_log("again").count("event=replay_dropped") < events:
            assert time.monotonic() < deadline, pipe.router_log("again")[-3000:]
            time.sleep(0.5)
        delivered = Counter(r.key().decode() for r in pipe.read_all(pipe.orders_topic))
    assert delivered == Counter(ids)


def test_a_first_read_from_a_time_waits_for_a_transaction_open_past_every_older_record(
        stack: StackEndpoints) -> None:
    # The only recent mark is in a transaction still open when the start is looked up: the
    # time lookup finds nothing below the last stable offset, and the read must start there,
    # not at the log end past the open transaction's records.
    topic = f"f66-open-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, 1, 1, config={
            "cleanup.policy": "compact,delete", "retention.ms": "86400000"})]).values():
        future.result(timeout=30)
    try:
        now_ms = int(time.time() * 1000)
        plain = Producer({"bootstrap.servers": stack.bootstrap_servers})
        for n in range(20):
            [old] = changelog_records([f"old-{n}"], now_ms - 3 * HOUR_MS, group="g")
            plain.produce(topic, key=old.key, value=old.value, timestamp=now_ms - 3 * HOUR_MS)
        assert plain.flush(30) == 0
        writer = Producer({"bootstrap.servers": stack.bootstrap_servers,
                           "transactional.id": f"{topic}-writer"})
        writer.init_transactions(30)
        writer.begin_transaction()
        [recent] = changelog_records(["recent"], now_ms, group="g")
        writer.produce(topic, key=recent.key, value=recent.value)
        assert writer.flush(30) == 0  # on the broker, the transaction open
        committer = threading.Timer(3.0, lambda: writer.commit_transaction(30))
        committer.start()
        reader = ChangelogReader({"bootstrap.servers": stack.bootstrap_servers}, topic)
        try:
            keys = [key for key, _ in reader.catch_up(timeout_s=60,
                                                      since_ms=now_ms - HOUR_MS)]
        finally:
            committer.join()
            reader.close()
        assert keys == [recent.key]
    finally:
        for future in admin.delete_topics([topic]).values():
            future.result(timeout=30)
