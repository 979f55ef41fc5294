"""`cdc-router streams`: create the JetStream streams a router config declares, plan first."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import click

from cdc_router.cli._options import config_option
from cdc_router.cli._plan import apply_options, describe, show_and_apply
from cdc_router.config.load import load_config
from cdc_router.errors import ConfigError
from cdc_router.nats.connection import connect_options
from cdc_router.nats.streams import StreamAdmin, StreamPlan, config_changes


@click.group(name="streams")
def cli() -> None:
    """Create the NATS JetStream streams of a router config (nats.streams)."""


def _describe(plan: StreamPlan) -> list[str]:
    return describe(f"{plan.action:<9} {plan.name}", config_changes(plan.changes),
                    plan.warnings)


@cli.command()
@config_option()
@apply_options
def apply(config_path: Path, dry_run: bool, yes: bool, output: str) -> None:
    """Show what would change, then create or update the streams (idempotent)."""
    config = load_config(config_path, env=os.environ).config
    if config.nats is None or not config.nats.streams:
        raise ConfigError("declares no JetStream stream", source=str(config_path),
                          field="nats.streams", hint="add the streams your nats: routes use")
    specs = config.nats.streams
    admin = StreamAdmin(config.nats.url, connect_options(config.nats))
    # The config's warnings of a stream (rules check's) where the plan sets what they are
    # about: QA 54-d F-5 (memory, created without a word), F-7 (a window lowered under it).
    plans = [dataclasses.replace(plan, warnings=plan.warnings + tuple(
        text for key, text in config.nats.warnings_of(index).items()
        if key in plan.changes or key == "storage"))
        for index, plan in enumerate(admin.plan(specs))]
    show_and_apply(plans, describe=_describe,
                   as_json=lambda plan: {"name": plan.name, "action": plan.action,
                                         "changes": config_changes(plan.changes),
                                         "warnings": list(plan.warnings)},
                   apply=lambda pending: admin.apply(specs, pending),
                   dry_run=dry_run, yes=yes, output=output)
