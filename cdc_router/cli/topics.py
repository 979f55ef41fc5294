"""`cdc-router topics`: create the topics a router config names, plan first."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import click
from confluent_kafka import KafkaException

from cdc_router.cli._options import config_option
from cdc_router.cli._plan import apply_options, describe, show_and_apply
from cdc_router.config.load import load_config
from cdc_router.config.model import RouterConfig
from cdc_router.errors import CdcRouterError
from cdc_router.ops.topics import dead_letter_state
from cdc_router.router import clients
from cdc_router.router.dlq_letters import sources_of
from cdc_router.router.topics import TopicAdmin, TopicPlan, retention_cuts, shared_topics


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
                       config.config_ceilings(), shared_topics(config))
    plans = admin.apply(plans, validate_only=True)  # a refusal: one line before any change
    plans = [_others_letters(plan, config, admin) for plan in plans]
    show_and_apply(plans, describe=_describe,
                   as_json=lambda plan: {**plan.__dict__, "warnings": list(plan.warnings)},
                   apply=admin.apply, dry_run=dry_run, yes=yes, output=output)


def _others_letters(plan: TopicPlan, config: RouterConfig, admin: TopicAdmin) -> TopicPlan:
    """`plan` with a warning when it deletes the dead-letter topic's records sooner while
    other pipelines' letters are on it. QA 63-b F-4: one team's `dead_letter.config`
    lowered a shared topic's retention.ms from 7 days to an hour without a word, and the
    other teams' letters, 146 of them, would have gone with it."""
    cuts = retention_cuts(plan)
    if plan.name != config.dead_letter.topic or plan.action != "update" or not cuts:
        return plan
    try:
        others = dead_letter_state(admin.admin, clients.logged_config(config), plan.name,
                                   int(time.time() * 1000), sources_of(config)).others
    except (KafkaException, CdcRouterError):  # not known: the plan as it is
        return plan
    if not others:
        return plan
    return replace(plan, warnings=(*plan.warnings, f"{', '.join(cuts)} deletes sooner the "
                   f"{others} letters of other pipelines on it too (`dlq list --all`): agree "
                   "it with them, or give this pipeline its own dead_letter.topic"))
