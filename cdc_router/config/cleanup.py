"""The `cleanup` section: removing outbox rows once their events are committed downstream."""

from __future__ import annotations

from typing import Literal

from pydantic import PositiveInt, model_validator

# Moved from settings.py with their bodies unchanged, hence the short local names.
from cdc_router.config.fields import ConfigModel as _Model
from cdc_router.config.fields import Dsn, TableName
from cdc_router.config.fields import field_problem as _fail


class CleanupSettings(_Model):
    """Removing outbox rows once their events are committed downstream."""

    mode: Literal["none", "delete", "retention"] = "none"
    retention_ms: PositiveInt | None = None  # mode retention: delete rows older than this
    batch_size: PositiveInt = 1000
    interval_ms: PositiveInt = 1000
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
