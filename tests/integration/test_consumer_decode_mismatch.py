"""A JSON decoder on a topic of the router's Avro wire format, on the real stack (QA 66-a F-6:
43,700 letters in 50 s, each offset committed): run() stops with a ConfigError naming the
topic and the decoder, no letter written, no offset committed; with decode_mismatch_limit=0
each record is a letter, as before."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from cdc_router.consumer import ConsumedEvent, ConsumerSettings, IdempotentConsumer
from cdc_router.consumer.dedup import MemoryDedupStore
from cdc_router.errors import ConfigError
from cdc_router.serde.json import parse_json
from tests.integration.support import StackEndpoints, read_topic, unique
from tests.integration.test_consumer_registry import wire_format
from tests.integration.test_idempotent_consumer import (
    offsets,
    produce,
    topic_and_dead_letter_topic,
    wait_until,
)

pytestmark = pytest.mark.integration

RECORDS = 150
NOT_COMMITTED = -1001


@pytest.fixture
def topics(stack: StackEndpoints) -> Iterator[tuple[str, str]]:
    with topic_and_dead_letter_topic(stack.bootstrap_servers, "avro_as_json", 2) as pair:
        yield pair


def _consumer(stack: StackEndpoints, topic: str, dead_letter: str, group: str,
              effects: list[ConsumedEvent], **settings: int) -> IdempotentConsumer[None]:
    return IdempotentConsumer(
        ConsumerSettings(bootstrap_servers=stack.bootstrap_servers, group_id=group,
                         topics=(topic,), dead_letter_topic=dead_letter, **settings),
        MemoryDedupStore(), lambda event, _: effects.append(event), decoder=parse_json)


def test_a_json_decoder_on_an_avro_topic_stops_with_a_config_error_and_letters_nothing(
        stack: StackEndpoints, topics: tuple[str, str]) -> None:
    topic, dead_letter = topics
    produce(stack.bootstrap_servers, topic,
            [(f"evt-{i}".encode(), wire_format(7, f"pay-{i}"), i % 2) for i in range(RECORDS)])
    group = unique("mismatch")
    effects: list[ConsumedEvent] = []
    consumer = _consumer(stack, topic, dead_letter, group, effects)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            consumer.run()
        except BaseException as error:  # the test reads it
            raised.append(error)

    runner = threading.Thread(target=run)
    runner.start()
    runner.join(timeout=120)
    if runner.is_alive():  # the old code dead-letters them all and runs on
        consumer.stop()
        runner.join(timeout=60)
    assert raised and isinstance(raised[0], ConfigError), raised
    text = str(raised[0])
    assert f"the first 100 records of topic {topic!r} all failed to decode with the decoder " \
           "parse_json" in text, text
    assert "schema id 7" in text and "PayloadDecoder" in text, text
    assert effects == []
    assert read_topic(stack.bootstrap_servers, dead_letter, 1, timeout_s=5) == []
    committed, ends = offsets(stack.bootstrap_servers, group, topic, 2)
    assert sum(ends) == RECORDS
    assert all(offset in (NOT_COMMITTED, 0) for offset in committed), committed

    # The opt-out: each record its letter, every offset committed (the old behaviour).
    letters_consumer = _consumer(stack, topic, dead_letter, group, effects,
                                 decode_mismatch_limit=0)
    runner = threading.Thread(target=letters_consumer.run)
    runner.start()
    try:
        wait_until(lambda: offsets(stack.bootstrap_servers, group, topic, 2)[0] == ends, 120,
                   "every offset committed")
    finally:
        letters_consumer.stop()
        runner.join(timeout=60)
    assert len(read_topic(stack.bootstrap_servers, dead_letter, RECORDS, timeout_s=30)) == RECORDS
    assert effects == []
