"""Commits Kafka acknowledged, then lost: the replay filter must not keep their ids.

Chaos 58 (a CI rehearsal, 283 events lost): Kafka 4.3, a single node kill -9'd just after it
wrote a transaction's PrepareCommit, completed that transaction on its restart without writing
a marker (its partitions had no leader yet, which the marker sender takes for deleted), and the
router's next transaction's abort took the batch's records, marks and offsets. The router had
counted the batch's ids delivered when commit_transaction returned, and reading the batch again
from the older committed offset it dropped each record as a replay.

Two guards. The filter remembers the ids it committed since the changelog's last read
(OwnBatches); a read, which returns every mark committed since the one before (kafka/reader.py
catch_up), confirms them, and the ids it lacks are forgotten: their commit was lost. Each
assignment reads the changelog so. And since offsets only move forward (another owner starts
where we stopped), a rewind after an aborted batch, which keeps the assignment, that reads back
a committed offset behind the one this instance committed (CommitLedger.behind) reads the
changelog too. (Review 59-r F-1: forgetting every id held instead kept only the marks since the
last read, and let Debezium's replays of anything older through.)
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from cdc_router.errors import EXIT_RESTART, DeliveryError

log = logging.getLogger("cdc_router.router")


class CommitLedger:
    """The offset this instance committed last for each raw partition."""

    def __init__(self) -> None:
        self._offsets: dict[tuple[str, int], int] = {}

    def committed(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """A batch committed these next offsets to read."""
        self._offsets.update(offsets)

    def reset(self, committed: Iterable[TopicPartition]) -> None:
        """A lost commit was handled: the group's offsets are the ones to compare with now
        (review 59-r F-4: each abort until the next commit read the changelog again)."""
        for tp in committed:
            if tp.offset >= 0:
                self._offsets[(tp.topic, tp.partition)] = tp.offset
            else:
                self._offsets.pop((tp.topic, tp.partition), None)

    def behind(self, committed: Iterable[TopicPartition]) -> list[str]:
        """`topic[partition] committed X, this instance Y` for each partition whose committed
        offset (read back from the group) is behind the one this instance committed."""
        return [f"{tp.topic}[{tp.partition}] committed "
                f"{tp.offset if tp.offset >= 0 else 'none'}, this instance {ours}"
                for tp in committed
                if (ours := self._offsets.get((tp.topic, tp.partition))) is not None
                and tp.error is None and tp.offset < ours]

    def read_back(self, consumer: Any, timeout_s: float) -> list[str]:
        """behind() of the group's offsets `consumer` reads back for the partitions this
        instance committed; [] when there are none, or when Kafka does not answer (unknown)."""
        if not self._offsets:
            return []
        try:
            found = consumer.committed([TopicPartition(topic, partition)
                                        for topic, partition in self._offsets], timeout_s)
        except KafkaException:
            return []
        return self.behind(found)


def lost_batch(lost: list[str], committed: int) -> DeliveryError:
    """The end (exit 75) of a `dlq replay` that found a batch it committed lost (`lost`:
    behind()'s): its letters are read and delivered again by the next run, which plans afresh."""
    log.warning("event=commit_lost partitions=%r", lost)
    stopped = DeliveryError("dlq replay stopped: Kafka lost a batch it had acknowledged, as "
                            f"after a broker's crash ({'; '.join(lost)}); that batch's letters "
                            f"stay on the dead-letter topic, undelivered ({committed} were "
                            "counted committed); run it again (what was delivered is skipped)")
    stopped.exit_code = EXIT_RESTART
    return stopped


# The filter's key of an id (router/replay.py compact_key): a canonical uuid's 16 bytes, else
# the str.
Key = str | bytes


class OwnBatches:
    """The ids this instance committed since the changelog's last read, oldest first."""

    def __init__(self) -> None:
        self._batches: deque[tuple[int, list[Key]]] = deque()
        self._count = 0

    def __bool__(self) -> bool:
        return bool(self._batches)

    def add(self, batch: tuple[int, list[Key]]) -> None:
        """(delivered_ms, keys): the filter's own batch when it holds it whole (no copy, 8
        bytes a batch; ids max_ids forgets go from here too)."""
        self._batches.append(batch)
        self._count += len(batch[1])

    def trim(self, horizon_ms: int, most: int) -> None:
        """Forget batches older than the window's horizon, and the oldest beyond `most` ids:
        the filter forgot their ids too."""
        # By count only while the newer batches alone hold `most`: a batch bigger than
        # max_ids stays (review 59-r2 F-2: its lost ids the filter still held were dropped).
        # The lists are the filter's, which max_ids shortens in place: the count is taken
        # again before it decides (reread 59 F-1), which happens only while max_ids bites.
        while self._batches:
            delivered_ms, keys = self._batches[0]
            if delivered_ms >= horizon_ms:
                if self._count - len(keys) < most:
                    return
                self._count = sum(len(held) for _, held in self._batches)
                if self._count - len(keys) < most:
                    return
            self._batches.popleft()
            self._count -= len(keys)

    def unconfirmed(self) -> set[Key]:
        """Every id held: a read discards those it returns."""
        return {key for _, keys in self._batches for key in keys}

    def keep(self, unconfirmed: set[Key]) -> None:
        """A read that failed part way: what it confirmed needs no other read."""
        self._batches = deque((ms, [key for key in keys if key in unconfirmed])
                              for ms, keys in self._batches)
        self._count = sum(len(keys) for _, keys in self._batches)

    def clear(self) -> None:
        self._batches.clear()
        self._count = 0
