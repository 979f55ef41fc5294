"""The idempotent consumer: run a handler once per event id, commit offsets only after.

    store = PostgresDedupStore(dsn)
    consumer = IdempotentConsumer(settings, store, ship_order)
    consumer.run()          # until consumer.stop()

On NATS JetStream: JetStreamConsumer(JetStreamSettings(...), store, ship_order), same handler.

See cdc_router/consumer/README.md for the guarantees and the limits of each store.
"""

from __future__ import annotations

from cdc_router.consumer.controls import ConsumerStats
from cdc_router.consumer.dead_letter import DeadLetterWriter, dead_letter_headers
from cdc_router.consumer.event import ConsumedEvent
from cdc_router.consumer.handler import Handler
from cdc_router.consumer.jetstream import JetStreamConsumer
from cdc_router.consumer.jetstream_settings import JetStreamSettings
from cdc_router.consumer.loop import IdempotentConsumer
from cdc_router.consumer.retry import RetryPolicy
from cdc_router.consumer.settings import ConsumerSettings, EventIdSource
from cdc_router.errors import DeadLetterRefused, FatalKafkaError, MalformedRecord, RetriableError

# The consumer's fatal error under its first name; the one fatal class is FatalKafkaError.
ConsumerFailed = FatalKafkaError

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
