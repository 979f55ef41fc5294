"""A restore reads the changelog newest slices first and stops once max_ids ids are held
(review 66 F-2), on the real stack: fewer marks read, the newest max_ids still drop replays."""

from __future__ import annotations

import re
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from cdc_router.router.replay import changelog_records
from tests.integration.pipeline import pipeline
from tests.integration.support import StackEndpoints

pytestmark = pytest.mark.integration

MAX_IDS = 1_000
RECORDS, IDS = 3_000, 10  # 30,000 marks of this group, one record every 12 s over 10 hours
EVERY_MS = 12_000


def _assigned(log: str) -> list[tuple[int, int, int]]:
    """(dedup_ids, restored, slices) of each `event=assigned` line that read the changelog
    (slices 0 in a line without: before review 66 F-2, one read of the whole window)."""
    return [(int(ids), int(restored), int(slices or 0)) for ids, restored, slices in re.findall(
        r"event=assigned partitions=\S+ dedup_ids=(\d+) restored=(\d+)(?: slices=(\d+))?",
        log)]


def test_a_restart_reads_the_newest_marks_only_and_still_drops_the_newest_max_ids_replays(
        stack: StackEndpoints, tmp_path: Path) -> None:
    events = 40
    config = {"dedup": {"max_ids": MAX_IDS,
                        "changelog_config": {"retention.ms": str(8 * 86_400_000)}}}
    with pipeline(stack, tmp_path, partitions=2, config=config) as pipe:
        now_ms = int(time.time() * 1000)
        producer = Producer({"bootstrap.servers": stack.bootstrap_servers,
                             "linger.ms": 20})
        synthetic: list[list[str]] = []  # each record's ids, oldest first
        for n in range(RECORDS):
            mark_ms = now_ms - (RECORDS - n) * EVERY_MS
            synthetic.append([str(uuid.uuid4()) for _ in range(IDS)])
            for record in changelog_records(synthetic[-1], mark_ms, group=pipe.name):
                # Written oldest first by several producers: stamps out of order by 0-2 s.
                producer.produce(pipe.changelog_topic, key=record.key, value=record.value,
                                 timestamp=mark_ms + (n * 7919) % 2_000)
            # Another pipeline's marks on the shared changelog, as many ids: read, not held.
            for record in changelog_records([str(uuid.uuid4()) for _ in range(IDS)],
                                            mark_ms + 500, group=f"{pipe.name}-other"):
                producer.produce(pipe.changelog_topic, key=record.key, value=record.value,
                                 timestamp=mark_ms + 500)
            producer.poll(0)
        assert producer.flush(60) == 0

        pipe.start_router("first", wait=True)
        [(held, restored, slices)] = _assigned(pipe.router_log("first"))
        # The newest 1,000 ids are 100 records (20 minutes); read in order the window held all
        # 30,000 (and the read stopped at none of them).
        assert (held, restored < 3_000, slices >= 2) == (MAX_IDS, True, True), restored
        assert "older_unread=true" in pipe.router_log("first")

        ids = pipe.insert([("Order", str(n % 4), "OrderPlaced", {"n": n})
                           for n in range(events)])
        assert len(pipe.read(pipe.orders_topic, events)) == events
        raw = pipe.read(pipe.raw_topic, events)
        assert pipe.kill_router("first", signal.SIGTERM) == 0

        pipe.start_router("again", wait=True)
        [(held, restored, slices)] = _assigned(pipe.router_log("again"))
        assert (held, restored < 3_000) == (MAX_IDS, True), restored
        # Debezium's replays: of the 40 delivered, of the newest synthetic ids (held: the
        # newest 1,000 are the 40 and 960 of them), and of ids 5 hours old (crowded out by
        # max_ids, as in a read of the whole window: delivered again).
        newest = [event_id for record in synthetic[-90:] for event_id in record]
        crowded = synthetic[RECORDS // 2][:5]
        template, template_id = raw[0], ids[0]
        for record in raw:
            producer.produce(pipe.raw_topic, key=record.key(), value=record.value(),
                             partition=record.partition())
        for event_id in [*newest, *crowded]:
            producer.produce(
                pipe.raw_topic, partition=template.partition(),
                key=(template.key() or b"").replace(template_id.encode(), event_id.encode()),
                value=(template.value() or b"").replace(template_id.encode(), event_id.encode()))
        assert producer.flush(30) == 0
        # The crowded-out ids come last on the raw partition: once delivered, every replay
        # before them was read.
        deadline = time.monotonic() + 180
        while not set(crowded) <= {r.key().decode() for r in pipe.read_all(
                pipe.orders_topic, settle_s=2)}:
            assert time.monotonic() < deadline, pipe.router_log("again")[-3000:]
        delivered = Counter(r.key().decode() for r in pipe.read_all(pipe.orders_topic))
    assert delivered == Counter(ids + crowded)
