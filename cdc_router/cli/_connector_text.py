"""How `cdc-router connectors` shows plans and states: text for people, JSON for scripts."""

from __future__ import annotations

from typing import Any

from cdc_router.cli._output import table
from cdc_router.config.redact import redact
from cdc_router.connect.plan import ConfigChange, ConnectorAction, ConnectorPlan
from cdc_router.connect.status import ConnectorStatus


def change_lines(changes: tuple[ConfigChange, ...]) -> list[str]:
    """One line a changed key, secrets masked: + added, - removed, ~ changed."""
    lines = []
    for change in changes:
        old, new = redact(change.key, change.deployed), redact(change.key, change.desired)
        if change.deployed is None:
            lines.append(f"  + {change.key} = {new}")
        elif change.desired is None:
            lines.append(f"  - {change.key} = {old}")
        else:
            lines.append(f"  ~ {change.key}: {old} -> {new}")
    return lines


def plan_text(plans: list[ConnectorPlan], *, all_keys: bool) -> str:
    """The plan of `apply` (changed keys of updates) and `diff` (`all_keys`), with its notes."""
    lines = []
    for item in plans:
        head = f"{item.spec.name} ({item.spec.source}): {item.action}"
        if item.action is not ConnectorAction.UNCHANGED:
            head += f" ({len(item.changes)} key{'s' if len(item.changes) != 1 else ''})"
        lines.append(head)
        if all_keys or item.action is ConnectorAction.UPDATE:
            lines.extend(change_lines(item.changes))
        lines.extend(f"  ! {note}" for note in item.notes)
    return "\n".join(lines)


def plan_json(plans: list[ConnectorPlan]) -> list[dict[str, Any]]:
    """`diff -o json`: each plan's name, file, action, changes (secrets masked), notes."""
    return [{"name": item.spec.name, "file": item.spec.source, "action": str(item.action),
             "changes": [{"key": change.key, "deployed": redact(change.key, change.deployed),
                          "desired": redact(change.key, change.desired)}
                         for change in item.changes], "notes": list(item.notes)}
            for item in plans]


def tasks_text(status: ConnectorStatus) -> str:
    """`0:RUNNING 1:FAILED`, or `-` without tasks."""
    return " ".join(f"{task.id}:{task.state}" for task in status.tasks) or "-"


def status_text(status: ConnectorStatus) -> str:
    """The connector and task table of `connectors status`, then any trace."""
    rows = [["connector", status.name, status.state, status.worker_id]]
    rows += [["task", str(task.id), task.state, task.worker_id] for task in status.tasks]
    lines = [table(["KIND", "NAME/ID", "STATE", "WORKER"], rows)]
    if status.trace:
        lines += ["", "connector trace:", status.trace.rstrip()]
    for task in status.tasks:
        if task.trace:
            lines += ["", f"task {task.id} trace:", task.trace.rstrip()]
    return "\n".join(lines)
