"""The idempotent consume loop on NATS JetStream: effect first (through a dedup store), ack after.

A durable pull consumer with explicit ack. Per message of a fetched batch, in stream order:
1. read the event id (the `id` header, else Nats-Msg-Id) and decode the data; a malformed
   message is dead-lettered at once (stage "decode");
2. `store.run_once(group, event id, handler)`: DONE and DUPLICATE both mean the effect is
   safe, so the message is acked; BUSY (another worker's live claim) naks it with a delay;
3. a handler exception naks with a delay (exponential backoff, full jitter, RetryPolicy); on
   its `retry.max_attempts`-th failure in this process it is dead-lettered instead (stage
   "handle"): published to the dead-letter subject, and after JetStream acked that publish,
   the original is TERMed. Attempts are the handler's failures counted here, not JetStream's
   delivery count, which also counts deliveries cut short by a stop, a crash or another
   worker's outage: those must never bring a message closer to the dead-letter subject;
4. a store failure (DedupStoreError), a handler's RetriableError, a registry outage
   (RegistryError) or a failed dead-letter publish naks with a delay and counts as no
   attempt; a dead letter the stream refuses for its size goes again without its data, and
   after retry.max_attempts run() stops. The letter its stream did not ack is remembered, so
   the redelivery publishes it again without decoding the message or running the handler
   (QA 56-e F-2: a full dead-letter stream ran the poison's handler at every retry).

Threads: run() runs an asyncio loop (nats-py is asyncio) in the calling thread. The blocking
parts, the decoder and the store with the handler inside, run one at a time in one worker
thread, so the loop stays free to keep the batch alive (in-progress acks every AckWait / 3,
for handlers slower than AckWait), to answer the server's pings and to see stop(). Messages
are still handled strictly one after the other.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from cdc_router.config.nats import MSG_ID_HEADER
from cdc_router.config.redact import shown_url
from cdc_router.consumer.controls import ConsumerControls
from cdc_router.consumer.dead_letter import STAGE_DECODE, STAGE_HANDLE, letter_class
from cdc_router.consumer.dedup.store import DedupKey, DedupStore, Outcome
from cdc_router.consumer.event import ConsumedEvent, Decoder
from cdc_router.consumer.handler import Handler, check_wiring, guarded
from cdc_router.consumer.jetstream_message import (
    GiveUp,
    JetStreamRecord,
    after_handler_failure,
    count_for,
    dead_letter_message,
    kafka_source,
    keep_for,
    letter_failure,
    read_jetstream_event,
    record_of,
    refused_for_good,
)
from cdc_router.consumer.jetstream_pull import (
    Puller,
    PullFailed,
    close_client,
    log_reconnected,
    quietly,
)
from cdc_router.consumer.jetstream_settings import JetStreamSettings
from cdc_router.consumer.jetstream_setup import check_durable, subscribe
from cdc_router.consumer.outage import StoreOutage
from cdc_router.consumer.store_checks import check_store
from cdc_router.dead_letter import shown_repr, without_frames
from cdc_router.errors import (
    ConfigError,
    DedupStoreError,
    JetStreamConsumerError,
    MalformedRecord,
    RegistryError,
    RetriableError,
)
from cdc_router.nats.connection import (
    RECENT_ERRORS,
    config_failure,
    error_text,
    require_tls,
    servers,
)

log = logging.getLogger(__name__)

Context = TypeVar("Context")
T = TypeVar("T")

# While nothing arrives, the durable is looked up this often (see _check_durable).
DURABLE_CHECK_S = 30.0


class JetStreamConsumer(ConsumerControls, Generic[Context]):
    """Consumes `settings.stream` through durable `settings.durable`, running
    `handler(event, context)` once per event id; same handler and stores as on Kafka.

    run() blocks until stop() is called from another thread or a signal handler, and raises
    JetStreamConsumerError when it cannot run at all (NATS unreachable, no stream, an
    incompatible durable). Constructing it makes no network call.
    """

    def __init__(self, settings: JetStreamSettings, store: DedupStore[Context],
                 handler: Handler[Context], *, decoder: Decoder | None = None,
                 rng: random.Random | None = None) -> None:
        check_wiring("JetStreamConsumer", settings, JetStreamSettings, store, handler, decoder)
        super().__init__()
        self.settings, self._store, self._handler = settings, store, guarded(handler)
        self._decoder = decoder
        self._rng = rng or random.Random()
        self._failures: dict[int, int] = {}  # stream sequence -> handler failures here
        self._outages = 0  # batches in a row cut short by an outage (the loop's pause)
        # The store's outage lines, as the Kafka consumer's: one, a repeat, the end (outage.py)
        self._store_outage = StoreOutage(type(store).__name__, time.monotonic)
        self._waits: dict[int, int] = {}  # stream sequence -> outage naks here (their backoff)
        self._refused: dict[int, int] = {}  # stream sequence -> refusals of its dead letter
        self._letters: dict[int, dict[str, Any]] = {}  # stream sequence -> its unacked letter
        self._executor: ThreadPoolExecutor | None = None
        self._js: Any = None
        self._dead_letter_stream = ""
        self._ack_wait_s = settings.ack_wait_s  # the durable's, once bound
        self._max_payload = 1024 * 1024
        self._closing = False

    def run(self) -> None:
        """Consume until stop(); the unhandled rest of a batch is naked for redelivery."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jetstream-effect")
        try:
            asyncio.run(self._main())
        finally:
            self._executor.shutdown(wait=True)
            log.info("event=consumer_stopped stream=%s durable=%s processed=%d duplicates=%d "
                     "dead_lettered=%d retries=%d", self.settings.stream, self.settings.durable,
                     *self._counts.values())

    # Setup ----------------------------------------------------------------------------------

    async def _main(self) -> None:
        client = await self._connect()
        try:
            # A wrong DSN, no table: now, not at the first message (QA 57-c F-2); in the
            # worker thread, whose store connection run_once then uses.
            await self._blocking(functools.partial(check_store, self._store))
            self._js = client.jetstream(timeout=self.settings.connect_timeout_s)
            self._max_payload = int(client.max_payload)
            self._dead_letter_stream, self._ack_wait_s = await subscribe(
                self._js, self.settings, client.connected_server_version)
            puller = Puller(client, self.settings.stream, self.settings.durable)
            await puller.start()
            log.info("event=consumer_started transport=jetstream stream=%s durable=%s "
                     "dead_letter_subject=%s store=%s", self.settings.stream,
                     self.settings.durable, self.settings.dead_letter_subject,
                     type(self._store).__name__)
            checked = time.monotonic()
            while not self._stop.is_set():
                batch = await self._fetch(puller, client)
                if batch:
                    await self._handle_batch(batch)
                elif time.monotonic() - checked > DURABLE_CHECK_S:
                    await check_durable(self._js, self.settings)
                    checked = time.monotonic()
        finally:
            self._closing = True
            await close_client(client)

    async def _connect(self) -> Any:
        import nats
        from nats.errors import Error as NatsError

        # The last errors nats-py reported while connecting (a refusal is often followed by a
        # broken pipe as the server hangs up).
        last: deque[BaseException] = deque(maxlen=RECENT_ERRORS)

        async def on_error(error: Exception) -> None:
            last.append(error)
            log.debug("event=nats_error error=%s", error_text(error))

        url, options = self.settings.url, dict(self.settings.connect_options)
        try:
            await require_tls(url, options, self.settings.connect_timeout_s,
                              url_field="JetStreamSettings.url",
                              tls_field="JetStreamSettings.connect_options.tls")
            # Reconnects for ever once connected: an outage is a pause, not a reason to stop.
            # (nats-py's first connect retries too: wait_for bounds it.)
            return await asyncio.wait_for(nats.connect(
                servers(url), name=f"cdc-router-consumer-{self.settings.durable}",
                connect_timeout=self.settings.connect_timeout_s, allow_reconnect=True,
                max_reconnect_attempts=-1, reconnect_time_wait=0.5, error_cb=on_error,
                disconnected_cb=self._disconnected, reconnected_cb=log_reconnected,
                **options),
                timeout=self.settings.connect_timeout_s)
        except ConfigError as refused:
            raise JetStreamConsumerError(str(refused)) from None
        except (NatsError, OSError, TimeoutError) as error:
            failure = config_failure(url, [error, *last])
            if failure is not None:
                raise JetStreamConsumerError(f"{failure} (JetStreamSettings.connect_options)"
                                             ) from None
            reason = error_text(last[-1] if last else error)
            raise JetStreamConsumerError(
                f"cannot connect to NATS at {shown_url(url)}: {reason}; is nats-server running "
                "there, and are the URL's credentials right?") from None

    async def _disconnected(self) -> None:
        if not (self._stop.is_set() or self._closing):
            log.warning("event=nats_disconnected url=%s", shown_url(self.settings.url))

    # The loop ---------------------------------------------------------------------------------

    async def _fetch(self, puller: Puller, client: Any) -> list[Any]:
        """The next batch; [] after nothing came, or after a failure (logged, then a pause)."""
        from nats.errors import Error as NatsError

        try:
            return await puller.fetch(self.settings.batch_size, self.settings.poll_timeout_s)
        except PullFailed as error:  # e.g. 503: JetStream unavailable
            failure: Exception = error
        except NatsError as error:
            if client.is_closed:
                raise JetStreamConsumerError(
                    f"the connection to NATS at {shown_url(self.settings.url)} closed: "
                    f"{error_text(error)}") from None
            failure = error  # reconnecting, or the server is busy
        log.warning("event=fetch_failed stream=%s durable=%s error=%s",
                    self.settings.stream, self.settings.durable, error_text(failure))
        await asyncio.sleep(self.settings.poll_timeout_s)
        return []

    async def _handle_batch(self, batch: list[Any]) -> None:
        unsettled, outage = list(batch), None
        keep_alive = asyncio.create_task(self._keep_alive(unsettled))
        try:
            for message in batch:
                if self._stop.is_set():
                    break
                outage = await self._handle(message)
                unsettled.remove(message)
                if outage is not None:
                    # The store or the registry is down: the rest of the batch would fail the
                    # same way, one warning and one new connection each. Hand it back and
                    # wait before fetching again, as the Kafka consumer pauses.
                    break
            else:
                self._outages = 0
        finally:
            keep_alive.cancel()
            # Stopping (or failing): hand the rest back now rather than after AckWait.
            for message in unsettled:
                await quietly(message.nak(), "nak")
        if outage is not None:
            await self._pause(outage)

    async def _pause(self, delay_s: float) -> None:
        """Wait `delay_s` (less if stop() comes) before the next fetch."""
        deadline = time.monotonic() + delay_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    async def _keep_alive(self, unsettled: list[Any]) -> None:
        """In-progress acks for the batch, so JetStream does not redeliver what waits here."""
        while True:
            await asyncio.sleep(self._ack_wait_s / 3)
            for message in list(unsettled):
                await quietly(message.in_progress(), "in_progress")

    async def _handle(self, message: Any) -> float | None:
        """Handle one message; the delay to wait before the next fetch after an outage."""
        record = record_of(message.subject, message.data, message.headers, message.metadata)
        if (letter := self._letters.get(record.sequence)) is not None:  # only its publish again
            await self._dead_letter(message, record, **letter)
            return None
        attempt = self._failures.get(record.sequence, 0) + 1
        settings = self.settings
        try:
            event = await self._blocking(functools.partial(
                read_jetstream_event, record, source=kafka_source(settings.event_id_source),
                header=settings.event_id_header, decoder=self._decoder, attempt=attempt,
                key_name=f"header {MSG_ID_HEADER!r}"))
        except MalformedRecord as error:
            await self._dead_letter(message, record, STAGE_DECODE, error, attempts=0)
            return None
        except RegistryError as error:
            return await self._outage(message, record, "registry_unavailable", error)
        key = DedupKey(settings.dedup_group, event.event_id)
        try:
            outcome = await self._blocking(functools.partial(
                self._store.run_once, key, functools.partial(self._handler, event)))
        except DedupStoreError as error:  # an outage's lines: outage.py; contention's: here
            return await self._outage(message, record, self._store_outage.failed(error), error)
        except Exception as error:
            self._store_outage.answered()  # the handler's failure: the store answered
            if isinstance(error, RetriableError):
                return await self._outage(message, record, "handler_retriable", error)
            await self._handler_failed(message, record, event, attempt, error)
            return None
        self._store_outage.answered()
        if outcome is Outcome.BUSY:
            await self._excuse(message, record, "claimed_elsewhere", None)
            return None
        self._counts["processed" if outcome is Outcome.DONE else "duplicates"] += 1
        log.debug("event=handled id=%s outcome=%s stream=%s sequence=%d", event.shown_id,
                  outcome.value, record.stream, record.sequence)
        await self._settle(message, record, term=False)
        return None

    async def _handler_failed(self, message: Any, record: JetStreamRecord,
                              event: ConsumedEvent, attempt: int, error: Exception) -> None:
        count_for(self._failures, record.sequence)
        verdict = after_handler_failure(attempt, self.settings.retry, self._rng, error)
        if isinstance(verdict, GiveUp):
            await self._dead_letter(message, record, STAGE_HANDLE, error,
                                    attempts=verdict.attempts, event_id=event.event_id)
            return
        self._counts["retries"] += 1
        log.warning("event=retry_scheduled reason=handler_failed stream=%s sequence=%d id=%s "
                    "attempt=%d delay_s=%.3f error=%s", record.stream, record.sequence,
                    event.shown_id, attempt, verdict.delay_s, shown_repr(error)[:300])
        await quietly(message.nak(delay=verdict.delay_s), "nak")

    async def _outage(self, message: Any, record: JetStreamRecord, reason: str,
                      error: BaseException) -> float:
        """_excuse the message; the loop's pause, growing with the outages in a row."""
        await self._excuse(message, record, reason, error)
        self._outages += 1
        return self.settings.retry.backoff(self._outages, self._rng)

    async def _excuse(self, message: Any, record: JetStreamRecord, reason: str,
                      error: BaseException | None) -> None:
        """Nak after an outage, without counting the delivery as an attempt."""
        waits = count_for(self._waits, record.sequence)
        delay = self.settings.retry.backoff(waits, self._rng)
        self._counts["retries"] += 1
        # Waiting for another worker's claim is expected, not a problem worth a warning; a
        # store outage is said once by StoreOutage, not at each retry (as loop.py's).
        level = logging.DEBUG if error is None or reason == "store_failed" else logging.WARNING
        log.log(level, "event=retry_scheduled reason=%s stream=%s sequence=%d delay_s=%.3f "
                "error=%s", reason, record.stream, record.sequence, delay,
                "" if error is None else shown_repr(error)[:300])  # as loop.py's (QA 61-b F6)
        await quietly(message.nak(delay=delay), "nak")

    async def _dead_letter(self, message: Any, record: JetStreamRecord, stage: str,
                           error: BaseException, *, attempts: int,
                           event_id: str | None = None) -> None:
        """Publish the dead letter, wait for its JetStream ack, then TERM the original."""
        import nats.errors
        letter = dead_letter_message(record, durable=self.settings.durable, stage=stage,
                                     error=error, attempts=attempts, event_id=event_id,
                                     max_payload=self._max_payload,
                                     drop_data=record.sequence in self._refused)
        try:
            await self._js.publish(self.settings.dead_letter_subject, letter.data,
                                   timeout=self.settings.dead_letter_timeout_s,
                                   stream=self._dead_letter_stream,
                                   headers={**letter.headers, MSG_ID_HEADER: letter.msg_id})
        except (nats.errors.Error, TimeoutError) as failure:
            if refused_for_good(failure):
                self._refused_letter(record, failure)
            keep_for(self._letters, record.sequence, {  # not the traceback: the handler's locals
                "stage": stage, "error": without_frames(error), "attempts": attempts,
                "event_id": event_id})
            await self._excuse(message, record, "dead_letter_failed", letter_failure(
                failure, self.settings.dead_letter_subject, self._dead_letter_stream))
            return
        self._counts["dead_lettered"] += 1
        log.warning("event=dead_lettered stream=%s sequence=%d subject=%s stage=%s "
                    "error_class=%s attempts=%d", record.stream, record.sequence,
                    record.subject, stage, letter_class(stage, error), attempts)
        await self._settle(message, record, term=True)

    def _refused_letter(self, record: JetStreamRecord, failure: BaseException) -> None:
        """Count a refusal of `record`'s dead letter; stop after retry.max_attempts (review
        33: retried for ever, its handler run each time). Else it comes back, as an outage."""
        refusals = count_for(self._refused, record.sequence)
        if refusals > 1 and self.settings.retry.exhausted(refusals):  # once without its data
            raise JetStreamConsumerError(
                f"stream {self._dead_letter_stream!r} refused the dead letter of message "
                f"{record.sequence} of stream {record.stream!r} {refusals} times, also without "
                f"its data: {error_text(failure)}; stopping rather than skip the message: raise "
                "that stream's max_msg_size, or shrink the message's headers (64 KiB at most)")

    async def _settle(self, message: Any, record: JetStreamRecord, *, term: bool) -> None:
        self._failures.pop(record.sequence, None)
        self._waits.pop(record.sequence, None)
        self._refused.pop(record.sequence, None)
        self._letters.pop(record.sequence, None)
        # A lost ack only means a redelivery, which the store reports as a duplicate.
        await quietly(message.term() if term else message.ack(), "term" if term else "ack")

    async def _blocking(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

