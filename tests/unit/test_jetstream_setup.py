"""The JetStream consumer's start: filter subjects against the stream's, and what a refusal
of the durable's creation says, over a fake of nats-py's JetStream context."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError

from cdc_router.config.nats import subjects_collide
from cdc_router.consumer.jetstream_settings import JetStreamSettings
from cdc_router.consumer.jetstream_setup import subscribe
from cdc_router.errors import JetStreamConsumerError


class FakeJetStream:
    """Stream PAYMENTS (payments.>), FDLQ (fulfillment.dlq), no durable yet; add_consumer
    answers `refusal` when given, as nats-server does."""

    def __init__(self, refusal: Exception | None = None, **stream: Any) -> None:
        self.stream = {"subjects": ["payments.>"], "mirror": None, "sources": None, **stream}
        self.refusal = refusal
        self.added: list[Any] = []

    async def stream_info(self, name: str) -> Any:
        return SimpleNamespace(config=SimpleNamespace(name=name, **self.stream))

    async def find_stream_name_by_subject(self, subject: str) -> str:
        return "FDLQ"

    async def consumer_info(self, stream: str, durable: str) -> Any:
        raise NotFoundError

    async def add_consumer(self, stream: str, config: Any) -> None:
        if self.refusal is not None:
            raise self.refusal
        self.added.append(config)

    async def pull_subscribe_bind(self, durable: str, stream: str) -> str:
        return "subscription"


def settings(*filters: str) -> JetStreamSettings:
    return JetStreamSettings(url="nats://x:4222", stream="PAYMENTS", durable="ful",
                             dead_letter_subject="fulfillment.dlq", filter_subjects=filters)


def refusal_of(js: FakeJetStream, wanted: JetStreamSettings) -> str:
    with pytest.raises(JetStreamConsumerError) as caught:
        asyncio.run(subscribe(js, wanted))
    return str(caught.value)


def test_a_filter_subject_outside_the_stream_names_the_setting_and_the_streams_subjects() -> None:
    # QA 49-a F3: JetStream's 10093 came out as "... is JetStream enabled?".
    js = FakeJetStream()
    assert refusal_of(js, settings("payments.confirmed", "orders.x")) == (
        "JetStreamSettings: field 'filter_subjects': 'orders.x' is not captured by stream "
        "'PAYMENTS' (its subjects: payments.>): give subjects of that stream, or another stream")
    assert js.added == []


@pytest.mark.parametrize("filters", [(), ("payments.confirmed",), ("payments.*",), ("payments.>",),
                                     ("*.confirmed", "payments.a.>")])
def test_filter_subjects_the_stream_may_hold_create_the_durable(filters: tuple[str, ...]
                                                                ) -> None:
    js = FakeJetStream()
    assert asyncio.run(subscribe(js, settings(*filters)))[:2] == ("subscription", "FDLQ")
    assert len(js.added) == 1


def test_a_mirror_is_not_checked_against_subjects_it_does_not_hold() -> None:
    js = FakeJetStream(subjects=None, mirror=SimpleNamespace(name="ORIGIN"))
    asyncio.run(subscribe(js, settings("orders.x")))
    assert len(js.added) == 1


def test_a_10093_refusal_names_the_setting_and_does_not_blame_jetstream() -> None:
    # Where the check above passes and the server still refuses (a nats-server that wants a
    # subset, not an overlap).
    js = FakeJetStream(BadRequestError(code=400, err_code=10093, description="consumer "
                                       "filter subject is not a valid subset of the interest "
                                       "subjects"), subjects=["payments.a.*"])
    text = refusal_of(js, settings("payments.*.x"))
    assert "is JetStream enabled" not in text
    assert text.endswith("JetStreamSettings field 'filter_subjects' (payments.*.x) must lie "
                         "within stream 'PAYMENTS''s subjects (payments.a.*)")


def test_only_a_refusal_that_is_not_jetstreams_own_answer_asks_whether_it_is_enabled() -> None:
    bad = refusal_of(FakeJetStream(BadRequestError(code=400, err_code=10084,
                                                   description="x")), settings())
    assert "is JetStream enabled" not in bad
    assert "JetStreamSettings" in bad
    off = refusal_of(FakeJetStream(ServiceUnavailableError(code=503, err_code=10039,
                                                           description="jetstream not "
                                                           "enabled")), settings())
    assert off.endswith("is JetStream enabled?")


@pytest.mark.parametrize(("first", "second", "collide"), [
    ("a.b", "a.b", True), ("a.*", "a.b", True), ("a.>", "a.b.c", True), ("*.b", "a.*", True),
    (">", "x", True), ("a.b", "a.c", False), ("a.>", "a", False), ("a.*", "a.b.c", False),
    ("orders.x", "payments.>", False)])
def test_subjects_collide_when_some_subject_matches_both(first: str, second: str,
                                                         collide: bool) -> None:
    assert subjects_collide(first, second) is collide
    assert subjects_collide(second, first) is collide
