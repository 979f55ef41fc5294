"""The `source` section: the raw Debezium topics, and the outbox table's columns."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

# Moved from settings.py with their bodies unchanged, hence the short local names.
from cdc_router.config.fields import ConfigModel as _Model
from cdc_router.config.topic_names import (
    librdkafka_takes_pattern,
    source_regex,
    topic_name_problem,
)
from cdc_router.outbox.table import OutboxColumns


class SourceSettings(_Model):
    """The raw Debezium topics to consume and how to read their rows."""

    topics: list[str] = Field(default_factory=list)  # empty only for `relay` (model.py)
    group_id: str = Field(default="cdc-router", min_length=1)
    outbox: OutboxColumns = Field(default_factory=OutboxColumns)
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
    heartbeat_topic_prefix: str = Field(default="__debezium-heartbeat", min_length=1)

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
