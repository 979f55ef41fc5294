"""`dlq replay` of a letter whose value was left out for size (QA 57-b F-1): no command
delivered such an event. The replay now reads its raw record again at its dlq.source.*
coordinates while the raw topic keeps it; when that is gone, its note names the one path left."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from confluent_kafka import KafkaError, TopicPartition

from cdc_router.dead_letter import dead_letter
from cdc_router.errors import RouteError
from cdc_router.router import dlq_raw, dlq_replay
from cdc_router.router.dlq_letters import Letter, Selection, read_letter
from cdc_router.router.dlq_raw import refilled
from tests.unit.router_fakes import DLQ, RAW, FakeCluster, Stored, raw_event
from tests.unit.test_dlq_replay import CHANGELOG, CUSTOMERS, replayer

VALUE = raw_event("e-big", aggregate_type="Customer", payload='{"pad": "' + "x" * 300 + '"}')


def _letter(event_id: str = "e-big", *, topic: str = RAW, offset: int = 7,
            max_bytes: int | None = 200) -> Letter:
    made = dead_letter(topic=topic, partition=0, offset=offset, key=event_id.encode(),
                       value=VALUE, original_headers=[], stage="route",
                       error=RouteError("payload of 360 bytes is over "
                                        "delivery.max_payload_bytes (200)"),
                       event_id=event_id, max_bytes=max_bytes, group="g")
    return read_letter(0, offset, 1, made.key, made.value, list(made.headers))


class Reader:
    def __init__(self, records: dict[tuple[str, int, int], bytes]) -> None:
        self.records, self.asked, self.closed = records, list[tuple[str, int, int]](), False

    def __call__(self, topic: str, partition: int, offset: int) -> bytes | None:
        self.asked.append((topic, partition, offset))
        return self.records.get((topic, partition, offset))

    def close(self) -> None:
        self.closed = True


def test_a_letter_without_its_value_gets_its_raw_record_read_again() -> None:
    dropped = _letter()
    assert dropped.value_dropped and dropped.value is None
    whole = _letter("e-small", offset=8, max_bytes=None)
    relay = _letter("e-relay", topic="public.outbox", offset=9)
    theirs = replace(_letter("e-theirs", offset=10), source_group="other")
    made: list[Reader] = []

    def reader() -> Reader:
        made.append(Reader({(RAW, 0, 7): VALUE}))
        return made[0]

    out = refilled([dropped, whole, relay, theirs], reader,
                   lambda topic, group: group == "g", "public.outbox")
    assert out[0] == replace(dropped, value=VALUE, value_dropped=False)
    assert out[1:] == [whole, relay, theirs]  # whole, the relay's (its row), another pipeline's
    assert len(made) == 1 and made[0].asked == [(RAW, 0, 7)] and made[0].closed
    # Nothing to read again: no reader is made.
    assert refilled([whole], lambda: pytest.fail("made"), lambda *_: True, None) == [whole]
    # Gone from the raw topic (retention): the letter stays as it was.
    assert refilled([dropped], lambda: Reader({}), lambda *_: True, None) == [dropped]


def _cluster() -> FakeCluster:
    cluster = FakeCluster(partitions={RAW: 1, CUSTOMERS: 3, DLQ: 1, CHANGELOG: 1})
    made = dead_letter(topic=RAW, partition=0, offset=7, key=b"e-big", value=VALUE,
                       original_headers=[], stage="route", error=RouteError("too big"),
                       event_id="e-big", max_bytes=200, group="g")
    cluster.publish(DLQ, [Stored(DLQ, 0, made.key, made.value, list(made.headers), None)])
    return cluster


def test_dlq_replay_delivers_a_letter_dropped_for_size_from_its_raw_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reader = Reader({(RAW, 0, 7): VALUE})
    monkeypatch.setattr(dlq_replay, "RawRecords", lambda config: reader)
    cluster = _cluster()
    replay = replayer(cluster, max_payload_bytes=4_000_000)  # the limit raised
    result = replay.apply(replay.plan(Selection(ids=frozenset({"e-big"}))))
    assert result.committed == {"deliver": 1} and reader.closed
    [delivered] = cluster.committed(CUSTOMERS)
    assert delivered.key == b"e-big" and b"x" * 300 in delivered.value
    assert replayer(cluster).plan(Selection()).counts() == {"already_delivered": 1}


def test_a_letter_whose_raw_record_is_gone_names_the_one_path_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dlq_replay, "RawRecords", lambda config: Reader({}))
    [planned] = replayer(_cluster(), max_payload_bytes=4_000_000).plan(Selection()).planned
    assert planned.action == "not_replayable"
    assert planned.note == (
        f"its value was left out (dlq.value.dropped.bytes) and its raw record {RAW}[0]@7 is no "
        "longer on the raw topic (deleted by its retention, or unreadable: see the "
        "event=dlq_value_unread line): its row stays in the outbox (the cleanup deletes "
        "delivered rows only); insert it again under a new id, and delete the old row (its own "
        "id is dropped as a replay)")


class _Refused:
    """A consumed message carrying `code`, as librdkafka hands a fetch's error."""

    def __init__(self, code: int) -> None:
        self.code = code

    def error(self) -> KafkaError:
        return KafkaError(self.code, "refused")


class _ErrorConsumer:
    def __init__(self, code: int) -> None:
        self.code, self.polls = code, 0

    def assign(self, partitions: list[TopicPartition]) -> None: ...

    def unassign(self) -> None: ...

    def poll(self, timeout: float) -> _Refused:
        self.polls += 1
        return _Refused(self.code)


@pytest.mark.parametrize(("code", "hint"), [
    (KafkaError.TOPIC_AUTHORIZATION_FAILED,
     f"grant the replay's principal Read (and Describe) on topic {RAW}"),
    (KafkaError.UNKNOWN_TOPIC_OR_PART, f"{RAW} or its partition does not exist"),
])
def test_a_raw_record_read_refused_is_said_at_once_not_blamed_on_retention(
        code: int, hint: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # Reread 57-a F-7: a consumed error (no Read grant, a topic gone) was skipped until the
    # 15 s timeout, then logged as "not on the raw topic (deleted by its retention?)".
    monkeypatch.setattr(dlq_raw, "FETCH_TIMEOUT_S", 1.0)
    records = object.__new__(dlq_raw.RawRecords)
    records._consumer = consumer = _ErrorConsumer(code)  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="cdc_router"):
        assert records(RAW, 0, 7) is None
    assert consumer.polls == 1 and "retention" not in caplog.text
    assert "event=dlq_value_unread" in caplog.text and hint in caplog.text
    assert "run the replay again" in caplog.text
