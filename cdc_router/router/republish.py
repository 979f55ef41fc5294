"""`cdc-router outbox republish`: outbox rows back onto the raw topic, for the router to route.

Why through the raw topic and not straight to the destinations: the running router is then the
only one that delivers, and its replay filter (restored from the dedup changelog) is the one
place that decides what was delivered; a republish racing the router on the same ids cannot
deliver one twice. The change events (cdc_router/outbox/republish.py) are produced in the
router's Transaction, under the transactional id `<prefix>-outbox-republish` (the prefix is
delivery.transactional_id, by default source.group_id), by delivery.commit_max_records /
commit_interval_ms, so the router (read_committed) sees whole batches. Each lands on the raw
partition Kafka Connect's producer gives Debezium's record of the same row (murmur2 of the
key), so one router instance sees both.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Producer

from cdc_router.config.model import RouterConfig
from cdc_router.errors import BatchFailed, ConfigError, DeliveryError, RecordRefused, RouteError
from cdc_router.kafka.producer import LatchingProducer
from cdc_router.outbox.republish import ChangeEvent
from cdc_router.outbox.setup import MAX_RECORD_BYTES
from cdc_router.router import clients
from cdc_router.router.grants import OperationsFactory, admin_operations
from cdc_router.router.partitioner import java_default_partition
from cdc_router.router.routing import OutboundRecord
from cdc_router.router.transaction import Transaction

INSTANCE = "outbox-republish"


def raw_topic(config: RouterConfig, topic: str | None) -> str:
    """The raw change topic to republish onto: `topic`, or the config's one source topic.

    `topic` must be one the router reads: a change event anywhere else (a destination, the
    dead-letter topic, the changelog) would reach its readers as it is, with no router to drop
    what was delivered already.
    """
    topics = config.source.topics
    if not topics:  # QA 47-d F6: "several raw topics (got [])", then a circle of errors
        raise ConfigError("names no raw topic (source.topics): a relay-only config, whose "
                          "relay reads the table itself; `outbox republish` feeds the raw "
                          "topic of a Debezium pipeline", field="source.topics", value=topics,
                          hint="for the relay, read the table again: README, 'Runbook: the "
                          "relay's database failed over to a replica'")
    if topic:
        # A "^" entry is a pattern, which librdkafka matches with a regex search.
        if not any(topic == read or (read.startswith("^") and re.search(read, topic))
                   for read in topics):
            raise ConfigError("is not a topic the router reads: republish onto the raw "
                              "change topic, where the router drops what it delivered already",
                              field="--topic", value=topic, hint=f"source.topics: {topics}")
        return topic
    if len(topics) == 1 and not topics[0].startswith("^"):
        return topics[0]
    raise ConfigError("the config reads several raw topics (or a pattern): name the outbox's",
                      field="--topic", value=topics)


def check_republish(config: RouterConfig) -> None:
    """ConfigError unless the router drops what it already delivered."""
    if not config.dedup.enabled:
        raise ConfigError("republish needs dedup enabled: without the replay filter the "
                          "router would deliver every republished row again",
                          field="dedup.enabled", value=False)


def republish(config: RouterConfig, topic: str, events: Iterable[ChangeEvent], *,
              producer_factory: Callable[[dict[str, Any]], Any] = Producer,
              operations_factory: OperationsFactory = admin_operations) -> int:
    """Produce `events` onto `topic` in transactions; how many were committed.

    Raises DeliveryError when the topic is missing or a batch fails (the batches before it
    stay committed: running it again is safe).
    """
    check_republish(config)
    # A raw change event may be as big as Debezium's (connectors/outbox-connector.json).
    producer = LatchingProducer(clients.watched({**clients.producer_config(config, INSTANCE),
                                                 "message.max.bytes": MAX_RECORD_BYTES}),
                                producer_factory)
    try:  # with the principal's Write grant, as `run` checks its destinations (router/grants.py)
        partitions = clients.destinations(config, producer, operations_factory).partitions(topic)
    except RouteError as refusal:  # review 51-d F10: met in the transaction, as INVALID_TXN_STATE
        raise DeliveryError(f"nothing was republished: {refusal}") from None
    if partitions is None:
        raise DeliveryError(f"the raw topic {topic} does not exist; check source.topics or "
                            "--topic")
    txn = Transaction(producer, None, delivery=config.delivery, changelog_topic=None,
                      mark_group=None, bootstrap=config.kafka.bootstrap_servers,
                      fenced_hint="another `outbox republish` of this pipeline took over")
    committed = 0
    batch: list[ChangeEvent] = []  # the open batch's events; a record's offset is its place
    try:
        txn.init()
        for event in events:
            txn.begin()
            batch.append(event)
            try:
                txn.produce(OutboundRecord(
                    topic=topic, key=event.key, value=event.value,
                    partition=java_default_partition(event.key, partitions), headers=(),
                    timestamp_ms=None, event_id=event.event_id, route_index=-1, format="json"),
                    (topic, -1, len(batch) - 1))
            except RecordRefused as refusal:
                raise BatchFailed(f"Kafka refused the change event of {event.event_id} "
                                  f"({len(event.value)} bytes): {refusal}") from refusal
            if txn.due():
                txn.commit()
                committed += len(batch)
                batch.clear()
        if txn.open:
            txn.commit()
            committed += len(batch)
    except BatchFailed as failure:
        refused = _refused_event(txn, batch)
        txn.discard()
        raise DeliveryError(f"republish stopped after {committed} committed events: {failure}"
                            f"{refused}; run it again (the router drops what it already "
                            "delivered)") from failure
    return committed


def _refused_event(txn: Transaction, batch: list[ChangeEvent]) -> str:
    """The biggest event of the open batch the broker refused (a refusal fails every record
    of its request), for the error line (QA 33-c: the line named none, and running it again
    hit the same row)."""
    try:
        failures = txn.abort()
    except BatchFailed:
        return ""
    refused = [batch[failure.source[2]] for failure in failures
               if failure.source is not None and 0 <= failure.source[2] < len(batch)]
    if not refused:
        return ""
    event = max(refused, key=lambda refused_event: len(refused_event.value))
    return (f" (the biggest refused change event: {event.event_id}, {len(event.value)} bytes; "
            "raise the raw topic's max.message.bytes, or republish the other rows with --ids)")
