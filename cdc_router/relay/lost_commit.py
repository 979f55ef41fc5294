"""A commit Kafka acknowledged, then lost, as the relay meets it (review 59-r F-2).

Kafka 4.3, a single node kill -9'd right after it acknowledged a transaction's commit, may
complete that transaction without its markers; the next transaction's abort then takes the
batch's records, marks and position record (router/lost_commits.py, chaos 58). The relay's
position in memory is past the batch by then: reading on from it, the relay never read the
batch's rows again.

So, exactly once, after an aborted batch (only once a batch committed since the last read: a
later abort reads nothing) and when a new producer starts, the relay reads its stored position
back before the next batch. It holds its table's lock, and its transactional id fences any
other writer of that record, so a stored position other than the one it committed last means
the commit was lost: `event=commit_lost`, the replay filter reads the dedup changelog and
forgets the ids of its own commits whose marks it lacks (as the router's, and only those), and
the relay reads on from the stored position. At least once has no transaction whose markers
Kafka could lose (and a failed batch may have stored its position): no check.

The rows must still be there to be read again: exactly once, the relay hands the cleanup a
batch's rows once the next commit (its markers on the position's partition commit the batch
before's too) or a read-back (the next abort, an idle poll once the batch waited
HELD_READ_BACK_S, a graceful stop) confirmed the batch; a lost one's are never handed (review
60-v F-2: left to the sweep alone, they waited after each start for a read of the whole
changelog).
"""

from __future__ import annotations

import logging
import time

from cdc_router.config.model import RouterConfig
from cdc_router.relay.guard import RelayPosition
from cdc_router.router.values import Delivered

log = logging.getLogger("cdc_router.relay")

_LOST_HINT = ("Kafka lost a commit it had acknowledged (or the position record was changed "
              "by hand): the replay filter forgets the ids whose marks the dedup changelog "
              "lacks, and the rows after the stored position are read and delivered again")


# An idle relay reads its position back for the batch it holds once the batch waited this long
# for a next commit: a low-rate stream's next commit confirms it sooner, with no read (one takes
# about 0.8 s, which the next row would wait).
HELD_READ_BACK_S = 5.0
# The longest a graceful stop reads its position back for the batch it holds (QA 61-a F-1:
# with Kafka down, TopicReader's lookups took ~31 s, past Kubernetes' default 30 s
# terminationGracePeriodSeconds, and the stop was SIGKILLed). A read-back takes about 0.8 s on
# a healthy cluster; given up, the stop says so (event=stop_read_back_failed) and the rows stay.
# The lookups take at least a second each, so the read may overrun this by a few seconds. Not
# 5 s: a position topic created before its segment.ms (5271a71) took up to ~4.4 s to read on an
# idle stack (review 61-w W-4), and a stop past the bound leaves its batch's rows.
STOP_READ_BACK_S = 10.0


class CommittedPosition:
    """The position this relay committed last, and whether it was read back since."""

    def __init__(self, *, checks: bool) -> None:
        """`checks`: exactly once; at least once nothing is kept, and nothing is lost()."""
        self._checks = checks
        self._last: RelayPosition | None = None
        self.unconfirmed = False
        self.held: list[Delivered] = []  # the last commit's, for the cleanup once confirmed
        self._held_at = 0.0  # monotonic time of the held batch's commit

    def committed(self, position: RelayPosition, delivered: list[Delivered]) -> list[Delivered]:
        """A batch committed `position` and `delivered`: the next abort reads it back. What
        the cleanup may delete now: exactly once, the batch before's (this commit's markers
        on the position's partition confirm it), this one's held until the next commit or a
        read-back (review 60-v F-2: the sweep alone took a whole changelog read after each
        start); at least once, this one's."""
        if not self._checks:
            return delivered
        confirmed, self.held, self._held_at = self.held, delivered, time.monotonic()
        self._last, self.unconfirmed = position, True
        return confirmed

    def overdue(self) -> bool:
        """Whether the held batch waited HELD_READ_BACK_S for a next commit (to read back)."""
        return bool(self.held) and time.monotonic() - self._held_at >= HELD_READ_BACK_S

    def lost(self, stored: RelayPosition, table: str) -> bool:
        """Whether `stored`, read back, is not the position this relay committed last: Kafka
        lost that commit; if so, said in the log (each time: confirm() ends it)."""
        last = self._last
        if last is None or stored.same(last):
            return False
        self.held = []  # read again and delivered again: their rows must stay until then
        log.warning("event=commit_lost table=%s committed=%s this_relay=%s hint='%s'", table,
                    stored.to_json().decode(), last.to_json().decode(), _LOST_HINT)
        return True

    def unconfirmed_at_stop(self, table: str, failure: Exception, config: RouterConfig) -> None:
        """A graceful stop could not read the position back (Kafka, or the lock lost): the
        held batch's rows are not handed to the cleanup; said, with where they go (before, not
        a word: review 60-v). Nothing held (none, or a loss found: read again at the next
        start), nothing said (review 61-v T-1)."""
        if config.cleanup.mode == "none" or not self.held:
            return
        after = "the cleanup's sweep deletes those whose marks the dedup changelog holds" \
            if config.cleanup_sweeps() else "without dedup there is no sweep: those " \
            "delivered stay until `cdc-router outbox purge --older-than D --force` (README, " \
            "Guarantees)"
        log.warning("event=stop_read_back_failed table=%s rows=%d error=%r: the stop could not "
                    "read the relay position back to confirm the last batch, so its rows were "
                    "not handed to the cleanup and stay in the table; the relay that reads the "
                    "table next goes on from the stored position, which delivers again the rows "
                    "of a batch Kafka lost, and %s", table, len(self.held), str(failure), after)

    def confirm(self, stored: RelayPosition) -> list[Delivered]:
        """`stored` is the position to go on from (read back, a lost commit dealt with); the
        deliveries it confirms, for the cleanup."""
        confirmed, self.held = self.held, []
        if self._checks:
            self._last, self.unconfirmed = stored, False
        return confirmed
