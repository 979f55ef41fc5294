"""The JetStream consumer's start on a real nats-server: what it refuses before a durable
delivers anything. Only NATS is needed (the dedup store is the in-memory one)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import nats
import pytest

from cdc_router.consumer.dedup.memory import MemoryDedupStore
from cdc_router.consumer.jetstream import JetStreamConsumer
from cdc_router.consumer.jetstream_settings import JetStreamSettings
from cdc_router.consumer.jetstream_setup import subscribe
from cdc_router.errors import JetStreamConsumerError
from tests.integration.nats_server import nats_server
from tests.integration.test_nats_consumer import Streams

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with nats_server(tmp_path_factory.mktemp("nats-home")) as server:
        yield server.url


@pytest.fixture
def payments(nats_url: str) -> Iterator[JetStreamSettings]:
    """Settings of a durable filtering two subjects of a fresh stream of payments."""
    streams = Streams(nats_url)
    yield JetStreamSettings(url=nats_url, stream=streams.stream, durable="two",
                            dead_letter_subject=streams.dead_letter_subject,
                            filter_subjects=(f"{streams.prefix}.payments.a",
                                             f"{streams.prefix}.payments.b"))
    streams.delete()


async def _server(settings: JetStreamSettings, action: Any) -> Any:
    client = await nats.connect(settings.url)
    try:
        return await action(client)
    finally:
        await client.close()


def _version(settings: JetStreamSettings) -> tuple[int, int]:
    async def version(client: Any) -> tuple[int, int]:
        return client.connected_server_version.major, client.connected_server_version.minor
    result: tuple[int, int] = asyncio.run(_server(settings, version))
    return result


def _durables(settings: JetStreamSettings) -> list[str]:
    async def names(client: Any) -> list[str]:
        infos = await client.jetstream().consumers_info(settings.stream)
        return [info.name for info in infos]
    result: list[str] = asyncio.run(_server(settings, names))
    return result


def test_several_filter_subjects_stop_run_on_a_server_before_2_10(
        payments: JetStreamSettings) -> None:
    # QA 49-a F8: on Debian's nats-server 2.9.10 the durable was made with no filter, and the
    # handler ran on every message of the stream.
    consumer = JetStreamConsumer(payments, MemoryDedupStore(), lambda event, conn: None)
    if _version(payments) >= (2, 10):
        pytest.skip("this nats-server knows filter_subjects")
    watchdog = threading.Timer(10, consumer.stop)  # before the fix it consumed for ever
    watchdog.start()
    try:
        with pytest.raises(JetStreamConsumerError) as stopped:
            consumer.run()
    finally:
        watchdog.cancel()
    assert str(stopped.value).startswith(
        "JetStreamSettings: field 'filter_subjects': 2 subjects (")
    assert "need nats-server 2.10 or later, and the server's version is 2." in str(stopped.value)
    assert _durables(payments) == []


def test_a_durable_the_server_made_without_the_filters_is_deleted_again(
        payments: JetStreamSettings) -> None:
    # The version not known beforehand: what the real server answers for the durable decides.
    async def start(client: Any) -> Any:
        return await subscribe(client.jetstream(), payments)

    if _version(payments) >= (2, 10):
        asyncio.run(_server(payments, start))
        assert _durables(payments) == ["two"]
        return
    with pytest.raises(JetStreamConsumerError, match=r"the server created durable 'two' that "
                       r"filters the whole stream, .* and it was deleted again$"):
        asyncio.run(_server(payments, start))
    assert _durables(payments) == []
