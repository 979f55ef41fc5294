"""The dedup stores and the consumer's checks load without a Kafka client (review 54-k F-10:
the package's __init__ and cdc_router.errors imported confluent_kafka for them anyway)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_the_dedup_stores_and_checks_do_not_load_confluent_kafka() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, cdc_router.consumer.checks, "
         "cdc_router.consumer.dedup.postgres, cdc_router.consumer.dedup.redis, cdc_router.cli, "
         "cdc_router.cli.dedup; print(sorted({m.split('.')[0] for m in sys.modules} & "
         "{'confluent_kafka', 'nats', 'cdc_router'}))"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "['cdc_router']"


def test_the_package_still_offers_every_name_it_did() -> None:
    import cdc_router.consumer as package
    from cdc_router.consumer import ConsumerFailed, IdempotentConsumer, JetStreamConsumer
    from cdc_router.consumer.jetstream import JetStreamConsumer as jetstream_consumer
    from cdc_router.consumer.loop import IdempotentConsumer as loop_consumer
    from cdc_router.errors import FatalKafkaError

    assert ConsumerFailed is FatalKafkaError and IdempotentConsumer is loop_consumer
    assert JetStreamConsumer is jetstream_consumer
    assert all(getattr(package, name) is not None for name in package.__all__)
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        _ = package.Nope  # type: ignore[attr-defined]
