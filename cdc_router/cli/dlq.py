"""`cdc-router dlq`: what went to the dead-letter topic, and why."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import click

from cdc_router.cli._output import emit, output_option, table
from cdc_router.config.load import load_config
from cdc_router.dead_letter import dead_letter_origin
from cdc_router.kafka.consumer import record_headers
from cdc_router.kafka.reader import TopicReader

# Reading the dead-letter topic to its end: on a cluster that answers, seconds; past this, say
# so rather than hang.
_READ_TIMEOUT_S = 60.0


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
    # Up to the last stable offset as of now: a router's open transaction is not waited for.
    reader = TopicReader(config.kafka.librdkafka(), config.dead_letter.topic,
                         group_id=f"dlq-list-{uuid.uuid4()}", what="dead-letter")
    letters: list[dict[str, Any]] = []
    try:
        for message in reader.read_to_end(end="stable", timeout_s=_READ_TIMEOUT_S):
            letters.append({"offset": message.offset(),
                            **dead_letter_origin(record_headers(message))})
            if len(letters) >= limit:
                break
    finally:
        reader.close()
    emit(letters, output, lambda rows: table(
        ["offset", "stage", "source", "event id", "error", "reason"],
        [[r["offset"], r["stage"], r["source"], r["event_id"] or "-", r["error"],
          (r["reason"] or "")[:120]] for r in rows]) if rows
        else f"no dead letters on {config.dead_letter.topic}")
