"""Dedup stores of the idempotent consumer: run an effect once per (consumer group, event id).

The router's own replay dedup is a different thing and lives in cdc_router.router.replay.
Store implementations import their client library lazily: `dedup.redis` needs redis-py.
"""

from __future__ import annotations

from cdc_router.consumer.dedup.memory import MemoryDedupStore
from cdc_router.consumer.dedup.store import (
    DedupKey,
    DedupStore,
    DedupStoreUnreachable,
    Effect,
    Outcome,
)
from cdc_router.errors import DedupStoreError, DedupStoreRefused, EffectAborted, NestedEventBusy

__all__ = ["DedupKey", "DedupStore", "DedupStoreError", "DedupStoreRefused",
           "DedupStoreUnreachable", "Effect", "EffectAborted", "MemoryDedupStore",
           "NestedEventBusy", "Outcome"]
