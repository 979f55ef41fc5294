"""A read_committed reader, in a thread of its own, that notes when each record became visible.

It is assigned (no group, nothing committed) to every partition of its topics at their end
offsets when it starts, so it sees only what is written afterwards. Per topic it counts the
records and keeps the wall-clock time of the first and the last one; with `ids`, also the first
time each row id appeared, for commit-to-visible latency.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

# Every path's key carries the row id: the router's and the pollers' as text, the raw topic's
# and the SMT's as JSON (`{"id": "..."}`, `"..."`).
_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def row_id(key: bytes | None) -> str | None:
    """The row id a record's key carries, or None."""
    found = _UUID.search(key or b"")
    return found.group().decode() if found else None


@dataclass
class TopicSeen:
    """What arrived on one topic since the watcher started."""

    count: int = 0
    first: float | None = None
    last: float | None = None
    ids: dict[str, float] = field(default_factory=dict)  # row id -> first time seen

    def span(self) -> float:
        return (self.last - self.first) if self.first is not None and self.last else 0.0


class Watcher:
    """Reads `topics` from their current ends in a thread until stop()."""

    def __init__(self, bootstrap: str, topics: Iterable[str], *, ids: bool = False) -> None:
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"bench-watch-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False, "isolation.level": "read_committed",
            # The broker answers a fetch at once when data is there; on a quiet topic it holds
            # the fetch up to this long, which would count as latency if it were longer.
            "fetch.wait.max.ms": 10})
        self.seen = {topic: TopicSeen() for topic in topics}
        self._ids = ids
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._consumer.assign([partition for topic in self.seen
                               for partition in self._ends(topic)])
        self._thread = threading.Thread(target=self._run, name="bench-watcher", daemon=True)
        self._thread.start()

    def _ends(self, topic: str) -> list[TopicPartition]:
        metadata = self._consumer.list_topics(topic, timeout=30).topics[topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        return [TopicPartition(topic, number, self._high(TopicPartition(topic, number)))
                for number in sorted(metadata.partitions)]

    def _high(self, partition: TopicPartition, timeout_s: float = 30) -> int:
        """The partition's end offset; a topic just created answers NOT_LEADER_FOR_PARTITION
        until its leader is known, which librdkafka does not retry for this query."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return int(self._consumer.get_watermark_offsets(partition, timeout=10)[1])
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                message = self._consumer.poll(0.05)
                if message is not None:
                    self._note(message, time.time())
        except BaseException as error:  # reported by wait_for(), never lost in the thread
            self._error = error

    def _note(self, message: Message, now: float) -> None:
        error = message.error()
        if error is not None:
            if error.fatal():
                raise KafkaException(error)
            return
        with self._lock:
            seen = self.seen[str(message.topic())]
            seen.count += 1
            seen.first = seen.first or now
            seen.last = now
            if self._ids:
                found = row_id(message.key())
                if found is not None and found not in seen.ids:
                    seen.ids[found] = now

    def count(self, topic: str) -> int:
        with self._lock:
            return self.seen[topic].count

    def wait_for(self, topic: str, count: int, timeout_s: float) -> bool:
        """True once `topic` has `count` records; False after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while self.count(topic) < count:
            if self._error is not None:
                raise RuntimeError(f"the watcher stopped: {self._error}") from self._error
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def wait_for_ids(self, topics: Iterable[str], ids: set[str], timeout_s: float) -> bool:
        """Wait until every topic has seen every id (True), or `timeout_s` passed (False)."""
        deadline = time.monotonic() + timeout_s
        complete = True
        for topic in topics:
            while True:
                with self._lock:
                    if ids <= self.seen[topic].ids.keys():
                        break
                if time.monotonic() >= deadline:
                    complete = False
                    break
                time.sleep(0.1)
        return complete

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._consumer.close()
