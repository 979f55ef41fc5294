"""SIGHUP in every long-running process (`run`, `relay`, `status --watch/--serve`,
`dedup purge --every`, an idempotent consumer): logged and ignored.

None of them reloads anything: each reads its config at start. SIGHUP's default (`systemctl
reload`, a closed terminal) ended the process at once, mid-batch, with no line (QA 54-a F-3,
review 54-k F-2); a reload a user expects but does not get must be said, and the process goes
on. SIGTERM and SIGINT stay each process's own (finish the batch, commit, leave).

Before that process exists (`run`'s and `relay`'s imports and start checks take seconds),
SIGTERM and SIGINT are held: the first is remembered and the command ends, exit 0, instead of
starting (stopped_early); a second one ends it at once, exit 128 + the signal. Their default
action killed it there, exit -15 and no line (fixer 63).
"""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType


def refuse_reload(logger: logging.Logger) -> None:
    """Have SIGHUP log `event=sighup_ignored` on `logger` and change nothing."""

    def refuse(signum: int, frame: FrameType | None) -> None:
        logger.warning(
            "event=sighup_ignored detail=%r", "the config is read at start: this signal "
            "reloads nothing and the process goes on; stop it (SIGTERM) and start it again "
            "to apply a change")

    signal.signal(signal.SIGHUP, refuse)


_held: list[int] = []  # the stop signals received while held


def hold_stop_signals() -> None:
    """From now until the command's process takes them over (cli/run.run_until_stopped),
    remember a SIGTERM or SIGINT; a second one ends the program at once."""

    def held(signum: int, frame: FrameType | None) -> None:
        if _held:
            sys.exit(128 + signum)  # asked twice: do not wait for the start's checks
        _held.append(signum)

    signal.signal(signal.SIGTERM, held)
    signal.signal(signal.SIGINT, held)


def stopped_early() -> str | None:
    """The name of the stop signal held before the process existed, or None."""
    return signal.Signals(_held[0]).name if _held else None
