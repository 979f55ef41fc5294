"""Commits Kafka acknowledged, then lost: the replay filter must not keep their ids.

Chaos 58 (a CI rehearsal, 283 events lost): Kafka 4.3, a single node kill -9'd just after it
wrote a transaction's PrepareCommit, completed that transaction on its restart without writing
a marker (its partitions had no leader yet, which the marker sender takes for deleted), and the
router's next transaction's abort took the batch's records, marks and offsets. The router had
counted the batch's ids delivered when commit_transaction returned, and reading the batch again
from the older committed offset it dropped each record as a replay.

Offsets only move forward (another owner starts where we stopped), so a committed offset read
back behind the one this instance committed last is a lost commit (or offsets reset by hand
while the group was empty): the filter then forgets the ids it holds and keeps the changelog's
committed marks only. An assignment always restores so (router/assignment.py); a rewind after
an aborted batch, which keeps the assignment, asks CommitLedger.behind first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import TopicPartition


class CommitLedger:
    """The offset this instance committed last for each raw partition."""

    def __init__(self) -> None:
        self._offsets: dict[tuple[str, int], int] = {}

    def committed(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """A batch committed these next offsets to read."""
        self._offsets.update(offsets)

    def behind(self, committed: Iterable[TopicPartition]) -> list[str]:
        """`topic[partition] committed X, this instance Y` for each partition whose committed
        offset (read back from the group) is behind the one this instance committed."""
        return [f"{tp.topic}[{tp.partition}] committed "
                f"{tp.offset if tp.offset >= 0 else 'none'}, this instance {ours}"
                for tp in committed
                if (ours := self._offsets.get((tp.topic, tp.partition))) is not None
                and tp.error is None and tp.offset < ours]
