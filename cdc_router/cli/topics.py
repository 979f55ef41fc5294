"""`cdc-router topics`: create the topics a router config names, plan first."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from cdc_router.config.load import load_config
from cdc_router.router.topics import TopicAdmin, TopicPlan

config_option = click.option("-c", "--config", "config_path", required=True,
                             type=click.Path(path_type=Path), envvar="CDC_ROUTER_CONFIG",
                             help="router.yaml [env CDC_ROUTER_CONFIG].")


@click.group(name="topics")
def cli() -> None:
    """Create the destination, dead-letter and changelog topics of a router config."""


def _describe(plan: TopicPlan) -> list[str]:
    lines = [f"{plan.action:<9} {plan.name}" + (
        f" (partitions {plan.partitions or 'broker default'}, replication "
        f"{plan.replication_factor or 'broker default'})" if plan.action == "create" else "")]
    for key, (have, want) in plan.config_changes.items():
        lines.append(f"            {key}: {have if have is not None else '-'} -> {want}")
    lines += [f"  warning: {warning}" for warning in plan.warnings]
    return lines


@cli.command()
@config_option
@click.option("--dry-run", is_flag=True, help="Only show the plan.")
@click.option("--yes", is_flag=True, help="Apply without asking.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text")
def apply(config_path: Path, dry_run: bool, yes: bool, output: str) -> None:
    """Show what would change, then create or update the topics (idempotent)."""
    config = load_config(config_path, env=os.environ).config
    admin = TopicAdmin(config.kafka.librdkafka())
    plans = admin.plan(config.topic_specs())
    if output == "json":
        click.echo(json.dumps([{**plan.__dict__, "warnings": list(plan.warnings)}
                               for plan in plans], indent=2))
    else:
        for plan in plans:
            for line in _describe(plan):
                click.echo(line)
    pending = [plan for plan in plans if plan.action != "unchanged"]
    if dry_run or not pending:
        if output == "text" and not pending:
            click.echo("nothing to do")
        return
    if not yes and sys.stdin.isatty() and not click.confirm("apply these changes?"):
        raise click.Abort()
    admin.apply(pending)
    if output == "text":
        click.echo(f"applied {len(pending)} change(s)")
