"""The idempotent consumer: run a handler once per event id, commit offsets only after.

    store = PostgresDedupStore(dsn)
    consumer = IdempotentConsumer(settings, store, ship_order)
    consumer.run()          # until consumer.stop()

See cdc_router/consumer/README.md for the guarantees and the limits of each store.
"""

from __future__ import annotations

from cdc_router.consumer.dead_letter import (
    DeadLetterRefused,
    DeadLetterWriter,
    dead_letter_headers,
)
from cdc_router.consumer.event import ConsumedEvent, MalformedRecord
from cdc_router.consumer.loop import ConsumerFailed, ConsumerStats, Handler, IdempotentConsumer
from cdc_router.consumer.retry import RetryPolicy
from cdc_router.consumer.settings import ConsumerSettings, EventIdSource

__all__ = [
    "ConsumedEvent",
    "ConsumerFailed",
    "ConsumerSettings",
    "ConsumerStats",
    "DeadLetterRefused",
    "DeadLetterWriter",
    "EventIdSource",
    "Handler",
    "IdempotentConsumer",
    "MalformedRecord",
    "RetryPolicy",
    "dead_letter_headers",
]
