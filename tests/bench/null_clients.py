"""The router's loop over clients that do nothing: what the loop costs besides librdkafka.

`run_loop(records)` hands the records, as real confluent_kafka.Message objects, to an
OutboxRouter (exactly once, dedup on) whose consumer, producer and changelog reader are
in-memory and as cheap as can be: the consumer returns the records in polls of the loop's
batch size and stops the router when they run out; the producer accepts every record and
reports nothing (no failure). Under `valgrind --tool=callgrind` (router_throughput.py's
`--loop-once`), the difference of two runs is the loop's own instructions per event: the step
plus the router's bookkeeping, without the broker and librdkafka, which no change of ours moves.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from confluent_kafka import Message, TopicPartition

from cdc_router.config.load import load_config
from cdc_router.router.loop import OutboxRouter
from cdc_router.router.metrics import RouterMetrics

RAW = "raw"


class NullConsumer:
    """Polls of the given messages; the router stops when they run out."""

    def __init__(self, messages: list[Message]) -> None:
        self._messages = messages
        self._next = 0
        self.router: OutboxRouter | None = None

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        callbacks["on_assign"](self, [TopicPartition(RAW, 0)])

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        batch = self._messages[self._next:self._next + num_messages]
        self._next += len(batch)
        if not batch and self.router is not None:
            self.router.stop()
        return batch

    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> list[Any]:
        return partitions

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(RAW, 0)]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(RAW, 0, self._next)]

    def get_watermark_offsets(self, partition: TopicPartition,
                              cached: bool = False) -> tuple[int, int]:
        return 0, len(self._messages)

    def consumer_group_metadata(self) -> str:
        return "group-metadata"

    def close(self) -> None:
        pass


class _EveryTopic(dict[str, Any]):
    """A cluster listing that holds any name asked for, with one partition."""

    def __contains__(self, topic: object) -> bool:
        return True

    def get(self, topic: str, default: Any = None) -> Any:
        return SimpleNamespace(error=None, partitions={0: 0})


class NullProducer:
    """Takes every record and transaction call; delivers without reports."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.records = 0

    def produce(self, topic: str, **record: Any) -> None:
        self.records += 1

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        """Every topic exists, with one partition."""
        return SimpleNamespace(topics=_EveryTopic())

    def init_transactions(self, timeout: float) -> None:
        pass

    def begin_transaction(self) -> None:
        pass

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        pass

    def commit_transaction(self, timeout: float) -> None:
        pass

    def abort_transaction(self, timeout: float) -> None:
        pass


class NullChangelog:
    def __init__(self, config: dict[str, Any], topic: str) -> None:
        pass

    def catch_up(self, *, since_ms: int | None = None) -> list[tuple[bytes, bytes]]:
        return []

    broker_stamped = False

    def older(self, since_ms: int) -> list[tuple[bytes, bytes]]:
        return []

    def older_left(self) -> bool:
        return False

    def older_done(self) -> None:
        pass

    def close(self) -> None:
        pass


def run_loop(records: list[tuple[bytes, bytes]]) -> int:
    """Route `records` (key, value) through the loop once; the records produced."""
    messages = [Message(topic=RAW, partition=0, offset=offset, key=key, value=value)
                for offset, (key, value) in enumerate(records)]
    consumer = NullConsumer(messages)
    producer: list[NullProducer] = []

    def make_producer(config: dict[str, Any]) -> NullProducer:
        producer.append(NullProducer(config))
        return producer[0]

    with tempfile.TemporaryDirectory() as workdir:
        config_path = Path(workdir) / "loop.yaml"
        config_path.write_text(yaml.safe_dump({
            "kafka": {"bootstrap_servers": "127.0.0.1:1"}, "source": {"topics": [RAW]},
            "routes": [{"topic": "orders"}], "dead_letter": {"topic": "dlq"},
            # Batches by commit_max_records only, never by the clock: the same commits (and
            # instructions) however slow the run, under callgrind too.
            "delivery": {"commit_interval_ms": 60_000, "transaction_timeout_ms": 600_000}}))
        router = OutboxRouter(load_config(config_path), instance_id="loop",
                              metrics=RouterMetrics(), producer_factory=make_producer,
                              consumer_factory=lambda config: consumer,
                              changelog_factory=NullChangelog,
                              clock=lambda: 0.0,  # no lag gauge or metadata refresh by time
                              describe_factory=lambda admin: lambda topic, timeout_s: {
                                  "message.timestamp.after.max.ms": "3600000"},
                              operations_factory=lambda admin: None)
    consumer.router = router
    router.run()
    return producer[0].records
