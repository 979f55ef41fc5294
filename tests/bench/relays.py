"""Polling relays, the alternative to log-based capture, for the side-by-side benchmark only.

    python -m tests.bench.relays naive|tuned --dsn DSN --table public.t --topic T --bootstrap B

Each runs as a process of its own (as a relay would be deployed) until SIGTERM, and delivers
at least once: a row is marked or deleted only in the transaction that commits after its
records were acknowledged by Kafka.

- naive: what a first outbox relay usually looks like. Every 500 ms: `SELECT ... WHERE NOT
  published ORDER BY created_at LIMIT 100`, produce each row, flush, then one
  `UPDATE ... SET published = true` per row. At most 200 rows/s, whatever the load.
- tuned: polls again at once while batches come back full (2,000 rows), otherwise every 20 ms;
  takes and removes a batch in one statement (`DELETE ... RETURNING`), produces it in one go
  and commits after the flush.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from psycopg import sql

from cdc_router.postgres import table_identifier

NAIVE_TICK_S = 0.5
NAIVE_LIMIT = 100
TUNED_BATCH = 2000
TUNED_IDLE_S = 0.02  # an empty outbox is asked 50 times a second: cheap for Postgres


class RelayProducer:
    """A producer whose first delivery error is raised by flush(), never swallowed."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                   "linger.ms": 5})
        self._topic = topic
        self._failed: KafkaError | None = None

    def _delivered(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None and self._failed is None:
            self._failed = error

    def send(self, rows: Sequence[tuple[Any, str]]) -> None:
        """Produce (id, payload text) rows and wait until Kafka has acknowledged them all."""
        for row_id, payload in rows:
            while True:
                try:
                    self._producer.produce(self._topic, key=str(row_id), value=payload,
                                           on_delivery=self._delivered)
                    break
                except BufferError:
                    self._producer.poll(0.05)
        # 60 s: far above delivery.timeout.ms's share for one batch on a healthy local broker.
        if self._producer.flush(60) > 0:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "records left unsent"))
        if self._failed is not None:
            raise KafkaException(self._failed)


def naive_round(conn: psycopg.Connection[Any], table: sql.Identifier,
                producer: RelayProducer) -> int:
    """One tick of the naive relay; the number of rows it relayed."""
    with conn.transaction():
        rows = conn.execute(sql.SQL(
            "SELECT id, payload::text FROM {} WHERE NOT published ORDER BY created_at LIMIT {}"
        ).format(table, sql.Literal(NAIVE_LIMIT))).fetchall()
        producer.send(rows)
        for row_id, _ in rows:
            conn.execute(sql.SQL("UPDATE {} SET published = true WHERE id = %s").format(table),
                         (row_id,))
    return len(rows)


def tuned_round(conn: psycopg.Connection[Any], table: sql.Identifier,
                producer: RelayProducer) -> int:
    """One batch of the tuned poller; the number of rows it relayed."""
    with conn.transaction():
        rows = conn.execute(sql.SQL(
            "DELETE FROM {0} WHERE id IN (SELECT id FROM {0} ORDER BY created_at LIMIT {1} "
            "FOR UPDATE SKIP LOCKED) RETURNING id, payload::text").format(
            table, sql.Literal(TUNED_BATCH))).fetchall()
        producer.send(rows)
    return len(rows)


def run(kind: str, dsn: str, table_name: str, topic: str, bootstrap: str,
        stop: threading.Event) -> None:
    """Relay rows until `stop` is set."""
    table = table_identifier(table_name)
    producer = RelayProducer(bootstrap, topic)
    with psycopg.connect(dsn) as conn:
        while not stop.is_set():
            if kind == "naive":
                # A tick that ran late is not made up for: no catch-up bursts in a naive relay.
                started = time.monotonic()
                naive_round(conn, table, producer)
                stop.wait(max(0.0, started + NAIVE_TICK_S - time.monotonic()))
            elif tuned_round(conn, table, producer) < TUNED_BATCH:
                stop.wait(TUNED_IDLE_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["naive", "tuned"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--bootstrap", required=True)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run(args.kind, args.dsn, args.table, args.topic, args.bootstrap, stop)


if __name__ == "__main__":
    main()
