"""A tls:// NATS URL asks for TLS as `tls` does (QA 61-b F2: without `tls` in the options,
the consumer sent its password in clear text to a server that did not require TLS)."""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import threading
from collections.abc import Iterator

import pytest

from cdc_router.consumer import JetStreamConsumer, JetStreamSettings
from cdc_router.consumer.dedup import MemoryDedupStore
from cdc_router.errors import ConfigError, JetStreamConsumerError
from cdc_router.nats.connection import require_tls

PLAIN_INFO = b'INFO {"server_id":"fake","version":"2.9.10","headers":true,"proto":1}\r\n'


class FakeServer:
    """A plain-text NATS greeting on a local port; keeps every byte a client sends back."""

    def __init__(self) -> None:
        self.received = bytearray()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            with client:
                client.sendall(PLAIN_INFO)
                client.settimeout(0.5)
                try:
                    while chunk := client.recv(4096):
                        self.received += chunk
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer()
    yield server
    server.close()


def test_a_tls_url_without_tls_options_refuses_a_plain_server(fake: FakeServer) -> None:
    with pytest.raises(ConfigError, match=r"field 'nats.url': the NATS server at tls://127.0.0.1"
                                          r".*does not require TLS.*clear text.*use nats://"):
        asyncio.run(require_tls(f"tls://127.0.0.1:{fake.port}", {}, 2.0))


def test_only_the_tls_servers_of_a_list_are_probed_without_tls_options(
        fake: FakeServer) -> None:
    asyncio.run(require_tls(f"nats://127.0.0.1:{fake.port},nats://127.0.0.1:1", {}, 0.5))
    with pytest.raises(ConfigError, match=r"nats\.url"):
        asyncio.run(require_tls(f"nats://127.0.0.1:1,tls://127.0.0.1:{fake.port}", {}, 0.5))


def test_the_consumer_never_sends_its_password_to_a_plain_server_of_a_tls_url(
        fake: FakeServer) -> None:
    settings = JetStreamSettings(url=f"tls://127.0.0.1:{fake.port}", stream="PAYMENTS",
                                 durable="f", dead_letter_subject="fulfillment.dlq",
                                 connect_timeout_s=2.0,
                                 connect_options={"user": "fulfillment",
                                                  "password": "s3cret-pw"})
    consumer = JetStreamConsumer(settings, MemoryDedupStore(), lambda event, context: None)
    with pytest.raises(JetStreamConsumerError) as raised:
        consumer.run()
    # Review 61-w W-6: the consumer's own parameters, not the router's nats.url / nats.tls.
    assert re.match(r"field 'JetStreamSettings\.url': the NATS server at tls://127\.0\.0\.1:\d+ "
                    r"does not require TLS.*; point JetStreamSettings\.url at the server's TLS "
                    r"listener", str(raised.value)), raised.value
    assert "nats.url" not in str(raised.value) and "nats.tls" not in str(raised.value)
    assert b"s3cret-pw" not in fake.received
    assert b"CONNECT" not in fake.received


def test_the_consumers_refusal_with_tls_options_names_its_connect_options(
        fake: FakeServer) -> None:
    settings = JetStreamSettings(url=f"nats://127.0.0.1:{fake.port}", stream="PAYMENTS",
                                 durable="f", dead_letter_subject="fulfillment.dlq",
                                 connect_timeout_s=2.0,
                                 connect_options={"tls": ssl.create_default_context()})
    consumer = JetStreamConsumer(settings, MemoryDedupStore(), lambda event, context: None)
    with pytest.raises(JetStreamConsumerError) as raised:
        consumer.run()
    text = str(raised.value)
    assert text.startswith("field 'JetStreamSettings.connect_options.tls': "), text
    assert "or remove JetStreamSettings.connect_options.tls" in text, text
    assert "nats.url" not in text and "nats.tls" not in text, text


def test_with_tls_options_the_refusal_still_names_nats_tls(fake: FakeServer) -> None:
    with pytest.raises(ConfigError, match=r"field 'nats.tls'.*remove nats.tls"):
        asyncio.run(require_tls(f"nats://127.0.0.1:{fake.port}",
                                {"tls": ssl.create_default_context()}, 2.0))


def test_tls_handshake_first_needs_no_probe(fake: FakeServer) -> None:
    # Review 61-w W-5: behind a TLS-terminating proxy (TLS first) each server waited its
    # connect timeout for a plain INFO; the client's TLS comes before any word.
    asyncio.run(require_tls(f"tls://127.0.0.1:{fake.port}", {"tls_handshake_first": True}, 2.0))
    assert fake.received == b""
