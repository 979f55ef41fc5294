"""What /healthz and /readyz of the router judge, besides its loop's last poll: the dedup
changelog's restore at each assignment, and whether the router has joined its group."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

Record = tuple[bytes | None, bytes | None]


class RestoreProgress:
    """When a read of the dedup changelog last yielded a record.

    A restore runs inside the consumer's poll (its assignment callback) and reads the
    changelog's window: millions of marks take minutes (README, the changelog restore's
    time), while the loop polls nothing. Judged by the poll alone, /healthz failed after 120 s
    of a restore that was getting on, and a liveness probe restarted the router into the same
    restore, for good (QA 66-b). A restore that stops reading is still caught: by this clock,
    and by the reader's own bounds (kafka/reader.py: renewed after 30 s without progress,
    given up after 300 s without progress)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.last_read = float("-inf")

    def reader(self, factory: Callable[[Mapping[str, Any], str], Any],
               ) -> Callable[[Mapping[str, Any], str], Any]:
        """A changelog_factory for OutboxRouter: `factory`'s reader, whose catch_up() reads
        are timed here."""
        return lambda config, topic: _TimedReader(factory(config, topic), self)

    def recent(self, max_age_s: float) -> bool:
        """Whether a changelog read yielded a record within `max_age_s`."""
        return self._clock() - self.last_read < max_age_s

    def timed(self, records: Iterator[Record]) -> Iterator[Record]:
        """`records`, noting the time of each."""
        for record in records:
            self.last_read = self._clock()
            yield record


class _TimedReader:
    """A ChangelogReader whose catch_up() and older() note their progress; anything else is
    the reader's."""

    def __init__(self, reader: Any, progress: RestoreProgress) -> None:
        self._reader, self._progress = reader, progress

    def catch_up(self, *args: Any, **kwargs: Any) -> Iterator[Record]:
        return self._progress.timed(self._reader.catch_up(*args, **kwargs))

    def older(self, *args: Any, **kwargs: Any) -> Iterator[Record]:
        return self._progress.timed(self._reader.older(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)
