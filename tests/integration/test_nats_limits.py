"""JetStream publishes at the edges of the server's limits, on a real nats-server with a low
max_payload: a message whose data fits but whose headers and data do not is a dead letter of
its own, never an outage of every batch (QA 54-d F-1)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import nats
import pytest
from nats.js.api import StreamConfig

from cdc_router.errors import JetStreamRefused
from cdc_router.nats.publisher import JetStreamPublisher, NatsMessage
from tests.integration.nats_server import read_stream
from tests.integration.test_nats_auth import _nats_with

pytestmark = pytest.mark.integration

MAX_PAYLOAD = 65536


def _add_stream(url: str, name: str, subjects: list[str]) -> None:
    async def add() -> None:
        client = await nats.connect(url)
        try:
            await client.jetstream().add_stream(StreamConfig(name=name, subjects=subjects))
        finally:
            await client.close()

    asyncio.run(add())


def test_a_message_over_max_payload_by_its_headers_is_refused_alone(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # QA 54-d F-1: data 65,439 bytes, a 65,603-byte message with its headers: nats-py sent it,
    # the server closed the connection, and every batch timed out for ever.
    with _nats_with(tmp_path, f"max_payload: {MAX_PAYLOAD}") as port:
        url = f"nats://127.0.0.1:{port}"
        _add_stream(url, "EDGE", ["edge.>"])
        publisher = JetStreamPublisher(url, ack_timeout_s=3, connect_timeout_s=3,
                                       max_payload_bytes=1024 * 1024)
        big = NatsMessage("edge.x", b"x" * (MAX_PAYLOAD - 100),
                          {"event-type": "x" * 200}, "big-1")
        small = NatsMessage("edge.x", b"{}", {"event-type": "small"}, "small-1")
        try:
            with caplog.at_level(logging.WARNING, logger="cdc_router.nats"), \
                    pytest.raises(JetStreamRefused) as refused:
                publisher.publish_batch([small, big])
            acks = publisher.publish_batch([small])
        finally:
            publisher.close()
        assert list(refused.value.refused) == [1]
        assert f"over the server's max_payload ({MAX_PAYLOAD})" in refused.value.refused[1]
        assert acks.stored == 1
        assert [m.headers["Nats-Msg-Id"] for m in read_stream(url, "EDGE")] == ["small-1"]
        assert f"nats.max_payload_bytes (1048576) is above the max_payload of the NATS " \
               f"server at {url} ({MAX_PAYLOAD})" in caplog.text
