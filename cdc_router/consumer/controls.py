"""What every idempotent consumer (Kafka's, JetStream's) shares: the stop flag and the counters."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class ConsumerStats:
    """Counts since start: processed (effect ran), duplicates, dead-lettered, retries."""

    processed: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    retries: int = 0


class ConsumerControls:
    """What every idempotent consumer shares: the stop flag and the counters."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._counts = {"processed": 0, "duplicates": 0, "dead_lettered": 0, "retries": 0}
        # Topics whose records were found without the event id header, their key taken.
        self._keyed_topics: set[str] = set()

    @property
    def stats(self) -> ConsumerStats:
        """A snapshot of the counters."""
        return ConsumerStats(**self._counts)

    def stop(self) -> None:
        """Ask run() to finish the record in hand, settle it and close; safe from any thread."""
        self._stop.set()
