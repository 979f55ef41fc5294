"""QA 57-c F-2, F-3: both consumers check their dedup store when run() starts, and a handler's
database error that is no record's fault stops run() (or waits, for an outage) instead of
dead-lettering every event."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
import redis

import cdc_router.consumer.jetstream as jetstream
from cdc_router import postgres
from cdc_router.consumer.dedup import DedupStoreError, MemoryDedupStore
from cdc_router.consumer.dedup.postgres import PostgresDedupStore
from cdc_router.consumer.dedup.redis import RedisDedupStore
from cdc_router.consumer.store_checks import EffectRefused
from cdc_router.errors import DedupStoreRefused
from tests.unit.consumer_fakes import Harness, rec
from tests.unit.test_jetstream_consumer import Harness as JetStreamHarness
from tests.unit.test_jetstream_consumer import failing, payment


class CheckedStore(MemoryDedupStore):
    """A memory store whose check() fails as told."""

    def __init__(self, failure: Exception | None) -> None:
        super().__init__()
        self.failure = failure
        self.checks = 0

    def check_usable(self) -> None:
        self.checks += 1
        if self.failure is not None:
            raise self.failure


def test_a_store_refusing_us_stops_run_at_its_start_before_the_subscription() -> None:
    h = Harness({0: []}, store=CheckedStore(DedupStoreRefused("the dedup table t cannot be used")))
    with pytest.raises(DedupStoreRefused, match="the dedup table t cannot be used"):
        h.run()
    assert not h.kafka.callbacks and h.kafka.closed  # never subscribed: an idle topic too


def test_a_stores_own_check_of_another_meaning_is_not_called() -> None:
    # Reread 57-a F-9: any attribute named `check` was called with no argument; a user's
    # store with check(self, key) stopped run() at its start with a TypeError traceback.
    class KeyChecking(MemoryDedupStore):
        def check(self, key: str) -> bool:
            raise AssertionError("called")

    h = Harness({0: [rec("a")]}, store=KeyChecking())
    h.run()
    assert h.kafka.committed == {0: 1}


def test_a_store_that_does_not_answer_at_start_is_a_warning_and_run_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    store = CheckedStore(DedupStoreError("cannot connect to the dedup database: refused"))
    h = Harness({0: [rec("a")]}, store=store)
    with caplog.at_level(logging.WARNING):
        h.run()
    assert store.checks == 1 and [e.event_id for e in h.effects] == ["a"]
    assert "event=dedup_store_unchecked store=CheckedStore" in caplog.text
    assert "check the store's address (the DSN's host and port" in caplog.text


def test_the_postgres_store_checks_its_table_with_an_insert_of_no_row(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []

    class Conn:
        closed = broken = False

        def transaction(self) -> Any:
            return self

        def __enter__(self) -> None: ...
        def __exit__(self, *exc: object) -> None: ...

        def execute(self, statement: Any, params: Any = None) -> None:
            sent.append(statement.as_string(None))
            raise psycopg.errors.UndefinedTable('relation "public.dedup" does not exist')

    monkeypatch.setattr(psycopg, "connect", lambda *a, **k: Conn())
    store = PostgresDedupStore("postgresql://u@h/db", table="public.dedup")
    with pytest.raises(DedupStoreRefused, match=r"the dedup table public.dedup cannot be used: "
                       r"relation .* does not exist; create it \(`cdc-router dedup init`"):
        store.check_usable()
    assert sent == ['INSERT INTO "public"."dedup" (consumer_group, event_id) '
                    "SELECT %s, %s WHERE false"]


@pytest.mark.parametrize("error", [
    psycopg.errors.UndefinedTable('relation "shipments" does not exist'),
    psycopg.errors.UndefinedColumn('column "amount" does not exist'),
    psycopg.OperationalError('connection failed: FATAL:  password authentication failed for '
                             'user "svc"'),
])
def test_a_handlers_deploy_fault_stops_run_not_dead_letters_each_event(
        error: psycopg.Error) -> None:
    h = Harness({0: [rec("a"), rec("b")]}, handler=failing(error))
    with pytest.raises(EffectRefused, match="the handler's database statement failed: ") as \
            stopped:
        h.run()
    assert "so the consumer stops rather than dead-letter each one" in str(stopped.value)
    assert stopped.value.__cause__ is error
    assert h.producer.sent == [] and h.kafka.stored == {}


def test_a_handlers_database_outage_is_retried_without_limit() -> None:
    calls: list[str] = []

    def handler(event: Any, _context: Any) -> None:
        calls.append(event.event_id)
        if len(calls) <= 5:  # past max_attempts=3
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    h = Harness({0: [rec("a")]}, handler=handler)
    h.run()
    assert calls == ["a"] * 6 and h.producer.sent == [] and h.kafka.committed == {0: 1}


def test_a_handlers_other_database_error_is_still_its_records_failure() -> None:
    h = Harness({0: [rec("a")]},
                handler=failing(psycopg.errors.UniqueViolation("duplicate key value")))
    h.run()
    assert len(h.producer.sent) == 1  # retried, then dead-lettered, as before


@pytest.mark.parametrize("message", [
    'new row violates row-level security policy for table "shipments"',
    "permission denied for table shipments",
])
def test_a_handlers_42501_is_its_records_failure_not_a_stop(message: str) -> None:
    # Reread 57-a F-2: 42501 is also a row-level-security refusal, which depends on the row;
    # stopping run() on it let one event block the stream for good.
    h = Harness({0: [rec("a"), rec("b")]},
                handler=failing(psycopg.errors.InsufficientPrivilege(message)))
    h.run()
    assert len(h.producer.sent) == 2 and h.kafka.committed == {0: 2}
    assert postgres.deploy_fault(psycopg.errors.InsufficientPrivilege(message))  # the store's


def test_jetstream_a_handlers_deploy_fault_stops_and_hands_the_message_back() -> None:
    harness = JetStreamHarness(failing(psycopg.errors.UndefinedTable("no shipments")))
    with pytest.raises(EffectRefused, match="no shipments"):
        harness.handle(payment("e1"))
    assert harness.js.published == []


def test_jetstream_checks_the_store_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    class Client:
        max_payload, connected_server_version, is_closed = 1024, "2.10.0", False

        def jetstream(self, timeout: float) -> object:
            return object()

    async def connect(_self: Any) -> Client:
        return Client()

    async def subscribe(*_args: Any) -> tuple[str, float]:
        return "DLQ", 30.0

    async def closed(_client: Any) -> None: ...

    pulled: list[str] = []

    class Puller:
        def __init__(self, *_args: Any) -> None: ...

        async def start(self) -> None:
            pulled.append("start")

    monkeypatch.setattr(jetstream.JetStreamConsumer, "_connect", connect)
    monkeypatch.setattr(jetstream, "subscribe", subscribe)
    monkeypatch.setattr(jetstream, "Puller", Puller)
    monkeypatch.setattr(jetstream, "close_client", closed)
    harness = JetStreamHarness(failing(ValueError()),
                               store=CheckedStore(DedupStoreRefused("wrong password")))
    with pytest.raises(DedupStoreRefused, match="wrong password"):
        harness.consumer.run()
    assert pulled == []


class PingClient:
    """A redis-py client's parts the store uses at construction, and a PING that fails."""

    def __init__(self, failure: Exception) -> None:
        self.failure = failure

    def register_script(self, _script: str) -> Any:
        return lambda **_kwargs: None

    def ping(self) -> None:
        raise self.failure


def test_the_redis_store_check_stops_for_a_refused_login_and_waits_for_an_outage() -> None:
    refused = RedisDedupStore(PingClient(  # type: ignore[arg-type]
        redis.AuthenticationError("invalid password")))
    with pytest.raises(DedupStoreRefused, match="Redis refuses the dedup store's client: "
                       "invalid password; check the client's username and password"):
        refused.check_usable()
    away = RedisDedupStore(PingClient(  # type: ignore[arg-type]
        redis.ConnectionError("Connection refused")))
    with pytest.raises(DedupStoreError, match="cannot reach Redis: Connection refused"):
        away.check_usable()
