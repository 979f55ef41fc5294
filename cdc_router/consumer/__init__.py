"""The idempotent consumer: run a handler once per event id, commit offsets only after.

    store = PostgresDedupStore(dsn)
    consumer = IdempotentConsumer(settings, store, ship_order)
    consumer.run()          # until consumer.stop()

On NATS JetStream: JetStreamConsumer(JetStreamSettings(...), store, ship_order), same handler.

See cdc_router/consumer/README.md for the guarantees and the limits of each store.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdc_router.consumer.controls import ConsumerStats
    from cdc_router.consumer.dead_letter import DeadLetterWriter, dead_letter_headers
    from cdc_router.consumer.event import ConsumedEvent
    from cdc_router.consumer.handler import Handler
    from cdc_router.consumer.jetstream import JetStreamConsumer
    from cdc_router.consumer.jetstream_settings import JetStreamSettings
    from cdc_router.consumer.loop import IdempotentConsumer
    from cdc_router.consumer.retry import RetryPolicy
    from cdc_router.consumer.settings import ConsumerSettings, EventIdSource
    from cdc_router.errors import (
        DeadLetterRefused,
        FatalKafkaError,
        MalformedRecord,
        RetriableError,
    )

    # The consumer's fatal error under its first name; the one fatal class is FatalKafkaError.
    ConsumerFailed = FatalKafkaError

# Where each name lives, imported on first use (PEP 562): importing a submodule runs this
# package first, and the dedup stores, consumer/checks.py and `cdc-router dedup` must not pay
# for confluent_kafka, nats-py and the loops (review 54-k F-10: about a second per import).
_HOMES = {
    "ConsumerStats": "controls", "DeadLetterWriter": "dead_letter",
    "dead_letter_headers": "dead_letter", "ConsumedEvent": "event", "Handler": "handler",
    "JetStreamConsumer": "jetstream", "JetStreamSettings": "jetstream_settings",
    "IdempotentConsumer": "loop", "RetryPolicy": "retry", "ConsumerSettings": "settings",
    "EventIdSource": "settings",
}
_ERRORS = {"DeadLetterRefused": "DeadLetterRefused", "FatalKafkaError": "FatalKafkaError",
           "MalformedRecord": "MalformedRecord", "RetriableError": "RetriableError",
           "ConsumerFailed": "FatalKafkaError"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    if name in _ERRORS:
        return getattr(importlib.import_module("cdc_router.errors"), _ERRORS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "ConsumedEvent",
    "ConsumerFailed",
    "ConsumerSettings",
    "ConsumerStats",
    "DeadLetterRefused",
    "DeadLetterWriter",
    "EventIdSource",
    "FatalKafkaError",
    "Handler",
    "IdempotentConsumer",
    "JetStreamConsumer",
    "JetStreamSettings",
    "MalformedRecord",
    "RetriableError",
    "RetryPolicy",
    "dead_letter_headers",
]
