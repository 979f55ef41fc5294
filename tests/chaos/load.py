"""The load: plain-SQL writers that put outbox rows and ledger rows in the same transactions.

The ledger is exactly the set of committed events (a transaction that Postgres lost during a
crash lost both), so the verifier needs no bookkeeping in this process. Each writer owns its
aggregates and numbers their events, so per-aggregate order is the order of the numbers.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

AGGREGATES_PER_WRITER = 200
MAX_TRANSACTION_ROWS = 40


@dataclass(frozen=True)
class Names:
    """Every name one campaign creates; unique per run so that runs never collide."""

    run: str

    @property
    def table(self) -> str:
        return self.run.replace("-", "_")

    @property
    def ledger(self) -> str:
        return f"{self.table}_ledger"

    def topic(self, suffix: str) -> str:
        return f"{self.run}-{suffix}"

    @property
    def raw(self) -> str:
        return f"{self.run}.public.{self.table}"


@dataclass(frozen=True)
class Row:
    """One outbox row and what the verifier must find for it."""

    id: str
    aggregate_type: str
    aggregate_id: str
    type: str
    payload: str
    created_at: datetime
    seq: int
    expect: str  # "deliver", or the dead-letter stage (decode, route, serialize, produce)
    topic: str  # where a delivered event must land; "" for a dead letter


def create_tables(dsn: str, names: Names) -> None:
    """The outbox table, its insert-only publication, and the ledger."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"""CREATE TABLE public.{names.table} (
            id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL,
            type text NOT NULL, payload jsonb NOT NULL, headers jsonb,
            created_at timestamp(6) NOT NULL DEFAULT (now() AT TIME ZONE 'utc'))""")
        conn.execute(f"CREATE PUBLICATION {names.table} FOR TABLE public.{names.table} "
                     "WITH (publish = 'insert')")
        conn.execute(f"""CREATE TABLE public.{names.ledger} (
            id uuid PRIMARY KEY, aggregateid text NOT NULL, seq bigint NOT NULL,
            expect text NOT NULL, topic text NOT NULL,
            committed_at timestamptz NOT NULL DEFAULT clock_timestamp())""")


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


class RowFactory:
    """Seeded rows of one writer: mostly good events, a few hostile and poison ones."""

    def __init__(self, names: Names, writer: int, seed: int, poison_rate: float) -> None:
        self._names = names
        self._writer = writer
        self._random = random.Random(seed * 1000 + writer)
        self._poison_rate = poison_rate
        self._seq = 0
        # The broker refuses a timestamp more than an hour ahead; each such row costs the
        # router four aborted batches, so they are rarer than the other poison.
        self._poison_kinds = ["deep", "deep", "connect_offsets", "connect_offsets",
                              "avro_missing", "avro_missing", "future"]

    def transaction(self) -> list[Row]:
        return [self._row() for _ in range(self._random.randint(1, MAX_TRANSACTION_ROWS))]

    def _row(self) -> Row:
        self._seq += 1
        aggregate = f"w{self._writer}-{self._random.randrange(AGGREGATES_PER_WRITER)}"
        if self._random.random() < self._poison_rate:
            return self._poison(aggregate, self._random.choice(self._poison_kinds))
        kind = self._random.random()
        now = datetime.now(UTC).replace(tzinfo=None)
        if kind < 0.55:
            body: dict[str, Any] = {"order": aggregate, "seq": self._seq, "total": "19.90"}
            return self._good("Order", aggregate, "OrderPaid", body, "orders", now)
        if kind < 0.75:
            body = {"payment_id": aggregate, "amount": "19.90", "seq": self._seq}
            return self._good("Payment", aggregate, "PaymentConfirmed", body, "payments", now)
        if kind < 0.85:
            # A templated {aggregate_type} route, rendered from row data (README: topic safety).
            return self._good(self._names.topic("broadcast"), aggregate, "Broadcast",
                              {"seq": self._seq}, "broadcast", now)
        return self._good("Customer", aggregate, "CustomerUpdated", {"seq": self._seq},
                          "events", now)

    def _good(self, aggregate_type: str, aggregate: str, type_: str, body: dict[str, Any],
              topic: str, created_at: datetime) -> Row:
        return Row(str(uuid.uuid4()), aggregate_type, aggregate, type_, json.dumps(body),
                   created_at, self._seq, "deliver", self._names.topic(topic))

    def _poison(self, aggregate: str, kind: str) -> Row:
        now = datetime.now(UTC).replace(tzinfo=None)
        event_id = str(uuid.uuid4())
        if kind == "deep":  # deeper than the router's MAX_JSON_DEPTH (256): its JSON
            # serializer refuses it (measured: dlq.stage=serialize)
            return Row(event_id, "Order", aggregate, "OrderPaid", _nested(3000), now,
                       self._seq, "serialize", "")
        if kind == "connect_offsets":  # renders Connect's offsets topic on {aggregate_type}
            return Row(event_id, "connect-offsets", aggregate, "Broadcast", "{}", now,
                       self._seq, "route", "")
        if kind == "avro_missing":  # the Avro schema's amount field is missing
            return Row(event_id, "Payment", aggregate, "PaymentConfirmed",
                       json.dumps({"payment_id": aggregate, "seq": self._seq}), now,
                       self._seq, "serialize", "")
        # 3 hours ahead: the broker refuses it (message.timestamp.after.max.ms is 1 hour).
        return Row(event_id, "Order", aggregate, "OrderPaid", json.dumps({"seq": self._seq}),
                   now + timedelta(hours=3), self._seq, "produce", "")


class Load:
    """Writers that write up to a budget the campaign raises segment by segment."""

    def __init__(self, dsn: str, names: Names, *, writers: int, seed: int,
                 poison_rate: float, rate_per_s: float) -> None:
        self._dsn = dsn
        self._names = names
        self._factories = [RowFactory(names, w, seed, poison_rate) for w in range(writers)]
        self._rate = rate_per_s / writers
        self._lock = threading.Lock()
        self._budget = 0
        self._in_flight = 0  # rows reserved by a writer whose transaction is not done yet
        self._stop = threading.Event()
        self.written = 0
        self.write_errors = 0
        self.timeline: list[tuple[float, int]] = []  # (monotonic time, events committed)
        self._threads = [threading.Thread(target=self._write, args=(f,), daemon=True)
                         for f in self._factories]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def raise_budget(self, events: int) -> None:
        with self._lock:
            self._budget += events

    def write_more(self, count: int) -> None:
        """Let the writers write `count` more events than they have now, and wait for them."""
        with self._lock:
            target = self.written + count
            self._budget = max(self._budget, target)
        self.wait_written(target)

    def wait_written(self, count: int, timeout_s: float = 1800) -> None:
        deadline = time.monotonic() + timeout_s
        while self.written < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the writers wrote {self.written} of {count} events "
                                   f"in {timeout_s}s; see the Postgres log")
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _write(self, factory: RowFactory) -> None:
        conn: psycopg.Connection[Any] | None = None
        pending: list[Row] = []
        while not self._stop.is_set():
            if not pending:
                rows = factory.transaction()
                # Reserve the rows under the lock: two writers must not both fill one room.
                with self._lock:
                    room = self._budget - self.written - self._in_flight
                    pending = rows[:max(0, room)]
                    self._in_flight += len(pending)
                if not pending:
                    time.sleep(0.05)
                    continue
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self._dsn, connect_timeout=5)
                self._commit(conn, pending)
            except psycopg.Error:
                # Postgres down or restarting. Whether the COMMIT landed is the ledger's to
                # say; the rows are not retried (their ids may exist), new ones are written.
                self.write_errors += 1
                with self._lock:
                    self._in_flight -= len(pending)
                pending = []
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.5)
                continue
            with self._lock:
                self.written += len(pending)
                self._in_flight -= len(pending)
                self.timeline.append((time.monotonic(), self.written))
            time.sleep(len(pending) / self._rate)
            pending = []
        if conn is not None:
            conn.close()

    def _commit(self, conn: psycopg.Connection[Any], rows: list[Row]) -> None:
        with conn.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO public.{self._names.table} (id, aggregatetype, aggregateid, type,"
                " payload, created_at) VALUES (%s, %s, %s, %s, %s::jsonb, %s)",
                [(r.id, r.aggregate_type, r.aggregate_id, r.type, r.payload, r.created_at)
                 for r in rows])
            cursor.executemany(
                f"INSERT INTO public.{self._names.ledger} (id, aggregateid, seq, expect, topic)"
                " VALUES (%s, %s, %s, %s, %s)",
                [(r.id, r.aggregate_id, r.seq, r.expect, r.topic) for r in rows])
        conn.commit()
