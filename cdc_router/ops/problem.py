"""One problem `status` found (its level, the part of the report, the line) and the thresholds
every check judges a value against."""

from __future__ import annotations

from dataclasses import dataclass

from cdc_router.config.status import Level


@dataclass(frozen=True)
class Problem:
    level: Level
    component: str  # a key of the report: wal, connector, router, ...
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.component}: {self.message}"


def reached(value: float, critical: float | None,
         warning: float | None) -> tuple[Level, float] | None:
    """The level whose threshold `value` reaches, critical first; None below both."""
    levels: tuple[tuple[Level, float | None], ...] = (("critical", critical), ("warning", warning))
    for level, threshold in levels:
        if threshold is not None and value >= threshold:
            return level, threshold
    return None


def size(count: float | None) -> str:
    """A byte count for people: 512 B, 3.2 MiB; '-' for None."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
