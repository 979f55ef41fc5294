"""Fulfillment: ships an order once per payment-confirmed event, however often it arrives.

The consumer half of the outbox demo. The router delivers each PaymentConfirmed event at
least once to the consumer (key = event id, value = the outbox payload as JSON, e.g.
{"order_id": "42", "amount": "19.90"}); this service inserts one shipment per event id.
The shipment row and the dedup row commit in one Postgres transaction, so a crash, a retry
or a redelivery never ships twice, and the offset is committed only after that commit.

    python -m cdc_router.examples.fulfillment --bootstrap 127.0.0.1:19092 \\
        --dsn postgresql://postgres:postgres@127.0.0.1:15432/postgres \\
        --topic payments.confirmed

The same service on NATS JetStream (a durable pull consumer `--durable`, default the group;
the dead-letter subject must be in a stream):

    python -m cdc_router.examples.fulfillment --nats-url nats://127.0.0.1:14222 \\
        --dsn postgresql://postgres:postgres@127.0.0.1:15432/postgres \\
        --stream PAYMENTS --subject payments.confirmed --dead-letter-subject fulfillment.dlq

SIGTERM or Ctrl-C stops it gracefully: the record in hand finishes, offsets are committed
(on JetStream: the rest of the fetched batch is naked for redelivery).
`--fail-after-write RATE` makes the handler raise after its insert on a share of first
attempts (of the first `--failing-attempts N` attempts), to watch the rollback and the retry
do their work.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import signal
import sys
from typing import Any

import psycopg
from psycopg import sql

from cdc_router.consumer import (
    ConsumedEvent,
    ConsumerSettings,
    IdempotentConsumer,
    JetStreamConsumer,
    JetStreamSettings,
    RetryPolicy,
)
from cdc_router.consumer.dedup.postgres import PostgresDedupStore
from cdc_router.errors import CdcRouterError
from cdc_router.postgres import table_identifier
from cdc_router.serde.json import parse_json
from cdc_router.signals import refuse_reload

log = logging.getLogger("fulfillment")


class InjectedFailure(RuntimeError):
    """Raised on purpose after the shipment insert (--fail-after-write)."""


def decode_payment(raw: bytes | None) -> dict[str, Any]:
    """The payment-confirmed payload; one without an order id is malformed (dead-lettered)."""
    payload = parse_json(raw or b"")  # UTF-8 JSON only, bounded nesting
    if not isinstance(payload, dict) or not payload.get("order_id"):
        raise ValueError("payment-confirmed payload has no order_id")
    return payload


SHIPMENT_COLUMNS = ("order_id", "event_id", "amount")  # what Fulfillment inserts


def create_shipments_table(dsn: str, table: str) -> None:
    """The effect table. No unique constraint on event_id on purpose: dedup is the store's job.
    A table of that name without the columns the service inserts is refused here (review 50-b
    F5: IF NOT EXISTS kept another example's `shipments`, every insert failed and each event
    was dead-lettered, while the demo said it shipped 0 and exited 0)."""
    # Another replica may create it at the same moment: IF NOT EXISTS is not atomic.
    raced = (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable)
    with psycopg.connect(dsn, autocommit=True) as conn:
        with contextlib.suppress(*raced):
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, order_id text NOT NULL,"
                " event_id text NOT NULL, amount text, shipped_at timestamptz NOT NULL DEFAULT"
                " now())").format(table_identifier(table)))
        found = {row[0] for row in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
            "AND NOT attisdropped", (table_identifier(table).as_string(conn),))}
    if missing := [column for column in SHIPMENT_COLUMNS if column not in found]:
        raise CdcRouterError(
            f"fulfillment: table {table} exists without column(s) {', '.join(missing)}, which "
            f"the service inserts ({', '.join(SHIPMENT_COLUMNS)}): another program's table of "
            "that name? drop it, or give another --shipments-table")


class Fulfillment:
    """The handler: one shipment row per event, written in the dedup transaction."""

    def __init__(self, table: str, fail_after_write: float = 0.0,
                 rng: random.Random | None = None, failing_attempts: int = 1) -> None:
        self._insert = sql.SQL(
            "INSERT INTO {} (order_id, event_id, amount) VALUES (%s, %s, %s)").format(
                table_identifier(table))
        self._fail_after_write = fail_after_write
        self._failing_attempts = failing_attempts
        self._rng = rng or random.Random()

    def ship_order(self, event: ConsumedEvent, conn: psycopg.Connection[Any]) -> None:
        """Insert the shipment with `conn`: it commits with the dedup row, or not at all."""
        payload = event.payload
        conn.execute(self._insert, (payload["order_id"], event.event_id, payload.get("amount")))
        if event.attempt <= self._failing_attempts and \
                self._rng.random() < self._fail_after_write:
            raise InjectedFailure(f"injected failure after shipping {event.event_id}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--bootstrap", help="Kafka bootstrap servers")
    source.add_argument("--nats-url", help="NATS server URL: consume JetStream instead")
    parser.add_argument("--dsn", required=True, help="Postgres connection string")
    parser.add_argument("--topic", action="append", default=[],
                        help="Kafka: payment-confirmed topic (repeatable)")
    parser.add_argument("--group", default="fulfillment", help="consumer group id")
    parser.add_argument("--dead-letter-topic", default="fulfillment.dlq")
    parser.add_argument("--stream", help="JetStream: the stream to consume")
    parser.add_argument("--durable", help="JetStream: durable consumer name (default: --group)")
    parser.add_argument("--subject", action="append", default=[],
                        help="JetStream: filter subject (repeatable; default: the whole stream)")
    parser.add_argument("--dead-letter-subject", default="fulfillment.dlq")
    parser.add_argument("--ack-wait", type=float, default=30.0,
                        help="JetStream: seconds before an unacked message is redelivered")
    parser.add_argument("--shipments-table", default="public.shipments")
    parser.add_argument("--dedup-table", default="public.cdc_router_dedup")
    parser.add_argument("--max-attempts", type=int, default=5)
    parser.add_argument("--commit-interval", type=float, default=1.0,
                        help="seconds between offset commits")
    parser.add_argument("--consumer-config", action="append", default=[], metavar="KEY=VALUE",
                        help="extra librdkafka consumer property (repeatable)")
    parser.add_argument("--fail-after-write", type=float, default=0.0, metavar="RATE",
                        help="demo: raise after the insert on this share of first attempts")
    parser.add_argument("--failing-attempts", type=int, default=1, metavar="N",
                        help="demo: --fail-after-write applies to attempts 1..N")
    parser.add_argument("--seed", type=int, default=None,
                        help="demo: seed of --fail-after-write's choices (a run to replay)")
    args = parser.parse_args(argv)
    if args.bootstrap and not args.topic:
        parser.error("--bootstrap needs at least one --topic")
    if args.nats_url and not args.stream:
        parser.error("--nats-url needs --stream")
    properties: dict[str, str] = {}
    for item in args.consumer_config:
        key, sep, value = item.partition("=")  # the first '=': a value may hold more
        if not key or not sep:
            parser.error(f"--consumer-config {item!r}: expected KEY=VALUE, a librdkafka "
                         "consumer property such as session.timeout.ms=6000")
        properties[key] = value
    args.consumer_config = properties
    return args


Service = IdempotentConsumer[psycopg.Connection[Any]] | JetStreamConsumer[psycopg.Connection[Any]]


def build(args: argparse.Namespace) -> Service:
    """The consumer for `args` (Kafka or JetStream); creates the tables it needs (idempotent)."""
    retry = RetryPolicy(max_attempts=args.max_attempts, initial_backoff_s=0.05,
                        max_backoff_s=2.0)
    store = PostgresDedupStore(args.dsn, table=args.dedup_table)
    store.ensure_schema()
    create_shipments_table(args.dsn, args.shipments_table)
    handler = Fulfillment(args.shipments_table, args.fail_after_write,
                          random.Random(args.seed), failing_attempts=args.failing_attempts)
    if args.nats_url:
        jetstream = JetStreamSettings(
            url=args.nats_url, stream=args.stream, durable=args.durable or args.group,
            group_id=args.group, filter_subjects=tuple(args.subject),
            dead_letter_subject=args.dead_letter_subject, ack_wait_s=args.ack_wait,
            retry=retry)
        return JetStreamConsumer(jetstream, store, handler.ship_order, decoder=decode_payment)
    settings = ConsumerSettings(
        bootstrap_servers=args.bootstrap, group_id=args.group, topics=tuple(args.topic),
        dead_letter_topic=args.dead_letter_topic, commit_interval_s=args.commit_interval,
        retry=retry, consumer_config=args.consumer_config)
    return IdempotentConsumer(settings, store, handler.ship_order, decoder=decode_payment)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    try:
        consumer = build(args)
        # Signals only set the stop flag; the loop finishes its record, commits and closes.
        signal.signal(signal.SIGTERM, lambda *_: consumer.stop())
        signal.signal(signal.SIGINT, lambda *_: consumer.stop())
        refuse_reload(log)  # SIGHUP (a reload, a closed terminal): logged, the loop goes on
        consumer.run()
    except CdcRouterError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code  # 75 (OffsetsUnfetched, ...): a supervisor restarts it
    stats = consumer.stats
    log.info("event=fulfillment_stopped shipped=%d duplicates=%d dead_lettered=%d retries=%d",
             stats.processed, stats.duplicates, stats.dead_lettered, stats.retries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
