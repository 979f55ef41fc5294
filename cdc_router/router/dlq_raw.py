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

from confluent_kafka import Consumer, KafkaException, TopicPartition

from cdc_router.router import clients

if TYPE_CHECKING:
    from cdc_router.config.model import RouterConfig
    from cdc_router.router.dlq_letters import Letter, OursTest

log = logging.getLogger("cdc_router.router")

# Reading one raw record: seconds on a cluster that answers.
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
                if message is None or message.error() is not None:
                    continue
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
