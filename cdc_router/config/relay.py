"""The `relay` section: `cdc-router relay`, which polls the outbox table instead of Debezium."""

from __future__ import annotations

from pydantic import Field, PositiveInt, field_validator

from cdc_router.config.fields import (
    ConfigModel,
    Dsn,
    TableName,
    TopicConfig,
    TopicCount,
    list_config_items,
)
from cdc_router.errors import ConfigError
from cdc_router.postgres import check_identifier, split_table

# An idle relay polls at least this often: half of /healthz's stall threshold (cli/run.py,
# _STALL_S, 120 s), so that a relay waiting out its interval is never reported stalled, and a
# liveness probe never restarts a healthy one (QA 36-b F3: 180,000 failed /healthz on every
# idle wait, and 1e20 made an idle relay never read its table again). Polling a quiet table
# once a minute costs one indexed query; a longer wait gains nothing.
MAX_POLL_INTERVAL_MS = 60_000

# The position topic's config, under relay.position_config: a segment rolls after 10 minutes,
# and what compaction leaves of the transactions' markers goes 10 minutes after. The relay
# reads the whole topic back at each start and each read-back (relay/lost_commit.py), where one
# record per table matters; with the broker's defaults (segments of 7 days or 1 GiB, which
# compaction never touches while active; markers kept a day) that was up to 1 GiB, ~3.6M
# commits of 298 B each (session 61, measured). 10 minutes bounds it to that many commits (the
# read skips ~1M records a second), and a read of seconds needs no longer for its tombstones.
POSITION_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.ms": "600000",
                         "delete.retention.ms": "600000"}

# The relay's own columns (`cdc-router outbox init --relay` adds them; relay/reader.py checks).
DEFAULT_TXID_COLUMN = "txid"
DEFAULT_SEQ_COLUMN = "seq"


class RelaySettings(ConfigModel):
    """Where the relay reads, how often and how much, and where it keeps its position."""

    table: TableName = "public.outbox"
    # The relay's database when it is not cleanup.dsn's (the relay cleans the table it reads):
    # a secret, for CDC_ROUTER__CLEANUP__DSN (or __RELAY__DSN) rather than the file.
    dsn: Dsn = None
    # An idle relay looks for new rows this often; a full batch is followed at once by the next.
    poll_interval_ms: PositiveInt = 200
    batch_rows: PositiveInt = Field(default=1000, le=100_000)
    # A batch also ends once its rows' values hold this many bytes (at least one row): rows of
    # megabytes each would otherwise take gigabytes of memory at batch_rows a batch.
    batch_bytes: PositiveInt = 16 * 1024 * 1024
    # The inserting transaction's id (xid8, DEFAULT pg_current_xact_id()) and the insert order
    # (an identity column); see cdc_router/relay/guard.py.
    txid_column: str = DEFAULT_TXID_COLUMN
    seq_column: str = DEFAULT_SEQ_COLUMN
    # Compacted topic holding the relay's position, one record per table; by default
    # `<source.group_id>.relay-position`.
    position_topic: str | None = None
    position_replication_factor: TopicCount | None = None
    position_config: TopicConfig = Field(default_factory=dict)

    @property
    def qualified_table(self) -> str:
        """`schema.table`: how the relay names its table (its position key, the source of its
        dead letters)."""
        return ".".join(split_table(self.table, "relay.table"))

    @property
    def producer_instance(self) -> str:
        """What names the relay's producer in place of an instance id: `relay-<schema.table>`,
        one transactional id per table, shared by all its relays (a newcomer fences the last)."""
        return f"relay-{self.qualified_table}"

    @field_validator("poll_interval_ms")
    @classmethod
    def _polls_within_health(cls, interval_ms: int) -> int:
        if interval_ms > MAX_POLL_INTERVAL_MS:
            raise ValueError(f"must be at most {MAX_POLL_INTERVAL_MS} (a minute): /healthz "
                             "reports a relay stalled when it has not polled for 120 s")
        return interval_ms

    @field_validator("txid_column", "seq_column")
    @classmethod
    def _column(cls, column: str) -> str:
        try:
            return check_identifier(column, "column")
        except ConfigError as error:
            raise ValueError(error.args[0].partition(": ")[2]) from None

    @field_validator("position_config")
    @classmethod
    def _compacted(cls, value: dict[str, str]) -> dict[str, str]:
        if list_config_items(value.get("cleanup.policy", "compact")) != {"compact"}:
            raise ValueError("the relay's position topic needs cleanup.policy compact: only "
                             "the latest position per table matters, and it must never expire")
        return value
