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
