"""SIGHUP in every long-running process (`run`, `relay`, `status --watch/--serve`,
`dedup purge --every`, an idempotent consumer): logged and ignored.

None of them reloads anything: each reads its config at start. SIGHUP's default (`systemctl
reload`, a closed terminal) ended the process at once, mid-batch, with no line (QA 54-a F-3,
review 54-k F-2); a reload a user expects but does not get must be said, and the process goes
on. SIGTERM and SIGINT stay each process's own (finish the batch, commit, leave).
"""

from __future__ import annotations

import logging
import signal
from types import FrameType


def refuse_reload(logger: logging.Logger) -> None:
    """Have SIGHUP log `event=sighup_ignored` on `logger` and change nothing."""

    def refuse(signum: int, frame: FrameType | None) -> None:
        logger.warning(
            "event=sighup_ignored detail=%r", "the config is read at start: this signal "
            "reloads nothing and the process goes on; stop it (SIGTERM) and start it again "
            "to apply a change")

    signal.signal(signal.SIGHUP, refuse)
