"""Declarative `apply` commands (topics, streams): show the plan, ask, then apply."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import click

from cdc_router.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])
P = TypeVar("P", bound="Plan")


class Plan(Protocol):
    @property
    def action(self) -> str: ...


def describe(head: str, changes: dict[str, tuple[Any, Any]],
             warnings: Sequence[str]) -> list[str]:
    """One plan's lines: its head, each `key: have -> want`, each warning."""
    lines = [head]
    for key, (have, want) in changes.items():
        lines.append(f"            {key}: {have if have is not None else '-'} -> {want}")
    return lines + [f"  warning: {warning}" for warning in warnings]


def apply_options(command: F) -> F:
    """--dry-run, --yes and -o text|json, as every apply command takes them."""
    for option in reversed((
            click.option("--dry-run", is_flag=True, help="Only show the plan."),
            click.option("--yes", is_flag=True, help="Apply without asking."),
            click.option("-o", "--output", type=click.Choice(["text", "json"]),
                         default="text"))):
        command = option(command)
    return command


def show_and_apply(plans: Sequence[P], *, describe: Callable[[P], list[str]],
                   as_json: Callable[[P], dict[str, Any]], apply: Callable[[list[P]], object],
                   dry_run: bool, yes: bool, output: str) -> None:
    """Print the plan; unless --dry-run or nothing changes, confirm (or --yes) and apply."""
    if output == "json":
        click.echo(json.dumps([as_json(plan) for plan in plans], indent=2))
    else:
        for plan in plans:
            for line in describe(plan):
                click.echo(line)
    pending = [plan for plan in plans if plan.action != "unchanged"]
    if dry_run or not pending:
        if output == "text" and not pending:
            click.echo("nothing to do")
        return
    confirm("apply these changes?", yes)
    apply(pending)
    if output == "text":
        click.echo(f"applied {len(pending)} change(s)")


def confirm(question: str, yes: bool) -> None:
    """Go on with --yes, or when the person at the terminal says yes; click.Abort otherwise.
    Without a terminal (a script, cron, CI, a pipe) nobody can say yes: a ConfigError naming
    --yes, never an action nobody asked for."""
    if yes:
        return
    if not sys.stdin.isatty():
        # No field: --yes is an option, and "field '--yes'" read as a config field (QA 36-c).
        context = click.get_current_context(silent=True)
        plans = context is not None and any(
            parameter.name == "dry_run" for parameter in context.command.params)
        raise ConfigError("no terminal to confirm on", hint="pass --yes to go on without "
                          "asking" + (", or --dry-run to only plan" if plans else ""))
    if not click.confirm(question):
        raise click.Abort()
