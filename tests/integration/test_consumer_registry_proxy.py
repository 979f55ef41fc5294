"""The consumer library behind an HTTP proxy that wants credentials (407, an HTML page) before
the schema registry, on the real stack (rv66): run() ends at once with one short line naming
the proxy variables, nothing acknowledged or dead-lettered; before, the line carried the page."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from cdc_router.consumer import ConsumedEvent, ConsumerSettings, IdempotentConsumer
from cdc_router.consumer.dedup import MemoryDedupStore
from cdc_router.consumer.event import RegistryRefused
from cdc_router.serde.decode import PayloadDecoder
from tests.integration.support import StackEndpoints, read_topic, unique
from tests.integration.test_consumer_registry import wire_format
from tests.integration.test_idempotent_consumer import (
    offsets,
    produce,
    topic_and_dead_letter_topic,
)

pytestmark = pytest.mark.integration

PAGE = b"<!DOCTYPE html>\n<html><head><title>407 Proxy Authentication Required</title></head>\n" \
    + b"<body>" + b"x" * 4000 + b"</body></html>\n"


class _Proxy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(407)
        self.send_header("Proxy-Authenticate", 'Basic realm="proxy"')
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def proxy() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_proxys_407_ends_run_with_one_line_naming_the_proxy_variables(
        stack: StackEndpoints, proxy: str) -> None:
    with topic_and_dead_letter_topic(stack.bootstrap_servers, "behind_proxy", 1) as (
            topic, dead_letter):
        produce(stack.bootstrap_servers, topic,
                [(f"evt-{i}".encode(), wire_format(1, f"pay-{i}"), 0) for i in range(3)])
        decoder = PayloadDecoder(registry=SchemaRegistryClient({"url": proxy}))
        effects: list[ConsumedEvent] = []
        group = unique("proxied")
        consumer: IdempotentConsumer[None] = IdempotentConsumer(
            ConsumerSettings(bootstrap_servers=stack.bootstrap_servers, group_id=group,
                             topics=(topic,), dead_letter_topic=dead_letter),
            MemoryDedupStore(), lambda event, _: effects.append(event),
            decoder=lambda raw: decoder.decode(raw or b"").value)
        with pytest.raises(RegistryRefused) as refused:
            consumer.run()
        committed, _ = offsets(stack.bootstrap_servers, group, topic, 1)
        letters = read_topic(stack.bootstrap_servers, dead_letter, 1, timeout_s=5)
    text = str(refused.value)
    assert "wants credentials of its own (HTTP 407 Proxy Authentication Required)" in text, text
    assert "HTTPS_PROXY" in text and "NO_PROXY" in text
    assert len(text) < 600 and "\n" not in text and "xxxx" not in text, text
    assert refused.value.exit_code == 1
    assert effects == [] and letters == [] and committed[0] in (-1001, 0)
