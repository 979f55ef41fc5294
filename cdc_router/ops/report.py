"""What `cdc-router status` found: one frozen value per part of the pipeline.

Each section carries `error`, set (and every other field left empty) when its part could not
be reached, so that one dead component is one line of the report, never a traceback. The
field names are the JSON keys of `status -o json`: renaming one breaks scripts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True)
class Slot:
    """One replication slot (pg_replication_slots), its WAL measured from pg_current_wal_lsn()."""

    name: str
    exists: bool
    active: bool | None = None
    wal_status: str | None = None  # reserved, extended, unreserved, lost
    retained_wal_bytes: int | None = None  # current LSN - restart_lsn
    safe_wal_size_bytes: int | None = None  # WAL left before the slot is lost; None: no limit
    flush_lag_bytes: int | None = None  # current LSN - confirmed_flush_lsn
    # When a watch (`--watch`, `--serve`) first saw it inactive, of its checks in a row (QA
    # 54-b F-4: Postgres 15 keeps no such time); a one-shot check: its own checked_at.
    inactive_since: str | None = None


@dataclass(frozen=True)
class PreparedXact:
    """A prepared transaction (pg_prepared_xacts, PREPARE TRANSACTION of two-phase commit): it
    holds its locks with no session, and logical decoding keeps the WAL since its start."""

    gid: str
    age_s: float  # since PREPARE TRANSACTION
    database: str
    owner: str


@dataclass(frozen=True)
class WalState:
    """The connector's slots and the server's limit on the WAL a slot may hold back."""

    error: str | None = None
    answered: bool = False  # Postgres answered this check (its rows, or a refused or failed query)
    max_slot_wal_keep_size_bytes: int | None = None  # -1: unlimited
    slots: tuple[Slot, ...] = ()
    prepared: tuple[PreparedXact, ...] = ()  # of every database, oldest first (QA 57-b F-2)
    # With the connector's slots named: this database's other logical slots nobody streams
    # from (one left behind by a slot.name change keeps its WAL for ever), by name.
    other_inactive_slots: tuple[Slot, ...] = ()


@dataclass(frozen=True)
class PublicationState:
    """The publication Debezium reads and the tables it publishes."""

    error: str | None = None
    answered: bool = False  # Postgres answered this check (its rows, or a refused or failed query)
    name: str | None = None
    exists: bool | None = None
    tables: tuple[str, ...] = ()
    operations: tuple[str, ...] = ()  # of insert, update, delete, truncate
    via_root: bool | None = None  # publish_via_partition_root
    signal_table: str | None = None  # the connector's signal.data.collection
    signal_table_exists: bool | None = None
    # What its row filter and column list on the outbox lose (review 50-d F13), or None.
    row_filter_problem: str | None = None
    column_list_problem: str | None = None


@dataclass(frozen=True)
class OutboxState:
    """Rows waiting in the outbox table, the oldest's age, the table's size on disk."""

    error: str | None = None
    answered: bool = False  # Postgres answered this check (its rows, or a refused or failed query)
    table: str | None = None
    rows: int | None = None
    oldest_age_s: float | None = None
    size_bytes: int | None = None
    partitioned: bool | None = None  # a partitioned table (its rows live in partitions)
    reader: str | None = None  # the connector's database.user
    reader_may_select: bool | None = None  # None: not known (no such role, not asked)
    # `outbox init`'s --column flags for this table's columns (rv66: status's init line gave
    # none, and init refused an outbox with renamed or absent columns), e.g. "payload=body".
    column_flags: tuple[str, ...] = ()
    # Of each source.outbox column listed with several names (a rename): which the table has.
    listed_columns: tuple[str, ...] = ()
    # The other tables the connector captures (table.include.list names several), each
    # checked as this one (QA 55-a F-4: their backlog went unseen; the cleanup deletes from
    # cleanup.table alone), and the entries naming no one table (a regex): not checked.
    others: tuple[OutboxState, ...] = ()
    is_cleanup_table: bool | None = None  # of `others`: the one the router's cleanup deletes in
    not_checked: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskState:
    id: int
    state: str
    worker_id: str
    failure: str | None = None  # the first line of the trace when FAILED


@dataclass(frozen=True)
class ConnectorState:
    """The connector and its tasks as Kafka Connect reports them."""

    error: str | None = None
    name: str | None = None
    exists: bool | None = None
    state: str | None = None
    worker_id: str | None = None
    failure: str | None = None
    tasks: tuple[TaskState, ...] = ()
    # Where it writes the outbox table's change events (<topic.prefix>.<schema>.<table>); None
    # when its config does not tell (several tables, a topic-renaming transform, ...).
    raw_topic: str | None = None
    raw_topic_read: bool | None = None  # whether source.topics names or matches raw_topic
    # With several tables: each one's raw topic (empty when the config does not tell), and
    # those source.topics neither names nor matches (QA 64-a F-1).
    raw_topics: tuple[str, ...] = ()
    unread_topics: tuple[str, ...] = ()
    # When it does not exist: the connectors Connect has (None: not known).
    deployed: tuple[str, ...] | None = None
    # table.include.list entries in SQL's double quotes: they match no table (QA 53-h F3).
    quoted_tables: tuple[str, ...] = ()


@dataclass(frozen=True)
class PartitionLag:
    """One raw topic partition against the router group's committed offset.

    `lag` counts committed records (read_committed) between the group's offset and the end;
    transaction markers are not records. Over the scan limit it is the offset difference and
    `lag_exact` is false.
    """

    topic: str
    partition: int
    committed: int | None  # None: the group never committed this partition
    end: int
    lag: int
    lag_exact: bool = True
    last_commit_age_s: float | None = None  # from the router's offset commit metadata
    oldest_pending_age_s: float | None = None  # the first uncommitted record's timestamp
    # The log end, open transactions included (read_uncommitted); `end` is the last stable
    # offset. None: not asked, or the ask failed.
    high_watermark: int | None = None
    # Behind `end` < high_watermark: the age of the open transaction's first record (QA 54-b
    # F-1: a transaction left open held the partition for minutes; the lag said 0).
    open_transaction_age_s: float | None = None


@dataclass(frozen=True)
class Member:
    """One router instance in the group."""

    instance_id: str | None
    client_id: str
    host: str
    partitions: tuple[str, ...]  # "topic[partition]"


@dataclass(frozen=True)
class RouterState:
    """The router group: how far behind the raw topic it is and who is in it."""

    error: str | None = None
    group: str | None = None
    group_state: str | None = None
    lag: int | None = None
    last_commit_age_s: float | None = None  # the newest commit of any partition
    oldest_pending_age_s: float | None = None
    partitions: tuple[PartitionLag, ...] = ()
    members: tuple[Member, ...] = ()
    # Partitions whose committed offset a transaction still holds open (asked when records
    # wait: a router's start waits for it, QA 52-b L2; a running batch holds them too).
    offsets_in_transaction: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeadLetterInfo:
    """The newest dead letter: where it came from, the stage that failed, and why."""

    partition: int
    offset: int
    age_s: float | None
    stage: str | None
    source: str
    event_id: str | None
    error: str | None
    reason: str | None


@dataclass(frozen=True)
class DeadLetterState:
    error: str | None = None
    topic: str | None = None
    count: int | None = None  # this pipeline's
    others: int = 0  # letters of other pipelines sharing the topic
    count_exact: bool = True  # false: only the newest records of a large topic were counted
    newest: DeadLetterInfo | None = None
    # Of `count`, not delivered since (kafka/commit_stamp.py: by the last complete `dlq
    # replay`'s count before its offset, and every letter after it); None: not known.
    undelivered: int | None = None


@dataclass(frozen=True)
class ChangelogState:
    """The dedup changelog's size: offsets retained (records plus transaction markers)."""

    error: str | None = None
    topic: str | None = None
    enabled: bool = True
    partitions: int | None = None
    retained_offsets: int | None = None  # every pipeline's that writes marks there
    # The other groups whose marks are among its newest records (ops/topics.py); None: not
    # read (no Read on the topic).
    other_groups: tuple[str, ...] | None = None


@dataclass(frozen=True)
class StreamState:
    """One JetStream stream of nats.streams as the server has it: its use against its limits,
    and how it differs from the config."""

    name: str
    subjects: tuple[str, ...]  # the config's
    exists: bool
    messages: int | None = None
    bytes: int | None = None
    max_msgs: int | None = None  # the server's; -1 (or 0): no limit
    max_bytes: int | None = None
    discard: str | None = None  # old, new: what JetStream does when a limit is reached
    # The settings `streams apply` would change, [server's, config's] by JetStream's name.
    changes: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    # Why the router's start refuses this stream as it is (nats/streams.py start_problem).
    refused: str | None = None
    # What the router's start warns about it (start_warning), the stream being usable.
    start_warning: str | None = None
    # Missing: why `streams apply` would be refused (another stream holds its subjects).
    overlap: str | None = None


@dataclass(frozen=True)
class JetStreamState:
    """The NATS server of nats.url and the streams the config's JetStream routes publish
    into; absent from a Report when no route publishes to JetStream."""

    error: str | None = None
    answered: bool = False  # a server answered (its streams, or a refusal of us or the API)
    url: str | None = None  # nats.url, credentials hidden
    streams: tuple[StreamState, ...] = ()


@dataclass(frozen=True)
class RegistryState:
    """The schema registry of schema_registry.url, asked as the router's start asks it;
    absent from a Report without schema_registry."""

    error: str | None = None
    answered: bool = False  # it answered (its subjects, or a refusal of us)
    url: str | None = None  # schema_registry.url, credentials hidden
    subjects: int | None = None  # how many subjects it holds
    # A line per route subject known before any event that lacks its schema: the router's
    # next start stops on it (QA 66-a F-3).
    lacking: tuple[str, ...] = ()


@dataclass(frozen=True)
class Report:
    """Everything one `status` run saw, in the order of the data path."""

    checked_at: str
    wal: WalState = field(default_factory=WalState)
    publication: PublicationState = field(default_factory=PublicationState)
    outbox: OutboxState = field(default_factory=OutboxState)
    connector: ConnectorState = field(default_factory=ConnectorState)
    router: RouterState = field(default_factory=RouterState)
    dead_letters: DeadLetterState = field(default_factory=DeadLetterState)
    dedup_changelog: ChangelogState = field(default_factory=ChangelogState)
    jetstream: JetStreamState | None = None  # None: no route publishes to JetStream
    registry: RegistryState | None = None  # None: no schema_registry in the config


# The parts of a Report, each with its `error`: wal, publication, outbox, connector, ...
SECTIONS = tuple(f.name for f in fields(Report) if f.name != "checked_at")


def sections(report: Report) -> Iterator[tuple[str, Any]]:
    """(name, section) of each part `report` has (jetstream only for JetStream routes,
    registry only with schema_registry)."""
    for name in SECTIONS:
        section = getattr(report, name)
        if section is not None:
            yield name, section


def carry_inactive_since(report: Report, previous: Report | None) -> Report:
    """`report` with each inactive slot's inactive_since: the previous check's when it was
    inactive then too, else this check's time."""
    before = {slot.name: slot.inactive_since for slot in previous.wal.slots
              if slot.active is False} if previous is not None else {}
    slots = tuple(replace(slot, inactive_since=before.get(slot.name) or report.checked_at)
                  if slot.active is False else slot for slot in report.wal.slots)
    return replace(report, wal=replace(report.wal, slots=slots))
