"""The relay's visibility guard and position (cdc_router/relay/guard.py), as plain values, and
against a model of Postgres where concurrent transactions commit out of insert order."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from itertools import pairwise

import pytest

from cdc_router.errors import ConfigError
from cdc_router.relay.guard import DatabaseIdentity, RelayPosition, Snapshot


def test_a_snapshot_reads_and_writes_postgres_text() -> None:
    snapshot = Snapshot.parse("100:108:101,105")
    assert snapshot == Snapshot(100, 108, (101, 105))
    assert str(snapshot) == "100:108:101,105"
    assert str(Snapshot.parse("7:7:")) == "7:7:"


@pytest.mark.parametrize("text", ["", "1:2", "a:b:", "9:5:", "5:9:4", "5:9:9", "0:0:"])
def test_a_bad_snapshot_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a Postgres snapshot"):
        Snapshot.parse(text)


def test_visible_is_completed_in_the_snapshot() -> None:
    snapshot = Snapshot.parse("100:108:101,105")
    assert snapshot.visible(99)  # below xmin: completed
    assert snapshot.visible(100)  # xmin itself is not running (xip holds the running ones)
    assert not snapshot.visible(101) and not snapshot.visible(105)  # running
    assert snapshot.visible(104) and snapshot.visible(107)  # completed between xmin and xmax
    assert not snapshot.visible(108) and not snapshot.visible(10**12)  # not started yet


def test_a_position_round_trips_through_json() -> None:
    position = RelayPosition(Snapshot.parse("5:9:6"), Snapshot.parse("8:12:8,11"), 42)
    assert RelayPosition.from_json(position.to_json()) == position
    assert RelayPosition.from_json(RelayPosition().to_json()) == RelayPosition()


@pytest.mark.parametrize("value", [b"", b"[]", b'{"done": null}', b'{"done": 5, "reading": null,'
                                   b' "after_seq": null}', b'{"done": null, "reading": null, '
                                   b'"after_seq": "7"}'])
def test_a_bad_position_is_refused_with_its_value(value: bytes) -> None:
    with pytest.raises(ValueError, match="not a relay position"):
        RelayPosition.from_json(value)


def test_a_short_batch_ends_the_read_and_a_full_one_pages_on() -> None:
    done, reading = Snapshot.parse("5:9:6"), Snapshot.parse("8:12:8")
    position = RelayPosition(done).start_read(reading)
    assert position == RelayPosition(done, reading, None)
    assert position.after_batch(3, 3, 77) == RelayPosition(done, reading, 77)
    assert position.after_batch(2, 3, 77) == RelayPosition(reading, None, None)
    assert position.after_batch(0, 3, None) == RelayPosition(reading, None, None)


def test_wanted_is_completed_now_not_before_and_after_the_last_seq() -> None:
    position = RelayPosition(Snapshot.parse("5:9:6"), Snapshot.parse("8:12:8"), 40)
    assert position.wanted(6, 41)  # running at done, completed at reading
    assert position.wanted(10, 41)
    assert not position.wanted(6, 40)  # delivered by an earlier batch of this read
    assert not position.wanted(7, 41)  # completed at done: delivered by an earlier read
    assert not position.wanted(8, 41)  # still running at reading: the next read takes it
    assert not position.wanted(12, 41)
    assert not RelayPosition().wanted(1, 1)  # no read in progress


def test_a_database_behind_the_position_is_refused() -> None:
    position = RelayPosition(Snapshot.parse("500:600:"))
    with pytest.raises(ConfigError, match="restored or replaced"):
        position.start_read(Snapshot.parse("10:20:"))


# A model of Postgres: transactions get their id on their first insert (as pg_current_xact_id()
# in the column default does), rows get their seq on insert, and commits come in any order.

@dataclass
class _Txn:
    xid: int | None = None
    rows: list[int] = field(default_factory=list)  # seqs


@dataclass
class _Database:
    rng: random.Random
    next_xid: int = 1000
    next_seq: int = 1
    clock: int = 0
    running: list[_Txn] = field(default_factory=list)
    committed: dict[int, tuple[int, int]] = field(default_factory=dict)  # seq -> (txid, time)
    aborted: set[int] = field(default_factory=set)

    def step(self) -> None:
        """One writer action: begin, insert, commit or roll back."""
        self.clock += 1
        choice = self.rng.random()
        if not self.running or (choice < 0.15 and len(self.running) < 12):
            self.running.append(_Txn())
        elif choice < 0.75:
            txn = self.rng.choice(self.running)
            if txn.xid is None:
                txn.xid = self.next_xid
                self.next_xid += 1
            txn.rows.append(self.next_seq)
            self.next_seq += 1
        else:
            txn = self.running.pop(self.rng.randrange(len(self.running)))
            if txn.xid is not None and self.rng.random() < 0.1:
                self.aborted.update(txn.rows)
            elif txn.xid is not None:
                for seq in txn.rows:
                    self.committed[seq] = (txn.xid, self.clock)

    def snapshot(self) -> Snapshot:
        xip = sorted(txn.xid for txn in self.running if txn.xid is not None)
        return Snapshot(xip[0] if xip else self.next_xid, self.next_xid, tuple(xip))

    def select(self, position: RelayPosition, limit: int) -> list[tuple[int, int]]:
        """What the relay's query returns: committed rows the position wants, by seq."""
        rows = sorted((seq, txid) for seq, (txid, _) in self.committed.items()
                      if position.wanted(txid, seq))
        return rows[:limit]


def _relay_against_the_model(seed: int) -> tuple[_Database, list[tuple[int, Snapshot]]]:
    """Writers and a relay (crashing now and then) interleaved; (database, delivered rows as
    (seq, the snapshot of the read that delivered it))."""
    rng = random.Random(seed)
    db = _Database(rng)
    stored = position = RelayPosition()
    delivered: list[tuple[int, Snapshot]] = []
    for _ in range(6000):
        db.step()
        if rng.random() < 0.3:
            position = position.start_read(db.snapshot())
            assert position.reading is not None
            limit = rng.choice((1, 3, 10))
            rows = db.select(position, limit)
            following = position.after_batch(len(rows), limit, rows[-1][0] if rows else None)
            if rows and rng.random() < 0.1:
                position = stored  # killed before the commit: the batch never happened
                continue
            if rows:
                delivered += [(seq, position.reading) for seq, _ in rows]
                stored = following  # committed with the batch
            position = following
    while db.running:  # the writers finish
        txn = db.running.pop()
        db.clock += 1
        for seq in txn.rows:
            db.committed[seq] = (txn.xid or 0, db.clock)
    while True:  # the relay drains the table
        position = position.start_read(db.snapshot())
        assert position.reading is not None
        rows = db.select(position, 10_000)
        delivered += [(seq, position.reading) for seq, _ in rows]
        position = position.after_batch(len(rows), 10_000, rows[-1][0] if rows else None)
        if not rows:
            return db, delivered


@pytest.mark.parametrize("seed", range(5))
def test_every_committed_row_is_delivered_once_and_reads_follow_commit_order(seed: int) -> None:
    db, delivered = _relay_against_the_model(seed)
    seqs = [seq for seq, _ in delivered]
    assert len(seqs) == len(set(seqs)), "a row was delivered twice"
    assert set(seqs) == set(db.committed), "a committed row was skipped"
    assert not set(seqs) & db.aborted
    # Every row of a read committed before every row of a later read.
    last_commit: dict[Snapshot, int] = {}  # in the order of the reads
    first_commit: dict[Snapshot, int] = {}
    for seq, read in delivered:
        at = db.committed[seq][1]
        last_commit[read] = max(last_commit.get(read, at), at)
        first_commit[read] = min(first_commit.get(read, at), at)
    reads = list(last_commit)
    assert len(reads) > 100
    for earlier, later in pairwise(reads):
        assert last_commit[earlier] < first_commit[later]


def test_the_model_commits_out_of_order_so_a_last_seq_poller_skips_rows() -> None:
    """The model is hard enough: remembering the highest seq read loses rows in it."""
    rng = random.Random(0)
    db = _Database(rng)
    last_seq, seen = 0, set()
    for _ in range(6000):
        db.step()
        visible = sorted(seq for seq in db.committed if seq > last_seq)
        seen.update(visible)
        last_seq = max(visible, default=last_seq)
    skipped = {seq for seq in db.committed if seq <= last_seq} - seen
    assert len(skipped) > 50


def test_a_position_keeps_its_database_and_refuses_another_ones() -> None:
    # QA 48-c F2: the relays of two databases of one config shared one position.
    shop = DatabaseIdentity("shop", "7301")
    stamped = RelayPosition(Snapshot(5, 9, (7,))).of_database(shop, "here")
    assert RelayPosition.from_json(stamped.to_json()) == stamped
    moved = stamped.start_read(Snapshot(9, 9)).after_batch(1, 10, 3)
    assert moved.database == shop  # each step keeps it
    older = RelayPosition.from_json(b'{"done":"5:9:7","reading":null,"after_seq":null}')
    assert older.database is None and older.of_database(shop, "here").database == shop
    # The id not readable on this connection: the known one stays in the position, which the
    # next commit stores (review 61-v: it was stored as null, and another cluster then passed).
    assert stamped.of_database(DatabaseIdentity("shop", None), "here").database == shop
    for other in (DatabaseIdentity("tenant2", "7301"), DatabaseIdentity("shop", "9999")):
        with pytest.raises(ConfigError, match=r"source\.group_id"):
            stamped.of_database(other, "here")


def test_a_position_is_the_same_whether_its_cluster_id_was_read_or_not() -> None:
    # Review 60-v F-4: after a reconnect the role may read the cluster id or not; the read-back
    # position then differed from the one committed, a false event=commit_lost.
    shop, unread = DatabaseIdentity("shop", "7301"), DatabaseIdentity("shop", None)
    position = RelayPosition(Snapshot(5, 9, (7,)), Snapshot(9, 9), 3, database=shop)
    assert position.same(replace(position, database=unread))
    assert replace(position, database=unread).same(position)
    assert RelayPosition().same(RelayPosition())
    for other in (replace(position, after_seq=4), replace(position, reading=None),
                  replace(position, done=Snapshot(5, 9)),
                  replace(position, database=DatabaseIdentity("shop", "9999")),
                  replace(position, database=DatabaseIdentity("tenant2", None)),
                  replace(position, database=None)):
        assert not position.same(other) and not other.same(position)


def test_a_standby_is_refused_as_the_relays_database() -> None:
    # QA 48-c F1: on a hot standby the snapshots leave out the primary's running transactions;
    # the position passed their rows, which were never read once they committed.
    from cdc_router.relay.same_database import primary_database

    class Answers:
        def __init__(self, *rows: tuple[object, ...]) -> None:
            self.rows = list(rows)

        def execute(self, query: str) -> Answers:
            return self

        def fetchone(self) -> tuple[object, ...]:
            return self.rows.pop(0)

    with pytest.raises(ConfigError, match=r"field 'relay.dsn': the database is a standby.*"
                       r"target_session_attrs=read-write"):
        primary_database(Answers((True, "shop")))  # type: ignore[arg-type]
    assert primary_database(Answers((False, "shop"), ("7301",))) == DatabaseIdentity(  # type: ignore[arg-type]
        "shop", "7301")


def test_passed_is_what_a_committed_batch_took_and_no_read_takes_again() -> None:
    """QA 55-b F-1: the rows a killed relay may have left behind (relay/start.py)."""
    done, reading = Snapshot(10, 12, (10,)), Snapshot(13, 13)
    position = RelayPosition(done, reading, after_seq=5)
    assert position.passed(9, 99) and position.passed(11, 99)  # completed in done
    assert position.passed(12, 5) and not position.passed(12, 6)  # paged up to seq 5
    assert position.passed(10, 4) and not position.passed(13, 1)  # 10 was running in done
    assert not RelayPosition(done, reading).passed(12, 1)  # the read took nothing yet
    assert not RelayPosition().passed(1, 1)
    for txid, seq in ((9, 1), (10, 4), (10, 7), (12, 5), (12, 6), (13, 1)):
        assert not (position.passed(txid, seq) and position.wanted(txid, seq))
