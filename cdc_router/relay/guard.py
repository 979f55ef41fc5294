"""The relay's visibility guard and position: which outbox rows it may take, and in what order.

The bug every hand-written polling relay has: ids, sequence numbers and created_at are assigned
when a row is inserted, but rows become visible when their transaction commits, and those two
orders differ. Transaction A inserts seq 7, transaction B inserts seq 8 and commits first; a
poller that reads seq 8 and remembers "done up to 8" never sees seq 7 once A commits.

The guard works with transaction ids instead. Each outbox row stores its inserting
transaction's full 64-bit id (column `txid xid8 DEFAULT pg_current_xact_id()`: the top-level
transaction's id, also when the insert ran in a savepoint, and never wrapping around, unlike the
32-bit `xmin` system column). A Postgres snapshot (`pg_current_snapshot()`, written
`xmin:xmax:xip,...`) says exactly which transactions had completed when it was taken: every id
below xmin, and those below xmax that are not in the in-progress list xip. A transaction
completed in a snapshot can add no row afterwards, so the rows it committed are final.

The relay's position is the snapshot D up to which it has consumed everything: every row whose
txid is completed in D (Snapshot.visible). Each read takes a new snapshot R and delivers the rows
completed in R but not in D, in insert (seq) order, then D := R. Hence:

- No row is skipped. A row whose transaction is still running at R is not completed in R; it is
  taken by the first read whose snapshot sees its commit, however late that is, because that
  snapshot's predecessor (the position) did not see it completed.
- No row is read before a row that precedes it in commit order: every row of one read committed
  before R was taken, every row of the next one after. Within one read rows go in seq order,
  which is commit order for the events of one aggregate when the writer locks the aggregate
  before writing its event (an UPDATE of the aggregate's row, as `write_event` callers do): the
  second writer waits for the first one's commit before it inserts, so gets a higher seq.
- Nothing waits for unrelated transactions. The simpler guard, "txid below the snapshot's
  xmin" (below the oldest transaction still running), is the special case that takes only the
  rows below xmin: it is as safe, but one long transaction anywhere in the database (a report,
  a session idle in transaction) stalls the relay for as long as it runs. This one takes every
  completed transaction's rows at once and waits only for those still running.

A read bigger than relay.batch_rows is taken in batches: the position then also holds R and
the last seq delivered from it (the rows completed in R and not in D are a fixed set, so paging
it by seq skips nothing). Positions are JSON, stored by the relay in a compacted Kafka topic in
the same transaction as the batch's records (relay/loop.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from cdc_router.errors import ConfigError


@dataclass(frozen=True)
class Snapshot:
    """A Postgres snapshot (pg_snapshot): which transactions had completed when it was taken."""

    xmin: int
    xmax: int
    xip: tuple[int, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        """`xmin:xmax:xip1,xip2`, as Postgres writes a pg_snapshot; ValueError if not one."""
        parts = text.split(":")
        if len(parts) != 3:
            raise ValueError(f"not a Postgres snapshot (xmin:xmax:xip,...): {text!r}")
        try:
            xmin, xmax = int(parts[0]), int(parts[1])
            xip = tuple(int(xid) for xid in parts[2].split(",") if xid)
        except ValueError:
            raise ValueError(f"not a Postgres snapshot (xmin:xmax:xip,...): {text!r}") from None
        if not 0 < xmin <= xmax or any(not xmin <= xid < xmax for xid in xip):
            raise ValueError(f"not a Postgres snapshot (xmin <= xip < xmax): {text!r}")
        return cls(xmin, xmax, xip)

    def __str__(self) -> str:
        return f"{self.xmin}:{self.xmax}:{','.join(map(str, self.xip))}"

    def visible(self, txid: int) -> bool:
        """Whether transaction `txid` had completed (committed or aborted) in this snapshot;
        what Postgres's pg_visible_in_snapshot(txid, snapshot) answers."""
        if txid < self.xmin:
            return True
        if txid >= self.xmax:
            return False
        return txid not in self.xip


@dataclass(frozen=True)
class DatabaseIdentity:
    """Whose transaction ids a position counts: a database of a cluster (its system
    identifier, which a physical standby shares; None when the role may not read it)."""

    name: str
    cluster: str | None = None

    def same(self, other: DatabaseIdentity) -> bool:
        return self.name == other.name and (None in (self.cluster, other.cluster)
                                            or self.cluster == other.cluster)

    def __str__(self) -> str:
        return f"{self.name!r} of cluster {self.cluster or '(not readable)'}"


@dataclass(frozen=True)
class RelayPosition:
    """How far the relay got: every row completed in `done` is delivered; of the rows completed
    in `reading` (and not in `done`), those up to seq `after_seq`. `database`: whose
    transactions they are (None in positions stored before it was kept)."""

    done: Snapshot | None = None  # None: nothing delivered yet, every row is to be read
    reading: Snapshot | None = None  # None: between reads, the next one takes a new snapshot
    after_seq: int | None = None
    database: DatabaseIdentity | None = None

    def of_database(self, database: DatabaseIdentity, where: str) -> RelayPosition:
        """This position, for `database`; ConfigError when it is another database's (QA 48-c
        F2: two databases' relays of one config shared the position, 609 of 621 rows of one
        were passed over for good)."""
        if self.database is not None and not self.database.same(database):
            raise ConfigError(
                f"the relay position {where} counts the transactions of database "
                f"{self.database}, and this relay reads database {database}: its rows would be "
                "skipped", field="source.group_id", hint="give each database's relay its own "
                "source.group_id (it names the position topic and the transactional id), or "
                "its own relay.position_topic and delivery.transactional_id")
        if database.cluster is None and self.database is not None:  # not readable here: the
            database = self.database  # known id stays, else the guard would take any (61-v)
        return replace(self, database=database)

    def same(self, other: RelayPosition) -> bool:
        """Whether `other` is this position: the same snapshots and seq, of the same database
        (DatabaseIdentity.same: its cluster id may be read on one connection and not on
        another, review 60-v F-4)."""
        if replace(self, database=None) != replace(other, database=None):
            return False
        if self.database is None or other.database is None:
            return self.database is other.database
        return self.database.same(other.database)

    def wanted(self, txid: int, seq: int) -> bool:
        """Whether the row (txid, seq) belongs to the read in progress and is not delivered
        yet: the predicate relay/reader.py's query applies in SQL."""
        if self.reading is None or not self.reading.visible(txid):
            return False
        if self.done is not None and self.done.visible(txid):
            return False
        return self.after_seq is None or seq > self.after_seq

    def passed(self, txid: int, seq: int) -> bool:
        """Whether the row (txid, seq) is behind the position: a committed batch delivered,
        dead-lettered or passed over it, and no read takes it again (OutboxReader.passed_ids)."""
        if self.done is not None and self.done.visible(txid):
            return True
        return self.reading is not None and self.reading.visible(txid) and \
            self.after_seq is not None and seq <= self.after_seq

    def start_read(self, snapshot: Snapshot) -> RelayPosition:
        """The position with a new read begun at `snapshot` (it must see at least `done`)."""
        if self.reading is not None:
            return self
        if self.done is not None and snapshot.xmax < self.done.xmax:
            raise ConfigError(
                f"the database's transaction ids ({snapshot}) are behind the relay's position "
                f"({self.done}): it was restored or replaced, and rows written since would be "
                "skipped", field="relay position",
                hint="delete the relay's record from its position topic to read the table "
                     "from its start (the replay filter drops what was delivered)")
        return replace(self, reading=snapshot, after_seq=None)

    def after_batch(self, rows: int, limit: int, last_seq: int | None) -> RelayPosition:
        """The position once a batch of `rows` (at most `limit`, the last one `last_seq`) of
        the read in progress is delivered: a short batch ends the read."""
        if self.reading is None:
            raise ValueError("after_batch needs a read in progress (start_read)")
        if rows < limit:
            return replace(self, done=self.reading, reading=None, after_seq=None)
        return replace(self, after_seq=last_seq)

    def to_json(self) -> bytes:
        document: dict[str, Any] = {"done": _text(self.done), "reading": _text(self.reading),
                                    "after_seq": self.after_seq}
        if self.database is not None:
            document["database"] = {"name": self.database.name,
                                    "cluster": self.database.cluster}
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, value: bytes) -> RelayPosition:
        """A stored position; ValueError (with the value) when it is not one."""
        try:
            document: Any = json.loads(value)
            after = document["after_seq"]
            if after is not None and type(after) is not int:
                raise ValueError("after_seq is not an integer")
            database = document.get("database")
            return cls(_snapshot(document["done"]), _snapshot(document["reading"]), after,
                       None if database is None else DatabaseIdentity(
                           str(database["name"]), database["cluster"] and str(database["cluster"])))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"not a relay position ({error}): {value[:200]!r}") from None


def _text(snapshot: Snapshot | None) -> str | None:
    return None if snapshot is None else str(snapshot)


def _snapshot(text: Any) -> Snapshot | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"a snapshot is text, not {text!r}")
    return Snapshot.parse(text)
