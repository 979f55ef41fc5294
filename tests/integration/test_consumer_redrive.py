"""redrive() on the real stack (QA 67-b F-4): a handler fails for some ids, their letters, the
handler fixed, the redrive: each id's effect once, another group's letters untouched, a letter
that fails again lettered again, and the run ends by itself."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from cdc_router.consumer import ConsumerSettings, IdempotentConsumer, RetryPolicy
from cdc_router.consumer.dedup.postgres import PostgresDedupStore
from cdc_router.consumer.redrive import redrive
from tests.integration.support import StackEndpoints, read_to_end, unique
from tests.integration.test_idempotent_consumer import (  # noqa: F401 (fixtures)
    count,
    effect_table,
    insert_effect,
    run_until,
    schema,
    store,
    topic_and_dead_letter_topic,
)

pytestmark = pytest.mark.integration


def produce_ids(bootstrap: str, topic: str, records: list[tuple[str, list[tuple[str, bytes]]]],
                partition: int = 0) -> None:
    """Records keyed and valued by their id, with `headers` (the id header, or a letter's)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for event_id, headers in records:
        producer.produce(topic, key=event_id.encode(), value=b'{"id": "%s"}' % event_id.encode(),
                         headers=headers, partition=partition)
    assert producer.flush(60) == 0


def test_redrive_runs_this_group_s_letters_once_each_and_ends_by_itself(
        stack: StackEndpoints, schema: str,  # noqa: F811 (fixtures)
        store: PostgresDedupStore) -> None:  # noqa: F811 (fixture)
    bootstrap = stack.bootstrap_servers
    effect_table(stack.postgres_dsn, schema)
    broken = {"e2", "e5", "e7"}

    def handler(event: Any, conn: psycopg.Connection[Any]) -> None:
        insert_effect(schema, event.event_id)(conn)  # rolled back when the handler raises
        if event.event_id in broken:
            raise LookupError(f"{event.event_id} is unknown")

    with topic_and_dead_letter_topic(bootstrap, "redrive", 2) as (topic, dead_letter):
        settings = ConsumerSettings(
            bootstrap_servers=bootstrap, group_id=unique("billing"), topics=(topic,),
            dead_letter_topic=dead_letter,
            retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.05, max_backoff_s=0.1))
        effects = f'SELECT count(*) FROM "{schema}".effects'
        produce_ids(bootstrap, topic, [(f"e{n}", [("id", f"e{n}".encode())]) for n in range(10)])
        run_until(IdempotentConsumer(settings, store, handler),
                  lambda: len(read_to_end(bootstrap, dead_letter)) == 3
                  and count(stack.postgres_dsn, effects) == 7, "3 letters, 7 effects")
        # Another service's letters on the same topic, and one of ours without a group header
        # (written before dlq.consumer.group): not this redrive's.
        produce_ids(bootstrap, dead_letter, [
            ("e3", [("id", b"e3"), ("dlq.event.id", b"e3"), ("dlq.consumer.group", b"other")]),
            ("e4", [("id", b"e4"), ("dlq.event.id", b"e4")])])
        # e5 fixed and sent again meanwhile: the live consumer does it; the redrive skips it.
        broken.discard("e5")
        produce_ids(bootstrap, topic, [("e5", [("id", b"e5")])], partition=1)
        run_until(IdempotentConsumer(settings, store, handler),
                  lambda: count(stack.postgres_dsn, effects) == 8, "e5's later copy done")

        broken.discard("e2")  # the handler fixed, but for e7
        runs: list[Counter[str]] = []
        runner = threading.Thread(target=lambda: runs.append(redrive(settings, store, handler)))
        runner.start()
        runner.join(120)
        assert not runner.is_alive(), "the redrive did not end by itself"
        assert runs[0] == Counter(redriven=1, duplicates=1, dead_lettered=1, other_groups=1,
                               unlabelled=1)
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            done = dict(conn.execute(f'SELECT event_id, count(*) FROM "{schema}".effects '
                                     "GROUP BY event_id").fetchall())
        assert done == {f"e{n}": 1 for n in range(10) if n != 7}  # each once; e7 still broken

        letters = read_to_end(bootstrap, dead_letter)
        assert len(letters) == 6  # 3 + 2 others' + e7's again, with its attempt history
        again = {name: [value for key, value in letters[-1].headers() if key == name]
                 for name in ("dlq.event.id", "dlq.attempts", "dlq.source.topic",
                              "dlq.consumer.group")}
        assert again == {"dlq.event.id": [b"e7", b"e7"], "dlq.attempts": [b"2", b"2"],
                         "dlq.source.topic": [topic.encode(), dead_letter.encode()],
                         "dlq.consumer.group": [settings.group_id.encode()] * 2}

        # A second run starts where the first stopped: e7's new letter alone.
        assert redrive(settings, store, handler) == Counter(dead_lettered=1)
        assert count(stack.postgres_dsn, effects) == 9
