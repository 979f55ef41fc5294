"""`cdc-router dlq`: what went to the dead-letter topic, and why."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import click
from confluent_kafka import Consumer

from cdc_router.cli._output import emit, output_option, table
from cdc_router.config.load import load_config
from cdc_router.dead_letter import (
    ERROR_CLASS,
    ERROR_MESSAGE,
    EVENT_ID,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    STAGE,
)
from cdc_router.kafka.consumer import record_headers

# Stop once nothing new has arrived for this long: the topic has been read to its end.
_IDLE_S = 3.0


@click.group(name="dlq")
def cli() -> None:
    """Inspect the dead-letter topic of a router config."""


@cli.command(name="list")
@click.option("-c", "--config", "config_path", required=True, type=click.Path(path_type=Path),
              envvar="CDC_ROUTER_CONFIG", help="router.yaml [env CDC_ROUTER_CONFIG].")
@click.option("-n", "--limit", default=50, show_default=True, help="At most this many, oldest "
              "first.")
@output_option
def list_letters(config_path: Path, limit: int, output: str) -> None:
    """Dead letters with where they came from, the stage that failed, and why."""
    config = load_config(config_path, env=os.environ).config
    consumer = Consumer({**config.kafka.librdkafka(), "group.id": f"dlq-list-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.subscribe([config.dead_letter.topic])
    letters: list[dict[str, Any]] = []
    last = time.monotonic()
    try:
        while len(letters) < limit and time.monotonic() - last < _IDLE_S:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            last = time.monotonic()
            headers = {name: value.decode(errors="replace")
                       for name, value in record_headers(message)}
            letters.append({
                "offset": message.offset(), "stage": headers.get(STAGE),
                "source": f"{headers.get(SOURCE_TOPIC)}[{headers.get(SOURCE_PARTITION)}]"
                          f"@{headers.get(SOURCE_OFFSET)}",
                "event_id": headers.get(EVENT_ID), "error": headers.get(ERROR_CLASS),
                "reason": headers.get(ERROR_MESSAGE)})
    finally:
        consumer.close()
    emit(letters, output, lambda rows: table(
        ["offset", "stage", "source", "event id", "error", "reason"],
        [[r["offset"], r["stage"], r["source"], r["event_id"] or "-", r["error"],
          (r["reason"] or "")[:120]] for r in rows]) if rows
        else f"no dead letters on {config.dead_letter.topic}")
