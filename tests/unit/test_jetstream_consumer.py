"""The JetStream consumer's decisions: the record a message becomes, attempt numbers, naks,
dead letters, outages excused; per-message handling over faithful fakes of nats-py's message
(ack, nak(delay), term) and of the JetStream publish."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import random
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import nats.errors
import pytest

from cdc_router.consumer import RetryPolicy
from cdc_router.consumer.dedup import DedupKey, DedupStoreError, MemoryDedupStore, Outcome
from cdc_router.consumer.event import read_event
from cdc_router.consumer.jetstream import JetStreamConsumer
from cdc_router.consumer.jetstream_message import (
    GiveUp,
    Retry,
    after_handler_failure,
    dead_letter_message,
    kafka_source,
    letter_failure,
    record_of,
)
from cdc_router.consumer.jetstream_settings import JetStreamSettings, consumer_problem
from cdc_router.errors import ConfigError, DedupStoreRefused, MalformedRecord, RetriableError
from cdc_router.nats.connection import error_text

STAMP = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
SUBJECT = "payments.confirmed"
STORED_MS = int(STAMP.timestamp() * 1000)


def metadata(sequence: int, delivered: int) -> SimpleNamespace:
    return SimpleNamespace(stream="PAYMENTS", sequence=SimpleNamespace(stream=sequence),
                           num_delivered=delivered, timestamp=STAMP)


class FakeMessage:
    """nats-py's Msg as the consumer uses it; records what it was told."""

    def __init__(self, data: bytes, headers: dict[str, str] | None, sequence: int = 7,
                 delivered: int = 1) -> None:
        self.subject, self.data, self.headers = SUBJECT, data, headers
        self.metadata = metadata(sequence, delivered)
        self.told: list[tuple[str, float | None]] = []

    async def ack(self) -> None: self.told.append(("ack", None))
    async def term(self) -> None: self.told.append(("term", None))
    async def in_progress(self) -> None: self.told.append(("in_progress", None))

    async def nak(self, delay: float | None = None) -> None:
        self.told.append(("nak", delay))


class FakeJetStream:
    """The JetStream publish of dead letters: stores them, or fails while `down`."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, dict[str, str], str | None]] = []
        self.down = False

    async def publish(self, subject: str, payload: bytes, timeout: float, stream: str | None,
                      headers: dict[str, str]) -> None:
        if self.down:
            raise nats.errors.TimeoutError
        self.published.append((subject, payload, headers, stream))


def payment(event_id: str, **more: Any) -> FakeMessage:
    return FakeMessage(json.dumps({"order_id": "42"}).encode(),
                       {"Nats-Msg-Id": event_id, "id": event_id}, **more)


SETTINGS = JetStreamSettings(url="nats://x:4222", stream="PAYMENTS", durable="fulfillment",
                             dead_letter_subject="fulfillment.dlq",
                             retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.1,
                                               max_backoff_s=1.0))


class Harness:
    """A JetStreamConsumer whose messages are handed to it one by one."""

    def __init__(self, handler: Callable[[Any, Any], None], store: Any = None) -> None:
        self.consumer = JetStreamConsumer(SETTINGS, store or MemoryDedupStore(), handler,
                                          decoder=json.loads, rng=random.Random(1))
        self.js = FakeJetStream()
        self.consumer._js = self.js  # what run() connects and checks; the tested seam
        self.consumer._dead_letter_stream = "FULFILLMENT-DLQ"

    def handle(self, message: FakeMessage) -> list[tuple[str, float | None]]:
        asyncio.run(self.consumer._handle(message))
        return message.told

    def dead_letter_of(self, event_id: str) -> dict[str, str]:
        """Hand message `event_id` over until its handler's third failure (SETTINGS' attempts):
        naked twice, then dead-lettered and termed; its letter's headers."""
        for _ in range(2):
            [(told, _delay)] = self.handle(payment(event_id))
            assert told == "nak"
        assert self.handle(payment(event_id)) == [("term", None)]
        [(_, _, headers, _)] = self.js.published
        return headers


def failing(error: Exception) -> Callable[[Any, Any], None]:
    def handler(event: Any, context: Any) -> None:
        raise error
    return handler


# --- the record and its event id ---------------------------------------------------------


def test_a_message_becomes_a_record_shaped_like_a_kafka_one() -> None:
    record = record_of(SUBJECT, b"{}", {"Nats-Msg-Id": "m1", "id": "e1"}, metadata(7, 2))
    assert (record.topic(), record.partition(), record.offset(), record.key()) == \
        (SUBJECT, 0, 7, b"m1")
    assert record.headers() == [("Nats-Msg-Id", b"m1"), ("id", b"e1")]
    assert record.timestamp() == (2, int(STAMP.timestamp() * 1000))
    assert (record.stream, record.num_delivered) == ("PAYMENTS", 2)


@pytest.mark.parametrize(("source", "expected"), [("auto", "e1"), ("header", "e1"),
                                                  ("msg_id", "m1")])
def test_the_event_id_is_the_id_header_else_nats_msg_id(source: Any, expected: str) -> None:
    record = record_of(SUBJECT, b"{}", {"Nats-Msg-Id": "m1", "id": "e1"}, metadata(1, 1))
    event = read_event(record, source=kafka_source(source), header="id", decoder=None,
                       attempt=1, key_name="header 'Nats-Msg-Id'")
    assert event.event_id == expected


def test_auto_falls_back_to_nats_msg_id_and_names_it_when_both_are_missing() -> None:
    only_msg_id = record_of(SUBJECT, b"{}", {"Nats-Msg-Id": "m1"}, metadata(1, 1))
    assert read_event(only_msg_id, source="auto", header="id", decoder=None,
                      attempt=1).event_id == "m1"
    bare = record_of(SUBJECT, b"{}", None, metadata(1, 1))
    with pytest.raises(MalformedRecord,
                       match="no 'id' header, and header 'Nats-Msg-Id' is missing"):
        read_event(bare, source="auto", header="id", decoder=None, attempt=1,
                   key_name="header 'Nats-Msg-Id'")


# --- attempts and backoff ------------------------------------------------------------------


def test_a_handler_failure_naks_with_jittered_backoff_until_the_last_attempt() -> None:
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.1, max_backoff_s=1.0)
    delays = [after_handler_failure(attempt, policy, random.Random(5), ValueError("x"))
              for attempt in (1, 2)]
    assert all(isinstance(d, Retry) for d in delays)
    assert [d.delay_s for d in delays if isinstance(d, Retry)] == [
        random.Random(5).uniform(0, 0.1), random.Random(5).uniform(0, 0.2)]
    assert after_handler_failure(3, policy, random.Random(5), ValueError("x")) == \
        GiveUp(attempts=3)
    # Review 47-e F7: a store that refuses for good is no handler failure; it stops the
    # consumer (the message is naked back by the stop, nothing dead-lettered).
    with pytest.raises(DedupStoreRefused, match="no table"):
        after_handler_failure(1, policy, random.Random(5), DedupStoreRefused("no table"))


# --- the dead-letter message ---------------------------------------------------------------


def test_a_dead_letters_msg_id_tells_a_re_created_streams_message_from_the_old_one() -> None:
    # Review 46 F10: a stream re-created within the dead-letter stream's duplicate window
    # numbers its messages from 1 again; the letter of its message 7 was dropped as the old
    # message 7's duplicate, and the message TERMed. A redelivery keeps its id.
    def msg_id(delivered: int, stored: datetime.datetime) -> str:
        meta = SimpleNamespace(stream="PAYMENTS", sequence=SimpleNamespace(stream=7),
                               num_delivered=delivered, timestamp=stored)
        return dead_letter_message(record_of(SUBJECT, b"{}", None, meta), durable="d",
                                   stage="handle", error=ValueError("x"), attempts=3,
                                   event_id="e1", max_payload=1024 * 1024).msg_id

    assert msg_id(3, STAMP) == msg_id(5, STAMP)
    assert msg_id(3, STAMP) != msg_id(3, STAMP + datetime.timedelta(days=1))


def test_a_dead_letter_keeps_data_and_headers_less_nats_ones_plus_one_line_dlq_headers() -> None:
    record = record_of(SUBJECT, b'{"a": 1}', {"Nats-Msg-Id": "e1", "Nats-Expected-Stream": "X",
                                              "id": "e1", "tenant": "t"}, metadata(7, 3))
    letter = dead_letter_message(record, durable="fulfillment", stage="handle",
                                 error=ValueError("bad\r\norder"), attempts=3, event_id="e1",
                                 max_payload=1024 * 1024)
    assert letter.data == b'{"a": 1}'
    assert letter.msg_id == f"dlq:PAYMENTS:fulfillment:7:{STORED_MS}"
    assert letter.headers == {
        "id": "e1", "tenant": "t", "dlq.source.topic": SUBJECT, "dlq.source.partition": "0",
        "dlq.source.offset": "7", "dlq.stage": "handle", "dlq.error.class": "ValueError",
        "dlq.error.message": "bad order", "dlq.attempts": "3", "dlq.event.id": "e1",
        "dlq.source.stream": "PAYMENTS"}


def test_a_dead_letters_reason_is_ascii_for_nats_py_readers() -> None:
    # QA 47-c F3: a cut reason ended in '…'; nats-py read the header as an email Header
    # object, and a dead-letter reader's slicing raised TypeError.
    record = record_of(SUBJECT, b"{}", {"id": "ü" * 3}, metadata(7, 1))
    letter = dead_letter_message(record, durable="d", stage="decode",
                                 error=ValueError("id 'üü…' is too long"), attempts=0,
                                 event_id="e1", max_payload=1024 * 1024)
    assert letter.headers["dlq.error.message"] == "id '\\xfc\\xfc\\u2026' is too long"
    assert letter.headers["id"] == "ü" * 3  # the message's own headers pass as they are


def test_a_dead_letter_no_stream_stores_names_the_subject_and_the_fix() -> None:
    # QA 47-c F6: the line said "nats: no response from stream", naming neither.
    from nats.js.errors import NoStreamResponseError

    said = str(letter_failure(NoStreamResponseError(), "pay.dlq", "PAYDLQ"))
    assert "dead-letter subject 'pay.dlq'" in said and "add it to a stream's subjects" in said
    timeout = TimeoutError("slow")
    assert letter_failure(timeout, "pay.dlq", "PAYDLQ") is timeout


def test_a_dead_letter_a_full_stream_refuses_names_that_stream_and_the_fix() -> None:
    # QA 49-a F2: "stream=PAYMENTS ... err_code=10077 description='maximum messages exceeded'"
    # named neither the dead-letter subject nor its stream, as if the consumed one were full.
    from nats.js.errors import ServiceUnavailableError

    full = ServiceUnavailableError(code=503, err_code=10077,
                                   description="maximum messages exceeded")
    said = error_text(letter_failure(full, "pay.dlq", "PAYDLQ"))
    assert said == (
        "JetStreamError: dead-letter stream 'PAYDLQ' (subject 'pay.dlq') is full and set to "
        "discard new messages (maximum messages exceeded): raise its max_msgs/max_bytes, or "
        "set it to discard old ones (`cdc-router streams apply` does when router.yaml declares "
        "it); the poison message waits meanwhile")
    assert len(said) <= 300  # the retry line's cut
    broken = ServiceUnavailableError(code=503, err_code=10077, description="store failed")
    assert letter_failure(broken, "pay.dlq", "PAYDLQ") is broken


def test_a_dead_letter_over_max_payload_goes_without_its_data() -> None:
    record = record_of(SUBJECT, b"x" * 10_000, {"id": "e1"}, metadata(7, 1))
    letter = dead_letter_message(record, durable="d", stage="decode", error=ValueError("x"),
                                 attempts=0, event_id=None, max_payload=8192)
    assert letter.data == b"" and letter.headers["dlq.value.dropped.bytes"] == "10000"


# --- settings and an existing durable -------------------------------------------------------


@pytest.mark.parametrize(("changes", "field"), [
    ({"batch_size": "5"}, "batch_size"), ({"poll_timeout_s": float("inf")}, "poll_timeout_s"),
    ({"retry": None}, "retry"), ({"ack_wait_s": "3"}, "ack_wait_s"),
    ({"dead_letter_timeout_s": float("nan")}, "dead_letter_timeout_s"),
    ({"max_ack_pending": True}, "max_ack_pending"),
    # Review 48-e F7: blanks, and a stream name NATS refuses.
    ({"url": " "}, "url"), ({"stream": " "}, "stream"), ({"stream": "a.b"}, "stream"),
    ({"group_id": ""}, "group_id"), ({"group_id": " "}, "group_id"),
    ({"event_id_header": "\t"}, "event_id_header"),
    # QA 61-b F3: taken, then run() stopped on "gaierror: Name or service not known".
    ({"url": "http://127.0.0.1:4222"}, "url': scheme 'http' is not one nats-py speaks "
                                       r"\(nats://, tls://, ws://, wss://\).*got 'http://"),
    ({"url": "nat://127.0.0.1:4222"}, "url': scheme 'nat'"),
    ({"url": "NATS://127.0.0.1:4222"}, "url': scheme 'NATS'.*write it in lower case, nats://"),
    ({"url": "nats://a:1,http://u:pw@b:2"}, r"url'.*got 'http://u:\*\*\*\*\*@b:2'"),
    ({"url": "nats//127.0.0.1:4222"}, "url': each server is"),
    ({"url": "ws://h:8080", "connect_options": {"tls": None}}, "url': ws:// is plain text"),
    # Review 61-w W-9: nats-py refused it only at connect.
    ({"url": "wss://h:443,nats://u:pw@h:4222"}, r"url': mixes WebSocket servers.*list servers "
                                                r"of one kind only \(got 'nats://u:\*\*\*\*\*@h:4222,"
                                                r"wss://h:443'\)")])
def test_settings_of_the_wrong_type_or_infinite_are_one_line(changes: dict[str, object],
                                                              field: str) -> None:
    # Review 47-e F12: tracebacks, and consume(timeout=inf) returned at once (a spinning loop).
    with pytest.raises(ConfigError, match=f"JetStreamSettings: field '{field}"):
        JetStreamSettings(**{"url": "nats://x", "stream": "S", "durable": "d",  # type: ignore[arg-type]
                             "dead_letter_subject": "dlq.x", "filter_subjects": ("pay.>",),
                             **changes})


@pytest.mark.parametrize(("options", "said"), [
    # Review 52-c F-low-7: `usr` for `user` was nats-py's TypeError traceback at run().
    ({"usr": "x"}, "field 'connect_options.usr': is not a nats.connect() keyword; did you "
                   "mean 'user'?"),
    ({"servers": ["nats://y"]}, "field 'connect_options.servers': is set by the consumer "
                                "itself; set JetStreamSettings.url"),
    ({"name": "x"}, "field 'connect_options.name': is set by the consumer itself"),
    (7, "field 'connect_options': must be a mapping of nats.connect() keywords (got 'int')"),
])
def test_connect_options_nats_connect_would_refuse_are_one_line(options: object,
                                                                 said: str) -> None:
    with pytest.raises(ConfigError) as raised:
        JetStreamSettings(url="nats://x", stream="S", durable="d", dead_letter_subject="dlq.x",
                          connect_options=options)  # type: ignore[arg-type]
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_the_keywords_the_routers_nats_settings_give_are_taken() -> None:
    JetStreamSettings(url="nats://x", stream="S", durable="d", dead_letter_subject="dlq.x",
                      connect_options={"user": "u", "password": "p", "token": "t",
                                       "user_credentials": "/c", "tls": None,
                                       "tls_hostname": "h"})


def test_the_dead_letter_subject_may_not_be_a_consumed_one() -> None:
    with pytest.raises(ConfigError, match="dead_letter_subject"):
        JetStreamSettings(url="nats://x", stream="S", durable="d", dead_letter_subject="pay.dlq",
                          filter_subjects=("pay.>",))


def test_one_filter_subject_given_as_a_string_is_one_subject() -> None:
    # Review 33: "payments.confirmed" was refused as an invalid subject, "payments" taken as
    # the filters 'p', 'a', 'y', ...
    settings = JetStreamSettings(url="nats://x", stream="S", durable="d",
                                 dead_letter_subject="pay.dlq",
                                 filter_subjects="payments.confirmed")  # type: ignore[arg-type]
    assert settings.filter_subjects == ("payments.confirmed",)


def durable_config(**changes: Any) -> SimpleNamespace:
    config = dict(deliver_subject=None, ack_policy="explicit", max_deliver=-1,
                  filter_subject=None, filter_subjects=None)
    return SimpleNamespace(**{**config, **changes})


@pytest.mark.parametrize(("changes", "problem"), [
    ({}, None),
    ({"deliver_subject": "inbox"}, "push consumer"),
    ({"ack_policy": "none"}, "not 'explicit'"),
    ({"max_deliver": 5}, "MaxDeliver 5"),
    ({"filter_subject": "pay.>"}, "filters ['pay.>']"),
])
def test_an_existing_durable_that_would_break_the_guarantees_is_refused(
        changes: dict[str, Any], problem: str | None) -> None:
    found = consumer_problem(durable_config(**changes), SETTINGS)
    assert (found is None) if problem is None else (found is not None and problem in found)


# --- handling one message ------------------------------------------------------------------


def test_the_effect_runs_once_and_both_copies_are_acked() -> None:
    calls: list[str] = []
    harness = Harness(lambda event, _: calls.append(event.event_id))
    assert harness.handle(payment("e1", sequence=1)) == [("ack", None)]
    copy = FakeMessage(b'{"order_id": "42"}', {"Nats-Msg-Id": "e1#copy", "id": "e1"}, 2)
    assert harness.handle(copy) == [("ack", None)]
    assert calls == ["e1"]
    assert harness.consumer.stats.processed == 1 and harness.consumer.stats.duplicates == 1


def test_a_failing_handler_is_naked_with_a_delay_then_dead_lettered_and_termed() -> None:
    harness = Harness(failing(ValueError("unknown order")))
    # Deliveries 5 and 6: four were cut short elsewhere (a stop, a crash, another worker's
    # outage); only the handler's failures here count toward max_attempts=3.
    for delivered in (5, 6):
        [(told, delay)] = harness.handle(payment("e1", delivered=delivered))
        assert told == "nak" and delay is not None and 0 <= delay <= 0.8
    assert harness.js.published == []
    assert harness.handle(payment("e1", delivered=7)) == [("term", None)]
    [(subject, data, headers, stream)] = harness.js.published
    assert (subject, stream) == ("fulfillment.dlq", "FULFILLMENT-DLQ")
    assert json.loads(data) == {"order_id": "42"}
    assert (headers["dlq.stage"], headers["dlq.attempts"], headers["Nats-Msg-Id"]) == \
        ("handle", "3", f"dlq:PAYMENTS:fulfillment:7:{STORED_MS}")


def test_a_malformed_message_is_dead_lettered_on_its_first_delivery(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="cdc_router.consumer")
    harness = Harness(failing(AssertionError("never called")))
    assert harness.handle(FakeMessage(b"not json", {"id": "e1"})) == [("term", None)]
    [(_, data, headers, _)] = harness.js.published
    assert data == b"not json"
    assert (headers["dlq.stage"], headers["dlq.attempts"], headers["dlq.error.class"]) == \
        ("decode", "0", "JSONDecodeError")
    # Review 52-c F-low-2: the log line said MalformedRecord, the letter JSONDecodeError.
    [line] = [r.getMessage() for r in caplog.records if "dead_lettered" in r.getMessage()]
    assert "error_class=JSONDecodeError " in line


@pytest.mark.parametrize("source", ["auto", "header", "msg_id"])
def test_an_event_id_that_is_not_utf8_is_dead_lettered_not_deduplicated(source: Any) -> None:
    # QA 54-c F-2: nats-py reads both ids as 'order-\ufffd1': the second was skipped as a
    # duplicate of the first, its effect never run.
    from nats.aio.client import Client

    calls: list[str] = []
    harness = Harness(lambda event, context: calls.append(event.event_id))
    harness.consumer.settings = dataclasses.replace(SETTINGS, event_id_source=source)
    for sequence, raw in enumerate((b"order-\xff1", b"order-\xfe1"), 1):
        headers = Client._parse_header_lines(b"Nats-Msg-Id: " + raw + b"\r\nid: " + raw)
        told = harness.handle(FakeMessage(b"{}", headers, sequence=sequence))
        assert told == [("term", None)]
    assert calls == [] and len(harness.js.published) == 2
    letter = harness.js.published[0][2]
    assert (letter["dlq.stage"], letter["dlq.error.class"]) == ("decode", "MalformedRecord")
    assert "event id 'order-\\ufffd1' is not UTF-8 (it holds U+FFFD" in \
        letter["dlq.error.message"]


class DownStore:
    """A dedup store whose database is away."""

    def run_once(self, key: DedupKey, effect: Any) -> Outcome:
        raise DedupStoreError("database unreachable")

    def close(self) -> None: ...


def test_a_store_outage_naks_without_limit_and_is_not_counted_as_an_attempt(
        caplog: pytest.LogCaptureFixture) -> None:
    harness = Harness(failing(ValueError("unknown order")), store=DownStore())
    for delivered in range(1, 6):  # far past max_attempts=3
        [(told, _)] = harness.handle(payment("e1", delivered=delivered))
        assert told == "nak"
    assert harness.js.published == []
    # QA 61-b F6: the Kafka consumer's form, a repr (was error="DedupStoreError: ...").
    assert "error=DedupStoreError('database unreachable')" in caplog.text
    # The store is back: the 6th delivery is the handler's first attempt, naked, not dead.
    harness.consumer._store = MemoryDedupStore()
    [(told, _)] = harness.handle(payment("e1", delivered=6))
    assert told == "nak" and harness.js.published == []


def test_a_store_outage_is_one_warning_a_repeat_at_most_every_30_s_and_one_line_at_its_end(
        caplog: pytest.LogCaptureFixture) -> None:
    # Fixer 63, item 6: a warning at every retry (the Kafka consumer says it once, QA 61-b F6).
    from cdc_router.consumer.outage import StoreOutage

    now = [0.0]
    harness = Harness(lambda event, _: None, store=DownStore())
    harness.consumer._store_outage = StoreOutage("DownStore", lambda: now[0])
    with caplog.at_level("DEBUG", logger="cdc_router.consumer"):
        for delivered in range(1, 41):  # a retry every 2 s for 80 s
            now[0] = 2.0 * delivered
            [(told, _)] = harness.handle(payment("e1", delivered=delivered))
            assert told == "nak"
        harness.consumer._store = MemoryDedupStore()
        now[0] = 90.0
        assert harness.handle(payment("e1", delivered=41)) == [("ack", None)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= 30]
    assert warnings[0].startswith("event=dedup_store_unavailable store=DownStore "
                                  "error=DedupStoreError('database unreachable')"), warnings
    assert [w.split()[0] for w in warnings[1:]] == ["event=dedup_store_still_unavailable"] * 2
    retries = [r for r in caplog.records if "retry_scheduled" in r.getMessage()]
    assert len(retries) == 40 and all(r.levelno == 10 for r in retries)
    [ended] = [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()]
    assert ended == "event=dedup_store_recovered store=DownStore outage_s=88.0 failures=40"


def test_a_handler_s_retriable_error_naks_without_limit_and_is_not_counted_as_an_attempt(
        ) -> None:
    harness = Harness(failing(RetriableError("payments service unreachable")))
    for delivered in range(1, 6):  # far past max_attempts=3
        [(told, _)] = harness.handle(payment("e1", delivered=delivered))
        assert told == "nak"
    assert harness.js.published == []
    # The service answers, but refuses this event: attempts count from here.
    harness.consumer._handler = failing(ValueError("unknown order"))
    for delivered in range(6, 8):
        [(told, _)] = harness.handle(payment("e1", delivered=delivered))
        assert told == "nak" and harness.js.published == []
    harness.handle(payment("e1", delivered=8))
    assert len(harness.js.published) == 1  # the 3rd handler failure: dead-lettered


class CountingDownStore(DownStore):
    def __init__(self) -> None:
        self.calls = 0

    def run_once(self, key: DedupKey, effect: Any) -> Outcome:
        self.calls += 1
        return super().run_once(key, effect)


def test_a_store_outage_hands_the_batch_back_and_pauses_the_loop_growing() -> None:
    # QA, session 25: during a 12 s outage the loop naked message after message, 10,608
    # warnings and as many connection attempts; the Kafka consumer pauses instead.
    store = CountingDownStore()
    harness = Harness(lambda event, _: None, store=store)
    pauses: list[float] = []

    async def pause(delay_s: float) -> None:
        pauses.append(delay_s)

    harness.consumer._pause = pause  # type: ignore[method-assign]
    for _ in range(2):
        batch = [payment(f"e{n}", sequence=n) for n in range(5)]
        asyncio.run(harness.consumer._handle_batch(list(batch)))
        assert [told for told, _ in batch[0].told] == ["nak"]
        assert all(message.told == [("nak", None)] for message in batch[1:])
    assert store.calls == 2  # one try a batch, not one a message
    # Full jitter under a cap that doubles: 0.1 s, then 0.2 s (initial_backoff_s 0.1).
    assert len(pauses) == 2 and 0 < pauses[0] <= 0.1 and 0 < pauses[1] <= 0.2
    harness.consumer._store = MemoryDedupStore()
    batch = [payment(f"e{n}", sequence=n) for n in range(5)]
    asyncio.run(harness.consumer._handle_batch(list(batch)))
    assert all(message.told == [("ack", None)] for message in batch)
    assert len(pauses) == 2 and harness.consumer._outages == 0


def test_an_unacknowledged_dead_letter_leaves_the_message_to_come_back() -> None:
    harness = Harness(failing(ValueError("unknown order")))
    for delivered in (1, 2):
        harness.handle(payment("e1", delivered=delivered))
    harness.js.down = True
    [(told, _)] = harness.handle(payment("e1", delivered=3))
    assert told == "nak"  # not termed: its dead letter is not stored
    harness.js.down = False
    assert harness.handle(payment("e1", delivered=4)) == [("term", None)]
    assert len(harness.js.published) == 1


def test_while_its_dead_letter_is_not_acked_only_the_publish_is_retried_not_the_handler(
        ) -> None:
    # QA 56-e F-2: with the dead-letter stream full (discard new) every redelivery ran the
    # poison's handler again (34 runs of one message, `dlq.attempts: 34`), whose effects
    # outside the store's transaction are not rolled back.
    calls: list[str] = []

    def handler(event: Any, context: Any) -> None:
        calls.append(event.event_id)
        try:
            {}["order"]
        except KeyError:  # chained: its traceback holds the handler's frame too
            raise ValueError("unknown order")  # noqa: B904

    harness = Harness(handler)
    for delivered in (1, 2):
        harness.handle(payment("e1", delivered=delivered))
    harness.js.down = True
    for delivered in range(3, 9):
        [(told, _)] = harness.handle(payment("e1", delivered=delivered))
        assert told == "nak"
    assert calls == ["e1"] * 3, "the handler ran for its 3 attempts only"
    # Kept without its traceback, which holds the handler's frames (the event, its locals).
    [kept] = [letter["error"] for letter in harness.consumer._letters.values()]
    assert (kept.__traceback__, kept.__context__.__traceback__) == (None, None)
    harness.js.down = False
    assert harness.handle(payment("e1", delivered=9)) == [("term", None)]
    [(_, _, headers, _)] = harness.js.published
    assert (headers["dlq.attempts"], headers["dlq.event.id"]) == ("3", "e1")
    assert calls == ["e1"] * 3 and harness.consumer._letters == {}
    # Another message of the same id is handled afresh (the letter was its sequence's).
    harness.handle(payment("e1", sequence=8))
    assert calls == ["e1"] * 4


def test_stop_finishes_the_message_in_hand_and_hands_the_rest_of_the_batch_back() -> None:
    harness = Harness(lambda event, _: harness.consumer.stop())
    batch = [payment(f"e{n}", sequence=n) for n in range(3)]
    asyncio.run(harness.consumer._handle_batch(list(batch)))
    assert [message.told for message in batch] == [[("ack", None)], [("nak", None)],
                                                   [("nak", None)]]


def test_only_a_refusal_of_the_message_itself_counts_against_a_dead_letter() -> None:
    # Review 33-2: an account over its storage quota answers 400 too (err_code 10002), and
    # clears by itself: an outage, retried, never a reason to drop the letter's data.
    from nats.js.errors import APIError, BadRequestError, ServiceUnavailableError

    from cdc_router.consumer.jetstream_message import refused_for_good

    assert refused_for_good(BadRequestError(code=400, err_code=10054))
    assert refused_for_good(APIError(code=400, err_code=10097))
    assert not refused_for_good(BadRequestError(code=400, err_code=10002))
    assert not refused_for_good(ServiceUnavailableError(code=503, err_code=10077))
    assert not refused_for_good(TimeoutError())
