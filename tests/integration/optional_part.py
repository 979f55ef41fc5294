"""An optional part of the local stack (nats-server, the schema registry) run alone under a
test's home: started by the stack's own code on a free port, stopped by its pid (never by
name); start() again keeps its data, so a test can take it down and bring it back."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from cdc_router.local import process, stack
from cdc_router.local.config import Part, StackConfig


class OptionalPart:
    """One optional part under `config.home`."""

    def __init__(self, config: StackConfig, part: Part) -> None:
        self.config = config
        self.part = part

    def start(self) -> None:
        stack.up_alone(self.config, self.part, lambda line: None)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop it by its pid (never by name)."""
        pid = process.read_pid(self.config.pid_path(self.part))
        if pid is not None:
            process.stop(pid, str(self.config.home), sig=sig)


P = TypeVar("P", bound=OptionalPart)


@contextmanager
def running(server: P) -> Iterator[P]:
    """`server` started, and stopped at the end."""
    server.start()
    try:
        yield server
    finally:
        server.stop()
