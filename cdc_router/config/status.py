"""The `status` section: what `cdc-router status` looks at, and when it warns or alarms.

Every threshold has a default that suits the local stack and a typical production setup; `None`
turns a check off. `cdc-router status --threshold KEY=VALUE` overrides one for a single run.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ByteSize, Field, NonNegativeFloat, NonNegativeInt, model_validator

from cdc_router.config.fields import ConfigModel as _Model
from cdc_router.config.fields import NonBlank, TableName
from cdc_router.config.fields import field_problem as _fail

Level = Literal["warning", "critical"]


class StatusSettings(_Model):
    """Where the pipeline's parts are and the thresholds of `cdc-router status`."""

    # The Debezium connector; its config names the slot, the publication and the table.
    connector: NonBlank = "outbox-connector"
    # The outbox table, schema.table; None: the connector's table.include.list when it names
    # one table, else cleanup.table.
    outbox_table: TableName | None = None  # review 57-b F-7: blank refused at load
    # Retained WAL against max_slot_wal_keep_size (percent), when that setting limits it.
    wal_warning_percent: float = Field(default=50.0, gt=0, le=100)
    wal_critical_percent: float = Field(default=80.0, gt=0, le=100)
    # Retained WAL in bytes when max_slot_wal_keep_size is -1 (a slot may fill the disk):
    # "10GB", "512MiB" or a number of bytes.
    wal_warning_bytes: ByteSize = ByteSize(10 * 1024**3)
    wal_critical_bytes: ByteSize = ByteSize(50 * 1024**3)
    # A slot nobody streams from retains WAL; it is normal for the seconds a task restarts.
    slot_inactive: Level = "warning"
    # A slot a watch (--watch, --serve) sees inactive this long while its connector and every
    # task say RUNNING: critical, capture stopped (Debezium retrying a retriable error). Many
    # times Debezium's pause before it tries again (retriable.restart.connector.wait.ms, 10 s
    # by default), so a task that reconnects by itself is not called stopped.
    capture_stopped_critical_s: NonNegativeFloat | None = 120.0
    # A prepared transaction (two-phase commit) pending this long: its locks stay held with no
    # session, its outbox rows are not streamed, and the slot keeps all WAL since it began.
    prepared_xact_warning_s: NonNegativeFloat | None = 60.0
    # Records of the raw topic the router group has not committed yet.
    lag_warning: NonNegativeInt | None = 10_000
    lag_critical: NonNegativeInt | None = None
    # Records are waiting and the group has not committed for this long: the router is stuck.
    stalled_warning_s: NonNegativeFloat | None = 60.0
    stalled_critical_s: NonNegativeFloat | None = 300.0
    # The outbox's oldest row (with cleanup on, rows older than the router's lag are leaks).
    outbox_age_warning_s: NonNegativeFloat | None = None
    outbox_rows_warning: NonNegativeInt | None = None
    # Dead letters on the topic; their growth between two ticks of --watch/--serve always warns.
    dead_letters_warning: NonNegativeInt | None = None
    dead_letters_critical: NonNegativeInt | None = None
    # A JetStream stream's messages or bytes against its max_msgs or max_bytes (percent):
    # from there on JetStream deletes its oldest messages, consumed or not (discard old), or
    # refuses every publish (discard new, set by hand). None: off (limits used as retention).
    stream_usage_warning_percent: float | None = Field(default=90.0, gt=0, le=100)
    # A router group with no member while records wait.
    no_router: Level = "critical"
    # Raw topics of the connector that another pipeline's router reads on purpose (one
    # connector capturing two pipelines' outboxes, review 64): not warned of as unread.
    read_elsewhere: list[NonBlank] = Field(default_factory=list)

    @model_validator(mode="after")
    def _ordered(self) -> StatusSettings:
        pairs = [("wal_warning_percent", "wal_critical_percent"),
                 ("wal_warning_bytes", "wal_critical_bytes"), ("lag_warning", "lag_critical"),
                 ("stalled_warning_s", "stalled_critical_s"),
                 ("dead_letters_warning", "dead_letters_critical")]
        for warning, critical in pairs:
            low, high = getattr(self, warning), getattr(self, critical)
            if low is not None and high is not None and low > high:
                raise _fail(warning, f"must not be above {critical} ({high})", low)
        return self
