"""The relay after a commit Kafka acknowledged, then lost (review 59-r F-2; relay/lost_commit.py):
the batch is read again from the stored position and delivered once, its rows are not handed
to the cleanup before their marks are read committed, and one loss is dealt with once."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc_router.errors import LockLost
from cdc_router.relay import lost_commit
from cdc_router.relay.guard import DatabaseIdentity, RelayPosition, Snapshot
from cdc_router.relay.loop import OutboxRelay
from cdc_router.relay.reader import FetchedRows
from cdc_router.relay.start import RestoredChangelog
from cdc_router.router.replay import changelog_records
from cdc_router.router.values import Delivered
from tests.unit.router_fakes import CHANGELOG, ORDERS, FakeCluster, Stored
from tests.unit.test_relay_loop import (
    POSITION,
    FakeLock,
    FakeTable,
    _cluster,
    _relay,
    _run_until,
)


@pytest.fixture(autouse=True)
def _read_back_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle relay reads its position back for the batch it holds at once (5 s in use)."""
    monkeypatch.setattr(lost_commit, "HELD_READ_BACK_S", 0.0)


def _lines(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(event)]


def _position_reads(relay: OutboxRelay,
                    timeouts: list[float] | None = None) -> list[str]:
    """Wraps the relay's topic reads and changelog readers: the topics read, in order (and
    into `timeouts`, the time each was given)."""
    read: list[str] = []
    records, changelogs = relay._records, relay._changelogs

    def counted(kafka: dict[str, Any], topic: str, what: str, timeout_s: float = 300.0
                ) -> Iterator[tuple[Any, Any]]:
        read.append(topic)
        if timeouts is not None:
            timeouts.append(timeout_s)
        return iter(list(records(kafka, topic, what, timeout_s=timeout_s)))

    def changelog(kafka: dict[str, Any], topic: str, *, group_id: str,
                  timeout_s: float) -> RestoredChangelog:
        read.append(topic)
        if timeouts is not None:
            timeouts.append(timeout_s)
        return changelogs(kafka, topic, group_id=group_id, timeout_s=timeout_s)

    relay._records, relay._changelogs = counted, changelog
    return read


def _handed_before_visible(relay: OutboxRelay, cluster: FakeCluster) -> list[str]:
    """Wraps the relay's hand-off to the cleanup: the ids it hands before their events are
    committed on the destination (none may be: the cleanup deletes their rows)."""
    early: list[str] = []
    on_delivered = relay._on_delivered
    assert on_delivered is not None

    def checked(events: list[Any]) -> None:
        visible = {stored.key.decode() for stored in cluster.committed(ORDERS)}
        early.extend(e.event_id for e in events if e.topic and e.event_id not in visible)
        on_delivered(events)

    relay._on_delivered = checked
    return early


def _lost_then_more(cluster: FakeCluster, table: FakeTable, ids: list[str]) -> Any:
    """done(): once the first batch's commit is lost, rows 4-6 are written."""
    def done() -> bool:
        if "commit lost" in cluster.journal and len(table.rows) == 3:
            ids.extend(table.add(seq, 11) for seq in (4, 5, 6))
            table.now = Snapshot(12, 12)
        return len(cluster.committed(ORDERS)) >= 6 or cluster.journal.count("abort") > 3
    return done


def test_a_batch_whose_commit_kafka_lost_is_delivered_again_once(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 59-r F-2: rows 1-3 were never visible, yet handed to the cleanup, and the next
    # commit's position was past them.
    caplog.set_level(logging.INFO)
    cluster, table = _cluster(), FakeTable()
    ids = [table.add(seq, 10) for seq in (1, 2, 3)]
    table.now = Snapshot(11, 11)
    cluster.lost_commits = 1
    relay, handed = _relay(cluster, table, batch_rows=3, cleanup="delete")
    early = _handed_before_visible(relay, cluster)
    _run_until(relay, _lost_then_more(cluster, table, ids), timeout_s=20)
    assert sorted(s.key.decode() for s in cluster.committed(ORDERS)) == sorted(ids)  # once
    # A batch's rows go to the cleanup once the next commit (or a read-back) confirmed it:
    # never the lost batch's before they were delivered again (review 60-v F-2: the sweep
    # alone deleted them, after a whole changelog read at each start).
    assert early == [] and handed == ids  # 4-6 once the stop read the position back
    [lost] = _lines(caplog, "event=commit_lost")
    assert 'committed={"done":null,"reading":null' in lost
    assert 'this_relay={"done":null,"reading":"11:11:","after_seq":3' in lost
    [forgotten] = _lines(caplog, "event=lost_commit_ids_forgotten")
    assert forgotten.startswith("event=lost_commit_ids_forgotten ids=3 ")
    assert len(_lines(caplog, "event=restored_after_lost_commit")) == 1


def test_one_loss_is_dealt_with_once_and_a_plain_abort_reads_the_position_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """A later abort does not detect the loss again (router: review 59-r F-4), and an abort
    reads the position back only when a batch committed since the last read."""
    cluster, table = _cluster(), FakeTable()
    ids = [table.add(seq, 10) for seq in (1, 2, 3)]
    table.now = Snapshot(11, 11)
    cluster.lost_commits = 1
    relay, _ = _relay(cluster, table, batch_rows=3)
    reads = _position_reads(relay)

    fetch = table.fetch

    def fetch_then_fail(position: RelayPosition, limit: int) -> FetchedRows:
        if len(cluster.committed(ORDERS)) == 3 and "commit timed out" not in cluster.journal:
            # Rows 1-3 read again committed: the next two commits (rows 4-6) fail.
            cluster.journal.append("commit timed out")
            cluster.commit_failures += [KafkaError(KafkaError._TIMED_OUT, "commit timed out",
                                                   txn_requires_abort=True)] * 2
        return fetch(position, limit)

    table.fetch = fetch_then_fail  # type: ignore[method-assign]

    def done() -> bool:
        if "commit lost" in cluster.journal and len(table.rows) == 3:
            ids.extend(table.add(seq, 11) for seq in (4, 5, 6))
            table.now = Snapshot(12, 12)
        return len(cluster.committed(ORDERS)) >= 6 or cluster.journal.count("abort") > 5

    _run_until(relay, done, timeout_s=20)
    assert sorted(s.key.decode() for s in cluster.committed(ORDERS)) == sorted(ids)
    assert cluster.journal.count("abort") == 3
    assert len(_lines(caplog, "event=commit_lost")) == 1
    # At the start; after the lost commit's abort, with the changelog; after the first
    # failed commit, which followed a commit; none after the second; the last batch's, read
    # back at an idle poll or at the stop, for the cleanup.
    assert reads == [CHANGELOG, POSITION, POSITION, CHANGELOG, POSITION, POSITION]


def test_a_loss_found_by_a_new_producer_is_delivered_again_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """The abort after the lost commit fails for good: the renewal reads the position back."""
    cluster, table = _cluster(), FakeTable()
    ids = [table.add(seq, 10) for seq in (1, 2, 3)]
    table.now = Snapshot(11, 11)
    cluster.lost_commits = 1
    cluster.abort_failures += [KafkaError(KafkaError._TIMED_OUT, "abort timed out")] * 5
    relay, _ = _relay(cluster, table, batch_rows=3)
    _run_until(relay, _lost_then_more(cluster, table, ids), timeout_s=30)
    assert sorted(s.key.decode() for s in cluster.committed(ORDERS)) == sorted(ids)
    assert cluster.producers_initialised >= 2
    assert len(_lines(caplog, "event=commit_lost")) == 1


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_what_the_cleanup_is_handed_at_commit(guarantee: str) -> None:
    """Exactly once: a batch's rows once the next commit or a read-back of the position (at
    the next idle poll) confirmed it; at least once, no transaction whose markers Kafka could
    lose: at once, as before. Rows whose ids dropped as replays too (QA 32-a: an id reused)."""
    cluster, table = _cluster(), FakeTable()
    seen = table.add(1, 10)
    fresh = table.add(2, 10)
    cluster.publish(CHANGELOG, [Stored(CHANGELOG, 0, mark.key, mark.value, [], None)
                                for mark in changelog_records([seen], int(time.time() * 1000),
                                                              group="shop")])
    table.now = Snapshot(11, 11)
    relay, handed = _relay(cluster, table, guarantee=guarantee, cleanup="delete")
    _run_until(relay, lambda: len(handed) >= 2)
    assert handed == [fresh, f"replayed {seen}"]


def test_at_least_once_reads_no_position_back_after_an_abort(
        caplog: pytest.LogCaptureFixture) -> None:
    cluster, table = _cluster(), FakeTable()
    table.add(1, 10)
    table.now = Snapshot(11, 11)
    relay, _ = _relay(cluster, table, guarantee="at_least_once")
    reads = _position_reads(relay)

    def done() -> bool:
        if len(cluster.committed(ORDERS)) == 1 and len(table.rows) == 1:
            table.add(2, 11)
            cluster.refuse = lambda topic, value, timestamp: (
                KafkaError.NOT_ENOUGH_REPLICAS if topic == ORDERS else None)
            table.now = Snapshot(12, 12)
        return table.fetches > 4

    _run_until(relay, done)
    assert reads == [CHANGELOG, POSITION]
    assert _lines(caplog, "event=commit_lost") == []


def test_a_successors_position_after_a_lost_lock_is_no_lost_commit(
        caplog: pytest.LogCaptureFixture) -> None:
    """The lock's connection dropped and another relay took over and committed: this relay's
    next abort stops it with LockLost, without a false event=commit_lost."""
    cluster, table = _cluster(), FakeTable()
    table.add(1, 10)
    table.now = Snapshot(11, 11)
    lock = FakeLock()
    relay, _ = _relay(cluster, table, lock=lock)

    def done() -> bool:
        if len(cluster.committed(ORDERS)) == 1 and len(table.rows) == 1:
            lock.alive = False
            successor = RelayPosition(Snapshot(13, 13), database=table.database)
            cluster.publish(POSITION, [Stored(POSITION, 0, b"public.outbox",
                                              successor.to_json(), [], None)])
            cluster.commit_failures.append(KafkaError(KafkaError._TIMED_OUT, "commit timed out",
                                                      txn_requires_abort=True))
            table.add(2, 11)
            table.now = Snapshot(12, 12)
        return False

    failure = _run_until(relay, done)
    assert isinstance(failure, LockLost)
    assert _lines(caplog, "event=commit_lost") == []


@pytest.mark.parametrize("then", [None, "7301"], ids=["id_unreadable", "id_readable"])
def test_a_position_read_back_with_or_without_the_cluster_id_is_no_lost_commit(
        caplog: pytest.LogCaptureFixture, then: str | None) -> None:
    """Review 60-v F-4: the reader reconnected and reads the cluster id now (or no longer):
    the stored position is the one committed, so no event=commit_lost, and the batch's rows
    go to the cleanup."""
    cluster, table = _cluster(), FakeTable()
    table.database = DatabaseIdentity("shop", "7301" if then is None else None)
    event_id = table.add(1, 10)
    table.now = Snapshot(11, 11)
    relay, handed = _relay(cluster, table, cleanup="delete")
    reads = _position_reads(relay)

    def reconnected() -> bool:
        if len(cluster.committed(ORDERS)) == 1:
            table.database = DatabaseIdentity("shop", then)
        return reads.count(POSITION) >= 2

    _run_until(relay, reconnected)
    assert _lines(caplog, "event=commit_lost") == []
    assert handed == [event_id] and reads.count(CHANGELOG) == 1


def test_an_idle_relay_reads_its_position_back_only_once_the_held_batch_waited(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A read-back takes about 0.8 s, which the next row would wait: on a low-rate stream the
    # next commit confirms the held batch sooner, with no read.
    monkeypatch.setattr(lost_commit, "HELD_READ_BACK_S", 60.0)
    cluster, table = _cluster(), FakeTable()
    event_id = table.add(1, 10)
    table.now = Snapshot(11, 11)
    relay, handed = _relay(cluster, table, cleanup="delete")
    reads = _position_reads(relay)
    fetches: list[int] = []

    def idle_a_while() -> bool:
        if len(cluster.committed(ORDERS)) == 1 and not fetches:
            fetches.append(table.fetches)
        return bool(fetches) and table.fetches >= fetches[0] + 5

    _run_until(relay, idle_a_while)
    assert reads == [CHANGELOG, POSITION, POSITION]  # the start's; the stop's, not the idle's
    assert handed == [event_id]  # at the stop, once read back


def test_a_stop_reads_its_position_back_within_a_bound_under_kubernetes_grace_period(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 61-a F-1: with Kafka down the stop's read-back took ~31 s (TopicReader's lookups),
    # past Kubernetes' default 30 s grace period; the start and an idle read-back keep theirs.
    monkeypatch.setattr(lost_commit, "HELD_READ_BACK_S", 60.0)  # only the stop reads back
    cluster, table = _cluster(), FakeTable()
    table.add(1, 10)
    table.now = Snapshot(11, 11)
    relay, handed = _relay(cluster, table, cleanup="delete")
    timeouts: list[float] = []
    reads = _position_reads(relay, timeouts)
    _run_until(relay, lambda: bool(cluster.committed(ORDERS)))
    assert reads == [CHANGELOG, POSITION, POSITION]
    assert timeouts == [300.0, 300.0, lost_commit.STOP_READ_BACK_S]
    assert lost_commit.STOP_READ_BACK_S <= 10  # with the lookups' overrun, well under 30 s
    assert len(handed) == 1


def test_a_loss_the_stop_finds_reads_the_changelog_within_the_stops_bound() -> None:
    # QA 61-a F-1: after a loss found by the stop's read-back, the changelog's read had 300 s.
    cluster, table = _cluster(), FakeTable()
    relay, _ = _relay(cluster, table)
    committed = RelayPosition(Snapshot(11, 11), database=table.database)
    relay._committed.committed(committed, [Delivered("id-1", ORDERS, 1)])  # never stored
    timeouts: list[float] = []
    reads = _position_reads(relay, timeouts)
    relay._reposition(lost_commit.STOP_READ_BACK_S)
    assert reads == [POSITION, CHANGELOG]
    assert timeouts == [lost_commit.STOP_READ_BACK_S] * 2


@pytest.mark.parametrize("failing", ["kafka", "lock", "no_dedup"])
def test_a_stop_that_cannot_read_its_position_back_says_where_the_rows_go(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    # Session 60: the stop's read-back swallowed a Kafka or lock failure without a line; its
    # batch's rows stay (delivered) for the sweep after the next start.
    monkeypatch.setattr(lost_commit, "HELD_READ_BACK_S", 60.0)  # only the stop reads back
    cluster, table, lock = _cluster(), FakeTable(), FakeLock()
    table.add(1, 10)
    table.now = Snapshot(11, 11)
    relay, handed = _relay(cluster, table, lock=lock, cleanup="delete",
                           dedup=failing != "no_dedup")
    records = relay._records

    def position_refused(kafka: dict[str, Any], topic: str, what: str,
                         timeout_s: float = 300.0) -> Any:
        if topic == POSITION and cluster.committed(ORDERS):
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
        return records(kafka, topic, what, timeout_s=timeout_s)

    stop = relay.stop
    if failing == "lock":  # lost as the stop begins (the loop would stop on it before)
        relay.stop = lambda: (setattr(lock, "alive", False), stop())[1]  # type: ignore[method-assign]
    else:
        relay._records = position_refused
    assert _run_until(relay, lambda: bool(cluster.committed(ORDERS))) is None
    assert handed == []
    [line] = _lines(caplog, "event=stop_read_back_failed")
    assert line.startswith("event=stop_read_back_failed table=public.outbox rows=1 error=")
    assert ("the relay lost its lock" if failing == "lock" else "broker down") in line
    assert line.endswith("the stop could not read the relay position back to confirm the last "
                         "batch, so its rows were not handed to the cleanup and stay in the "
                         "table; the relay that reads the table next goes on from the stored "
                         "position, which delivers again the rows of a batch Kafka lost, and " + (
                             "without dedup there is no sweep: those delivered stay until "
                             "`cdc-router outbox purge --older-than D --force` (README, "
                             "Guarantees)" if failing == "no_dedup"
                             else "the cleanup's sweep deletes those whose marks the dedup "
                             "changelog holds"))


def test_a_stop_after_a_loss_was_found_says_nothing_of_rows_it_no_longer_holds(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 61-v T-1: the stop's read-back found the loss (commit_lost: its rows are read
    # again at the next start), then the changelog's read failed: no line calling them delivered.
    held = lost_commit.CommittedPosition(checks=True)
    database = DatabaseIdentity("postgres", "7")
    committed = RelayPosition(Snapshot(11, 11), database=database)
    held.committed(committed, [Delivered("id-1", "orders", 1)])
    assert held.lost(RelayPosition(Snapshot(10, 10), database=database), "public.outbox")
    config = _relay(_cluster(), FakeTable(), cleanup="delete")[0]._config
    held.unconfirmed_at_stop("public.outbox", KafkaException(KafkaError._TRANSPORT), config)
    assert _lines(caplog, "event=commit_lost") and not _lines(caplog, "event=stop_read_back_failed")
