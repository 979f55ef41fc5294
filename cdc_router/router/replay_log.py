"""The lines of replays the router and the relay drop: at most SAID_PER_MINUTE a minute, each
naming its id (QA 44-a: an id the application reused was dropped without a word), then one
line saying that the rest of the minute's are counted only (QA 47-d F2: an `outbox republish`
of 37,500 delivered rows, each dropped as a replay, wrote 41,993 lines in 20 s).

The WARNING of a dropped replay of a dead-lettered id (a republish that delivered nothing: its
letter does) has a cap of its own, WARNED_PER_MINUTE, and the first line of the next minute
says how many it left out (review 53-c F17: behind 100 ordinary lines it was not said at all).

A run of replays past the cap (a re-snapshot: 40,000 rows) is summed up in one line, at the first
record after it that is not a replay and at each minute's turn while it goes on (QA 64-a F-9:
the log never said how many a re-snapshot dropped, only the metric did); at most
SUMMED_PER_MINUTE such lines a minute besides the turn's: replays alternating with new events
(an incremental snapshot or a republish under live writes) would otherwise say one line each
(review 65: 9,900 in 50 s); what is held back is said at the minute's turn, with the replays
after it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cdc_router.errors import show
from cdc_router.router.replay import ReplayFilter

log = logging.getLogger("cdc_router.router")

SAID_PER_MINUTE = 100
WARNED_PER_MINUTE = 100
SUMMED_PER_MINUTE = 10  # runs' summaries; a few runs (two tables' re-snapshots) said at once
# A run whose last replay is this old while the router reads nothing is over (review 65: it
# was said only at the next record, which may come hours later). Longer than Debezium's pauses
# within a snapshot, a poll of 20 ms (connectors/outbox-connector.json) and a batch's commit.
RUN_IDLE_S = 5.0


class ReplayLines:
    def __init__(self, replay: ReplayFilter | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._replay = replay
        self._clock = clock
        self._since = clock()
        self._said = self._warned = self._unwarned = 0
        # The replays of the run going on (0: none), and those of them said by count only;
        # a run held back (a summary said this minute already) goes on counting.
        self.run = self._unsaid = 0
        self._run_since = self._since
        self._summed = 0  # runs' summaries said this minute, besides the turn's
        self._last = self._since  # the run's last replay

    def read(self, replay: bool) -> None:
        """A record was read: one that is no `replay` ends the run going on (run_ended)."""
        if self.run and not replay:
            self.run_ended()

    def run_ended(self) -> None:
        """A record that is no replay came after `run` replays: summed up if lines were capped,
        unless SUMMED_PER_MINUTE were this minute: then at the minute's turn (the caller calls
        again at each record while `run` is not 0)."""
        if not self._unsaid:
            self.run = 0
            return
        now = self._clock()
        if now - self._since >= 60:
            self._turn(now, "ended")
        elif self._summed < SUMMED_PER_MINUTE:
            self._sum_up("ended")
            self._summed += 1

    def idle(self) -> None:
        """Nothing was read: a run whose last replay is RUN_IDLE_S old has ended."""
        if self.run and self._clock() - self._last >= RUN_IDLE_S:
            self.run_ended()

    def dropped(self, event_id: str, where: str) -> None:
        """One replay dropped: its line, while the minute has room for it."""
        now = self._last = self._clock()
        if now - self._since >= 60:
            self._turn(now, "goes on")
        if not self.run:
            self._run_since = now
        self.run += 1
        if self._replay is not None and self._replay.dead_lettered(event_id):
            self._warn(event_id, where)
            return
        if self._said >= SAID_PER_MINUTE:
            self._unsaid += 1
            return
        self._said += 1
        log.info("event=replay_dropped id=%s %s", show(event_id), where)
        if self._said == SAID_PER_MINUTE:
            log.info("event=replay_lines_capped per_minute=%d: the rest of this minute's "
                     "replays are counted, and their number said when the run ends",
                     SAID_PER_MINUTE)

    def _turn(self, now: float, how: str) -> None:
        """The minute's turn: the count it held back, the warnings it left out; lines anew."""
        if self._unsaid:  # a run longer than the minute, or one held back: its count so far
            self._sum_up(how)
        if self._unwarned:
            log.warning("event=replay_warnings_left_out count=%d: the last minute dropped "
                        "that many more replays of dead-lettered ids than it said; "
                        "`cdc-router dlq replay` delivers their letters", self._unwarned)
        self._since, self._said, self._warned, self._unwarned = now, 0, 0, 0
        self._summed = 0

    def _sum_up(self, how: str) -> None:
        log.info("event=replays_dropped count=%d unsaid=%d seconds=%d run=%s: that many "
                 "replays of delivered ids dropped since the first of them (a re-snapshot or "
                 "a republish), the unsaid ones past the lines' cap", self.run, self._unsaid,
                 self._clock() - self._run_since, how)
        self.run = self._unsaid = 0

    def _warn(self, event_id: str, where: str) -> None:
        # QA 48-a F-med-3: an `outbox republish` of a dead-lettered row, after the rules
        # were fixed, was dropped as a replay: its letter is what delivers it.
        if self._warned >= WARNED_PER_MINUTE:
            self._unwarned += 1
            return
        self._warned += 1
        log.warning("event=replay_dropped id=%s %s: the id was dead-lettered; unless a "
                    "`dlq replay` delivered it since, `cdc-router dlq replay --id %s` "
                    "delivers its letter (one without its value, for size, from its raw "
                    "record while the raw topic keeps it; if that is gone, the replay says "
                    "what to do)", show(event_id), where, show(event_id))
        if self._warned == WARNED_PER_MINUTE:
            log.warning("event=replay_warnings_capped per_minute=%d: the rest of this minute's "
                        "replays of dead-lettered ids are counted, and their number said at "
                        "the next minute's first replay", WARNED_PER_MINUTE)
