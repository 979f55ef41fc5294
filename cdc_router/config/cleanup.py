"""The `cleanup` section: removing outbox rows once their events are committed downstream."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

# Moved from settings.py with their bodies unchanged, hence the short local names.
from cdc_router.config.fields import ConfigModel as _Model
from cdc_router.config.fields import Dsn, TableName
from cdc_router.config.fields import field_problem as _fail

_HOUR_MS = 3_600_000
_YEARS_100_MS = 100 * 366 * 24 * _HOUR_MS


class CleanupSettings(_Model):
    """Removing outbox rows once their events are committed downstream."""

    mode: Literal["none", "delete", "retention"] = "none"
    # Bounded (QA 33-b: a batch_size over 100,000 or an interval_ms of 1e30 ended the cleanup
    # thread): the sweep reads ten batches of ids at a time, librdkafka at most a million.
    retention_ms: int | None = Field(default=None, ge=1, le=_YEARS_100_MS)
    batch_size: int = Field(default=1000, ge=1, le=100_000)
    interval_ms: int = Field(default=1000, ge=1, le=_HOUR_MS)
    table: TableName = "public.outbox"
    dsn: Dsn = None  # Postgres DSN; set it through CDC_ROUTER__CLEANUP__DSN, not the file

    @model_validator(mode="after")
    def _complete(self) -> CleanupSettings:
        if self.mode == "retention" and self.retention_ms is None:
            raise _fail("retention_ms", "mode retention needs retention_ms")
        return self

    def missing_dsn(self) -> str | None:
        """What is wrong when the cleanup is on without its DSN: checked by `run`, which
        deletes rows, not at load, so that `rules check`, `topics apply` and `status` (in CI,
        in docker-compose's init) need no database secret."""
        if self.mode != "none" and not self.dsn:
            return (f"mode {self.mode} needs the Postgres DSN (cleanup.dsn, or the "
                    "environment variable CDC_ROUTER__CLEANUP__DSN)")
        return None


# Review 49-b F2. In retention mode the ids of delivered rows wait retention_ms in memory; after
# a restart (a deploy too) only the dedup changelog, read back by the sweep, proves which rows
# were delivered. Its marks must live that long: the changelog keeps them retention_ms and
# this margin (the marks carry the router's clock, created_at the writer's), not only the
# dedup window.
SWEEP_MARGIN_MS = 3_600_000


def sweep_keep_ms(cleanup: CleanupSettings, window_ms: int, *, sweeps: bool) -> int:
    """How long the dedup changelog must keep its marks: the replay filter's window, and in
    retention mode with a sweep (`sweeps`), retention_ms and a margin."""
    if cleanup.mode != "retention" or not sweeps or cleanup.retention_ms is None:
        return window_ms
    return max(window_ms, cleanup.retention_ms + SWEEP_MARGIN_MS)


def retention_leak(cleanup: CleanupSettings, *, without_sweep: str | None,
                   changelog_retention_ms: str | None, keep_ms: int) -> str | None:
    """Why rows delivered before a restart would stay for good in retention mode, or None.
    `without_sweep`: the setting that leaves the cleanup without its sweep (dedup off,
    at_least_once); `changelog_retention_ms`: dedup.changelog_config's retention.ms, if set."""
    if cleanup.mode != "retention":
        return None
    if without_sweep is not None:
        return (f"cleanup.mode retention with {without_sweep}: the ids of delivered rows wait "
                "cleanup.retention_ms in memory only, and without the dedup changelog's marks "
                "(written with exactly_once deliveries) nothing proves their delivery after a "
                "restart: each restart, a deploy too, leaves the rows delivered within "
                "cleanup.retention_ms before it in the table for good; use cleanup.mode "
                "delete, or remove them yourself (`cdc-router outbox purge --older-than`, which "
                "goes by age alone)")
    if changelog_retention_ms is not None and 0 <= int(changelog_retention_ms) < keep_ms:
        return (f"dedup.changelog_config retention.ms ({changelog_retention_ms}) is below "
                f"cleanup.retention_ms ({cleanup.retention_ms}) + 1 h: after a restart the "
                "cleanup finds the rows delivered before it in the changelog's marks, and the "
                "rows whose marks it dropped stay in the table for good; raise it to "
                f"{keep_ms} or leave it out (`cdc-router topics apply` sets it)")
    return None
