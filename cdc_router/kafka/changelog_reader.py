"""The dedup changelog's reader: read to its end at each assignment, and at a restore backwards
in time slices, newest first.

A first read of the changelog (ChangelogReader.catch_up) starts each partition
at its first record timestamped at or after a time, and reads on to the end. Each older slice
then reads, of each partition, from its first record timestamped at or after an earlier time up
to the offset where the slice before it started; so every record is read once, and a record
below a slice's start is timestamped before the slice's time (Kafka's ListOffsets by time
answers the first offset of a record timestamped then or later). router/changelog_restore.py
decides how far back to go.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    Message,
    TopicPartition,
)

from cdc_router.kafka.read_positions import first_offsets_since
from cdc_router.kafka.reader import End, TopicReader

KeyValue = tuple[bytes | None, bytes | None]

_SLICE_CONSUME_WAIT_S = 0.02
# How long the broker holds a fetch that finds nothing new (librdkafka's default 500 ms). A read
# takes its ends on the consumer's own connection after the assignment, and a lookup waits
# behind a fetch held at the log end: the restore's first slice, near the end, took 1.5 s more
# with 3 partitions (review 67). The reader fetches nothing between its reads (paused).
FETCH_WAIT_MS = 20


class OlderSlices(TopicReader):
    """The slices older than a first read that started each partition at `below` (partition →
    offset; a partition left out was read from its beginning: nothing is older)."""

    def __init__(self, config: Mapping[str, Any], topic: str, *, group_id: str, what: str,
                 below: Mapping[int, int], consumer: Callable[[dict[str, Any]], Consumer],
                 ) -> None:
        # Renewable: a slice that reads nothing for 30 s (a broker's restart) goes on with a
        # new consumer, as the first read does, not at its deadline (review 67 L-3).
        super().__init__(config, topic, group_id=group_id, what=what, lean=True, renewable=True)
        # Each slice's last consume() waits out its timeout for a batch its last records do
        # not fill: at a read to the end's 0.2 s (paid once there), 11 slices of a quiet
        # changelog took 2.4 s more than one read of it; at 0.02 s, 0.25 s more.
        self._consume_wait_s = _SLICE_CONSUME_WAIT_S
        self._below = {partition: offset for partition, offset in below.items() if offset > 0}
        self._new_consumer = consumer
        self._stops: dict[int, int] = {}  # this slice's: where the newer slice started

    def exhausted(self) -> bool:
        """Whether no partition holds a record below what was read (as far as known)."""
        return not self._below

    def read(self, since_ms: int, *, timeout_s: float = 300.0) -> Iterator[Message]:
        """Every committed record from each partition's first timestamped `since_ms` or later
        up to where the previous slice started; the next slice goes on below it."""
        for message in self.read_to_end(end="stable", timeout_s=timeout_s, since_ms=since_ms):
            partition, offset = message.partition(), message.offset()
            # A read yields what its last fetch took past its ends: read already, newer.
            if partition is not None and offset is not None and \
                    offset < self._stops.get(partition, 0):
                yield message

    def _ends(self, end: End, deadline: float) -> tuple[Consumer, dict[int, int]]:
        """The consumer assigned at this slice's starts, and its stops (TopicReader's hook)."""
        # A new consumer a slice: one assigned again read 430 of a quiet changelog's 1,690
        # marks and stalled for 8 s (why, not looked into). A new one's first lookups take
        # about 100 ms (a quiet changelog's 5 slices: 0.4 s more than one read).
        self.close()
        consumer = self._consumer = self._new_consumer(self._config)
        since_ms = self._since_ms
        assert since_ms is not None  # read() passes it
        found = first_offsets_since(consumer, self._topic, sorted(self._below), since_ms)
        # A failed lookup (left out): that partition from its beginning, its last slice.
        starts = {p: min(found.get(p, OFFSET_BEGINNING), stop) for p, stop in self._below.items()}
        self._stops = {p: stop for p, stop in self._below.items()
                       if starts[p] == OFFSET_BEGINNING or starts[p] < stop}
        self._partitions = sorted(self._stops)
        consumer.assign([TopicPartition(self._topic, p, starts[p]) for p in self._partitions])
        self._assigned_at = {p: starts[p] for p in self._partitions if starts[p] >= 0}
        self._below = {p: start for p, start in starts.items() if start > 0}
        return consumer, dict(self._stops)


class ChangelogReader(TopicReader):
    """The router's dedup changelog, read to its log end on each partition assignment; a first
    read from a time, then older slices (OlderSlices) back as far as the replay filter needs
    (router/changelog_restore.py)."""

    def __init__(self, config: Mapping[str, Any], topic: str, *,
                 group_id: str | None = None, timeout_s: float = 300.0) -> None:
        """`timeout_s`: how long a read may go without progress, unless a call says."""
        self._timeout_s = timeout_s
        super().__init__(config, topic, what="dedup changelog", lean=True, renewable=True,
                         paused_between=True, group_id=group_id or
                         f"{config.get('client.id', 'cdc-router')}-changelog-reader")
        self._config["fetch.wait.max.ms"] = FETCH_WAIT_MS  # OlderSlices take this config too
        self._older: OlderSlices | None = None
        # Whether a record read was stamped by the broker (message.timestamp.type
        # LogAppendTime): its time may precede its mark's (router/changelog_restore.py).
        self.broker_stamped = False

    def catch_up(self, timeout_s: float | None = None, *, since_ms: int | None = None,
                 ) -> Iterator[KeyValue]:
        """(key, value) of every committed mark written before this call, waiting for a
        transaction still open (it may hold marks of a previous owner of our partitions);
        the first read, only of the records timestamped `since_ms` or later (read_to_end)."""
        self.older_done()
        for message in self.read_to_end(end="log_end", timeout_s=timeout_s or self._timeout_s,
                                        since_ms=since_ms):
            yield self._noted(message)
        if self.started_at is not None:
            self._older = OlderSlices(self._config, self._topic, group_id=self._config["group.id"],
                                      what=self._what, below=self.started_at,
                                      consumer=Consumer)

    def older(self, since_ms: int, timeout_s: float | None = None) -> Iterator[KeyValue]:
        """(key, value) of the committed marks timestamped `since_ms` or later below those
        read since the last catch_up(since_ms=...) (nothing after a catch_up that went on
        from before); each call goes further back."""
        if self._older is not None:
            for message in self._older.read(since_ms, timeout_s=timeout_s or self._timeout_s):
                yield self._noted(message)

    def _noted(self, message: Message) -> KeyValue:
        if message.timestamp()[0] == TIMESTAMP_LOG_APPEND_TIME:
            self.broker_stamped = True
        return message.key(), message.value()

    def older_left(self) -> bool:
        """Whether older() may find more (a partition holds records below those read)."""
        return self._older is not None and not self._older.exhausted()

    def older_done(self) -> None:
        """Close older()'s consumer: the restore has read what it needed."""
        if self._older is not None:
            self._older.close()
            self._older = None

    def close(self) -> None:
        self.older_done()
        super().close()
