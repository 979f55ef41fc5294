"""The relay's loop over fakes: the fake cluster of router_fakes, a table of rows, a lock."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc_router.config.compiled import compile_config
from cdc_router.config.model import RouterConfig
from cdc_router.errors import EXIT_RESTART, ConfigError, DecodeError, LockLost
from cdc_router.relay import backoff as relay_backoff
from cdc_router.relay import lost_commit
from cdc_router.relay.guard import DatabaseIdentity, RelayPosition, Snapshot
from cdc_router.relay.loop import OutboxRelay
from cdc_router.relay.reader import FetchedRows, RelayRow
from cdc_router.router.replay import DEAD_LETTERED_KEY_PREFIX, changelog_records
from tests.unit.router_fakes import (
    CHANGELOG,
    DLQ,
    ORDERS,
    FakeChangelog,
    FakeCluster,
    FakeProducer,
    Stored,
)


@pytest.fixture(autouse=True)
def _read_back_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle relay reads its position back for the batch it holds at once (5 s in use)."""
    monkeypatch.setattr(lost_commit, "HELD_READ_BACK_S", 0.0)


TABLE = "public.outbox"
POSITION = "shop.relay-position"


SHOP = DatabaseIdentity("shop", "7301")


class FakeTable:
    """Committed rows (seq, txid); the snapshot is set by the test."""

    def __init__(self) -> None:
        self.rows: list[RelayRow] = []
        self.now = Snapshot(1, 1)
        self.columns: dict[str, dict[str, Any]] = {}
        self.fetches = 0
        self.database = SHOP

    def add(self, seq: int, txid: int, **values: Any) -> str:
        event_id = f"00000000-0000-4000-8000-{seq:012d}"
        self.rows.append(RelayRow(seq, txid, {
            "id": event_id, "aggregatetype": "Order", "aggregateid": f"o-{seq % 3}",
            "type": "OrderPaid", "payload": json.dumps({"seq": seq}), "headers": None,
            "created_at": "2026-03-01 10:11:12.123456", **values}))
        return event_id

    def snapshot(self) -> Snapshot:
        return self.now

    def fetch(self, position: RelayPosition, limit: int) -> FetchedRows:
        self.fetches += 1
        return FetchedRows(sorted((row for row in self.rows
                                   if position.wanted(row.txid, row.seq)),
                                  key=lambda row: row.seq)[:limit])

    def passed_ids(self, position: RelayPosition, keep: Callable[[str], bool]) -> list[str]:
        return [str(row.values["id"]) for row in self.rows
                if position.passed(row.txid, row.seq) and keep(str(row.values["id"]))]

    def reset(self) -> None:
        pass


class FakeLock:
    def __init__(self) -> None:
        self.alive = True
        self.released = False

    def acquire(self, wait: Any) -> bool:
        return True

    def held(self) -> bool:
        return self.alive

    def release(self) -> None:
        self.released = True


def _relay(cluster: FakeCluster, table: FakeTable, lock: FakeLock | None = None,
           batch_rows: int = 3, name: str = TABLE,
           dedup: bool = True,
           guarantee: str = "exactly_once",
           cleanup: str = "none",
           on_started: Callable[[], None] = lambda: None) -> tuple[OutboxRelay, list[str]]:
    config = RouterConfig.model_validate({
        "source": {"group_id": "shop"}, "routes": [{"topic": ORDERS}],
        "dedup": {"enabled": dedup}, "delivery": {"guarantee": guarantee},
        "cleanup": {"mode": cleanup},
        "relay": {"table": name, "batch_rows": batch_rows, "poll_interval_ms": 10}})
    delivered: list[str] = []

    def records(kafka: dict[str, Any], topic: str, what: str, timeout_s: float = 300.0
                ) -> Iterator[tuple[Any, Any]]:
        for stored in cluster.committed(topic):
            yield stored.key, stored.value

    relay = OutboxRelay(compile_config(config), dsn="postgresql://unused", instance_id="t",
                        producer_factory=lambda conf: FakeProducer(cluster, conf),
                        describe_factory=cluster.describe_factory,
                        operations_factory=cluster.operations_factory,
                        reader=table, lock=lock or FakeLock(), records=records,
                        changelogs=lambda kafka, topic, **_: FakeChangelog(cluster, topic),
                        on_started=on_started,
                        on_delivered=lambda events: delivered.extend(
                            e.event_id if e.topic else f"replayed {e.event_id}" for e in events))
    return relay, delivered


def _cluster() -> FakeCluster:
    cluster = FakeCluster()
    cluster.partitions[POSITION] = 1
    return cluster


def _failing_first(table: FakeTable, error: psycopg.Error, times: int) -> None:
    """The table's first `times` fetches raise `error`, the next ones read."""
    fetch, failures = table.fetch, [error] * times

    def failing(position: RelayPosition, limit: int) -> FetchedRows:
        if failures:
            raise failures.pop()
        return fetch(position, limit)

    table.fetch = failing  # type: ignore[method-assign]


def _relayed_after_read_failures(monkeypatch: pytest.MonkeyPatch,
                                 caplog: pytest.LogCaptureFixture, times: int,
                                 error: psycopg.Error) -> tuple[FakeCluster, list[str], list[str]]:
    """Two rows relayed after `times` reads that raised `error`: the cluster, their ids and
    the relay's log lines (INFO and up)."""
    monkeypatch.setattr(relay_backoff, "BACKOFF_S", (0.001, 0.001))
    cluster, table = _cluster(), FakeTable()
    ids = [table.add(seq, 10) for seq in (1, 2)]
    table.now = Snapshot(11, 11)
    _failing_first(table, error, times)
    relay, delivered = _relay(cluster, table)
    with caplog.at_level("INFO", logger="cdc_router.relay"):
        _run_until(relay, lambda: len(delivered) == 2 and table.fetches > times)
    return cluster, ids, [record.getMessage() for record in caplog.records]


def _run_until(relay: OutboxRelay, done: Any, timeout_s: float = 10) -> BaseException | None:
    """Run the relay on a thread until `done()` holds, then stop it; what run() raised."""
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(relay.run)
        deadline = threading.Event()
        for _ in range(int(timeout_s / 0.01)):
            if done() or running.done():
                break
            deadline.wait(0.01)
        relay.stop()
        return running.exception(timeout=10)


def test_each_batch_commits_its_records_with_the_next_position() -> None:
    cluster, table = _cluster(), FakeTable()
    ids = [table.add(seq, txid) for seq, txid in ((1, 10), (2, 12), (3, 10), (4, 11))]
    table.now = Snapshot(13, 13)
    relay, delivered = _relay(cluster, table)
    _run_until(relay, lambda: len(delivered) == 4)
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == ids  # seq order
    positions = [RelayPosition.from_json(s.value) for s in cluster.committed(POSITION)
                 if s.value is not None]
    # A full batch of 3 pages on within the read; the short one ends it.
    assert positions == [RelayPosition(None, Snapshot(13, 13), 3, SHOP), RelayPosition(
        Snapshot(13, 13), database=SHOP)]
    assert [s.key for s in cluster.committed(POSITION)] == [TABLE.encode()] * 2
    assert delivered == ids


def test_a_restarted_relay_goes_on_from_the_committed_position() -> None:
    """Without the replay filter: the position alone keeps the first row from going twice."""
    cluster, table = _cluster(), FakeTable()
    first = table.add(1, 10)
    second = table.add(2, 11)  # still running at the first snapshot
    table.now = Snapshot(11, 12, (11,))
    relay, _ = _relay(cluster, table, dedup=False)
    _run_until(relay, lambda: len(cluster.committed(ORDERS)) == 1)
    table.now = Snapshot(12, 12)
    # The same table, spelled otherwise: the same position.
    again, _ = _relay(cluster, table, name="outbox", dedup=False)
    _run_until(again, lambda: len(cluster.committed(ORDERS)) >= 2)
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == [first, second]


def test_a_position_of_another_database_stops_the_relay_before_it_reads() -> None:
    # QA 48-c F2: one config, two tenants' databases: the second relay went on from the first
    # one's position, and 609 of its 621 rows were passed over for good.
    cluster, table = _cluster(), FakeTable()
    table.add(1, 10)
    table.now = Snapshot(11, 11)
    relay, _ = _relay(cluster, table, dedup=False)
    _run_until(relay, lambda: len(cluster.committed(ORDERS)) == 1)
    tenant = FakeTable()
    tenant.database = DatabaseIdentity("tenant2", "7301")
    tenant.add(1, 5)
    tenant.now = Snapshot(6, 6)
    other, _ = _relay(cluster, tenant, dedup=False)
    with pytest.raises(ConfigError, match=r"field 'source.group_id': the relay position of "
                       r".* counts the transactions of database 'shop' of cluster 7301, and "
                       r"this relay reads database 'tenant2' of cluster 7301.*own "
                       r"source.group_id"):
        other.run()
    assert len(cluster.committed(ORDERS)) == 1


def test_a_failed_commit_keeps_the_position_and_the_batch_is_read_again() -> None:
    cluster, table = _cluster(), FakeTable()
    ids = [table.add(seq, 10) for seq in (1, 2)]
    table.now = Snapshot(11, 11)
    cluster.commit_failures.append(KafkaError(KafkaError._TIMED_OUT, "commit timed out",
                                              txn_requires_abort=True))
    relay, delivered = _relay(cluster, table)
    _run_until(relay, lambda: len(delivered) == 2)
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == ids  # once each
    assert cluster.journal.count("abort") == 1 and table.fetches >= 2
    assert relay.position == RelayPosition(Snapshot(11, 11), database=SHOP)


def test_a_fatal_abort_after_an_outage_renews_the_producer_and_the_batch_is_read_again() -> None:
    # QA, session 28: after a 90 s Kafka outage the pending abort got a fatal INVALID_TXN_STATE
    # when the broker came back, and the relay exited 1.
    cluster, table = _cluster(), FakeTable()
    ids = [table.add(seq, 10) for seq in (1, 2)]
    table.now = Snapshot(11, 11)
    cluster.commit_failures.append(KafkaError(KafkaError._TIMED_OUT, "commit timed out",
                                              txn_requires_abort=True))

    def refuse_the_abort(timeout: float) -> None:
        # Review, session 28: the new producer's init can time out too: retried, no traceback.
        cluster.init_failures.append(KafkaError(KafkaError._TIMED_OUT, "init timed out",
                                                retriable=True))
        raise KafkaException(KafkaError(KafkaError.INVALID_TXN_STATE, "Failed to end "
                                        "transaction", fatal=True))

    relay, delivered = _relay(cluster, table)
    relay._producer.client.abort_transaction = refuse_the_abort  # type: ignore[method-assign]
    _run_until(relay, lambda: len(delivered) == 2)
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == ids  # once each
    assert cluster.producers_initialised == 2 and cluster.init_failures == []
    assert relay.position == RelayPosition(Snapshot(11, 11), database=SHOP)


def test_an_abort_that_keeps_timing_out_is_ended_by_a_new_producer() -> None:
    # QA 36-b (the router's loop): an abort timing out at every try was retried without end.
    cluster, table = _cluster(), FakeTable()
    ids = [table.add(seq, 10) for seq in (1, 2)]
    table.now = Snapshot(11, 11)
    cluster.commit_failures.append(KafkaError(KafkaError._TIMED_OUT, "commit timed out",
                                              txn_requires_abort=True))
    cluster.abort_failures = [KafkaError(KafkaError._TIMED_OUT, "Timed out", retriable=True)] * 60
    relay, delivered = _relay(cluster, table)
    _run_until(relay, lambda: len(delivered) == 2)
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == ids  # once each
    assert len(cluster.abort_failures) == 54 and cluster.producers_initialised == 2
    assert relay.position == RelayPosition(Snapshot(11, 11), database=SHOP)


def test_a_producer_that_never_gets_metadata_again_is_renewed_after_failures_in_a_row(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 37-b (the router's loop): a producer whose metadata requests failed for good was
    # backed off for ever.
    monkeypatch.setattr(relay_backoff, "BACKOFF_S", (0.001, 0.001))
    cluster, table = _cluster(), FakeTable()
    ids = [table.add(1, 10)]
    table.now = Snapshot(11, 11)
    relay, delivered = _relay(cluster, table)

    def lose_metadata_after_the_first() -> bool:
        if len(delivered) == 1 and not cluster.metadata_lost_producers:
            cluster.metadata_lost_producers = cluster.producers_built
            relay._destinations.clear()  # its cached counts expire: asked again
            ids.append(table.add(2, 12))
            table.now = Snapshot(13, 13)
        return len(delivered) == 2

    _run_until(relay, lose_metadata_after_the_first)
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == ids  # once each
    assert cluster.producers_built == 2 and cluster.producers_purged == 1


def test_a_fence_met_by_the_abort_of_a_failed_commit_renews_the_producer() -> None:
    # Review, session 30: the commit fails abortably while a fence waits to be served; the
    # abort's poll(0) raised it as a bare KafkaException and the relay exited 1.
    cluster, table = _cluster(), FakeTable()
    cluster.fence_on_serve = True
    ids = [table.add(seq, 10) for seq in (1, 2)]
    table.now = Snapshot(11, 11)
    relay, delivered = _relay(cluster, table)
    client = relay._producer.client

    def fenced_meanwhile(timeout: float) -> None:
        cluster.fence()
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit timed out",
                                        txn_requires_abort=True))

    client.commit_transaction = fenced_meanwhile  # type: ignore[method-assign]
    _run_until(relay, lambda: len(delivered) == 2)
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == ids  # once each
    assert cluster.producers_initialised == 2


def test_a_relay_that_lost_its_lock_stops_instead_of_renewing_its_producer() -> None:
    # Review, session 28: another relay may own the transactional id by now.
    cluster, table, lock = _cluster(), FakeTable(), FakeLock()
    table.add(1, 10)
    table.now = Snapshot(11, 11)
    cluster.commit_failures.append(KafkaError(KafkaError._TIMED_OUT, "commit timed out",
                                              txn_requires_abort=True))

    def lose_lock_then_fail(timeout: float) -> None:
        lock.alive = False
        raise KafkaException(KafkaError(KafkaError.INVALID_TXN_STATE, "Failed to end "
                                        "transaction", fatal=True))

    relay, _ = _relay(cluster, table, lock=lock)
    relay._producer.client.abort_transaction = lose_lock_then_fail  # type: ignore[method-assign]
    with pytest.raises(LockLost, match="lost its lock"):
        relay.run()
    assert cluster.producers_initialised == 1


def _one_letter_then_the_good_row(table: FakeTable) -> tuple[Stored, list[str], str]:
    """The first row of `table` dead-lettered, a good row after it: its letter, what was
    delivered, the good row's id."""
    cluster = _cluster()
    good = table.add(2, 10)
    table.now = Snapshot(11, 11)
    relay, delivered = _relay(cluster, table)
    _run_until(relay, lambda: len(delivered) == 1)
    [letter] = cluster.committed(DLQ)
    return letter, delivered, good


def test_a_row_that_fails_to_decode_is_a_dead_letter_with_the_row() -> None:
    table = FakeTable()
    bad = table.add(1, 10, payload=None)
    letter, delivered, good = _one_letter_then_the_good_row(table)
    assert letter.header("dlq.stage") == "decode"
    assert letter.header("dlq.source.topic") == TABLE
    assert letter.header("dlq.source.offset") == "1"
    assert json.loads(letter.value or b"")["after"]["id"] == bad
    assert delivered == [good]


def test_a_row_the_reader_could_not_read_as_text_is_a_decode_letter_with_its_id() -> None:
    # A SQL_ASCII database's non-UTF-8 text failed every read (stop 46, documented).
    table = FakeTable()
    bad = table.add(1, 10, aggregateid="caf\\xe9")
    undecodable = DecodeError("column 'aggregateid' is not UTF-8 text")
    undecodable.event_id = bad
    table.rows[0] = dataclasses.replace(table.rows[0], undecodable=undecodable)
    letter, delivered, good = _one_letter_then_the_good_row(table)
    assert letter.header("dlq.stage") == "decode"
    assert letter.header("dlq.event.id") == bad
    assert "not UTF-8" in (letter.header("dlq.error.message") or "")
    assert json.loads(letter.value or b"")["after"]["aggregateid"] == "caf\\xe9"
    assert delivered == [good]


def test_an_id_in_the_changelog_is_dropped_as_a_replay() -> None:
    cluster, table = _cluster(), FakeTable()
    seen = table.add(1, 10)
    fresh = table.add(2, 10)
    cluster.publish(CHANGELOG, [Stored(CHANGELOG, 0, mark.key, mark.value, [], None)
                                for mark in changelog_records([seen], int(time.time() * 1000))])
    table.now = Snapshot(11, 11)
    relay, delivered = _relay(cluster, table)
    _run_until(relay, lambda: len(delivered) == 2)
    # QA 32-a: the replay's row goes to the cleanup too (an id reused by a new row).
    assert delivered == [fresh, f"replayed {seen}"]
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == [fresh]


def test_the_start_line_says_the_ids_held_apart_from_the_marks_read(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 66-c F-3: `dedup_ids=` gave the marks read, expired ones among them.
    cluster, table = _cluster(), FakeTable()
    now_ms = int(time.time() * 1000)
    marks = [*changelog_records(["old-id"], now_ms - 8 * 86_400_000),
             *changelog_records(["new-id"], now_ms)]
    cluster.publish(CHANGELOG, [Stored(CHANGELOG, 0, m.key, m.value, [], None) for m in marks])
    table.add(1, 10)
    table.now = Snapshot(11, 11)
    relay, delivered = _relay(cluster, table)
    with caplog.at_level(logging.INFO, logger="cdc_router"):
        _run_until(relay, lambda: len(delivered) == 1)
    [line] = [r.getMessage() for r in caplog.records if "event=relay_started" in r.getMessage()]
    assert " dedup_ids=1 restored=2 " in line


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_the_rows_a_killed_relay_delivered_and_left_go_at_the_next_start(guarantee: str) -> None:
    """QA 55-b F-1: at least once, a relay killed between its commit and the cleanup's delete
    left its delivered rows behind the position for ever (no sweep there); the next start hands
    the cleanup those the changelog marks delivered, never a dead-lettered one. Exactly once,
    the cleanup's sweep does it (router/committed_ids.py), not the start."""
    cluster, table = _cluster(), FakeTable()
    delivered_before = [table.add(1, 10), table.add(2, 10)]
    table.add(3, 10, payload=None)  # a decode letter: no mark, its row stays
    dead = table.add(4, 10)  # dead-lettered before (a `dead:` mark): its row stays
    cluster.publish(CHANGELOG, [Stored(CHANGELOG, 0, mark.key, mark.value, [], None)
                                for mark in changelog_records([dead], int(time.time() * 1000),
                                                              DEAD_LETTERED_KEY_PREFIX,
                                                              group="shop")])
    table.now = Snapshot(11, 11)
    killed, _ = _relay(cluster, table, batch_rows=2, guarantee=guarantee,
                       cleanup="delete")
    _run_until(killed, lambda: len(cluster.committed(ORDERS)) == 2 and
               killed.position.reading is None)
    # Its cleanup never deleted them (the kill): the rows are all still in the table.
    fresh = table.add(5, 12)
    table.now = Snapshot(13, 13)
    again, delivered = _relay(cluster, table, batch_rows=2, guarantee=guarantee,
                             cleanup="delete")
    _run_until(again, lambda: fresh in delivered)
    left_behind = [f"replayed {event_id}" for event_id in delivered_before]
    # Exactly once, the fresh row once a read-back of the position confirmed its commit
    # (review 59-r F-2: a commit Kafka lost), at the next idle poll.
    assert delivered == ([*left_behind, fresh] if guarantee == "at_least_once" else [fresh])
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == [*delivered_before, fresh]


def test_a_lost_lock_stops_the_relay_with_one_line_for_a_restart() -> None:
    cluster, table, lock = _cluster(), FakeTable(), FakeLock()
    lock.alive = False
    relay, _ = _relay(cluster, table, lock)
    with pytest.raises(LockLost, match=r"lost its lock on public\.outbox") as stopped:
        relay.run()
    assert stopped.value.exit_code == EXIT_RESTART
    assert lock.released


def test_a_row_the_broker_refuses_is_isolated_and_dead_lettered_the_rest_once() -> None:
    cluster, table = _cluster(), FakeTable()
    ids = [table.add(seq, 10) for seq in range(1, 6)]
    poison = table.add(6, 10, payload=json.dumps({"poison": True}))
    table.now = Snapshot(11, 11)
    cluster.refuse = lambda topic, value, timestamp: (
        KafkaError.MSG_SIZE_TOO_LARGE if topic == ORDERS and b"poison" in (value or b"")
        else None)
    relay, delivered = _relay(cluster, table, batch_rows=10)
    _run_until(relay, lambda: len(cluster.committed(DLQ)) == 1 and len(delivered) == len(ids))
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == ids
    [letter] = cluster.committed(DLQ)
    assert letter.header("dlq.stage") == "produce" and letter.header("dlq.event.id") == poison
    assert delivered == ids
    # Counted once, at the commit of its batch (QA 43-a: each re-read counted it again).
    assert relay._metrics.registry.get_sample_value(
        "cdc_router_dead_letters_total", {"stage": "produce"}) == 1.0


def test_a_dead_lettered_id_inserted_again_is_dropped_with_the_warning_naming_dlq_replay(
        caplog: pytest.LogCaptureFixture) -> None:
    # Fixer 53-g: the relay's replay lines had no replay filter, so such a row was dropped
    # with an ordinary INFO line, nothing saying that its letter is what delivers it.
    cluster, table = _cluster(), FakeTable()
    table.add(1, 10)
    poison = table.add(2, 10, payload=json.dumps({"poison": True}))
    table.now = Snapshot(11, 11)
    cluster.refuse = lambda topic, value, timestamp: (
        KafkaError.MSG_SIZE_TOO_LARGE if topic == ORDERS and b"poison" in (value or b"")
        else None)
    relay, _ = _relay(cluster, table, batch_rows=10)

    def again() -> bool:
        if cluster.committed(DLQ) and len(table.rows) == 2:
            table.add(3, 12, id=poison)  # the row inserted again, under its own id
            table.now = Snapshot(13, 13)
        return any("the id was dead-lettered" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.INFO, logger="cdc_router"):
        assert _run_until(relay, again) is None
    assert again() and len(cluster.committed(DLQ)) == 1 and cluster.committed(ORDERS)[-1].key != \
        poison.encode()


def test_a_topic_librdkafka_calls_unknown_but_the_cluster_lists_is_retried() -> None:
    cluster, table = _cluster(), FakeTable()
    ids = [table.add(seq, 10) for seq in range(1, 5)]
    table.now = Snapshot(11, 11)
    cluster.unknown_on_produce[ORDERS] = 1  # librdkafka's metadata lags the cluster's
    relay, delivered = _relay(cluster, table, batch_rows=10)
    _run_until(relay, lambda: len(delivered) == 4)
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == ids
    assert cluster.committed(DLQ) == []


def test_a_standby_stopped_while_it_waits_closes_its_lock_connection(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 43: run() returned before its try/finally, leaving the lock's connection open;
    # QA 53-a: and without the event=stopped line the active relay logs.
    class Standby(FakeLock):
        def acquire(self, wait: Any) -> bool:
            while not wait(0.01):
                pass
            return False

    lock = Standby()
    relay, _ = _relay(_cluster(), FakeTable(), lock)
    with caplog.at_level(logging.INFO, logger="cdc_router"):
        _run_until(relay, lambda: True)
    assert lock.released
    assert any("event=stopped" in r.getMessage() and "standby=true" in r.getMessage()
               for r in caplog.records)


def test_postgres_failures_do_not_count_toward_the_producer_renewal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 43: reads that failed shared the aborts' count, so that after 5 of them one
    # passing Kafka abort renewed the producer (RENEW_AFTER_ABORTS).
    monkeypatch.setattr(relay_backoff, "BACKOFF_S", (0.001, 0.001))
    cluster, table = _cluster(), FakeTable()
    ids = [table.add(seq, 10) for seq in (1, 2)]
    table.now = Snapshot(11, 11)
    _failing_first(table, psycopg.OperationalError("server closed the connection"), 5)
    cluster.commit_failures.append(KafkaError(KafkaError._TIMED_OUT, "commit timed out",
                                              txn_requires_abort=True))
    relay, delivered = _relay(cluster, table)
    _run_until(relay, lambda: len(delivered) == 2)
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == ids  # once each
    assert cluster.producers_initialised == 1, "renewed after one abort"


@pytest.mark.parametrize(("granted", "refusal"), [
    ({"DESCRIBE", "READ"}, "may not write topic shop.relay-position .*grant it Write on the "
                           "topic"),
    ({"DESCRIBE", "WRITE"}, "may not read topic shop.relay-position .*grant it Read on the "
                            r"topic \(the relay reads its position back at each start\)"),
])
def test_a_position_topic_the_principal_may_not_use_stops_the_start(
        granted: set[str], refusal: str) -> None:
    # Review 51-d F10: without Write it was met in the first batch's transaction, and the relay
    # stopped saying "INVALID_TXN_STATE ... another relay of the table may have taken over".
    cluster, table = _cluster(), FakeTable()
    cluster.granted[POSITION] = frozenset(granted)
    table.add(1, 10)
    table.now = Snapshot(11, 11)
    relay, _ = _relay(cluster, table)
    raised = _run_until(relay, lambda: False, 5)
    assert isinstance(raised, ConfigError), raised
    assert re.search(f"field 'relay.position_topic': .*{refusal}", str(raised)), raised
    assert cluster.committed(ORDERS) == [] and table.fetches == 0


def test_write_on_the_position_topic_revoked_while_relaying_stops_naming_it() -> None:
    # Review 51-d F10: AddPartitionsToTxn refused the position topic, the abort was refused
    # too (INVALID_TXN_STATE, as measured), and the relay stopped guessing at another relay.
    cluster, table = _cluster(), FakeTable()
    ids = [table.add(seq, 10) for seq in (1, 2)]
    table.now = Snapshot(11, 11)
    fetch = table.fetch

    def revoked(position: RelayPosition, limit: int) -> FetchedRows:
        cluster.add_partitions_refused.add(POSITION)
        cluster.granted[POSITION] = frozenset({"DESCRIBE", "READ"})
        cluster.abort_failures.append(KafkaError(
            KafkaError.INVALID_TXN_STATE, "Failed to end transaction", fatal=True))
        return fetch(position, limit)

    table.fetch = revoked  # type: ignore[method-assign]
    relay, delivered = _relay(cluster, table)
    raised = _run_until(relay, lambda: False, 5)
    assert isinstance(raised, ConfigError) and raised.exit_code == 1, raised
    assert re.search("field 'relay.position_topic': .*may not write topic shop.relay-position "
                     ".*grant it Write on the topic", str(raised)), raised
    assert cluster.committed(ORDERS) == [] and delivered == [] and len(ids) == 2  # kept


def test_a_select_grant_revoked_while_relaying_is_said_with_the_grant_and_the_resume_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Review 51-d F9: every retry logged only "permission denied for table outbox". QA 67-a
    # F-3: after failures backed off up to 30 s, no line said the reads went on.
    cluster, ids, lines = _relayed_after_read_failures(monkeypatch, caplog, 3, psycopg.errors.
                                                       InsufficientPrivilege("permission denied "
                                                                             "for table outbox"))
    said = [line for line in lines if "batch_failed" in line]
    assert len(said) == 3 and all(f"GRANT SELECT ON {TABLE} TO the role of relay.dsn" in line
                                  for line in said), said
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == ids  # granted again: on
    resumed = [line for line in lines if "read_resumed" in line]
    assert len(resumed) == 1 and re.fullmatch(
        rf"event=read_resumed table={TABLE} failures=3 after_s=\d+\.\d", resumed[0]), resumed


def test_after_a_failover_that_reused_xids_a_tombstoned_position_reads_the_table_again() -> None:
    # Review 46 F7: a promoted replica that lost transaction 11 gives its id to a new one. The
    # position (done: all below 13) cannot tell: its row is skipped. The README's runbook
    # deletes the table's position record; the table is read again, the replay filter drops
    # what was delivered.
    cluster, table = _cluster(), FakeTable()
    first = table.add(1, 10)
    table.now = Snapshot(13, 13)
    relay, _ = _relay(cluster, table)
    _run_until(relay, lambda: len(cluster.committed(ORDERS)) == 1)
    reused = table.add(2, 11)  # on the new primary, whose ids have passed 13 since
    table.now = Snapshot(20, 20)
    skipped, _ = _relay(cluster, table)
    fetches = table.fetches
    _run_until(skipped, lambda: table.fetches >= fetches + 3)  # idle reads: nothing wanted
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == [first]  # the limit
    cluster.publish(POSITION, [Stored(POSITION, 0, TABLE.encode(), None, [], None)])
    again, delivered = _relay(cluster, table)
    _run_until(again, lambda: len(cluster.committed(ORDERS)) >= 2 and len(delivered) >= 2)
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == [first, reused]
    assert f"replayed {first}" in delivered


def test_a_created_at_of_the_epoch_is_delivered_by_the_relay_with_the_producers_clock() -> None:
    # QA 53-a F1: the relay dead-lettered a row dated 1970-01-01 00:00:00 with advice about
    # Kafka Connect's JsonConverter, which the relay does not use: it reads Postgres itself, so
    # the value is the row's. Delivered, its record gets the producer's clock (confluent-kafka
    # reads a timestamp 0 as "now"), also on a topic whose retention would drop a 1970 record.
    cluster, table = _cluster(), FakeTable()
    cluster.topic_configs[ORDERS] = {"retention.ms": "86400000000", "cleanup.policy": "delete"}
    epoch = table.add(1, 10, created_at="1970-01-01 00:00:00")
    dated = table.add(2, 10)
    table.now = Snapshot(11, 11)
    relay, delivered = _relay(cluster, table)
    _run_until(relay, lambda: len(delivered) == 2)
    assert delivered == [epoch, dated] and cluster.committed(DLQ) == []
    first, second = cluster.committed(ORDERS)
    assert first.timestamp is None  # the producer's clock
    assert second.timestamp == 1772359872123


def _started_with_position_config(found: dict[str, str] | Exception,
                                  caplog: pytest.LogCaptureFixture) -> list[str]:
    """The relay's warnings of its start with the position topic's config `found` (or the
    describe failing with it)."""
    cluster, table = _cluster(), FakeTable()
    table.add(1, 10)
    table.now = Snapshot(11, 11)
    describe = cluster.describe_factory

    def describe_factory(admin_config: Any) -> Any:
        others = describe(admin_config)

        def described(topic: str, timeout_s: float) -> dict[str, str]:
            if topic != POSITION:
                return dict(others(topic, timeout_s))
            if isinstance(found, Exception):
                raise found
            return found
        return described

    cluster.describe_factory = describe_factory  # type: ignore[method-assign]
    relay, delivered = _relay(cluster, table)
    with caplog.at_level(logging.DEBUG, logger="cdc_router"):
        assert _run_until(relay, lambda: len(delivered) == 1) is None
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
            and "position_topic_config" in r.getMessage()]


def test_a_position_topic_without_the_bounds_of_topics_apply_is_warned_at_start(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 62 P-2: a topic made before topics apply gave segment.ms and delete.retention.ms
    # was read whole at each start (up to 1 GiB) and nothing said so.
    warned = _started_with_position_config(
        {"cleanup.policy": "compact", "segment.ms": "604800000",
         "delete.retention.ms": "600000"}, caplog)
    assert len(warned) == 1, warned
    assert f"topic={POSITION}" in warned[0]
    assert "segment.ms=604800000 (wanted 600000)" in warned[0]
    assert "delete.retention" not in warned[0].split("reason=")[0]
    assert "cdc-router topics apply -c <config>" in warned[0]


@pytest.mark.parametrize("segment_ms", ["600000", "60000"])  # 60000: set tighter by hand
def test_a_position_topic_as_topics_apply_makes_it_is_not_warned(
        caplog: pytest.LogCaptureFixture, segment_ms: str) -> None:
    assert _started_with_position_config(
        {"cleanup.policy": "compact", "segment.ms": segment_ms,
         "delete.retention.ms": "600000"}, caplog) == []


def test_a_position_topic_missing_a_bound_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    warned = _started_with_position_config({"cleanup.policy": "compact", "segment.ms": "60000"},
                                           caplog)
    assert len(warned) == 1, warned
    assert "delete.retention.ms=unset (wanted 600000)" in warned[0]
    assert "segment.ms" not in warned[0].split("reason=")[0]


def test_a_refused_describe_of_the_position_topic_is_no_warning_and_no_failure(
        caplog: pytest.LogCaptureFixture) -> None:
    refused = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    assert _started_with_position_config(refused, caplog) == []
    assert "event=position_config_unchecked" in caplog.text


@pytest.mark.parametrize("missing", [None, DLQ, CHANGELOG, POSITION])
def test_on_started_is_called_once_the_starts_checks_passed_never_before_a_refusal(
        missing: str | None) -> None:
    # QA 61-a F-5: the cleanup's sweep, started before, said its failure on a missing topic
    # before the relay's own line naming it; the relay now starts the cleanup when it can run.
    cluster, table = _cluster(), FakeTable()
    if missing is not None:
        cluster.partitions.pop(missing, None)
    table.add(1, 10)
    table.now = Snapshot(11, 11)
    started: list[int] = []
    relay, delivered = _relay(cluster, table, on_started=lambda: started.append(len(delivered)))
    raised = _run_until(relay, lambda: len(delivered) == 1, 5)
    if missing is None:
        assert raised is None and started == [0]
    else:
        assert isinstance(raised, ConfigError) and missing in str(raised), raised
        assert started == []


@pytest.mark.parametrize("then", ["a new row", "nothing"])
def test_a_run_of_replays_past_the_lines_cap_is_summed_up_by_the_relay(
        then: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 66: the relay never ended a run (only the router's batch writer did), so after
    # `replay_lines_capped ... their number said when the run ends` it said none, unless a
    # replay came a minute later (and then counted every replay since its start).
    from cdc_router.router import replay_log
    monkeypatch.setattr(replay_log, "RUN_IDLE_S", 0.0)
    cluster, table = _cluster(), FakeTable()
    replayed = [table.add(seq, 10) for seq in range(1, 106)]
    fresh = table.add(106, 10) if then == "a new row" else None
    cluster.publish(CHANGELOG, [Stored(CHANGELOG, 0, mark.key, mark.value, [], None)
                                for mark in changelog_records(replayed, int(time.time() * 1000))])
    table.now = Snapshot(11, 11)
    relay, _ = _relay(cluster, table, batch_rows=200)
    with caplog.at_level(logging.INFO, logger="cdc_router"):
        _run_until(relay, lambda: "event=replays_dropped" in caplog.text)
    assert "event=replays_dropped count=105 unsaid=5 " in caplog.text
    assert [s.key.decode() for s in cluster.committed(ORDERS)] == ([fresh] if fresh else [])
