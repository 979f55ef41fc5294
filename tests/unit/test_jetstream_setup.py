"""The JetStream consumer's start: filter subjects against the stream's, and what a refusal
of the durable's creation says, over a fake of nats-py's JetStream context."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError

from cdc_router.config.nats_subjects import subjects_collide
from cdc_router.consumer.jetstream_settings import JetStreamSettings
from cdc_router.consumer.jetstream_setup import subscribe
from cdc_router.errors import JetStreamConsumerError


class FakeJetStream:
    """Stream PAYMENTS (payments.>), FDLQ (fulfillment.dlq), no durable yet; add_consumer
    answers `refusal` when given, as nats-server does."""

    def __init__(self, refusal: Exception | None = None, drops_filter_subjects: bool = False,
                 **stream: Any) -> None:
        self.stream = {"subjects": ["payments.>"], "mirror": None, "sources": None, **stream}
        self.refusal = refusal
        # nats-server 2.9: ConsumerConfig.filter_subjects is unknown, the durable filters nothing
        self.drops_filter_subjects = drops_filter_subjects
        self.added: list[Any] = []
        self.deleted: list[str] = []

    async def stream_info(self, name: str) -> Any:
        return SimpleNamespace(config=SimpleNamespace(name=name, **self.stream))

    async def find_stream_name_by_subject(self, subject: str) -> str:
        return "FDLQ"

    async def consumer_info(self, stream: str, durable: str) -> Any:
        raise NotFoundError

    async def add_consumer(self, stream: str, config: Any) -> Any:
        if self.refusal is not None:
            raise self.refusal
        self.added.append(config)
        if self.drops_filter_subjects:
            config = replace(config, filter_subjects=None)
        return SimpleNamespace(config=config)

    async def delete_consumer(self, stream: str, durable: str) -> None:
        self.deleted.append(durable)


def settings(*filters: str) -> JetStreamSettings:
    return JetStreamSettings(url="nats://x:4222", stream="PAYMENTS", durable="ful",
                             dead_letter_subject="fulfillment.dlq", filter_subjects=filters)


def refusal_of(js: FakeJetStream, wanted: JetStreamSettings, version: Any = None) -> str:
    with pytest.raises(JetStreamConsumerError) as caught:
        asyncio.run(subscribe(js, wanted, version))
    return str(caught.value)


def version(text: str) -> Any:
    major, minor, patch = (int(part) for part in text.split("."))
    return SimpleNamespace(major=major, minor=minor, patch=patch)


def test_several_filter_subjects_on_a_server_before_2_10_are_refused_before_any_durable(
        ) -> None:
    # QA 49-a F8: nats-server 2.9.10 ignored filter_subjects and made a durable of the whole
    # stream: the handler ran on every message of it.
    js = FakeJetStream()
    text = refusal_of(js, settings("payments.a", "payments.b"), version("2.9.10"))
    assert text == (
        "JetStreamSettings: field 'filter_subjects': 2 subjects (payments.a, payments.b) need "
        "nats-server 2.10 or later, and the server's version is 2.9.10 (it ignores them and "
        "would deliver the whole stream 'PAYMENTS'): give one subject per consumer (one "
        "subject with wildcards, or one consumer per subject), or upgrade nats-server")
    assert js.added == []


def test_a_durable_the_server_made_without_the_filters_is_deleted_and_refused() -> None:
    # The version unknown (or a server that says 2.10 and still drops the field): what the
    # server answers for the durable is checked, before it delivers anything.
    js = FakeJetStream(drops_filter_subjects=True)
    text = refusal_of(js, settings("payments.a", "payments.b"))
    assert text.startswith("JetStreamSettings: field 'filter_subjects': 2 subjects (payments.a, "
                           "payments.b) need nats-server 2.10 or later, and the server's "
                           "version is unknown")
    assert text.endswith("the server created durable 'ful' that filters the whole stream, the "
                         "settings say ['payments.a', 'payments.b'], and it was deleted again")
    assert js.deleted == ["ful"]


@pytest.mark.parametrize("server", ["2.10.0", "2.11.3"])
def test_several_filter_subjects_on_2_10_or_later_create_the_durable(server: str) -> None:
    js = FakeJetStream()
    asyncio.run(subscribe(js, settings("payments.a", "payments.b"), version(server)))
    assert js.added[0].filter_subjects == ["payments.a", "payments.b"]
    assert js.deleted == []


def test_one_filter_subject_on_an_old_server_creates_the_durable() -> None:
    js = FakeJetStream()
    asyncio.run(subscribe(js, settings("payments.a"), version("2.9.10")))
    assert js.added[0].filter_subject == "payments.a"


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
    assert asyncio.run(subscribe(js, settings(*filters)))[0] == "FDLQ"
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


def test_a_durable_deleted_while_running_stops_with_exit_75() -> None:
    # QA 65-b: `nats consumer rm` under a running consumer stopped it with exit 1, though its
    # own line says that starting it again mends it: a supervisor restarting on 75 (the
    # consumer README's convention for "a restart may cure it") left the service down.
    from cdc_router.consumer.jetstream_setup import check_durable

    with pytest.raises(JetStreamConsumerError, match="was deleted while this consumer ran: "
                       "start it again") as stopped:
        asyncio.run(check_durable(FakeJetStream(), settings()))
    assert stopped.value.exit_code == 75
