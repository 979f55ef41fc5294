"""A synchronous JetStream publisher over nats-py's asyncio client.

The router's loop is synchronous; nats-py is asyncio. The publisher runs one event loop in a
thread of its own and hands it whole batches: publish_batch() publishes every message at once
(pipelined on one connection), then waits for all the JetStream acks or fails the batch. Nothing
is published between batches, so a failed batch leaves nothing half-done that the next one
depends on: the router aborts its Kafka transaction, rewinds and publishes the same messages
again, and the stream's duplicate window (Nats-Msg-Id = event id) acks the ones it already
stored as duplicates without storing them twice.

Built lazily: constructing it makes no network call and starts no thread.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from cdc_router.config.nats import JETSTREAM_MAX_HEADER_BYTES, MSG_ID_HEADER, nats_message_size
from cdc_router.config.redact import shown_url
from cdc_router.errors import JetStreamError, JetStreamRefused
from cdc_router.nats.connection import (
    RECENT_ERRORS,
    config_failure,
    error_text,
    require_tls,
    servers,
)

log = logging.getLogger("cdc_router.nats")
T = TypeVar("T")

# Beyond the ack timeout, how long the caller waits for the loop thread to report: the acks'
# own timeouts end the batch; this only guards against a loop that stopped answering.
_GRACE_S = 5.0
# JetStream's refusals of one message for what it is (nats-server's errors.json): over the
# stream's max_msg_size (JSStreamMessageExceedsMaximumErr), headers over its limit
# (JSStreamHeaderExceedsMaximumErr). No retry mends them: the record is poison. A full stream
# (discard new) refuses every message alike: that is the stream's limits, not a record.
MESSAGE_REFUSED = frozenset({10054, 10097})
# A store failure; "maximum messages exceeded" / "maximum bytes exceeded" (the description
# tells them from a broken store, review 34-3): a full stream with discard: new.
STREAM_FULL = 10077
# JetStream's storage itself is full, whatever the stream's limits (nats-server's errors.json):
# insufficient resources (the server's max_file_store / max_memory_store reached: QA 65-b),
# the account's limits, insufficient memory / storage resources available.
STORAGE_FULL = frozenset({10002, 10023, 10028, 10047})
_STORAGE_HINT = ("; JetStream's storage is full (nats-server's jetstream max_file_store, or "
                 "max_memory_store for a memory stream, the account's limits, or the disk): "
                 "every batch waits until there is room; free some (lower a stream's max_bytes "
                 "or max_age_ms in nats.streams and run `cdc-router streams apply -c <config>`, "
                 "delete streams nobody reads) or raise the limit and reload nats-server")


def failure_cause(failure: BaseException,
                  ) -> Literal["jetstream_storage_full", "jetstream_stream_full", "jetstream"]:
    """What failed a batch on JetStream, for the abort's cause label: `jetstream_storage_full`
    (the server's or account's store: STORAGE_FULL), `jetstream_stream_full` (a stream full
    and set to discard new), else `jetstream`. Reads the nats-py error publish_batch() raised
    its JetStreamError from (`__cause__`)."""
    error = failure.__cause__
    if getattr(error, "err_code", None) in STORAGE_FULL:
        return "jetstream_storage_full"
    return "jetstream_stream_full" if error is not None and stream_full(error) else "jetstream"


def stream_full(error: BaseException) -> bool:
    """Whether JetStream refused a publish because its stream is full and set to discard new."""
    return getattr(error, "err_code", None) == STREAM_FULL and \
        "maximum" in str(getattr(error, "description", ""))


def _full_hint(error: BaseException, stream: str | None) -> str:
    """What mends a stream_full() refusal, by the limit its description names (QA 54-d F-3:
    'maximum messages per subject exceeded' was told max_msgs/max_bytes)."""
    description = str(getattr(error, "description", ""))
    if "per subject" in description:
        # Lifted first (review 54-m F-2): set back to discard old while the limit stands, each
        # publish would delete its subject's oldest message, consumed or not.
        return ("is full per subject (max_msgs_per_subject, set outside the config) and set to "
                "discard new messages: first lift that limit (`nats stream edit "
                f"{stream or '<stream>'} --max-msgs-per-subject=-1`), then run "
                "`cdc-router streams apply -c <config>`, which sets it back to discard old ones")
    return ("is full and set to discard new messages: `cdc-router streams apply -c <config>` "
            "sets it back to discard old ones (or raise its "
            f"{'max_bytes' if 'bytes' in description else 'max_msgs'})")


# nats-server's -ERR for a publish the user's permissions refuse (nats-py lowercases it).
_PUBLISH_DENIED = re.compile(r'permissions violation for publish to "([^"]+)"', re.IGNORECASE)


@dataclass(frozen=True)
class NatsMessage:
    """One JetStream publish: its subject, data, headers, and the id JetStream dedups on."""

    subject: str
    data: bytes
    headers: Mapping[str, str]
    msg_id: str


@dataclass(frozen=True)
class BatchAcks:
    """What JetStream said about a batch: stored, or recognised as a duplicate."""

    stored: int
    duplicates: int


class JetStreamPublisher:
    """publish_batch(messages) -> BatchAcks once every message is acked; JetStreamError else."""

    def __init__(self, url: str, *, ack_timeout_s: float, connect_timeout_s: float,
                 name: str = "cdc-router", options: Mapping[str, Any] | None = None,
                 max_payload_bytes: int | None = None,
                 stream_of: Callable[[str], str | None] | None = None) -> None:
        """`options`: nats.connect() keywords for credentials and TLS (nats/connection.py);
        `max_payload_bytes`: the config's nats.max_payload_bytes, warned about at connect when
        it is above the server's max_payload; `stream_of(subject)`: the stream of the config
        that captures the subject, which each ack must name."""
        self._max_payload_bytes = max_payload_bytes
        self._stream_of = stream_of
        self._expected: dict[str, str | None] = {}  # stream_of's answers, by subject
        self._url = url
        self._options = dict(options or {})
        self._errors: deque[BaseException] = deque(maxlen=RECENT_ERRORS)  # since connected
        # Subjects the server refused this batch's publish to, lowercased: nats-py's parser
        # lowercases the whole -ERR line (review 44-3: orders.OrderPaid never matched).
        self._denied: set[str] = set()
        self._ack_timeout_s = ack_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._js: Any = None
        self._closing = False

    def publish_batch(self, messages: Sequence[NatsMessage]) -> BatchAcks:
        """Publish every message and wait for all their acks (at most the ack timeout).

        Raises JetStreamError naming the first failure: NATS unreachable, no stream for a
        subject, an ack that did not come in time. The caller fails its batch for it.
        """
        if not messages:
            return BatchAcks(0, 0)
        return self._run(self._publish_all(messages),
                         self._connect_timeout_s + self._ack_timeout_s + _GRACE_S)

    def close(self) -> None:
        """Drain the connection and stop the loop thread; safe to call twice."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        for work, timeout_s in ((self._disconnect, self._connect_timeout_s + _GRACE_S),
                                (_end_other_tasks, _GRACE_S)):  # the second after any first
            try:
                self._run(work(), timeout_s)
            except JetStreamError as failure:
                log.warning("event=nats_close_failed error=%r", str(failure))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=_GRACE_S)
        if not thread.is_alive():
            loop.close()
        self._loop = self._thread = None

    # The loop thread ---------------------------------------------------------------------

    def _run(self, work: Coroutine[Any, Any, T], timeout_s: float) -> T:
        loop = self._started()
        future = asyncio.run_coroutine_threadsafe(work, loop)
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            future.cancel()
            raise JetStreamError(f"NATS at {shown_url(self._url)} did not answer within "
                                 f"{timeout_s:.0f}s") from None

    def _started(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="nats-publisher",
                                      daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    async def _connected(self) -> Any:
        import nats
        from nats.errors import Error as NatsError

        if self._client is not None and self._client.is_connected:
            return self._js
        if self._client is None or self._client.is_closed:
            await require_tls(self._url, self._options, self._connect_timeout_s)
            self._errors.clear()
            try:
                # Reconnects for ever once connected: an outage is a run of failed batches that
                # end when the server is back, not a reason to stop the router.
                # (nats-py's first connect retries for ever too: wait_for bounds it.)
                self._client = await asyncio.wait_for(nats.connect(
                    servers(self._url), name=self._name, connect_timeout=self._connect_timeout_s,
                    max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                    allow_reconnect=True, error_cb=self._error,
                    disconnected_cb=self._disconnected, reconnected_cb=self._reconnected,
                    **self._options),
                    timeout=self._connect_timeout_s)
            except (NatsError, OSError, TimeoutError) as error:
                self._client = None
                self._stop_on_config_failure(error)
                raise JetStreamError(f"cannot connect to NATS at {shown_url(self._url)}: "
                                     f"{error_text(error)}; is nats-server running?") from None
            self._errors.clear()
            self._js = self._client.jetstream(timeout=self._ack_timeout_s)
            log.info("event=nats_connected url=%s", shown_url(self._url))
            self._warn_max_payload()
        # Reconnecting: publishes would wait in the client's buffer; fail the batch now.
        if not self._client.is_connected:
            self._stop_on_config_failure(None)
            raise JetStreamError(f"NATS at {shown_url(self._url)} is not connected (reconnecting)")
        return self._js

    async def _publish_all(self, messages: Sequence[NatsMessage]) -> BatchAcks:
        # MaxPayloadError: nats-py refuses, before sending, a message over the server's
        # max_payload (nats.max_payload_bytes set above it): certainly that message's.
        from nats.errors import MaxPayloadError
        from nats.js.errors import NoStreamResponseError

        js = await self._connected()
        self._oversize(messages)
        self._denied.clear()
        results = await asyncio.gather(
            *(js.publish(message.subject, message.data, timeout=self._ack_timeout_s,
                         headers={**message.headers, MSG_ID_HEADER: message.msg_id})
              for message in messages), return_exceptions=True)
        failed = [(message, result) for message, result in zip(messages, results, strict=True)
                  if isinstance(result, BaseException)]
        refused = {index: f"JetStream refused the {len(message.data)}-byte message for "
                          f"{message.subject}: {error_text(result)}; " + (
                              "its headers are over JetStream's fixed 64 KiB: shorten the "
                              "headers column's" if getattr(result, "err_code", None) == 10097
                              else "raise the limit (the stream's max_msg_size, the server's "
                              "max_payload), then `cdc-router dlq replay` the letter")
                   for index, (message, result) in enumerate(zip(messages, results, strict=True))
                   if getattr(result, "err_code", None) in MESSAGE_REFUSED
                   or isinstance(result, MaxPayloadError)}
        # Review 44 M4: every batch timed out for ever on one subject the user may not publish
        # to (one rendered from row data, say). As a Kafka topic without a grant: a dead letter.
        refused |= {index: f"NATS refused the publish to {message.subject}: this user may not "
                           "publish to it (a permissions violation); grant it in the server's "
                           "authorization (or route the event elsewhere), then `cdc-router dlq "
                           "replay` the letter"
                    for index, (message, result) in enumerate(zip(messages, results, strict=True))
                    if isinstance(result, BaseException)
                    and message.subject.lower() in self._denied}
        if refused:
            raise JetStreamRefused(f"JetStream refused {len(refused)} of {len(messages)} "
                                   f"messages; first: {next(iter(refused.values()))}", refused)
        if failed:
            message, error = failed[0]
            # The stream that captured the subject at start is gone (deleted, or its subjects
            # changed): nothing answers the publish. The batch waits; `streams apply` mends it.
            hint = ("; no stream captures this subject now (was one deleted?): run "
                    "`cdc-router streams apply -c <config>`"
                    if isinstance(error, NoStreamResponseError) else
                    # QA 34-d: a full stream with discard: new refuses every publish.
                    f"; the stream that captures {message.subject!r} "
                    f"{_full_hint(error, self._stream_of and self._stream_of(message.subject))}"
                    if stream_full(error) else
                    _STORAGE_HINT if getattr(error, "err_code", None) in STORAGE_FULL else
                    # QA 60-a F-4: a hung server (SIGSTOP) keeps its connection: only timeouts.
                    f"; no acknowledgement within nats.ack_timeout_ms "
                    f"({self._ack_timeout_s * 1000:.0f} ms): is nats-server answering (hung, "
                    "overloaded, or cut off with the connection still open)? See its log and "
                    "its /healthz; raise "
                    "nats.ack_timeout_ms for a slow server"
                    if len(failed) == len(messages)
                    and all(isinstance(failure, TimeoutError) for _, failure in failed) else "")
            raise JetStreamError(
                f"JetStream did not acknowledge {len(failed)} of {len(messages)} messages; "
                f"first: subject {message.subject!r} id {message.msg_id}: {error_text(error)}"
                f"{hint}") from error  # its err_code: failure_cause()
        self._check_streams(messages, results)
        duplicates = sum(1 for ack in results if getattr(ack, "duplicate", False))
        return BatchAcks(len(messages) - duplicates, duplicates)

    def _check_streams(self, messages: Sequence[NatsMessage], acks: Sequence[Any]) -> None:
        """JetStreamError when an ack names another stream than the config's for its subject:
        a stream edited by hand took the subject while the router ran, and the events went
        there, unseen by the declared stream's consumers (QA 54-d F-4)."""
        if self._stream_of is None:
            return
        expected = self._expected
        if len(expected) > 10_000:  # subjects rendered from row data: keep it bounded
            expected.clear()
        for message, ack in zip(messages, acks, strict=True):
            subject = message.subject
            if subject not in expected:
                expected[subject] = self._stream_of(subject)
            wanted = expected[subject]
            if wanted is not None and ack.stream != wanted:
                raise JetStreamError(
                    f"JetStream stored {subject!r} (id {message.msg_id}) in stream "
                    f"{ack.stream}, not in {wanted} as nats.streams says: a stream was changed "
                    f"on the server to capture it; take the subject out of {ack.stream} and "
                    f"give {wanted} its subjects back (`cdc-router streams apply -c <config>`); "
                    f"the events stored in {ack.stream} stay there")

    def _warn_max_payload(self) -> None:
        server = self._client.max_payload
        if self._max_payload_bytes is not None and self._max_payload_bytes > server:
            log.warning("event=config_warning detail=%r", (
                f"nats.max_payload_bytes ({self._max_payload_bytes}) is above the max_payload "
                f"of the NATS server at {shown_url(self._url)} ({server}): a message between "
                "the two is dead-lettered at stage produce; lower nats.max_payload_bytes to "
                f"{server}, or raise the server's max_payload"))

    def _oversize(self, messages: Sequence[NatsMessage]) -> None:
        """JetStreamRefused for the messages over the server's max_payload, headers counted:
        nats-py checks the data alone, and the server closes the connection on such a
        publish, so the batch failed as an outage for ever (QA 54-d F-1). Nothing is sent."""
        limit = self._client.max_payload
        # The route stage refuses a header block of JETSTREAM_MAX_HEADER_BYTES or more, so
        # only data within that of the limit needs its headers counted (9 us a message else).
        near = limit - JETSTREAM_MAX_HEADER_BYTES
        sizes = [nats_message_size(message.data, message.msg_id,
                                   ((name, value.encode()) for name, value
                                    in message.headers.items()))
                 if len(message.data) > near else 0 for message in messages]
        refused = {index: f"NATS refuses the {size}-byte message (headers and data) for "
                          f"{message.subject}: over the server's max_payload ({limit}); raise "
                          "the server's max_payload (and nats.max_payload_bytes to it, which "
                          "dead-letters such an event at stage route), then `cdc-router dlq "
                          "replay` the letter"
                   for index, (message, size) in enumerate(zip(messages, sizes, strict=True))
                   if size > limit}
        if refused:
            raise JetStreamRefused(f"JetStream refused {len(refused)} of {len(messages)} "
                                   f"messages; first: {next(iter(refused.values()))}", refused)

    def _stop_on_config_failure(self, error: BaseException | None) -> None:
        """Raise ConfigError when `error`, or the last error since we were last connected, is
        our credentials or our TLS settings refused: no retry mends those."""
        failure = config_failure(self._url, [error, *self._errors])
        if failure is not None:
            raise failure

    async def _error(self, error: Exception) -> None:
        denied = _PUBLISH_DENIED.search(str(error))
        if denied:  # the server drops such a publish and says so here only: its ack never comes
            self._denied.add(denied[1].lower())
            log.warning("event=nats_publish_denied subject=%s", denied[1])
            return
        self._errors.append(error)
        log.debug("event=nats_error error=%s", error_text(error))

    async def _reconnected(self) -> None:
        self._errors.clear()  # an error before the reconnect says nothing about now
        log.info("event=nats_reconnected")

    async def _disconnected(self) -> None:
        if not self._closing:
            log.warning("event=nats_disconnected url=%s", shown_url(self._url))

    async def _disconnect(self) -> None:
        from nats.errors import Error as NatsError

        self._closing = True
        client, self._client, self._js = self._client, None, None
        if client is None or client.is_closed:
            return
        try:
            await client.drain()
        except (NatsError, OSError, TimeoutError) as error:
            # Reconnecting (the server is down): nothing is in flight between batches, so
            # there is nothing to drain; close without it.
            log.info("event=nats_closed_without_drain reason=%r", error_text(error))
            try:
                await client.close()
            except (NatsError, OSError, TimeoutError) as closing:
                log.info("event=nats_close_failed reason=%r", error_text(closing))


async def _end_other_tasks() -> None:
    """Cancel the loop's other tasks and wait for them, as asyncio.run does before it closes
    its loop. nats-py's close() cancels its subscriptions' readers without waiting; a loop
    stopped with them pending leaves coroutines that warn when collected (an outage's close)."""
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
