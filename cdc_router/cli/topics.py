"""`cdc-router topics`: create the topics a router config names, plan first."""

from __future__ import annotations

import os
from pathlib import Path

import click

from cdc_router.cli._options import config_option
from cdc_router.cli._plan import apply_options, describe, show_and_apply
from cdc_router.config.load import load_config
from cdc_router.router import clients
from cdc_router.router.topics import TopicAdmin, TopicPlan


@click.group(name="topics")
def cli() -> None:
    """Create the destination, dead-letter and changelog topics of a router config."""


def _describe(plan: TopicPlan) -> list[str]:
    head = f"{plan.action:<9} {plan.name}" + (
        f" (partitions {plan.partitions or 'broker default'}, replication "
        f"{plan.replication_factor or 'broker default'})" if plan.action == "create" else "")
    return describe(head, plan.config_changes, plan.warnings)


@cli.command()
@config_option()
@apply_options
def apply(config_path: Path, dry_run: bool, yes: bool, output: str) -> None:
    """Show what would change, then create or update the topics (idempotent)."""
    config = load_config(config_path, env=os.environ).config
    admin = TopicAdmin(clients.logged_config(config))
    plans = admin.plan(config.topic_specs(), config.config_floors(),
                       config.config_ceilings())
    plans = admin.apply(plans, validate_only=True)  # a refusal: one line before any change
    show_and_apply(plans, describe=_describe,
                   as_json=lambda plan: {**plan.__dict__, "warnings": list(plan.warnings)},
                   apply=admin.apply, dry_run=dry_run, yes=yes, output=output)
