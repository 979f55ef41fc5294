"""`dlq replay` of a letter whose value was left out (dlq.value.dropped.bytes), from its raw record.

A letter carries the raw change event it failed on; one over the producer's limit (an event
dead-lettered for delivery.max_payload_bytes, whose raw record is bigger still) is written
without it. Its dlq.source.* headers name the raw record, which the raw topic keeps until its
retention deletes it: the replay reads it there, at that offset (read_committed), and plans the
letter with it as with any other (QA 57-b F-1: such a letter was not_replayable, the replay
filter dropped a republish of its id, and no command delivered it). A raw record no longer
there (deleted by retention, or unreadable) leaves the letter not_replayable, and its note says
what delivers the event then (dlq_letters._dropped_note). The relay's letters are left alone:
their record is the row (relay.table), read again by inserting it anew.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from cdc_router.router import clients

if TYPE_CHECKING:
    from cdc_router.config.model import RouterConfig
    from cdc_router.router.dlq_letters import Letter, OursTest

log = logging.getLogger("cdc_router.router")

# Reading one raw record: seconds on a cluster that answers, with room for a fetch's first
# metadata and leader lookups (librdkafka's, each up to a few seconds on a loaded cluster).
FETCH_TIMEOUT_S = 15.0


class RawReader(Protocol):
    def __call__(self, topic: str, partition: int, offset: int) -> bytes | None: ...

    def close(self) -> None: ...


def refilled(letters: Iterable[Letter], reader: Callable[[], RawReader], ours: OursTest,
             relay_table: str | None) -> list[Letter]:
    """`letters`, each of ours from a raw topic whose value was left out given its raw record's
    value (`reader()` is made once, when one is needed, and closed); left as is when the raw
    topic no longer has it."""
    result: list[Letter] = []
    made: RawReader | None = None
    try:
        for letter in letters:
            if letter.value_dropped and letter.from_router and \
                    letter.source_topic != relay_table and \
                    ours(letter.source_topic, letter.source_group):
                made = made or reader()
                value = made(letter.source_topic, letter.source_partition, letter.source_offset)
                if value is not None:
                    log.info("event=dlq_value_reread id=%s topic=%s partition=%d offset=%d "
                             "bytes=%d", letter.event_id, letter.source_topic,
                             letter.source_partition, letter.source_offset, len(value))
                    letter = replace(letter, value=value, value_dropped=False)
            result.append(letter)
    finally:
        if made is not None:
            made.close()
    return result


def gone_note(letter: Letter) -> str:
    """plan_replay's note on a letter of a raw topic whose value was left out and whose raw
    record could not be read again: the one path that delivers its event then."""
    return (f"its value was left out (dlq.value.dropped.bytes) and its raw record "
            f"{letter.source_topic}[{letter.source_partition}]@{letter.source_offset} is no "
            "longer on the raw topic (deleted by its retention, or unreadable: see the "
            "event=dlq_value_unread line): its row stays in the outbox (the cleanup deletes "
            "delivered rows only); insert it again under a new id, and delete the old row "
            "(its own id is dropped as a replay)")


class RawRecords:
    """Reads single records of the raw topics by offset, read_committed, never joining a group
    (the partition is assigned) and committing nothing."""

    def __init__(self, config: RouterConfig) -> None:
        self._consumer = Consumer({**clients.common_config(config),
                                   "group.id": f"{config.source.group_id}.dlq-replay-raw",
                                   "enable.auto.commit": False,
                                   "isolation.level": "read_committed",
                                   "auto.offset.reset": "earliest",
                                   "allow.auto.create.topics": False})

    def __call__(self, topic: str, partition: int, offset: int) -> bytes | None:
        """The value of the record at `offset`; None when it is gone (a later offset comes
        first: retention deleted it), unreadable, or not read within FETCH_TIMEOUT_S."""
        try:
            self._consumer.assign([TopicPartition(topic, partition, offset)])
            deadline = time.monotonic() + FETCH_TIMEOUT_S
            while time.monotonic() < deadline:
                message = self._consumer.poll(0.5)
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    # Reread 57-a F-7: an error was skipped until the timeout, and then blamed
                    # on the retention although the record was there (a Read not granted).
                    if error.code() == KafkaError._PARTITION_EOF or error.retriable():
                        continue
                    log.warning("event=dlq_value_unread topic=%s partition=%d offset=%d "
                                "error=%r: the record was not read, not found gone: %s, then "
                                "run the replay again", topic, partition, offset, str(error),
                                _unread_hint(error, topic))
                    return None
                found = message.offset()
                if found == offset:
                    value = message.value()
                    return value if isinstance(value, bytes) else None
                if found is not None and found > offset:
                    break
        except KafkaException as error:
            log.warning("event=dlq_value_unread topic=%s partition=%d offset=%d error=%r",
                        topic, partition, offset, str(error))
            return None
        finally:
            self._consumer.unassign()
        log.warning("event=dlq_value_unread topic=%s partition=%d offset=%d: not on the raw "
                    "topic (deleted by its retention?)", topic, partition, offset)
        return None

    def close(self) -> None:
        self._consumer.close()


def _unread_hint(error: KafkaError, topic: str) -> str:
    """What to do about a consumed `error` that stops a raw record's read."""
    if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return f"grant the replay's principal Read (and Describe) on topic {topic}"
    if error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
                        KafkaError._UNKNOWN_PARTITION):
        return f"{topic} or its partition does not exist on this cluster: check the letter's " \
            "dlq.source.topic and the config's kafka.bootstrap_servers"
    return "fix what the error names"
