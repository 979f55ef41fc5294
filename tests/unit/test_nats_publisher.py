"""JetStreamPublisher's loop thread: what close() leaves behind."""

from __future__ import annotations

import asyncio

from cdc_router.nats.publisher import JetStreamPublisher


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
