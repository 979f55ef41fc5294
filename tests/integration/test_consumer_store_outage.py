"""The idempotent consumer's lines while its Postgres dedup store is away, on the real stack:
one warning when the outage starts, one line when it ends, not one per partition per retry
(QA 61-b F6: 55 warnings in 12 s on 4 partitions). The outage is a proxy in front of the
stack's Postgres that drops its connections and refuses new ones, so the stack is untouched."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import suppress

import pytest
from confluent_kafka import Producer
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdc_router.consumer import ConsumerSettings, IdempotentConsumer, RetryPolicy
from cdc_router.consumer.dedup.postgres import PostgresDedupStore
from tests.integration.support import StackEndpoints, free_port, unique
from tests.integration.test_idempotent_consumer import (  # noqa: F401 (fixtures)
    schema,
    topics,
    wait_until,
)

pytestmark = pytest.mark.integration


class Proxy:
    """A TCP proxy to (host, port) on a free local port of the tests' range (support.py);
    down() drops every connection and closes the listener (connection refused), up() listens
    again on the same port."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self.port = free_port()
        self.up()

    def up(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port))
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with suppress(OSError):  # wakes the accept (close alone leaves it listening)
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            for sock in self._open:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            with self._lock:
                self._open += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with suppress(OSError):
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@pytest.fixture
def proxy(stack: StackEndpoints) -> Iterator[Proxy]:
    target = conninfo_to_dict(stack.postgres_dsn)
    through = Proxy(str(target.get("host", "127.0.0.1")), int(target.get("port", 5432)))
    yield through
    through.down()


def test_a_store_outage_is_one_warning_when_it_starts_and_one_line_when_it_ends(
        stack: StackEndpoints, schema: str, topics: tuple[str, str],  # noqa: F811
        proxy: Proxy,
        caplog: pytest.LogCaptureFixture) -> None:
    topic, dead_letter = topics
    dsn = make_conninfo(stack.postgres_dsn, host="127.0.0.1", port=str(proxy.port),
                        connect_timeout="2")
    store = PostgresDedupStore(dsn, table=f"{schema}.dedup")
    store.ensure_schema()
    settings = ConsumerSettings(
        bootstrap_servers=stack.bootstrap_servers, group_id=unique("outage"), topics=(topic,),
        dead_letter_topic=dead_letter,
        retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.05, max_backoff_s=0.5))
    done: list[str] = []
    consumer = IdempotentConsumer(settings, store, lambda event, conn: done.append(event.event_id))
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers})

    def produce(prefix: str) -> None:
        for partition in range(4):
            for n in range(3):
                event_id = f"{prefix}-{partition}-{n}".encode()
                producer.produce(topic, key=event_id, value=b"{}", partition=partition,
                                 headers=[("id", event_id)])
        producer.flush(30)

    runner = threading.Thread(target=consumer.run)
    with caplog.at_level(logging.DEBUG, logger="cdc_router.consumer"):
        runner.start()
        try:
            produce("before")
            wait_until(lambda: len(set(done)) == 12, 120, "the records before the outage")
            proxy.down()
            produce("during")
            # Every partition's first record meets the outage and is retried (0.5 s at most).
            wait_until(lambda: caplog.text.count("reason=store_failed") >= 12, 60, "retries")
            time.sleep(4)
            proxy.up()
            wait_until(lambda: len(set(done)) == 24, 120, "the records after the outage")
        finally:
            consumer.stop()
            runner.join(60)
            store.close()
    said = [(r.levelno, r.getMessage()) for r in caplog.records
            if r.name.startswith("cdc_router.consumer") and r.levelno >= logging.INFO
            and "store" in r.getMessage()]
    warnings = [message for level, message in said if level >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("event=dedup_store_unavailable store=PostgresDedupStore ")
    assert "retried without limit" in warnings[0]
    ended = [message for _, message in said if "dedup_store_recovered" in message]
    assert len(ended) == 1, said
