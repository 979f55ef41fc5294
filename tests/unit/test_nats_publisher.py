"""JetStreamPublisher's loop thread: what close() leaves behind; its size check."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from cdc_router.errors import JetStreamRefused
from cdc_router.nats.publisher import JetStreamPublisher, NatsMessage


def test_close_ends_the_tasks_left_on_its_loop_and_closes_the_loop() -> None:
    # nats-py's close() cancels its subscriptions' readers without waiting for them; a loop
    # stopped with such a task pending warned when the task was collected (CI rehearsals 4-8).
    publisher = JetStreamPublisher("nats://127.0.0.1:1", ack_timeout_s=1, connect_timeout_s=1)
    loop = publisher._started()

    async def start_reader() -> asyncio.Task[bool]:
        return asyncio.get_running_loop().create_task(asyncio.Event().wait())

    reader = asyncio.run_coroutine_threadsafe(start_reader(), loop).result(timeout=5)
    publisher.close()
    assert reader.cancelled()
    assert loop.is_closed()
    publisher.close()  # a second close does nothing


def test_a_message_over_the_servers_max_payload_with_its_headers_is_refused_unsent() -> None:
    # QA 54-d F-1: nats-py checks the data alone; the server closed the connection on it.
    publisher = JetStreamPublisher("nats://127.0.0.1:1", ack_timeout_s=1, connect_timeout_s=1)
    publisher._client = SimpleNamespace(max_payload=200)
    fits = NatsMessage("a.b", b"x" * 100, {"h": "v"}, "id-1")
    publisher._oversize([fits])  # 100 + 12 + 11 + 4 + 4 + 1 + 1 + 4 = 137 bytes
    over = NatsMessage("a.b", b"x" * 150, {"event-type": "y" * 20}, "id-2")
    with pytest.raises(JetStreamRefused) as refused:
        publisher._oversize([fits, over])
    assert list(refused.value.refused) == [1]
    assert "the 215-byte message (headers and data) for a.b: over the server's max_payload " \
           "(200)" in refused.value.refused[1]
