"""A real nats-server (Debian's) with JetStream for tests, started by the local stack's own
code on a free port under a home of the test's, stopped by its pid; and a stream reader."""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import nats

from cdc_router.local.config import StackConfig
from tests.integration.optional_part import OptionalPart, running
from tests.integration.support import free_port


class NatsServer(OptionalPart):
    """nats-server with JetStream under `home`, on a free port; start() again keeps its store."""

    def __init__(self, home: Path) -> None:
        super().__init__(StackConfig(home=home.resolve(), jar_cache=home / "jars",
                                     nats_port=free_port()), "nats")
        self.url = self.config.nats_url


def nats_server(home: Path) -> AbstractContextManager[NatsServer]:
    """A started NatsServer under `home`, stopped at the end."""
    return running(NatsServer(home))


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
