"""Redrive: run the idempotent consumer's own dead letters again, once its handler is fixed.

    counts = redrive(settings, store, handler)   # the service's settings, store and handler

A one-shot run (QA 67-b F-4: `cdc-router dlq replay` re-delivers the router's letters only, and
the consumer's had no way back). It reads `settings.dead_letter_topic` from where the last
redrive of this group stopped up to its end when the run started, and of those letters only
the ones of this group (`dlq.consumer.group` = `settings.group_id`): each goes to `handler`
through `store` under the letter's event id (`dlq.event.id`) and `settings.group_id`, so an id
done since (a later copy) is a duplicate and skipped. A letter that fails `max_attempts` times
again is lettered again (its old dlq.* headers kept: its attempt history) and the run goes on.

Not a second IdempotentConsumer on the dead-letter topic: that one would handle every group's
letters, never end, and join the service's Kafka group with another subscription. The
position is the Kafka group `<group_id>.redrive`'s, committed after each letter: a run that
stops (a store outage stops it) resumes where it stopped. Run one at a time per group.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from cdc_router.consumer.client import consumer_error
from cdc_router.consumer.dead_letter import STAGE_DECODE, STAGE_HANDLE, DeadLetterWriter
from cdc_router.consumer.dedup.store import DedupKey, DedupStore, Outcome
from cdc_router.consumer.event import Decoder, KafkaMessage, read_event
from cdc_router.consumer.handler import Handler, check_wiring, guarded
from cdc_router.consumer.settings import ConsumerSettings, built
from cdc_router.dead_letter import (
    CONSUMER_GROUP,
    EVENT_ID,
    HEADERS_DROPPED,
    KEY_DROPPED,
    SOURCE_GROUP,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    VALUE_DROPPED,
)
from cdc_router.errors import DedupStoreError, FatalKafkaError, MalformedRecord
from cdc_router.kafka.consumer import record_headers
from cdc_router.kafka.errors import kafka_error_of

log = logging.getLogger(__name__)

Context = TypeVar("Context")
REDRIVE_GROUP_SUFFIX = ".redrive"
# A letter without one of its record's parts (left out for size): the handler would run on
# another record than the one that failed (no value, no key, or none of its own headers).
_DROPPED_PARTS = {VALUE_DROPPED: "value", KEY_DROPPED: "key", HEADERS_DROPPED: "own headers"}


def letter_group(headers: list[tuple[str, bytes]]) -> str | None:
    """The consumer group that wrote the letter (its last dlq.consumer.group), or None."""
    found = [value for name, value in headers if name == CONSUMER_GROUP]
    return found[-1].decode("utf-8", "replace") if found else None


def original_place(headers: list[tuple[str, bytes]]) -> tuple[str, int, int] | None:
    """Where the letter's record was first consumed: the first dlq.source.* headers (a letter
    lettered again carries its earlier ones first), or None when they are unreadable."""
    first = {name: value for name, value in reversed(headers)
             if name in (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET)}
    try:
        return (first[SOURCE_TOPIC].decode(), int(first[SOURCE_PARTITION]),
                int(first[SOURCE_OFFSET]))
    except (KeyError, ValueError):
        return None


def unfinished(ends: dict[int, int], positions: dict[int, int]) -> dict[int, int]:
    """The partitions whose position has not reached the end they had when the run started."""
    return {partition: end for partition, end in ends.items()
            if positions.get(partition, -1) < end}


def start_at(committed: int, low: int, high: int) -> int:
    """Where a partition's run starts: the group's committed offset, or the partition's start
    when there is none, or it is out of the partition's range (deleted by retention; past
    its end: the topic created again, whose letters a stale position would pass for ever)."""
    return committed if low <= committed <= high else low


def redrive(settings: ConsumerSettings, store: DedupStore[Context], handler: Handler[Context],
            *, decoder: Decoder | None = None, unlabelled: bool = False,
            stop: threading.Event | None = None,
            consumer_factory: Callable[[dict[str, Any]], Any] = Consumer,
            producer_factory: Callable[[dict[str, Any]], Any] = Producer,
            rng: random.Random | None = None,
            sleep: Callable[[float], None] = time.sleep) -> Counter[str]:
    """Run this group's letters on `settings.dead_letter_topic` again, up to the topic's end at
    the start; returns the counts: redriven, duplicates, dead_lettered, other_groups,
    unlabelled, incomplete. `unlabelled`: run the letters that name no group (no
    dlq.consumer.group nor the router's dlq.source.group: written before the header existed) as
    this group's; for a dead-letter topic that this service alone writes to. `stop` set (by
    the service's signal handler, say) ends the run after the letter in hand, its position
    committed: the next run resumes at the first letter not done."""
    check_wiring("redrive", settings, ConsumerSettings, store, handler, decoder)
    topic, timeout = settings.dead_letter_topic, settings.dead_letter_timeout_s
    config = {**settings.librdkafka_consumer(),
              "group.id": settings.group_id + REDRIVE_GROUP_SUFFIX}
    consumer = built(consumer_factory, config, "consumer_config")
    letters = DeadLetterWriter(topic, settings.librdkafka_producer(), producer_factory,
                               timeout, settings.group_id)
    counts: Counter[str] = Counter()
    rng, stop = rng or random.Random(), stop or threading.Event()
    try:
        letters.open()
        letters.require_topic(consumer, lambda: None)  # one line, not an empty run
        try:
            partitions = sorted(consumer.list_topics(topic, timeout=timeout)
                                .topics[topic].partitions)
            marks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                       timeout=timeout) for p in partitions}
            done = consumer.committed([TopicPartition(topic, p) for p in partitions],
                                      timeout=timeout)
        except KafkaException as error:
            raise _failed(error, f"read the partitions and offsets of {topic!r}", settings,
                          config["group.id"], "nothing was run, run it again") from error
        starts = {tp.partition: start_at(tp.offset, *marks[tp.partition]) for tp in done}
        for tp in done:
            if tp.offset > marks[tp.partition][1]:  # as auto.offset.reset=earliest would
                log.warning("event=redrive_position_reset group=%s topic=%s partition=%d "
                            "committed=%d end=%d: the position is past the partition's end "
                            "(the topic deleted and created again?); reading from its start",
                            config["group.id"], topic, tp.partition, tp.offset,
                            marks[tp.partition][1])
        ends = {p: high for p, (_low, high) in marks.items() if starts[p] < high}
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in ends])
        log.info("event=redrive_started group=%s topic=%s letters_up_to=%s", settings.group_id,
                 topic, ",".join(f"{p}:{end}" for p, end in ends.items()))
        pending, run = dict(ends), guarded(handler)
        while pending and not stop.is_set():
            for message in consumer.consume(settings.batch_size, settings.poll_timeout_s):
                if message.error() is not None:
                    consumer_error(message.error(), settings.group_id)  # raises if fatal
                elif message.offset() < ends[message.partition()]:
                    if not _redrive_one(message, settings, store, run, decoder, letters, rng,
                                        sleep, counts, unlabelled=unlabelled, stop=stop):
                        break  # stopped before it was done: the next run starts there
                    try:
                        consumer.commit(offsets=[TopicPartition(topic, message.partition(),
                                                                message.offset() + 1)],
                                        asynchronous=False)
                    except KafkaException as error:
                        raise _failed(error, f"commit its position on {topic!r}", settings,
                                      config["group.id"], "the next run resumes at the letter "
                                      f"at offset {message.offset()} (done now: a duplicate "
                                      "then)") from error
                if stop.is_set():
                    break
            positions = {tp.partition: tp.offset for tp in consumer.position(
                [TopicPartition(topic, p) for p in pending])}
            pending = unfinished(pending, positions)
    finally:
        consumer.close()
        letters.close()
    log.info("event=redrive_%s group=%s %s", "stopped" if stop.is_set() else "done",
             settings.group_id,
             " ".join(f"{name}={counts[name]}" for name in ("redriven", "duplicates",
                      "dead_lettered", "other_groups", "unlabelled", "incomplete")))
    if counts["unlabelled"]:
        log.warning("event=redrive_unlabelled group=%s letters=%d: letters that name no group "
                    "(no dlq.consumer.group: written before it existed) were passed, not run; "
                    "if no other service writes to %s, rewind this redrive's group "
                    "(kafka-consumer-groups.sh --bootstrap-server %s --group %s --topic %s "
                    "--reset-offsets --to-earliest --execute) and call redrive(..., "
                    "unlabelled=True)", settings.group_id, counts["unlabelled"], topic,
                    settings.bootstrap_servers, config["group.id"], topic)
    return counts


def _failed(error: KafkaException, what: str, settings: ConsumerSettings, group: str,
            then: str) -> FatalKafkaError:
    """The one line for a Kafka call of the run that failed: an authorization failure names
    the ACL to grant (the group <group_id>.redrive is a new name for the cluster's ACLs)."""
    kafka_error = kafka_error_of(error)
    code = kafka_error.code() if kafka_error is not None else None
    if code in (KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED):
        fix = (f"grant this client's principal Read on the group {group!r} and the topic "
               f"{settings.dead_letter_topic!r} (kafka-acls.sh --add --allow-principal ... "
               f"--operation Read --group {group} --topic {settings.dead_letter_topic})")
    else:
        fix = (f"check bootstrap_servers ({settings.bootstrap_servers}) and that Kafka runs "
               "there")
    return FatalKafkaError(f"redrive cannot {what}: {error}; {fix}; {then}", code=code)


def _redrive_one(message: KafkaMessage, settings: ConsumerSettings, store: DedupStore[Any],
                 handler: Handler[Any], decoder: Decoder | None, letters: DeadLetterWriter,
                 rng: random.Random, sleep: Callable[[float], None],
                 counts: Counter[str], *, unlabelled: bool = False,
                 stop: threading.Event | None = None) -> bool:
    """Run one letter; False when `stop` came before it was done (nothing to commit)."""
    headers = record_headers(message)
    group = letter_group(headers)
    if group is None and all(name != SOURCE_GROUP for name, _value in headers):
        if not unlabelled:  # ours or not, no header tells (review 67-b)
            counts["unlabelled"] += 1
            return True
    elif group != settings.group_id:
        counts["other_groups"] += 1  # another service's, or the router's: not ours to run
        return True
    dropped = sorted({_DROPPED_PARTS[name] for name, _value in headers
                      if name in _DROPPED_PARTS})
    if dropped:
        # Left out for size: the handler would run on part of the record. It is at dlq.source.*.
        counts["incomplete"] += 1
        log.warning("event=redrive_incomplete topic=%s partition=%d offset=%d dropped=%s: this "
                    "letter lacks its record's %s (left out for size: dlq.*.dropped headers), "
                    "so it is not run; its record is on the topic its dlq.source.* headers name",
                    message.topic(), message.partition(), message.offset(), ",".join(dropped),
                    " and ".join(dropped))
        return True
    failures = waits = 0
    while True:
        try:
            event = read_event(message, source="header", header=EVENT_ID, decoder=decoder,
                               attempt=failures + 1)
        except MalformedRecord as error:  # still: no id, or a value the decoder refuses
            letters.send(message, stage=STAGE_DECODE, error=error, attempts=0)
            counts["dead_lettered"] += 1
            return True
        place = original_place(headers)
        if place is not None:  # the handler sees where the record was, as it did then
            event = dataclasses.replace(event, topic=place[0], partition=place[1],
                                        offset=place[2])
        try:
            outcome = store.run_once(DedupKey(settings.group_id, event.event_id),
                                     functools.partial(handler, event))
        except DedupStoreError:
            raise  # an outage stops the run; the next run resumes at this letter
        except Exception as error:
            failures += 1
            if settings.retry.exhausted(failures):
                letters.send(message, stage=STAGE_HANDLE, error=error, attempts=failures,
                             event_id=event.event_id)
                counts["dead_lettered"] += 1
                return True
            if stop is not None and stop.is_set():
                return False  # not lettered: the next run tries it again
            sleep(settings.retry.backoff(failures, rng))
            continue
        if outcome is Outcome.BUSY:  # another worker holds the id: wait for its end
            if stop is not None and stop.is_set():
                return False
            waits += 1
            sleep(settings.retry.backoff(waits, rng))
            continue
        counts["redriven" if outcome is Outcome.DONE else "duplicates"] += 1
        return True
