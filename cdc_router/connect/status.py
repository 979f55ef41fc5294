"""What Kafka Connect says of a connector and its tasks (GET /connectors/{name}/status)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TaskStatus:
    """One task of a connector, as Connect reports it; `trace` is set when it FAILED."""

    id: int
    state: str
    worker_id: str
    trace: str | None = None


# The task states of a task that still runs or may run again as it is.
_LIVE = ("RUNNING", "PAUSED", "RESTARTING")


@dataclass(frozen=True)
class ConnectorStatus:
    """A connector's state and its tasks' states (GET /connectors/{name}/status)."""

    name: str
    state: str
    worker_id: str
    tasks: tuple[TaskStatus, ...]
    type: str | None = None
    trace: str | None = None

    def reached(self, state: str) -> bool:
        """True when the connector and each task are in `state`: STOPPED, or PAUSED from it,
        has no task (QA 64-a F-5: `wait --state PAUSED` never ended); RUNNING needs one."""
        if self.state != state:
            return False
        if state == "STOPPED":
            # it65: STOPPED came a moment before the status topic dropped the task, which
            # `connectors status` then listed RUNNING. One a dead worker left UNASSIGNED or
            # FAILED stays listed: not waited for.
            return not any(task.state in _LIVE for task in self.tasks)
        if state == "PAUSED" and not self.tasks:
            return True
        return bool(self.tasks) and all(task.state == state for task in self.tasks)

    def failure(self) -> str | None:
        """'FAILED: <first trace line>' or 'task N FAILED: ...'; None when nothing failed."""
        candidates = [("", self.state, self.trace)] + [
            (f"task {task.id} ", task.state, task.trace) for task in self.tasks]
        for what, state, trace in candidates:
            if state == "FAILED":  # with the root cause (QA 48-a F-low-10, review 48-b F12)
                return f"{what}FAILED: {failure_of(trace) or 'no trace'}"
        return None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ConnectorStatus:
        connector = data.get("connector", {})
        tasks = tuple(
            TaskStatus(int(task["id"]), str(task["state"]), str(task.get("worker_id", "")),
                       task.get("trace"))
            for task in sorted(data.get("tasks", []), key=lambda task: int(task["id"])))
        return cls(str(data["name"]), str(connector.get("state", "UNKNOWN")),
                   str(connector.get("worker_id", "")), tasks, data.get("type"),
                   connector.get("trace"))


def failure_of(trace: str | None) -> str | None:
    """A failed connector's or task's Java trace in one line: its first line and, when the
    trace has one, its root cause (the last `Caused by:`). Debezium wraps most failures in the
    same first line ("An exception occurred in the change event producer"), and the cause
    (a publication missing, a refused login, a bad setting) is what says what to do."""
    lines = [line.strip() for line in (trace or "").strip().splitlines()]
    if not lines:
        return None
    causes = [line.removeprefix("Caused by:").strip() for line in lines
              if line.startswith("Caused by:")]
    return f"{lines[0]} (root cause: {causes[-1]})" if causes and causes[-1] != lines[0] \
        else lines[0]
