"""A real nats-server (Debian's) with JetStream for tests, started by the local stack's own
code on a free port under a home of the test's, stopped by its pid; and a stream reader."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nats

from cdc_router.local import process, stack
from cdc_router.local.config import StackConfig
from tests.integration.redis_server import free_port


class NatsServer:
    """nats-server with JetStream under `home`, on a free port; start() again keeps its store."""

    def __init__(self, home: Path) -> None:
        self.config = StackConfig(home=home.resolve(), jar_cache=home / "jars",
                                  nats_port=free_port())
        self.url = self.config.nats_url

    def start(self) -> None:
        stack.up_nats(self.config, lambda line: None)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop the server by its pid (never by name)."""
        pid = process.read_pid(self.config.pid_path("nats"))
        if pid is not None:
            process.stop(pid, str(self.config.home), sig=sig)


@contextmanager
def nats_server(home: Path) -> Iterator[NatsServer]:
    """A started NatsServer under `home`, stopped at the end."""
    server = NatsServer(home)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def read_stream(url: str, stream: str, timeout_s: float = 5.0, **options: Any) -> list[Any]:
    """Every message stored in `stream`, first to last (a pull consumer of our own);
    `options`: nats.connect() keywords (credentials, TLS)."""

    async def read() -> list[Any]:
        client = await nats.connect(url, **options)
        try:
            js = client.jetstream()
            total = (await js.stream_info(stream)).state.messages
            subscription = await js.pull_subscribe("", stream=stream)
            messages: list[Any] = []
            while len(messages) < total:
                batch = await subscription.fetch(min(500, total - len(messages)),
                                                 timeout=timeout_s)
                for message in batch:
                    await message.ack()
                messages += batch
            return messages
        finally:
            await client.close()

    return asyncio.run(read())
