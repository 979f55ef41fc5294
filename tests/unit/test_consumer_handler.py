"""What the consumers take for a handler and what a handler's failures do (review 52-c):
wiring refused at construction (F-med-6, F-HIGH-11), an awaitable returned or a BaseException
raised at run time as that record's failure (F-HIGH-11, F-med-14), an exception whose __str__
or __repr__ raises rendered, not a crash (F-HIGH-13); on the Kafka and the JetStream
consumer."""

from __future__ import annotations

import asyncio
import functools
import warnings
from typing import Any

import pytest

from cdc_router.consumer import ConsumedEvent, ConsumerSettings, IdempotentConsumer
from cdc_router.consumer.dedup import DedupKey, MemoryDedupStore
from cdc_router.consumer.jetstream import JetStreamConsumer
from cdc_router.errors import ConfigError
from tests.unit.consumer_fakes import DLQ, TOPIC, Harness, dlq_headers, rec, run_poisoned
from tests.unit.test_jetstream_consumer import SETTINGS, payment
from tests.unit.test_jetstream_consumer import Harness as JetStreamHarness

KAFKA = ConsumerSettings(bootstrap_servers="b:9092", group_id="g", topics=(TOPIC,),
                         dead_letter_topic=DLQ)


def build(transport: str, store: Any, handler: Any, decoder: Any = None,
          settings: Any = None) -> Any:
    if transport == "kafka":
        return IdempotentConsumer(KAFKA if settings is None else settings, store, handler,
                                  decoder=decoder)
    return JetStreamConsumer(SETTINGS if settings is None else settings, store, handler,
                             decoder=decoder)


def ok(event: ConsumedEvent, context: Any) -> None:
    pass


async def shipped(event: ConsumedEvent, context: Any) -> None:
    raise AssertionError("an async handler's body must never be reached")


class AsyncCall:
    async def __call__(self, event: ConsumedEvent, context: Any) -> None:
        pass


def with_yield(event: ConsumedEvent, context: Any) -> Any:
    yield event


def one_argument(event: ConsumedEvent) -> None:
    pass


# --- F-med-6, F-HIGH-11: wiring refused at construction, in one line naming the argument ----


@pytest.mark.parametrize("transport", ["kafka", "jetstream"])
@pytest.mark.parametrize(("field", "store", "handler", "decoder", "words"), [
    ("store", None, ok, None, "must be a dedup store"),
    ("store", "postgresql://x", ok, None, "must be a dedup store"),
    ("handler", MemoryDedupStore(), None, None, "must be a function handler(event, context)"),
    ("handler", MemoryDedupStore(), "ship", None, "must be a function"),
    ("handler", MemoryDedupStore(), one_argument, None, "must take two arguments"),
    ("handler", MemoryDedupStore(), shipped, None, "an `async def` handler is never awaited"),
    ("handler", MemoryDedupStore(), functools.partial(shipped), None, "never awaited"),
    ("handler", MemoryDedupStore(), AsyncCall(), None, "never awaited"),
    ("handler", MemoryDedupStore(), with_yield, None, "not a generator function"),
    ("decoder", MemoryDedupStore(), ok, b"json", "must be None or a function"),
])
def test_a_consumer_that_cannot_run_its_handler_is_refused_at_construction(
        transport: str, field: str, store: Any, handler: Any, decoder: Any, words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        build(transport, store, handler, decoder)
    text = str(refused.value)
    assert f"field '{field}'" in text and words in text and "\n" not in text
    assert text.startswith("IdempotentConsumer" if transport == "kafka" else "JetStreamConsumer")


@pytest.mark.parametrize("transport", ["kafka", "jetstream"])
def test_settings_of_the_wrong_type_are_refused_in_one_line(transport: str) -> None:
    with pytest.raises(ConfigError, match="field 'settings': must be a"):
        build(transport, MemoryDedupStore(), ok, settings={"group_id": "g"})


def _with_db(handle: Any) -> Any:
    """A decorator that supplies the handler's first argument (reread 52-l F1: its wrapper
    was refused, inspect.signature reading the wrapped function's three arguments)."""
    @functools.wraps(handle)
    def wrapper(event: Any, context: Any) -> None:
        handle("db", event, context)
    return wrapper


@_with_db
def _decorated(db: str, event: Any, context: Any) -> None:
    pass


@pytest.mark.parametrize("handler", [print, lambda *args: None, lambda event, context=None:
                                     None, functools.partial(lambda a, b, c: None, 1),
                                     _decorated])
def test_a_handler_that_can_take_event_and_context_or_whose_signature_is_unknown_is_taken(
        handler: Any) -> None:
    for transport in ("kafka", "jetstream"):
        build(transport, MemoryDedupStore(), handler)


# --- F-HIGH-11: an awaitable returned at run time is the record's failure, never done ------


async def effect(event: ConsumedEvent) -> None:
    raise AssertionError("never awaited, never run")


def returns_a_coroutine(event: ConsumedEvent, context: Any) -> Any:
    return effect(event)  # a def hiding an async one: only run time shows it


def test_kafka_a_handler_returning_an_awaitable_is_dead_lettered_never_marked_done() -> None:
    store = MemoryDedupStore()
    h = Harness({0: [rec("a")]}, store=store, handler=returns_a_coroutine)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "coroutine ... was never awaited" left behind
        h.run()
    [dead] = h.producer.sent
    headers = dlq_headers(dead)
    assert (headers["dlq.stage"], headers["dlq.error.class"], headers["dlq.attempts"]) == \
        ("handle", "TypeError", "3")
    assert "returned coroutine 'effect'" in headers["dlq.error.message"]
    assert "effect did not happen" in headers["dlq.error.message"]
    assert not store.is_done(DedupKey("fulfillment", "a"))
    assert h.loop.stats.processed == 0 and h.loop.stats.dead_lettered == 1


def test_jetstream_a_handler_returning_an_awaitable_is_naked_then_dead_lettered() -> None:
    store = MemoryDedupStore()
    harness = JetStreamHarness(returns_a_coroutine, store=store)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        headers = harness.dead_letter_of("e1")
    assert headers["dlq.error.class"] == "TypeError" and "never runs" in \
        headers["dlq.error.message"]
    assert not store.is_done(DedupKey("fulfillment", "e1"))
    assert harness.consumer.stats.processed == 0


# --- F-med-14: a BaseException that asks no stop is the record's failure -------------------


@pytest.mark.parametrize("raised", [asyncio.CancelledError(), GeneratorExit()])
def test_kafka_a_cancelled_error_from_the_handler_is_that_record_s_failure(
        raised: BaseException) -> None:
    h, headers = run_poisoned(raised)
    assert (headers["dlq.error.class"], headers["dlq.attempts"]) == ("HandlerAborted", "3")
    assert headers["dlq.error.message"].startswith(
        f"the handler raised {type(raised).__name__} (a BaseException, not an Exception)")
    assert h.kafka.committed == {0: 2}


def test_jetstream_a_cancelled_error_from_the_handler_is_that_record_s_failure() -> None:
    def handler(event: ConsumedEvent, _: Any) -> None:
        raise asyncio.CancelledError("inner task cancelled")

    harness = JetStreamHarness(handler)
    headers = harness.dead_letter_of("e1")
    assert headers["dlq.error.class"] == "HandlerAborted"
    assert "CancelledError" in headers["dlq.error.message"]
    assert "inner task cancelled" in headers["dlq.error.message"]


def test_kafka_a_cancelled_error_from_the_decoder_dead_letters_its_record() -> None:
    _, headers = run_poisoned(asyncio.CancelledError(), in_decoder=True)
    assert (headers["dlq.stage"], headers["dlq.error.class"]) == ("decode", "CancelledError")


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_a_request_to_stop_the_process_still_ends_run_and_marks_nothing(
        raised: type[BaseException]) -> None:
    store = MemoryDedupStore()

    def handler(event: ConsumedEvent, _: Any) -> None:
        raise raised()

    h = Harness({0: [rec("a")]}, store=store, handler=handler)
    with pytest.raises(raised):
        h.run()
    assert h.producer.sent == [] and h.kafka.committed == {} and h.kafka.closed
    assert not store.is_done(DedupKey("fulfillment", "a"))
    harness = JetStreamHarness(handler)
    with pytest.raises(raised):
        harness.handle(payment("e1"))
    assert harness.js.published == []


def test_a_store_used_directly_never_marks_done_an_effect_that_returned_an_awaitable() -> None:
    store, key = MemoryDedupStore(), DedupKey("fulfillment", "e1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="returned coroutine 'effect'"):
            store.run_once(key, lambda context: effect(None))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="returned generator"):
            store.run_once(key, lambda context: (yield))
    assert not store.is_done(key)
