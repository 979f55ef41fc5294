"""Reading a topic to its end: every partition from its beginning (or from its first record of
a given time: kafka/read_positions.py), up to ends taken first.

Deterministic, unlike "stop once nothing came for N seconds": the end offsets are fetched
before reading, and the read stops when every partition's position has reached its end.
Read with read_committed and without a group: no offsets are ever committed.

Two ends, for two questions:
- "stable" (the last stable offset): what is committed now; an open transaction is not waited
  for (`dlq list`);
- "log_end" (the high watermark, open transactions included): nothing written before the call
  may be missed, so an open transaction is waited for until it commits or aborts (the router's
  dedup changelog restore).

A reader read again and again (the router's changelog reader, at each assignment) outlives
broker restarts: its consumer, if librdkafka left it without metadata, is replaced by one that
goes on from the same positions (TopicReader._stable_ends). Between its reads its partitions
are paused: librdkafka fetches nothing meanwhile (QA 65-b F-4).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from cdc_router.errors import DeliveryError, fatal_kafka_error
from cdc_router.kafka.errors import REFUSED_CREDENTIALS, describe
from cdc_router.kafka.lookups import (
    LOOKUP_TIMEOUT_S,
    AdminConnection,
    log_end_offsets,
    stable_offsets,
)
from cdc_router.kafka.read_positions import (
    LOW_LOOKUP_S,
    assign_added,
    assign_from_beginning,
    assign_since,
    positions,
    reached,
    shown,
)

End = Literal["stable", "log_end"]

log = logging.getLogger("cdc_router.kafka")

# Messages a consume() call returns, and librdkafka's prefetch queue (queued.max.messages.kbytes),
# of a lean reader: a dedup changelog holds records of up to 64 KB (router/replay.py), and with
# the defaults (10,000 messages, a 64 MB queue) a restore kept up to ~70 MB of fetched records
# alive at once, which the C heap kept after the restore (measured: 70 MB of a router's RSS
# restoring 1M ids, against 3 MB with these; tests/bench/replay_memory.py).
_DEFAULT_BATCH = 10_000
_LEAN_BATCH = 100
_LEAN_QUEUE_KBYTES = 4096
# A full queue postpones the next fetch by fetch.queue.backoff.ms (librdkafka's default 1 s):
# a small queue fills at once, so the wait must be short too (at 1 s a 1M-id restore took 8.6 s
# instead of 1.9).
_LEAN_QUEUE_BACKOFF_MS = 10


class ReadTimedOut(DeliveryError):
    """A topic was not read to its end in time: the cluster is slow or a transaction is stuck,
    not a setting to change."""


def reassigned(stale: Consumer, config: dict[str, Any], topic: str, partitions: list[int],
               assigned_at: Mapping[int, int], why: str) -> tuple[Consumer, dict[int, int]]:
    """A new consumer of `config` assigned where `stale` stood on `partitions` (see
    positions()), and where it assigned a partition at an offset (its `assigned_at`). The
    positions are the consumer's own, not the broker's: a read goes on as it would have. For a
    consumer librdkafka left without metadata after a broker's outage (QA 38-a O2, QA 39-b: for
    minutes, while new clients answered at once)."""
    where = positions(stale, topic, partitions, assigned_at)
    log.warning("event=reader_renewed topic=%s positions=%s error=%s; a new consumer asks "
                "again, from the same positions", topic, shown(where), why)
    # The new one first: when it cannot be made, the caller keeps the stale one (review 39-2).
    consumer = Consumer(config)
    try:
        # Nothing read yet (a negative position): from the beginning, as first assigned.
        consumer.assign([TopicPartition(topic, partition,
                                        offset if offset >= 0 else OFFSET_BEGINNING)
                         for partition, offset in where.items()])
    except BaseException:
        consumer.close()
        raise
    # Not waited for: a client left without metadata may be slow to let go. It joined no
    # group, so its close can neither hold its successor out nor act on its partitions.
    threading.Thread(target=stale.close, name="cdc-router-reader-close", daemon=True).start()
    return consumer, {partition: offset for partition, offset in where.items() if offset >= 0}


# A renewable reader's consumer whose lookups fail this long is replaced: after a broker's
# outage a consumer left without metadata failed for 30 s or for minutes, while a new one
# answered within 1-5 s (QA 39-b: every restore that needed a renewal took 30.7-32.3 s).
_RENEW_AFTER_S = 10.0
# A read that returns nothing below its ends this long is said to stall, and a renewable
# reader's consumer is replaced: it races an open transaction, which holds a read_committed
# read up to transaction.timeout.ms (delivery.transaction_timeout_ms, 20 s by default), so a
# renewal may find the read still held; QA 39-a saw a restore read nothing for 26 s after a
# broker's kill.
_STALLED_S = 30.0

# The prefetch settings of a lean reader (see _LEAN_QUEUE_KBYTES).
LEAN_QUEUE = {"queued.max.messages.kbytes": _LEAN_QUEUE_KBYTES,
              "fetch.queue.backoff.ms": _LEAN_QUEUE_BACKOFF_MS}


class TopicReader:
    """Reads one topic to its end, and again later from where it stopped; built lazily."""

    def __init__(self, config: Mapping[str, Any], topic: str, *, group_id: str,
                 what: str, lean: bool = False, renewable: bool = False,
                 paused_between: bool = False) -> None:
        """`lean`: little buffered at a time, for a topic of large records read once.
        `renewable`: a consumer whose lookups fail is replaced (_stable_ends); not for a reader
        whose consumer was handed out (its `consumer`, which `dlq replay` commits under).
        `paused_between`: its partitions paused from the end of a read to the next, for a
        reader kept between reads (else librdkafka fetches all that is written meanwhile
        into its queue: QA 65-b F-4, a router's RSS +0.74 MB a minute)."""
        self._batch = _LEAN_BATCH if lean else _DEFAULT_BATCH
        # How long a consume() waits for a full batch: it waits so whenever fewer are left.
        self._consume_wait_s = 0.2
        self._renewable = renewable
        self._paused_between = paused_between
        self._since_ms: int | None = None  # where a new consumer starts (read_to_end)
        # Where this read started the partitions it assigned at a time (a first read with
        # since_ms); None for a read that went on from before (ChangelogReader.older).
        self.started_at: dict[int, int] | None = None
        self._config = {
            **config,
            **(LEAN_QUEUE if lean else {}),
            # Needed by librdkafka, never joined: partitions are assigned, offsets not committed.
            "group.id": group_id,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "allow.auto.create.topics": False,
        }
        self._client_config = {key: value for key, value in config.items()
                               if key != "allow.auto.create.topics"}  # not an admin property
        self._topic = topic
        self._what = what
        self._consumer: Consumer | None = None
        self._partitions: list[int] = []
        self._assigned_at: dict[int, int] = {}  # the consumer's partitions assigned at an offset
        self._admin = AdminConnection(self._client_config)
        self._held = False  # the last stall of this read: held by an open transaction

    def read_to_end(self, *, end: End = "stable", timeout_s: float = 300.0,
                    since_ms: int | None = None) -> Iterator[Message]:
        """Yield every committed record up to the ends as of this call (see the module doc).

        Records consumed past an end in the last fetch are yielded too, not dropped: the
        next call goes on after them. Control markers and transient errors are passed over.
        `since_ms`: a first read (of a new consumer) starts at each partition's first record
        timestamped then or later (kafka/read_positions.py); a later one goes on as ever.
        `timeout_s`: how long a read may go without its positions moving (ReadTimedOut).
        """
        deadline = time.monotonic() + timeout_s
        self._held = False
        self._since_ms, self.started_at = since_ms, None
        consumer, ends = self._ends(end, deadline)
        started, read = positions(consumer, self._topic, list(ends), self._assigned_at), 0
        moved, moved_at = started, time.monotonic()  # the positions, and when they last moved
        while not reached(consumer, self._topic, ends, self._assigned_at):
            now = time.monotonic()
            if now > deadline:
                raise ReadTimedOut(f"the read of the {self._what} topic {self._topic} to its "
                                   f"end made no progress for over {timeout_s:.0f}s; is a "
                                   "transaction stuck open?")
            if now - moved_at > _STALLED_S:
                consumer, moved_at = self._stalled(consumer, moved, ends), now
            for message in consumer.consume(num_messages=self._batch,
                                            timeout=self._consume_wait_s):
                error = message.error()
                if error is None:
                    read += 1
                    yield message
                elif error.code() in REFUSED_CREDENTIALS:  # not the group's: never joined (QA 31-d)
                    # QA 31-c: a topic the principal may not read was passed over like a
                    # transient error for 300 s, then "is a transaction stuck open?".
                    raise fatal_kafka_error(
                        f"reading the {self._what} topic {self._topic} failed for good: "
                        f"{describe(error)}; " + (
                            "grant this principal Read on the topic"
                            if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED else
                            "check the kafka section's security settings"), error)
            if (where := positions(consumer, self._topic, list(ends), self._assigned_at)) != moved:
                moved, moved_at = where, time.monotonic()
                # A read that moves goes on: a restore longer than `timeout_s` ended in exit 75
                # and the same restore again, for good (QA 66-b).
                deadline = max(deadline, moved_at + timeout_s)

        if self._paused_between:
            consumer.pause(consumer.assignment())  # resumed by the next read (_looked_up)
        log.info("event=topic_read topic=%s ends=%s from=%s records=%d", self._topic,
                 shown(ends), shown(started), read)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._assigned_at = {}

    def _ends(self, end: End, deadline: float) -> tuple[Consumer, dict[int, int]]:
        """The consumer, and the ends to read to: the committed ends the consumer asks of the
        leaders, and for "log_end" the log ends an admin client asks, of which the committed
        end is the floor (a second opinion; QA 37-a: after the changelog's leader was killed,
        the admin's answer, -1001, made a restore read no mark)."""
        consumer, ends = self._stable_ends(deadline)
        if end == "log_end":
            logged = log_end_offsets(self._admin, self._topic, self._partitions, deadline)
            ends = {p: max(offset, ends.get(p, 0)) for p, offset in logged.items()}
        return consumer, ends

    def _stalled(self, consumer: Consumer, where: dict[int, int],
                 ends: dict[int, int]) -> Consumer:
        """The consumer to read on with after _STALLED_S without progress below the ends:
        said, and a renewable reader's replaced (QA 39-a: a restore read nothing for 26 s after
        a broker's kill, unsaid; a consumer left without metadata would wait for the deadline).
        An open transaction holds a read up as long, which a new consumer waits for as well: a
        consumer at the last stable offsets waits with it (_held_open), and once it ends is
        given one more period to read what it held (it may end just before the check)."""
        log.warning("event=read_stalled topic=%s positions=%s ends=%s seconds=%.0f: no record "
                    "read; a transaction open, or the consumer without a leader", self._topic,
                    shown(where), shown(ends), _STALLED_S)
        if not self._renewable:
            return consumer
        was_held, self._held = self._held, self._held_open(consumer, where)
        if self._held or was_held:  # just released: one more period to read what it held
            return consumer
        self._renew(consumer, f"nothing read for {_STALLED_S:.0f} s")
        return self._consumer or consumer

    def _held_open(self, consumer: Consumer, where: dict[int, int]) -> bool:
        """Whether the consumer stands at every partition's last stable offset, which it can
        look up: an open transaction holds the read, and a new consumer would wait the same
        (review 39-2: a restore renewed its consumer every 30 s until the transaction ended)."""
        try:
            stable = stable_offsets(consumer, self._topic, list(where),
                                    time.monotonic() + _RENEW_AFTER_S)
            # A partition nothing was read of yet stands at its log start (review 40-2: not 0
            # once retention has moved it).
            held = all((where[p] if where[p] >= 0 else consumer.get_watermark_offsets(
                TopicPartition(self._topic, p), timeout=LOW_LOOKUP_S, cached=False)[0]) >= offset
                       for p, offset in stable.items())
        except KafkaException:
            return False
        if held:
            log.info("event=read_held topic=%s stable=%s: an open transaction holds the read "
                     "at the last stable offset until it ends", self._topic, shown(stable))
        return held

    def _stable_ends(self, deadline: float) -> tuple[Consumer, dict[int, int]]:
        """The consumer and the committed ends. A renewable reader's consumer whose lookups
        fail for _RENEW_AFTER_S is replaced by a new one at the same positions,
        which asks again until `deadline` (QA 38-a O2: after a broker's kill the changelog
        reader's consumer answered "Failed to get metadata" for minutes while new clients
        worked, and the router's next restore failed: exit 75, 118-193 s without delivery)."""
        if not self._renewable or self._consumer is None:
            return self._looked_up(deadline)
        try:
            return self._looked_up(min(deadline, time.monotonic() + _RENEW_AFTER_S))
        except KafkaException as failure:
            if time.monotonic() > deadline:
                raise
            self._renew(self._consumer, repr(str(failure)))
        return self._looked_up(deadline)

    def _looked_up(self, deadline: float) -> tuple[Consumer, dict[int, int]]:
        consumer = self._assigned(
            refresh=True, timeout_s=max(1.0, min(LOOKUP_TIMEOUT_S, deadline - time.monotonic())))
        if self._paused_between:
            # librdkafka fetches a resumed partition again from the consumer's position.
            consumer.resume(consumer.assignment())
        return consumer, stable_offsets(consumer, self._topic, self._partitions, deadline)

    def _renew(self, stale: Consumer, why: str) -> None:
        """Replace the consumer (reassigned()), and the admin client, made before the same
        outage (QA 39-a: the renewed read's first lookup failed again)."""
        self._admin.reset()
        self._consumer, self._assigned_at = reassigned(
            stale, self._config, self._topic, self._partitions, self._assigned_at, why)

    @property
    def consumer(self) -> Consumer:
        """The consumer, built and assigned on first use: its group metadata names the reader's
        group (`dlq replay` commits offsets under it in a transaction)."""
        return self._assigned()

    def _assigned(self, *, refresh: bool = False,
                  timeout_s: float = LOOKUP_TIMEOUT_S) -> Consumer:
        """The consumer; a new one's partitions, and with `refresh` those added to the topic
        since, looked up within `timeout_s` (QA 61-a F-1: a new one's took 30 s, whatever the
        read's deadline)."""
        if self._consumer is None:
            consumer = Consumer(self._config)
            self._assigned_at = {}  # every partition from its beginning
            try:
                if self._since_ms is None:
                    self._partitions = assign_from_beginning(consumer, self._topic, self._what,
                                                             timeout_s=timeout_s)
                else:
                    self._partitions, self._assigned_at = assign_since(
                        consumer, self._topic, self._what, self._since_ms, timeout_s=timeout_s)
                    self.started_at = dict(self._assigned_at)
            except BaseException:
                consumer.close()
                raise
            self._consumer = consumer
        elif refresh:
            self._partitions = assign_added(self._consumer, self._topic, self._partitions,
                                            self._what, timeout_s)
        return self._consumer
