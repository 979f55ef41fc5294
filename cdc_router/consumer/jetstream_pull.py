"""The JetStream consumer's pull request, made here rather than by nats-py's fetch().

nats-py's PullSubscription.fetch() tells the server's status messages (404 No Messages, 408
Request Timeout, 100 Idle Heartbeat, 503 ...) from stream messages by a `Status` header, so a
stream message whose publisher gave it a `Status` header was taken for one: never delivered
(404, 408, 409, 100), its whole batch lost (503 and any other number), or run() crashed
(`Status: abc`, ValueError), for ever at each redelivery (QA 54-c F-1). Here a message is told
by its reply subject: JetStream delivers a stream message with an ack subject (`$JS.ACK.`...),
and a status message with none. A stream message is handed to the consumer whatever its headers.

One request per fetch, as fetch() made it: `batch` messages at most, `no_wait` so that the
server answers as soon as it has nothing more, `expires` just under the poll timeout when
nothing was left over from the previous request (else the request ends at once). Messages of
an earlier request that come late (after its timeout) stay queued and open the next batch.
Each request has a reply subject of its own under one wildcard subscription (as nats.go's
Fetch): a status answering an earlier request, come late, is stale and does not end the
current one (review 54-m F-4).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from cdc_router.config.nats import DESCRIPTION_HEADER, STATUS_HEADER
from cdc_router.nats.connection import error_text

log = logging.getLogger("cdc_router.consumer.jetstream")

# JetStream's ack subject, the reply subject of every message a consumer delivers (with or
# without a domain: $JS.ACK.<domain>.<hash>.<stream>... is still under it).
ACK_PREFIX = "$JS.ACK."
_API_PREFIX = "$JS.API"
# Status codes that end a pull request: nothing more to deliver for it, no error.
_ENDED = frozenset({"404", "408", "409"})
# 409 before any message is the durable refusing the request (Exceeded MaxRequestBatch,
# MaxRequestExpires, MaxWaiting, Consumer Deleted): a failure, paused on, not an empty poll
# asked again at once (review 54-m F-1: 2,454 requests in 0.5 s, unsaid).
_REFUSED = "409"
_HEARTBEAT = "100"
# The server's expiry, this much before the client stops waiting (as nats-py's fetch).
_EXPIRES_MARGIN_NS = 100_000
# nats-py's bounds of a pull subscription's inbox (DEFAULT_JS_SUB_PENDING_*).
_PENDING_MSGS = 512 * 1024
_PENDING_BYTES = 256 * 1024 * 1024


class PullFailed(Exception):
    """The server answered a pull request with a status that is an error (503 ...)."""

    def __init__(self, status: str, description: str) -> None:
        super().__init__(f"JetStream answered the pull request with status {status}"
                         + (f" ({description})" if description else ""))
        self.status, self.description = status, description


def is_stream_message(message: Any) -> bool:
    """Whether `message` is one of the stream's (it has an ack subject), not a status."""
    return str(getattr(message, "reply", "") or "").startswith(ACK_PREFIX)


def status_of(message: Any) -> tuple[str, str]:
    """A status message's code and description ('' when missing)."""
    headers = getattr(message, "headers", None) or {}
    return str(headers.get(STATUS_HEADER, "")), str(headers.get(DESCRIPTION_HEADER, ""))


class Puller:
    """Pull requests of durable `durable` of `stream`, answered on an inbox of our own."""

    def __init__(self, client: Any, stream: str, durable: str) -> None:
        self._client = client
        self._next = f"{_API_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = ""
        self._requests = 0
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    async def start(self) -> None:
        """Subscribe to the inbox (nats-py resubscribes it after a reconnect)."""
        self._inbox = self._client.new_inbox()
        await self._client.subscribe(f"{self._inbox}.*", cb=self._arrived,
                                     pending_msgs_limit=_PENDING_MSGS,
                                     pending_bytes_limit=_PENDING_BYTES)

    async def _arrived(self, message: Any) -> None:
        self._queue.put_nowait(message)

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        """Up to `batch` stream messages within `timeout` seconds ([] when none came).
        Raises PullFailed on an error status before any message, and nats-py's errors of
        the request's publish."""
        messages = self._left_over(batch)
        if len(messages) >= batch:
            return messages
        request: dict[str, Any] = {"batch": batch - len(messages), "no_wait": True}
        if not messages:  # without expires the server answers at once
            request["expires"] = max(1, int(timeout * 1e9) - _EXPIRES_MARGIN_NS)
        self._requests += 1
        reply = f"{self._inbox}.{self._requests}"
        await self._client.publish(self._next, json.dumps(request).encode(), reply=reply)
        deadline = time.monotonic() + timeout
        while len(messages) < batch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                message = await asyncio.wait_for(self._queue.get(), remaining)
            except TimeoutError:
                break
            if is_stream_message(message):
                messages.append(message)
                continue
            status, description = status_of(message)
            if status == _HEARTBEAT or getattr(message, "subject", reply) != reply:
                continue  # a heartbeat, or a stale status of an earlier request
            if status == _REFUSED and not messages:
                raise PullFailed(status, description)
            if status in _ENDED:
                break
            if not status:  # no status and no ack subject: not JetStream's, not ours
                log.debug("event=pull_reply_ignored subject=%s", getattr(message, "subject", ""))
                continue
            if not messages:
                raise PullFailed(status, description)
            log.warning("event=pull_status status=%s description=%s note=the batch so far is "
                        "handled", status, description)
            break
        return messages

    def _left_over(self, batch: int) -> list[Any]:
        """Stream messages that came after their request's timeout; stale statuses dropped."""
        messages: list[Any] = []
        while len(messages) < batch and not self._queue.empty():
            message = self._queue.get_nowait()
            if is_stream_message(message):
                messages.append(message)
        return messages


async def close_client(client: Any) -> None:
    """Flush the acks sent so far, then close. Not drain(): every fetched message is settled
    by now, and draining a pull subscription waits on fetch replies that never come."""
    from nats.errors import Error as NatsError

    try:
        await client.flush(timeout=5)  # the acks' PING/PONG: seconds at most, or the server is gone
    except (NatsError, TimeoutError, OSError) as error:
        log.info("event=nats_flush_failed error=%s", error_text(error))
    try:
        await client.close()
    except (NatsError, TimeoutError, OSError) as error:  # the server went away meanwhile
        log.info("event=nats_close_failed error=%s", error_text(error))


async def quietly(acknowledgement: Any, what: str) -> None:
    """Send an ack, nak, term or in-progress; a failure is logged, never raised."""
    from nats.errors import Error as NatsError
    try:
        await acknowledgement
    except NatsError as error:
        log.info("event=%s_not_sent error=%s", what, error_text(error))


async def log_reconnected() -> None:
    log.info("event=nats_reconnected")
