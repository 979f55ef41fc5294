"""The `source` section: the raw Debezium topics, and the outbox table's columns."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

# Moved from settings.py with their bodies unchanged, hence the short local names.
from cdc_router.config.fields import ConfigModel as _Model
from cdc_router.config.fields import NonBlank, field_problem, refuse_blank
from cdc_router.config.outbox_columns import OutboxColumnNames
from cdc_router.config.topic_names import (
    librdkafka_takes_pattern,
    source_regex,
    topic_name_problem,
)
from cdc_router.outbox.table import OutboxColumns


class SourceSettings(_Model):
    """The raw Debezium topics to consume and how to read their rows."""

    topics: list[str] = Field(default_factory=list)  # empty only for `relay` (model.py)
    group_id: str = "cdc-router"
    outbox: OutboxColumnNames = Field(default_factory=OutboxColumnNames)
    snapshot_rows: bool = True  # route op 'r' (rows read by Debezium's initial snapshot)
    on_update: Literal["skip", "fail"] = "skip"  # an outbox is insert-only; 'fail' dead-letters
    # The connector's binary.handling.mode ('bytes' is base64 in JSON too).
    binary_handling: Literal["base64", "base64-url-safe", "hex"] = "base64"
    # How to read the payload column: 'auto' trusts the schema when the converter sends one
    # and otherwise takes the value as JSON text (jsonb, json, text); 'bytes' is for bytea.
    payload_type: Literal["auto", "json", "bytes"] = "auto"
    # An integer created_at when the connector sends no schema: 'auto' takes values from 10^14
    # up as microseconds (a timestamp(6) column after 1973), below as milliseconds; 'micros'
    # (timestamp(4..6)) or 'millis' (timestamp(0..3)) say it, for rows dated before 1973.
    created_at_unit: Literal["auto", "micros", "millis"] = "auto"
    # The connector's topic.heartbeat.prefix; records on topics starting with it are skipped.
    heartbeat_topic_prefix: NonBlank = "__debezium-heartbeat"
    # Seconds a raw partition may go unread while records wait behind its high watermark (a
    # transaction open on it holds its last stable offset) before the router logs
    # event=raw_partition_held (router/held.py). As status.stalled_warning_s: a transaction
    # in flight holds a partition a moment, one that lasts is worth a line.
    held_partition_warning_s: float = 60.0

    @field_validator("outbox", mode="before")
    @classmethod
    def _table_columns(cls, outbox: object) -> object:
        # The table's own model (one name each), as the outbox commands and write_event take.
        return outbox.model_dump() if isinstance(outbox, OutboxColumns) else outbox

    @field_validator("held_partition_warning_s")
    @classmethod
    def _held_bound(cls, seconds: float) -> float:
        # The router looks at its partitions once a second (router/metrics.py LAG_INTERVAL_S);
        # nan or inf would mean never, without a word.
        if not 1 <= seconds < float("inf"):
            raise ValueError("must be a number of seconds, at least 1 (the router looks at "
                             "its partitions once a second), e.g. 60 (the default)")
        return seconds

    @field_validator("group_id")
    @classmethod
    def _group_not_blank(cls, group_id: str) -> str:
        # Review 48-e F1: librdkafka takes a blank group.id as none, and confluent-kafka's
        # Consumer then failed a C assertion: the process aborted (SIGABRT) in `rules check`.
        return refuse_blank(group_id, "give the router's Kafka consumer group, e.g. "
                            "cdc-router (the default)")

    @field_validator("topics")
    @classmethod
    def _legal_topics(cls, topics: list[str]) -> list[str]:
        for topic in topics:
            # librdkafka subscribes to every topic matching a name that starts with '^'.
            if topic.startswith("^"):
                source_regex(topic)
                librdkafka_takes_pattern(topic)
                continue
            problem = topic_name_problem(topic, internal_ok=True)
            if problem:
                raise ValueError(problem)
        if len(set(topics)) != len(topics):
            raise ValueError("a topic is listed twice")
        return topics

    @model_validator(mode="after")
    def _heartbeats_not_events(self) -> SourceSettings:
        # Review 47-a F6: every record of a topic starting with the prefix is skipped as a
        # heartbeat, counted and not logged, and its offset committed: with the prefix
        # 'outbox', every event of outbox.public.outbox was passed over without a word.
        for topic in self.topics:
            if not topic.startswith("^") and topic.startswith(self.heartbeat_topic_prefix):
                raise field_problem(
                    "heartbeat_topic_prefix", f"is a prefix of the source topic {topic}, whose "
                    "events would all be skipped as heartbeats; set it to the connector's "
                    "topic.heartbeat.prefix (Debezium's default: __debezium-heartbeat)",
                    self.heartbeat_topic_prefix)
        return self

    @model_validator(mode="after")
    def _binary_handling_read(self) -> SourceSettings:
        # QA 35-a F4: with payload_type auto, a bytea column in hex (or base64-url-safe) is
        # never decoded: Debezium gives it a string schema, so auto takes the text for JSON,
        # and hex digits such as 1234 were delivered as that text without a word. Refused
        # rather than warned about: a warning scrolls by while the router delivers wrong bytes.
        # The relay alone (no topics) reads the column's type itself and decodes either.
        if self.topics and self.payload_type == "auto" and self.binary_handling != "base64":
            raise field_problem(
                "payload_type", f"must be bytes or json with binary_handling "
                f"{self.binary_handling}: that setting is only read for a bytea payload, and "
                "with auto the connector's string (a string schema, or none) is taken for JSON "
                "text, so a bytea payload's hex digits such as 1234 would be delivered as "
                "that text; set payload_type: bytes for a bytea payload column, or json (and "
                "drop binary_handling) for a jsonb, json or text one", self.payload_type)
        return self
