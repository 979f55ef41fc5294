"""The JetStream consumer's own pull request: stream messages told from the server's status
messages by their ack subject, never by a `Status` header (QA 54-c F-1); over nats-py's real
Msg and a fake client that answers each pull request with a script."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from nats.aio.msg import Msg

from cdc_router.consumer.jetstream_pull import Puller, PullFailed, is_stream_message

ACK = "$JS.ACK.PAYMENTS.ful.1.{seq}.{seq}.1764590400000000000.0"


def stream_message(seq: int, headers: dict[str, str] | None = None) -> Msg:
    return Msg(_client=None, subject="payments.x", reply=ACK.format(seq=seq),  # type: ignore[arg-type]
               data=b"{}", headers=headers)


def status(code: str, description: str = "", subject: str = "") -> Msg:
    """A status message, on the reply subject of the request it answers ('' = this one's)."""
    headers = {"Status": code, **({"Description": description} if description else {})}
    return Msg(_client=None, subject=subject, reply="", data=b"",  # type: ignore[arg-type]
               headers=headers)


class FakeClient:
    """Answers the n-th pull request with the n-th list of `answers`, on the inbox."""

    def __init__(self, *answers: list[Msg]) -> None:
        self.answers, self.requests = list(answers), list[tuple[str, dict[str, Any], str]]()
        self.deliver: Callable[[Msg], Awaitable[None]] | None = None
        self.subscribed = ""

    def new_inbox(self) -> str:
        return "_INBOX.test"

    async def subscribe(self, subject: str, cb: Callable[[Msg], Awaitable[None]],
                        **limits: int) -> None:
        self.subscribed, self.deliver = subject, cb

    async def publish(self, subject: str, payload: bytes, reply: str) -> None:
        self.requests.append((subject, json.loads(payload), reply))
        assert self.deliver is not None
        for message in self.answers.pop(0) if self.answers else []:
            if not message.reply and not message.subject:
                message.subject = reply
            await self.deliver(message)


def fetch(client: FakeClient, batch: int = 10, timeout: float = 0.2,
          times: int = 1) -> list[list[Msg]]:
    async def run() -> list[list[Msg]]:
        puller = Puller(client, "PAYMENTS", "ful")
        await puller.start()
        return [await puller.fetch(batch, timeout) for _ in range(times)]

    return asyncio.run(run())


@pytest.mark.parametrize("code", ["503", "abc", "404", "408", "409", "100", "200"])
def test_a_stream_message_with_a_status_header_is_delivered_with_its_batch(code: str) -> None:
    messages = [stream_message(1), stream_message(2, {"Status": code, "Description": "x"}),
                stream_message(3), status("404", "No Messages")]
    [batch] = fetch(FakeClient(messages))
    assert [m.metadata.sequence.stream for m in batch] == [1, 2, 3]


def test_the_request_asks_for_the_batch_without_waiting_once_messages_are_there() -> None:
    client = FakeClient([stream_message(1), status("404")])
    fetch(client, batch=50, timeout=1.0)
    [(subject, request, reply)] = client.requests
    assert subject == "$JS.API.CONSUMER.MSG.NEXT.PAYMENTS.ful" and reply == "_INBOX.test.1"
    assert client.subscribed == "_INBOX.test.*"
    assert request == {"batch": 50, "no_wait": True, "expires": 1_000_000_000 - 100_000}


def test_heartbeats_are_skipped_and_a_timeout_gives_an_empty_batch() -> None:
    assert fetch(FakeClient([status("100", "Idle Heartbeat")]), timeout=0.05) == [[]]
    assert fetch(FakeClient([status("408", "Request Timeout")])) == [[]]


def test_an_error_status_before_any_message_raises_after_one_the_batch_is_kept() -> None:
    with pytest.raises(PullFailed, match=r"status 503 .No Responders"):
        fetch(FakeClient([status("503", "No Responders")]))
    [batch] = fetch(FakeClient([stream_message(1), status("503")]))
    assert len(batch) == 1


def test_messages_after_their_requests_end_open_the_next_batch() -> None:
    # A batch of 2 filled; the third message waits, the stale 404 is dropped.
    client = FakeClient([stream_message(1), stream_message(2), stream_message(3), status("404")],
                        [status("404")])
    first, second = fetch(client, batch=2, times=2)
    assert [len(first), len(second)] == [2, 1]
    assert client.requests[1][1] == {"batch": 1, "no_wait": True}  # answered at once
    assert not is_stream_message(status("503")) and is_stream_message(stream_message(1))


def test_a_refused_pull_request_is_a_failure_not_an_empty_poll() -> None:
    # Review 54-m F-1: a durable answering 409 (a batch over its max pull batch, a deleted
    # durable) ended each request at once, and the consumer asked again without a pause.
    with pytest.raises(PullFailed, match=r"status 409 .Exceeded MaxRequestBatch of 5"):
        fetch(FakeClient([status("409", "Exceeded MaxRequestBatch of 5")]))
    [batch] = fetch(FakeClient([stream_message(1), status("409", "Leadership Change")]))
    assert len(batch) == 1


def test_a_late_status_of_an_earlier_request_does_not_end_the_current_one() -> None:
    # Review 54-m F-4: the first request's 408 came after its timeout, during the second
    # request, and ended that one with nothing; it is told by its reply subject now.
    client = FakeClient([], [status("408", "Request Timeout", subject="_INBOX.test.1"),
                             stream_message(5), status("404")])
    first, second = fetch(client, timeout=0.05, times=2)
    assert first == [] and [m.metadata.sequence.stream for m in second] == [5]
    assert [reply for _, _, reply in client.requests] == ["_INBOX.test.1", "_INBOX.test.2"]
