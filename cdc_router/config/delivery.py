"""The `delivery`, `dead_letter` and `dedup` sections: transactions and what guards them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, PositiveInt, ValidationInfo, field_validator, model_validator

# Moved from settings.py with their bodies unchanged, hence the short local names.
from cdc_router.config.fields import ConfigModel as _Model
from cdc_router.config.fields import NonBlank, TopicConfig, TopicCount, list_config_items
from cdc_router.config.fields import field_problem as _fail
from cdc_router.dead_letter import DEFAULT_MESSAGE_MAX_BYTES


class DeliverySettings(_Model):
    """Delivery guarantee and the size of each transaction."""

    guarantee: Literal["exactly_once", "at_least_once"] = "exactly_once"
    commit_interval_ms: PositiveInt = 100
    # Bounds (QA 57-d F-6: 10^30 loaded): a count Kafka's int32 holds; librdkafka's own
    # message.max.bytes limit; about 120 GB of ids, beyond any router's memory.
    commit_max_records: PositiveInt = Field(default=1000, le=2**31 - 1)
    # The transactional ids' prefix, `<prefix>-<instance id>`; by default source.group_id, so
    # that two pipelines on one host (both --instance-id the host name) never fence each other.
    transactional_id: NonBlank | None = None
    # The broker's default message.max.bytes is ~1 MiB.
    max_payload_bytes: PositiveInt = Field(default=1_000_000, le=1_000_000_000)
    # The producer's transaction.timeout.ms: how long a crashed instance's open transaction
    # blocks read_committed readers (when no restart of the same instance fences it first), and
    # the watchdog's base (kafka/watchdog.py: a call hung 15 s past it ends the process). 20 s,
    # not the producer's 60 s: like Kafka Streams' exactly-once default (10 s), short enough
    # that a dead instance stalls readers and a hung client briefly, long enough for a batch
    # (commit_interval_ms 100) and for nats.connect_timeout_ms + nats.ack_timeout_ms (15 s).
    # The broker refuses a longer one than its transaction.max.timeout.ms (15 minutes by
    # default: the bound here) with INVALID_TRANSACTION_TIMEOUT; librdkafka also takes it as
    # a 32-bit number, so a bigger value would silently wrap.
    transaction_timeout_ms: int = Field(default=20_000, gt=0, le=900_000)
    # A record's Kafka timestamp: the row's created_at, or the router's clock. A broker refuses
    # a timestamp outside message.timestamp.{before,after}.max.ms (after: 1 hour by default);
    # with created_at such a row is dead-lettered with that reason, with now it is delivered.
    record_timestamp: Literal["created_at", "now"] = "created_at"

    @model_validator(mode="after")
    def _commit_well_inside_transaction(self) -> DeliverySettings:
        # A batch must commit long before the broker aborts its transaction: a tenth leaves
        # room for the flush, the offsets and a slow broker.
        if self.commit_interval_ms * 10 > self.transaction_timeout_ms:
            raise _fail("commit_interval_ms", f"must be at most a tenth of "
                        f"transaction_timeout_ms ({self.transaction_timeout_ms})",
                        self.commit_interval_ms)
        return self


class DeadLetterSettings(_Model):
    """Where poison input goes, and how `topics apply` creates that topic."""

    topic: str = "cdc-router.dlq"
    partitions: TopicCount = 1
    replication_factor: TopicCount | None = None  # None: the broker's default
    config: TopicConfig = Field(default_factory=dict)

    @field_validator("config")
    @classmethod
    def _keeps_its_letters(cls, value: dict[str, str]) -> dict[str, str]:
        # A number already (TopicConfig); a compact-only topic deletes nothing by time.
        kept = int(value.get("retention.ms", "-1"))
        deletes = "delete" in list_config_items(value.get("cleanup.policy", "delete"))
        if deletes and 0 <= kept < MIN_DEAD_LETTER_RETENTION_MS:
            # Kafka deletes the letters silently: poison events lost, the stream never stopped.
            raise ValueError(f"retention.ms ({kept}) keeps a dead letter less than an hour, "
                             "and a poison event whose raw record is gone lives nowhere else: "
                             f"set at least {MIN_DEAD_LETTER_RETENTION_MS} (1 h; days are "
                             "usual, Kafka's default is 604800000, 7 days), or -1 to keep "
                             "them until replayed")
        size = int(value.get("retention.bytes", "-1"))
        if deletes and 0 <= size < MIN_DEAD_LETTER_RETENTION_BYTES:
            raise ValueError(f"retention.bytes ({size}) is less than one dead letter of the "
                             f"largest size a partition takes ({DEFAULT_MESSAGE_MAX_BYTES} bytes: "
                             "each holds its raw record), so one big letter pushes out every "
                             "one before it, and a poison event whose raw record is gone lives "
                             f"nowhere else: set at least {LOW_DEAD_LETTER_RETENTION_BYTES} "
                             "(100 MB a partition; Kafka's default is -1, no size limit), or "
                             "leave it out and bound the topic by retention.ms")
        return value

    def warnings(self) -> list[str]:
        """A size bound (config retention.bytes) that a flood of big letters fills: taken,
        warned of (between one letter and a hundred of the largest size)."""
        size = int(self.config.get("retention.bytes", "-1"))
        deletes = "delete" in list_config_items(self.config.get("cleanup.policy", "delete"))
        if not deletes or not MIN_DEAD_LETTER_RETENTION_BYTES <= size < \
                LOW_DEAD_LETTER_RETENTION_BYTES:
            return []
        return [f"dead_letter.config retention.bytes ({size}) holds fewer than a hundred dead "
                f"letters of the largest size a partition takes ({DEFAULT_MESSAGE_MAX_BYTES} "
                "bytes: each holds its raw record): a flood of big poison events pushes out "
                "the letters before it, each the only copy of its event once its raw record "
                f"is gone; {LOW_DEAD_LETTER_RETENTION_BYTES} (100 MB a partition) or -1 keeps "
                "them, retention.ms bounding the topic"]


# A dead letter must outlive the time to notice its alert and run `dlq replay` (L1: 1000 ms was
# taken, and every letter deleted a second later). An hour: the shortest on-call answer time
# one can count on; it refuses only a setting no one can react within.
MIN_DEAD_LETTER_RETENTION_MS = 3_600_000
# The same for a size bound (fixer 63: retention.bytes 1000 was taken). Kafka's is per
# partition, and deletes the oldest segments past it: a poison flood (QA 63-b: 146 events;
# chaos seed 25: 214) pushes out the letters before it, whatever their age. A hundred
# letters of the largest size a producer sends by default (a letter carries its raw record
# unchanged) is what a flood of big records cannot fill at once; a topic of small letters
# holds thousands within it. Below it a bound is warned of, not refused (rv64: 50 MB, a team's
# deliberate bound, stopped the router at load after an upgrade); below one such letter, refused.
LOW_DEAD_LETTER_RETENTION_BYTES = 100 * DEFAULT_MESSAGE_MAX_BYTES
MIN_DEAD_LETTER_RETENTION_BYTES = DEFAULT_MESSAGE_MAX_BYTES


class DedupSettings(_Model):
    """The replay filter: ids delivered recently, bounded by time and count.

    window_ms defaults to 7 days, the raw topic's default retention, which covers Debezium's
    replays after a crash; a new snapshot (offsets reset, slot dropped) re-reads every row
    still in the outbox, however old (QA 34-b): with cleanup on, delivered rows are gone by
    then. max_ids bounds memory (about 120 bytes per id, router/replay.py).
    """

    enabled: bool = True
    # At most 100 years (QA 43-a F4: 1e23 loaded, then set the changelog's retention.ms, a
    # Kafka long): a window past the raw topic's retention buys nothing.
    window_ms: PositiveInt = Field(default=7 * 24 * 3600 * 1000, le=100 * 366 * 24 * 3600 * 1000)
    max_ids: PositiveInt = Field(default=1_000_000, le=1_000_000_000)
    changelog_topic: str = "cdc-router.dedup"
    changelog_partitions: TopicCount = 1
    changelog_replication_factor: TopicCount | None = None
    changelog_config: TopicConfig = Field(default_factory=dict)  # retention.ms: checked below

    @field_validator("changelog_config")
    @classmethod
    def _compacted(cls, value: dict[str, str]) -> dict[str, str]:
        # A set of items (Kafka's LIST type): `delete, compact` is compact,delete too.
        policy = list_config_items(value.get("cleanup.policy", "compact"))
        if policy not in ({"compact"}, {"compact", "delete"}):
            raise ValueError("the dedup changelog needs cleanup.policy compact,delete "
                             "(or compact): one record per id, gone after the window")
        return value

    @field_validator("changelog_config")
    @classmethod
    def _holds_the_window(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        window_ms = info.data.get("window_ms")
        if not info.data.get("enabled", True) or not window_ms:
            return value
        try:
            forgets = forgets_before(value, window_ms, default_policy="compact,delete")
        except ValueError:
            raise ValueError(f"retention.ms must be a number of milliseconds, not "
                             f"{value.get('retention.ms')!r}") from None
        if forgets:
            # The router restored from it would deliver again the replays of ids it forgot.
            raise ValueError(f"retention.ms ({value['retention.ms']}) is below dedup.window_ms "
                             f"({window_ms}): ids forgotten sooner are delivered again when "
                             "Debezium replays them; leave retention.ms out (it defaults to "
                             "the window) or lower window_ms")
        return value

    def topic_config(self, keep_ms: int) -> dict[str, str]:
        """The changelog's topic config, its marks kept `keep_ms` (config/cleanup.py)."""
        kept = int(self.changelog_config.get("retention.ms", keep_ms))
        segments = {} if kept < 0 else {"segment.ms": str(changelog_segment_ms(kept))}
        return {"cleanup.policy": "compact,delete", "retention.ms": str(keep_ms), **segments,
                **self.changelog_config}


# Kafka deletes and compacts closed segments only, and closes one after segment.ms (7 days by
# default) or 1 GiB: the changelog's marks outlived dedup.window_ms by up to that long, and a
# restart read them all (QA 58-c F-1: a 10-minute window, 15.6 MB in one segment from the
# start). A tenth of the time they are kept; a minute at least, so that a short window does
# not make a file a second. The cleaner still merges closed segments (by size), and time
# retention deletes a merged one when its newest mark is due: marks live a few times the
# window, not the topic's lifetime (reread 58-r F-2).
CHANGELOG_SEGMENTS = 10
MIN_SEGMENT_MS = 60_000


def changelog_segment_ms(keep_ms: int) -> int:
    """The dedup changelog's segment.ms for marks kept `keep_ms`."""
    return max(keep_ms // CHANGELOG_SEGMENTS, MIN_SEGMENT_MS)


def forgets_before(topic_config: Mapping[str, str], window_ms: int, *,
                   default_policy: str) -> bool:
    """Whether a dedup changelog of this topic configuration deletes records by time sooner
    than `window_ms` (a cleanup.policy with delete, 0 <= retention.ms < the window). Raises
    ValueError for a retention.ms that is no number."""
    retention = topic_config.get("retention.ms")
    if retention is None or "delete" not in list_config_items(
            topic_config.get("cleanup.policy", default_policy)):
        return False
    return 0 <= int(retention) < window_ms
