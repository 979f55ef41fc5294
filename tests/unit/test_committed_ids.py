"""The cleanup's sweep (CommittedIds) over fake consumers: what a refused topic does."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from cdc_router.router import committed_ids
from cdc_router.router.committed_ids import CommittedIds
from cdc_router.router.replay import changelog_records

CHANGELOG, DLQ = "g.dedup", "g.dlq"


class _Message:
    def __init__(self, key: bytes | None = None, value: bytes | None = None,
                 error: KafkaError | None = None) -> None:
        self._key, self._value, self._error = key, value, error

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> KafkaError | None:
        return self._error

    def headers(self) -> None:
        return None


class _Broker:
    """The topics' records, and whether the principal may read the dead-letter topic."""

    def __init__(self) -> None:
        record = changelog_records(["e-1"], 1_000, group="g")[0]
        self.records = {CHANGELOG: [_Message(record.key, record.value)], DLQ: []}
        self.dead_letters_readable = False
        self.consumers: list[_Consumer] = []


class _Consumer:
    """As librdkafka's: a fetch refused by the authorizer is one error message, once per
    consumer; afterwards consume() returns nothing (measured by review 51-d on Kafka 4.3)."""

    def __init__(self, broker: _Broker) -> None:
        self.broker = broker
        self.topic = ""
        self.read = False
        self.refusal_said = False
        broker.consumers.append(self)

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.topic = partitions[0].topic

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(self.topic, 0)]

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        if self.topic == DLQ and not self.broker.dead_letters_readable:
            if self.refusal_said:
                return []
            self.refusal_said = True
            return [_Message(error=KafkaError(
                KafkaError.TOPIC_AUTHORIZATION_FAILED,
                "Fetch from broker 1 failed: Broker: Topic authorization failed"))]
        if self.read:
            return []
        self.read = True
        return list(self.broker.records[self.topic])

    def close(self) -> None:
        pass


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> _Broker:
    found = _Broker()
    monkeypatch.setattr(committed_ids, "Consumer", lambda config: _Consumer(found))
    monkeypatch.setattr(committed_ids, "assign_from_beginning", lambda consumer, topic, what:
                        consumer.assign([TopicPartition(topic, 0)]))
    monkeypatch.setattr(committed_ids, "log_end_offsets", lambda admin, topic, partitions:
                        {partition: 0 for partition in partitions})
    monkeypatch.setattr(committed_ids, "reached", lambda consumer, *args: consumer.read)

    def reassigned(stale: _Consumer, config: Any, topic: str, partitions: list[int],
                   assigned_at: Any, why: str) -> tuple[_Consumer, dict[int, int]]:
        renewed = _Consumer(found)
        renewed.assign([TopicPartition(topic, 0)])
        return renewed, {}

    monkeypatch.setattr(committed_ids, "reassigned", reassigned)
    return found


def _sweep() -> CommittedIds:
    return CommittedIds({"bootstrap.servers": "127.0.0.1:1"}, changelog_topic=CHANGELOG,
                        group="g", dead_letter_topic=DLQ, window_ms=60_000,
                        ours=lambda topic, group: True)


def test_a_dead_letter_topic_refused_to_the_sweep_is_said_at_every_step(
        broker: _Broker) -> None:
    # Review 51-d F8: the sweep failed twice (the consumer, then its renewal, said the
    # refusal once each), then returned nothing for ever, without a line: the rows delivered
    # before a restart stayed in the table.
    sweep = _sweep()
    for _ in range(6):  # each step raises: the cleanup logs each (cleanup_sweep_failed)
        with pytest.raises(KafkaException) as raised:
            sweep.next(10)
    assert f"may not read topic {DLQ}; grant it Read on the topic" in str(raised.value)
    broker.dead_letters_readable = True  # granted: the next renewal reads on
    sweep._renewed = float("-inf")
    with pytest.raises(KafkaException):
        sweep.next(10)  # the refusal still kept renews the consumers
    assert sweep.next(10) == [("e-1", 1_000)]
