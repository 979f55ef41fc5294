"""A handler's or a decoder's exception whose __str__ or __repr__ raises is rendered
`<unprintable ClassName>`, and its record retried and dead-lettered as any other, on the Kafka
and the JetStream consumer (review 52-c F-HIGH-13: run() crashed at the dead letter, or at the
retry's log line, and again after every restart)."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_router.consumer import ConsumedEvent
from cdc_router.consumer.dead_letter import dead_letter_headers
from cdc_router.dead_letter import reason_of, shown_error, shown_repr
from cdc_router.errors import RetriableError
from cdc_router.nats.connection import error_text
from tests.unit.consumer_fakes import TOPIC, Harness, rec, run_poisoned
from tests.unit.test_jetstream_consumer import Harness as JetStreamHarness
from tests.unit.test_jetstream_consumer import payment

# --- F-HIGH-13: an exception that cannot be printed is rendered, never a crash -------------


class OrderRejected(Exception):
    """An exception class with a bug in its __str__ (the payload has 'order_id', not 'id')."""

    def __init__(self, order: dict[str, Any]) -> None:
        super().__init__()
        self.order = order

    def __str__(self) -> str:
        return f"order {self.order['id']} rejected"


class ReprBroken(ValueError):
    def __repr__(self) -> str:
        raise KeyError("id")


class Unprintable(RetriableError):
    def __str__(self) -> str:
        raise KeyError("id")

    def __repr__(self) -> str:
        raise KeyError("id")


def test_the_renderers_survive_a_failing_str_and_repr() -> None:
    error = OrderRejected({"order_id": 1})
    assert shown_error(error) == "<unprintable OrderRejected>"
    assert reason_of(error) == "<unprintable OrderRejected>"
    assert shown_repr(Unprintable()) == "<unprintable Unprintable>"
    assert error_text(Unprintable()) == "Unprintable: <unprintable Unprintable>"
    assert shown_error(ValueError("fine")) == "fine"


@pytest.mark.parametrize("raised", [OrderRejected({"order_id": 7}), ReprBroken("no repr")])
def test_kafka_a_handler_exception_that_cannot_be_printed_is_retried_and_dead_lettered(
        raised: Exception) -> None:
    h, headers = run_poisoned(raised)
    assert (headers["dlq.error.class"], headers["dlq.attempts"]) == \
        (type(raised).__name__, "3")
    assert headers["dlq.error.message"] == shown_error(raised)
    assert h.kafka.committed == {0: 2}


def test_kafka_a_retriable_error_that_cannot_be_printed_is_retried() -> None:
    failures = iter(range(2))

    def handler(event: ConsumedEvent, _: Any) -> None:
        if next(failures, None) is not None:
            raise Unprintable()
        h.effects.append(event)

    h = Harness({0: [rec("a")]}, handler=handler)
    h.run()
    assert [event.event_id for event in h.effects] == ["a"]
    assert h.loop.stats.retries == 2


def test_kafka_a_decoder_exception_that_cannot_be_printed_dead_letters_the_record() -> None:
    _, headers = run_poisoned(OrderRejected({}), in_decoder=True)
    assert (headers["dlq.stage"], headers["dlq.error.class"]) == ("decode", "OrderRejected")
    assert headers["dlq.error.message"] == \
        "value cannot be decoded: OrderRejected: <unprintable OrderRejected>"


@pytest.mark.parametrize("raised", [OrderRejected({"order_id": 7}), ReprBroken("no repr")])
def test_jetstream_a_handler_exception_that_cannot_be_printed_is_dead_lettered(
        raised: Exception) -> None:
    def handler(event: ConsumedEvent, _: Any) -> None:
        raise raised

    harness = JetStreamHarness(handler)
    headers = harness.dead_letter_of("e1")
    assert headers["dlq.error.message"] == shown_error(raised)


def test_jetstream_a_retriable_error_that_cannot_be_printed_is_naked() -> None:
    def handler(event: ConsumedEvent, _: Any) -> None:
        raise Unprintable()

    harness = JetStreamHarness(handler)
    [(told, _delay)] = harness.handle(payment("e1"))
    assert told == "nak" and harness.js.published == []


def test_a_dead_letter_s_headers_of_an_unprintable_error() -> None:
    class Record:
        def topic(self) -> str: return TOPIC
        def partition(self) -> int: return 0
        def offset(self) -> int: return 5

    headers = dict(dead_letter_headers(Record(), stage="handle",  # type: ignore[arg-type]
                                       error=OrderRejected({}), attempts=3))
    assert headers["dlq.error.message"] == b"<unprintable OrderRejected>"
