"""The idempotent consumer on a real nats-server (JetStream) and the real Postgres store: the
fulfillment example through 3x redelivery and kill -9, poison and malformed messages
dead-lettered with their dlq.* headers while the stream goes on."""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest
from psycopg import sql

from cdc_router.consumer import RetryPolicy
from cdc_router.consumer.dedup import MemoryDedupStore
from cdc_router.consumer.dedup.postgres import PostgresDedupStore
from cdc_router.consumer.jetstream import JetStreamConsumer
from cdc_router.consumer.jetstream_settings import JetStreamSettings
from cdc_router.errors import JetStreamConsumerError
from cdc_router.examples.fulfillment import create_shipments_table
from tests.integration import test_idempotent_consumer
from tests.integration.nats_server import nats_server, read_stream
from tests.integration.support import StackEndpoints, unique
from tests.integration.test_idempotent_consumer import (
    Crew,
    Unprintable,
    count,
    shipped_event_ids,
    wait_until,
)

pytestmark = pytest.mark.integration

Message = tuple[str, bytes, dict[str, str]]
# A fresh Postgres schema per test (the idempotent consumer's fixture).
schema = test_idempotent_consumer.schema


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with nats_server(tmp_path_factory.mktemp("nats-home")) as server:
        yield server.url


class Streams:
    """A stream of payments and a stream of dead letters, named for one test."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = unique("jsc").replace("_", "-")
        self.stream = self.prefix.upper()
        self.dead_letters = self.stream + "-DLQ"
        self.subject = f"{self.prefix}.payments.confirmed"
        self.dead_letter_subject = f"{self.prefix}.dlq"
        asyncio.run(self._admin(create=True))

    def delete(self) -> None:
        asyncio.run(self._admin(create=False))

    async def _admin(self, *, create: bool) -> None:
        client = await nats.connect(self.url)
        try:
            js = client.jetstream()
            for name, subjects in ((self.stream, [f"{self.prefix}.payments.>"]),
                                   (self.dead_letters, [self.dead_letter_subject])):
                if create:
                    await js.add_stream(name=name, subjects=subjects)
                else:
                    await js.delete_stream(name)
        finally:
            await client.close()

    def publish(self, messages: list[Message]) -> None:
        async def publish() -> None:
            client = await nats.connect(self.url)
            try:
                js = client.jetstream()
                for subject, data, headers in messages:
                    await js.publish(subject, data, headers=headers or None)
            finally:
                await client.close()

        asyncio.run(publish())

    def consumer_settled(self, durable: str) -> bool:
        """Every message of the stream delivered to `durable` and acked (or termed)."""
        async def state() -> bool:
            client = await nats.connect(self.url)
            try:
                info = await client.jetstream().consumer_info(self.stream, durable)
                return bool(info.num_pending == 0 and info.num_ack_pending == 0)
            finally:
                await client.close()

        return asyncio.run(state())

    def dead_letter_count(self) -> int:
        async def total() -> int:
            client = await nats.connect(self.url)
            try:
                return int((await client.jetstream().stream_info(self.dead_letters))
                           .state.messages)
            finally:
                await client.close()

        return asyncio.run(total())


@pytest.fixture
def streams(nats_url: str) -> Iterator[Streams]:
    created = Streams(nats_url)
    yield created
    created.delete()


def payment(subject: str, event_id: str, msg_id: str) -> Message:
    return (subject, json.dumps({"order_id": f"order-{event_id[:8]}", "amount": "19.90"}).encode(),
            {"Nats-Msg-Id": msg_id, "id": event_id})


# --- the acceptance run: the fulfillment example on JetStream -----------------------------

EVENTS = 300
PROCESSES = 2
# kill -9 one consumer each time the shipments table passes one of these counts.
KILL_AT = (60, 140, 220)


def test_the_fulfillment_example_ships_once_per_event_through_redeliveries_and_kill_9(
        stack: StackEndpoints, schema: str, streams: Streams, tmp_path: Path) -> None:
    dsn = stack.postgres_dsn
    rng = random.Random(20261201)
    event_ids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(EVENTS)]
    # Each event twice: under its own Nats-Msg-Id and as a copy under another one (as a
    # re-publish past the duplicate window would), same `id` header; shuffled.
    messages = [payment(streams.subject, event_id, event_id + suffix)
                for event_id in event_ids for suffix in ("", "#copy")]
    rng.shuffle(messages)
    streams.publish(messages)
    group = unique("fulfillment")
    shipments = f"{schema}.shipments"
    args = ["--nats-url", streams.url, "--dsn", dsn, "--stream", streams.stream,
            "--subject", f"{streams.prefix}.payments.>", "--group", group,
            "--dead-letter-subject", streams.dead_letter_subject,
            "--shipments-table", shipments, "--dedup-table", f"{schema}.dedup",
            # A killed worker's messages come back after 2 s, not the default 30.
            "--ack-wait", "2", "--max-attempts", "5",
            # Every event's first two attempts fail after the insert: 3 deliveries each.
            "--fail-after-write", "1.0", "--failing-attempts", "2"]
    # Tables and the durable exist before the workers start: the run is about consuming.
    PostgresDedupStore(dsn, table=f"{schema}.dedup").ensure_schema()
    create_shipments_table(dsn, shipments)
    shipped = f'SELECT count(*) FROM "{schema}".shipments'
    logs = Crew(args, tmp_path, PROCESSES).run_with_kills(
        KILL_AT, lambda: count(dsn, shipped), EVENTS, lambda: streams.consumer_settled(group),
        "every message acked by the durable consumer", 60)

    assert count(dsn, shipped) == EVENTS
    assert sorted(shipped_event_ids(dsn, schema)) == sorted(event_ids)  # each exactly once
    assert count(dsn, f'SELECT count(*) FROM "{schema}".dedup WHERE consumer_group = %s',
                 group) == EVENTS
    assert streams.dead_letter_count() == 0
    # The faults really happened: failed attempts were rolled back and naked (at least one
    # per event: a kill mid-attempt can stand in for one of the two), and copies were
    # recognised as duplicates.
    assert logs.count("reason=handler_failed") >= EVENTS, logs[-3000:]
    stopped = re.findall(r"event=fulfillment_stopped shipped=(\d+) duplicates=(\d+)", logs)
    assert len(stopped) == PROCESSES and sum(int(dups) for _, dups in stopped) > 0, stopped


# --- poison and malformed messages --------------------------------------------------------


def consumer(streams: Streams, store: PostgresDedupStore, handler: Any,
             durable: str) -> JetStreamConsumer[Any]:
    settings = JetStreamSettings(
        url=streams.url, stream=streams.stream, durable=durable,
        dead_letter_subject=streams.dead_letter_subject, ack_wait_s=2,
        retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.05, max_backoff_s=0.2))
    return JetStreamConsumer(settings, store, handler, decoder=json.loads)


def run_until_dead_letters(jetstream: JetStreamConsumer[Any], streams: Streams, durable: str,
                           dead: int) -> None:
    runner = threading.Thread(target=jetstream.run)
    runner.start()
    try:
        wait_until(lambda: streams.dead_letter_count() >= dead
                   and streams.consumer_settled(durable), 30, f"{dead} dead letters")
    finally:
        jetstream.stop()
        runner.join(30)
    assert not runner.is_alive()


def shipping_handler(schema: str, poison: str, calls: list[str]) -> Any:
    def ship(event: Any, conn: psycopg.Connection[Any]) -> None:
        calls.append(event.event_id)
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s)").format(
            sql.Identifier(schema, "effects")), (event.event_id,))
        if event.event_id == poison:
            raise ValueError(f"order of {poison} is unknown\nsecond line")
    return ship


@pytest.fixture
def store(stack: StackEndpoints, schema: str) -> Iterator[PostgresDedupStore]:
    dedup = PostgresDedupStore(stack.postgres_dsn, table=f"{schema}.dedup")
    dedup.ensure_schema()
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (event_id text NOT NULL)").format(
            sql.Identifier(schema, "effects")))
    yield dedup
    dedup.close()


def effects(dsn: str, schema: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return sorted(row[0] for row in conn.execute(sql.SQL("SELECT event_id FROM {}").format(
            sql.Identifier(schema, "effects"))))


def test_a_poison_message_is_dead_lettered_after_max_deliver_and_the_stream_goes_on(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        streams: Streams) -> None:
    subject = streams.subject
    streams.publish([payment(subject, "ok-1", "ok-1"), payment(subject, "poison", "poison"),
                     payment(subject, "ok-2", "ok-2")])
    calls: list[str] = []
    durable = unique("poison")
    jetstream = consumer(streams, store, shipping_handler(schema, "poison", calls), durable)
    run_until_dead_letters(jetstream, streams, durable, 1)

    assert effects(stack.postgres_dsn, schema) == ["ok-1", "ok-2"]  # the poison's rolled back
    assert calls.count("poison") == 3  # MaxDeliver (retry.max_attempts) tries, no more
    [letter] = read_stream(streams.url, streams.dead_letters)
    assert letter.subject == streams.dead_letter_subject
    assert json.loads(letter.data) == json.loads(payment(subject, "poison", "poison")[1])
    headers = letter.headers
    assert headers["id"] == "poison"  # the original headers travel along
    assert (headers["dlq.source.topic"], headers["dlq.source.partition"],
            headers["dlq.source.offset"], headers["dlq.source.stream"]) == \
        (subject, "0", "2", streams.stream)
    assert (headers["dlq.stage"], headers["dlq.attempts"], headers["dlq.event.id"]) == \
        ("handle", "3", "poison")
    assert headers["dlq.error.class"] == "ValueError"
    assert headers["dlq.error.message"] == "order of poison is unknown second line"
    assert headers["Nats-Msg-Id"].startswith(f"dlq:{streams.stream}:{durable}:2:")
    assert jetstream.stats.dead_lettered == 1 and jetstream.stats.processed == 2


def test_a_handler_exception_that_cannot_be_printed_is_dead_lettered_not_a_crash(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        streams: Streams) -> None:
    # Review 52-c F-HIGH-13: run() raised at the retry's log line or the dead letter, and the
    # message, back after AckWait, crashed the next process too.
    subject = streams.subject
    streams.publish([payment(subject, "poison", "poison"), payment(subject, "ok-1", "ok-1")])

    def handler(event: Any, conn: psycopg.Connection[Any]) -> None:
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s)").format(
            sql.Identifier(schema, "effects")), (event.event_id,))
        if event.event_id == "poison":
            raise Unprintable()

    durable = unique("unprintable")
    jetstream = consumer(streams, store, handler, durable)
    run_until_dead_letters(jetstream, streams, durable, 1)
    assert effects(stack.postgres_dsn, schema) == ["ok-1"]
    [letter] = read_stream(streams.url, streams.dead_letters)
    assert (letter.headers["dlq.error.class"], letter.headers["dlq.error.message"]) == \
        ("Unprintable", "<unprintable Unprintable>")
    assert jetstream.stats.dead_lettered == 1 and jetstream.stats.processed == 1


def test_a_handler_that_returns_a_coroutine_is_dead_lettered_never_acked_as_done(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        streams: Streams) -> None:
    # Review 52-c F-HIGH-11 ("nats-py is asyncio": an async effect comes naturally here): it
    # never ran, and each message was marked done and acked.
    subject = streams.subject
    streams.publish([payment(subject, "async", "async"), payment(subject, "ok-1", "ok-1")])

    async def ship(event: Any, conn: psycopg.Connection[Any]) -> None:
        raise AssertionError("never awaited, never run")

    def handler(event: Any, conn: psycopg.Connection[Any]) -> Any:
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s)").format(
            sql.Identifier(schema, "effects")), (event.event_id,))
        return ship(event, conn) if event.event_id == "async" else None

    durable = unique("async")
    jetstream = consumer(streams, store, handler, durable)
    run_until_dead_letters(jetstream, streams, durable, 1)
    assert effects(stack.postgres_dsn, schema) == ["ok-1"]  # the async one's write rolled back
    [letter] = read_stream(streams.url, streams.dead_letters)
    assert letter.headers["dlq.error.class"] == "TypeError"
    assert "returned coroutine" in letter.headers["dlq.error.message"]
    assert jetstream.stats.dead_lettered == 1 and jetstream.stats.processed == 1


def test_malformed_messages_are_dead_lettered_at_once(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        streams: Streams) -> None:
    subject = streams.subject
    streams.publish([(subject, b'{"order_id": "1"}', {}),  # no event id at all
                     (subject, b"not json", {"id": "bad-json", "Nats-Msg-Id": "bad-json"}),
                     payment(subject, "ok-1", "ok-1")])
    calls: list[str] = []
    durable = unique("malformed")
    jetstream = consumer(streams, store, shipping_handler(schema, "-", calls), durable)
    run_until_dead_letters(jetstream, streams, durable, 2)

    assert calls == ["ok-1"] and effects(stack.postgres_dsn, schema) == ["ok-1"]
    letters = read_stream(streams.url, streams.dead_letters)
    assert [(m.headers["dlq.source.offset"], m.headers["dlq.stage"], m.headers["dlq.attempts"],
             m.headers["dlq.error.class"]) for m in letters] == [
        ("1", "decode", "0", "MalformedRecord"), ("2", "decode", "0", "JSONDecodeError")]
    assert "no event id" in letters[0].headers["dlq.error.message"]
    assert letters[1].data == b"not json"
    assert jetstream.stats.retries == 0  # at once: no nak, no second delivery


def test_messages_with_a_status_header_of_another_publisher_are_handled_like_any(
        streams: Streams) -> None:
    # QA 54-c F-1: nats-py's fetch() read a stream message's `Status` header as the server's
    # status: 404/408/409/100 never delivered, 503 lost its whole batch, `abc` crashed run().
    subject = streams.subject
    statuses = ("503", "abc", "404", "408", "409", "100")
    published = [payment(subject, f"ok-{n}", f"ok-{n}") for n in range(3)]
    for status in statuses:
        _, data, headers = payment(subject, f"s-{status}", f"s-{status}")
        published.insert(1, (subject, data, {**headers, "Status": status,
                                             "Description": "a publisher's own"}))
    streams.publish(published)
    calls: list[str] = []
    durable = unique("status")
    settings = JetStreamSettings(url=streams.url, stream=streams.stream, durable=durable,
                                 dead_letter_subject=streams.dead_letter_subject, ack_wait_s=2)
    jetstream = JetStreamConsumer(settings, MemoryDedupStore(),
                                  lambda event, context: calls.append(event.event_id),
                                  decoder=json.loads)
    runner = threading.Thread(target=jetstream.run)
    runner.start()
    try:
        wait_until(lambda: len(calls) >= 9 and streams.consumer_settled(durable), 30,
                   "every message handled and acked")
        assert runner.is_alive()  # no crash
    finally:
        jetstream.stop()
        runner.join(30)
    assert sorted(calls) == sorted(["ok-0", "ok-1", "ok-2", *(f"s-{s}" for s in statuses)])
    assert jetstream.stats.processed == 9 and jetstream.stats.dead_lettered == 0


# --- errors that are no message's fault ----------------------------------------------------


def test_nats_unreachable_stops_run_with_one_readable_line(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore) -> None:
    from tests.integration.support import free_port

    settings = JetStreamSettings(url=f"nats://127.0.0.1:{free_port()}", stream="PAYMENTS",
                                 durable="fulfillment", dead_letter_subject="fulfillment.dlq",
                                 connect_timeout_s=1)
    with pytest.raises(JetStreamConsumerError, match=r"cannot connect to NATS at nats://") as info:
        JetStreamConsumer(settings, store, lambda event, conn: None).run()
    assert "\n" not in str(info.value)


def test_a_dead_letter_subject_in_no_stream_stops_run_before_consuming(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        streams: Streams) -> None:
    settings = JetStreamSettings(url=streams.url, stream=streams.stream, durable="d",
                                 dead_letter_subject=f"{streams.prefix}.nowhere")
    with pytest.raises(JetStreamConsumerError, match=r"is in no JetStream stream"):
        JetStreamConsumer(settings, store, lambda event, conn: None).run()


def test_the_keep_alive_follows_the_ack_wait_of_an_existing_durable(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        streams: Streams) -> None:
    # Review 33: a durable made with AckWait 1 s, settings of 30 s: in-progress acks went out
    # every 10 s, and a message waiting in its batch was redelivered (a duplicate). Here 3 s,
    # not 1: a second test worker on the 2 cores can hold this process up for most of a second.
    from nats.js.api import AckPolicy, ConsumerConfig

    durable = unique("ackwait")

    async def create() -> None:
        client = await nats.connect(streams.url)
        try:
            await client.jetstream().add_consumer(streams.stream, ConsumerConfig(
                durable_name=durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=3,
                max_deliver=-1))
        finally:
            await client.close()

    asyncio.run(create())
    streams.publish([payment(streams.subject, f"e{n}", f"e{n}") for n in range(3)])
    calls: list[str] = []

    def slow(event: Any, conn: psycopg.Connection[Any]) -> None:
        calls.append(event.event_id)
        threading.Event().wait(4.5)  # each longer than the durable's AckWait

    settings = JetStreamSettings(url=streams.url, stream=streams.stream, durable=durable,
                                 dead_letter_subject=streams.dead_letter_subject, ack_wait_s=30)
    jetstream = JetStreamConsumer(settings, store, slow, decoder=json.loads)
    runner = threading.Thread(target=jetstream.run)
    runner.start()
    try:
        wait_until(lambda: len(calls) >= 3 and streams.consumer_settled(durable), 30,
                   "three messages handled and acked")
    finally:
        jetstream.stop()
        runner.join(30)
    assert calls == ["e0", "e1", "e2"]
    assert (jetstream.stats.processed, jetstream.stats.duplicates) == (3, 0)


def _limit_dead_letter_stream(streams: Streams, max_msg_size: int) -> None:
    async def update() -> None:
        client = await nats.connect(streams.url)
        try:
            await client.jetstream().update_stream(
                name=streams.dead_letters, subjects=[streams.dead_letter_subject],
                max_msg_size=max_msg_size)
        finally:
            await client.close()

    asyncio.run(update())


def test_a_dead_letter_over_the_streams_limit_goes_without_its_data(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        streams: Streams) -> None:
    # Review 33: a dead-letter stream whose max_msg_size is below the message refused the
    # letter for ever; the handler ran again at every redelivery and nothing was dead-lettered.
    _limit_dead_letter_stream(streams, 2048)
    poison = payment(streams.subject, "poison", "poison")
    streams.publish([(poison[0], b'{"pad": "' + b"x" * 5000 + b'"}', poison[2]),
                     payment(streams.subject, "ok-1", "ok-1")])
    calls: list[str] = []
    durable = unique("limited")
    jetstream = consumer(streams, store, shipping_handler(schema, "poison", calls), durable)
    run_until_dead_letters(jetstream, streams, durable, 1)

    [letter] = read_stream(streams.url, streams.dead_letters)
    assert letter.data == b"" and letter.headers["dlq.value.dropped.bytes"] == "5011"
    assert letter.headers["dlq.event.id"] == "poison"
    assert effects(stack.postgres_dsn, schema) == ["ok-1"]
    # 3 failures; the refused letter goes again without its data, the handler not run again
    # (QA 56-e F-2; it ran a fourth time before)
    assert calls.count("poison") == 3


def test_a_dead_letter_the_stream_refuses_even_without_data_stops_run(
        stack: StackEndpoints, schema: str, store: PostgresDedupStore,
        streams: Streams) -> None:
    _limit_dead_letter_stream(streams, 64)  # below the dlq.* headers alone
    streams.publish([payment(streams.subject, "poison", "poison")])
    settings = JetStreamSettings(
        url=streams.url, stream=streams.stream, durable=unique("limited"),
        dead_letter_subject=streams.dead_letter_subject, ack_wait_s=2,
        retry=RetryPolicy(max_attempts=1, initial_backoff_s=0.05, max_backoff_s=0.2))
    jetstream = JetStreamConsumer(settings, store, shipping_handler(schema, "poison", []),
                                  decoder=json.loads)
    with pytest.raises(JetStreamConsumerError) as stopped:
        jetstream.run()
    # Review 33-2: with max_attempts 1 it stopped at once, never trying without the data.
    message = str(stopped.value)
    assert message.startswith(f"stream {streams.dead_letters!r} refused the dead letter of "
                              f"message 1 of stream {streams.stream!r} 2 times, also without "
                              "its data: BadRequestError"), message
    assert "err_code=10054" in message, message
    assert read_stream(streams.url, streams.dead_letters) == []


def _fill_dead_letter_stream(streams: Streams, *, full: bool) -> None:
    """The dead-letter stream holding one message, `full` (max_msgs 1, discard new) or open."""
    from nats.js.api import DiscardPolicy

    async def update() -> None:
        client = await nats.connect(streams.url)
        try:
            js = client.jetstream()
            if full:
                await js.publish(streams.dead_letter_subject, b"earlier letter")
            await js.update_stream(name=streams.dead_letters, subjects=[
                streams.dead_letter_subject], max_msgs=1 if full else -1,
                discard=DiscardPolicy.NEW if full else DiscardPolicy.OLD)
        finally:
            await client.close()

    asyncio.run(update())


def test_while_the_dead_letter_stream_is_full_the_poisons_handler_runs_no_more(
        streams: Streams) -> None:
    # QA 56-e F-2: with the dead-letter stream full (max_msgs, discard new) each redelivery
    # ran the poison's handler again (34 runs of one message), though a failed dead-letter
    # publish "is not an attempt"; its letter said dlq.attempts 34.
    _fill_dead_letter_stream(streams, full=True)
    streams.publish([payment(streams.subject, "poison", "poison"),
                     payment(streams.subject, "ok-1", "ok-1")])
    calls: list[str] = []

    def handler(event: Any, context: Any) -> None:
        calls.append(event.event_id)
        if event.event_id == "poison":
            raise ValueError("order unknown")

    durable = unique("full")
    settings = JetStreamSettings(
        url=streams.url, stream=streams.stream, durable=durable,
        dead_letter_subject=streams.dead_letter_subject, ack_wait_s=2,
        retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.05, max_backoff_s=0.2))
    jetstream = JetStreamConsumer(settings, MemoryDedupStore(), handler, decoder=json.loads)
    runner = threading.Thread(target=jetstream.run)
    runner.start()
    try:
        # 2 handler retries, then the dead letter refused again and again (0.2 s apart at most)
        wait_until(lambda: jetstream.stats.retries >= 12, 30, "ten refused dead letters")
        assert calls.count("poison") == 3 and calls.count("ok-1") == 1
        _fill_dead_letter_stream(streams, full=False)
        wait_until(lambda: streams.dead_letter_count() == 2
                   and streams.consumer_settled(durable), 30, "the letter, once open")
    finally:
        jetstream.stop()
        runner.join(30)
    assert not runner.is_alive()
    assert calls.count("poison") == 3, calls
    letter = read_stream(streams.url, streams.dead_letters)[-1]
    assert (letter.headers["dlq.attempts"], letter.headers["dlq.event.id"],
            letter.headers["dlq.error.class"]) == ("3", "poison", "ValueError")
    assert jetstream.stats.dead_lettered == 1 and jetstream.stats.processed == 1
