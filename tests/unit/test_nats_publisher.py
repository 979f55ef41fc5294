"""JetStreamPublisher's loop thread: what close() leaves behind; its size check."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from cdc_router.errors import JetStreamError, JetStreamRefused
from cdc_router.nats.publisher import JetStreamPublisher, NatsMessage, failure_cause


def test_close_ends_the_tasks_left_on_its_loop_and_closes_the_loop() -> None:
    # nats-py's close() cancels its subscriptions' readers without waiting for them; a loop
    # stopped with such a task pending warned when the task was collected (CI rehearsals 4-8).
    publisher = JetStreamPublisher("nats://127.0.0.1:1", ack_timeout_s=1, connect_timeout_s=1)
    loop = publisher._started()

    async def start_reader() -> asyncio.Task[bool]:
        return asyncio.get_running_loop().create_task(asyncio.Event().wait())

    reader = asyncio.run_coroutine_threadsafe(start_reader(), loop).result(timeout=5)
    publisher.close()
    assert reader.cancelled()
    assert loop.is_closed()
    publisher.close()  # a second close does nothing


def test_a_message_over_the_servers_max_payload_with_its_headers_is_refused_unsent() -> None:
    # QA 54-d F-1: nats-py checks the data alone; the server closed the connection on it.
    publisher = JetStreamPublisher("nats://127.0.0.1:1", ack_timeout_s=1, connect_timeout_s=1)
    publisher._client = SimpleNamespace(max_payload=200)
    fits = NatsMessage("a.b", b"x" * 100, {"h": "v"}, "id-1")
    publisher._oversize([fits])  # 100 + 12 + 11 + 4 + 4 + 1 + 1 + 4 = 137 bytes
    over = NatsMessage("a.b", b"x" * 150, {"event-type": "y" * 20}, "id-2")
    with pytest.raises(JetStreamRefused) as refused:
        publisher._oversize([fits, over])
    assert list(refused.value.refused) == [1]
    assert "the 215-byte message (headers and data) for a.b: over the server's max_payload " \
           "(200)" in refused.value.refused[1]


def test_an_ack_naming_another_stream_than_the_configs_fails_the_batch() -> None:
    # QA 54-d F-4: a subject moved to another stream while the router ran was stored there.
    asked: list[str] = []

    def stream_of(subject: str) -> str | None:
        asked.append(subject)
        return {"a.b": "A"}.get(subject)

    publisher = JetStreamPublisher("nats://127.0.0.1:1", ack_timeout_s=1, connect_timeout_s=1,
                                   stream_of=stream_of)
    ok = [NatsMessage("a.b", b"", {}, f"id-{i}") for i in range(3)] + [
        NatsMessage("other", b"", {}, "id-x")]
    publisher._check_streams(ok, [SimpleNamespace(stream="A")] * 3
                             + [SimpleNamespace(stream="Z")])
    assert asked == ["a.b", "other"]  # once a subject
    with pytest.raises(JetStreamError, match=r"in stream B, not in A as nats\.streams says"):
        publisher._check_streams(ok[:1], [SimpleNamespace(stream="B")])


@pytest.mark.parametrize(("description", "named"), [
    ("maximum messages per subject exceeded", "max_msgs_per_subject"),
    ("maximum messages exceeded", "or raise its max_msgs"),
    ("maximum bytes exceeded", "or raise its max_bytes")])
def test_a_full_stream_names_the_limit_it_hit(description: str, named: str) -> None:
    # QA 54-d F-3: the per-subject limit was told to raise max_msgs/max_bytes.
    from cdc_router.nats.publisher import _full_hint, stream_full

    error = SimpleNamespace(err_code=10077, description=description)
    assert stream_full(error)  # type: ignore[arg-type]
    assert named in _full_hint(error, "PAY")  # type: ignore[arg-type]


def test_a_stream_full_per_subject_is_told_to_lift_the_limit_before_streams_apply() -> None:
    # Review 54-m F-2: `streams apply` first (discard old) under a per-subject limit deletes
    # each subject's oldest message at every publish, consumed or not; the stream was unnamed.
    from cdc_router.nats.publisher import _full_hint

    error = SimpleNamespace(err_code=10077, description="maximum messages per subject exceeded")
    hint = _full_hint(error, "PAY")  # type: ignore[arg-type]
    assert hint.index("nats stream edit PAY --max-msgs-per-subject=-1") < hint.index(
        "then run `cdc-router streams apply")


def test_a_batch_whose_every_ack_timed_out_asks_whether_nats_server_answers() -> None:
    # QA 60-a F-4: nats-server stopped (SIGSTOP) keeps its connection, so no disconnect is
    # said; every publish times out, and the line said only "TimeoutError: nats: timeout".
    from nats.errors import TimeoutError as NatsTimeout

    publisher = JetStreamPublisher("nats://127.0.0.1:1", ack_timeout_s=2.5, connect_timeout_s=1)
    publisher._client = SimpleNamespace(max_payload=1_000_000)
    answered: list[str] = []

    class Hung:
        async def publish(self, subject: str, data: bytes, **_: object) -> object:
            if subject in answered:
                return SimpleNamespace(stream="S", duplicate=False)
            raise NatsTimeout

    async def connected() -> Hung:
        return Hung()

    publisher._connected = connected  # type: ignore[method-assign]
    messages = [NatsMessage("a.b", b"{}", {}, "id-1"), NatsMessage("a.c", b"{}", {}, "id-2")]
    with pytest.raises(JetStreamError) as hung:
        asyncio.run(publisher._publish_all(messages))
    assert str(hung.value).endswith(
        "nats: timeout; no acknowledgement within nats.ack_timeout_ms (2500 ms): is nats-server "
        "answering (hung, overloaded, or cut off with the connection still open)? See its log "
        "and its /healthz; raise nats.ack_timeout_ms for a slow server")
    answered.append("a.c")  # one acknowledged: no such question
    with pytest.raises(JetStreamError) as one:
        asyncio.run(publisher._publish_all(messages))
    assert str(one.value).endswith("TimeoutError: nats: timeout"), str(one.value)


def test_a_batch_refused_for_full_jetstream_storage_says_what_makes_room() -> None:
    # QA 65-b: with nats-server's max_file_store reached every batch failed for good with
    # "code=503 err_code=10023 description='insufficient resources'" and nothing else.
    from nats.js.errors import ServiceUnavailableError

    publisher = JetStreamPublisher("nats://127.0.0.1:1", ack_timeout_s=1, connect_timeout_s=1)
    publisher._client = SimpleNamespace(max_payload=1_000_000)

    class Full:
        async def publish(self, subject: str, data: bytes, **_: object) -> object:
            raise ServiceUnavailableError(code=503, err_code=10023,
                                          description="insufficient resources")

    async def connected() -> Full:
        return Full()

    publisher._connected = connected  # type: ignore[method-assign]
    with pytest.raises(JetStreamError) as full:
        asyncio.run(publisher._publish_all([NatsMessage("a.b", b"{}", {}, "id-1")]))
    assert "insufficient resources'; JetStream's storage is full (nats-server's jetstream " \
           "max_file_store" in str(full.value)
    assert "`cdc-router streams apply -c <config>`" in str(full.value)
    assert failure_cause(full.value) == "jetstream_storage_full"  # the abort's metric label
