"""The cleanup's sweep source on the real broker: committed marks only, never dead letters."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from cdc_router.dead_letter import EVENT_ID, SOURCE_GROUP, SOURCE_TOPIC, STAGE
from cdc_router.router import committed_ids
from cdc_router.router.committed_ids import CommittedIds
from cdc_router.router.replay import (
    DEAD_LETTERED_KEY_PREFIX,
    REPLAYED_KEY_PREFIX,
    ChangelogRecord,
    changelog_records,
)
from tests.integration.support import StackEndpoints, WithoutMetadata, unique

pytestmark = pytest.mark.integration

RAW = b"raw.outbox"  # the sweeping pipeline's source topic


def _sweep(stack: StackEndpoints, changelog: str, dead_letters: str) -> CommittedIds:
    return CommittedIds({"bootstrap.servers": stack.bootstrap_servers},
                        changelog_topic=changelog, group="g", dead_letter_topic=dead_letters,
                        window_ms=3_600_000, ours=lambda topic, group: topic == RAW.decode())


@pytest.fixture
def topics(stack: StackEndpoints) -> Iterator[tuple[str, str]]:
    name = unique("sweep").replace("_", "-")
    changelog, dead_letters = f"{name}-dedup", f"{name}-dlq"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for future in admin.create_topics([NewTopic(changelog, 2, 1),
                                       NewTopic(dead_letters, 2, 1)]).values():
        future.result(timeout=30)
    yield changelog, dead_letters
    for future in admin.delete_topics([changelog, dead_letters]).values():
        future.result(timeout=30)


def _transaction(producer: Producer, changelog: str, dead_letters: str, delivered: list[str],
                 dead: list[str], *, commit: bool, legacy: bool = False,
                 replayed: list[str] | None = None, undecoded: list[str] | None = None) -> None:
    producer.begin_transaction()
    for event_id in dead:  # as the router does: the dead letter, then its mark
        producer.produce(dead_letters, key=b"raw", value=b"poison",
                         headers=[(EVENT_ID, event_id.encode()), (SOURCE_TOPIC, RAW)])
    for event_id in undecoded or []:  # a letter at stage decode: no mark
        producer.produce(dead_letters, key=b"raw", value=b"poison",
                         headers=[(EVENT_ID, event_id.encode()), (STAGE, b"decode"),
                                  (SOURCE_TOPIC, RAW)])
    now_ms = int(time.time() * 1000)
    if legacy:  # one record per id, as versions before #14 wrote
        for event_id in delivered + dead:
            producer.produce(changelog, key=event_id.encode(), value=b'{"ts": %d}' % now_ms)
    for mark in [] if legacy else changelog_records(delivered + dead, now_ms):
        producer.produce(changelog, key=mark.key, value=mark.value)
    for mark in changelog_records(replayed or [], now_ms, REPLAYED_KEY_PREFIX):
        producer.produce(changelog, key=mark.key, value=mark.value)  # as `dlq replay` does
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)


def _all(source: CommittedIds, timeout_s: float = 30) -> list[str]:
    found: list[str] = []
    deadline = time.monotonic() + timeout_s
    idle_since: float | None = None
    while time.monotonic() < deadline:
        batch = source.next(3)
        found += [event_id for event_id, _ in batch]
        if batch:
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        # Before the first id, the new source may still be joining and reading both topics
        # to their ends (slow with a second test worker on the 2 cores): wait longer then.
        elif time.monotonic() - idle_since > (3 if found else 10):
            break
    return found


def test_only_committed_marks_of_delivered_events_come_out(stack: StackEndpoints,
                                                           topics: tuple[str, str]) -> None:
    changelog, dead_letters = topics
    committed = Producer({"bootstrap.servers": stack.bootstrap_servers,
                          "transactional.id": unique("sweep-a")})
    committed.init_transactions(30)
    aborted = Producer({"bootstrap.servers": stack.bootstrap_servers,
                        "transactional.id": unique("sweep-b")})
    aborted.init_transactions(30)
    _transaction(committed, changelog, dead_letters, ["a", "b"], ["dead-0"], commit=True,
                 legacy=True)
    # One record of four ids, handed out three at a time by _all.
    _transaction(committed, changelog, dead_letters, ["c", "d", "d2"], ["dead-1"], commit=True)
    _transaction(aborted, changelog, dead_letters, ["never-1"], ["never-dead"], commit=False)
    _transaction(committed, changelog, dead_letters, ["e"], ["dead-2"], commit=True)
    aborted.abort_transaction(30)
    _transaction(committed, changelog, dead_letters, ["f"], [], commit=True)
    source = _sweep(stack, changelog, dead_letters)
    try:
        first = _all(source)
        _transaction(committed, changelog, dead_letters, ["g"], ["dead-3"], commit=True)
        later = _all(source)
        # `dlq replay` delivered dead-1: its replayed: mark is proof, though dead-1 is dead.
        _transaction(committed, changelog, dead_letters, [], [], commit=True,
                     replayed=["dead-1"])
        replayed = _all(source)
        # A row dead-lettered at decode, fixed and republished: its one mark is its delivery.
        _transaction(committed, changelog, dead_letters, [], [], commit=True,
                     undecoded=["fixed-1"])
        _transaction(committed, changelog, dead_letters, ["fixed-1"], [], commit=True)
        fixed = _all(source)
        # Another pipeline sharing the dead-letter topic dead-lettered "shared" from its own
        # raw topic while this one delivered it: its letter says nothing of our row.
        committed.begin_transaction()
        committed.produce(dead_letters, key=b"raw", value=b"poison",
                          headers=[(EVENT_ID, b"shared"), (SOURCE_TOPIC, b"billing.raw")])
        for mark in changelog_records(["shared"], int(time.time() * 1000),
                                      DEAD_LETTERED_KEY_PREFIX, group="billing"):
            committed.produce(changelog, key=mark.key, value=mark.value)
        committed.commit_transaction(30)
        _transaction(committed, changelog, dead_letters, ["shared"], [], commit=True)
        shared = _all(source)
        # Today's router letter names its group and keys its mark dead:; once that mark has
        # left the changelog (its retention), a batch: mark of the id is a delivery since
        # (Debezium re-read the row after the replay filter forgot it): its row goes.
        committed.begin_transaction()
        committed.produce(dead_letters, key=b"raw", value=b"poison", headers=[
            (EVENT_ID, b"late-1"), (SOURCE_TOPIC, RAW), (SOURCE_GROUP, b"g")])
        for mark in changelog_records(["late-1"], int(time.time() * 1000),
                                      DEAD_LETTERED_KEY_PREFIX, group="g"):
            committed.produce(changelog, key=mark.key, value=mark.value)
        committed.commit_transaction(30)
        dead_only = _all(source)
        _transaction(committed, changelog, dead_letters, ["late-1"], [], commit=True)
        late = _all(source)
    finally:
        source.close()
    assert sorted(first) == ["a", "b", "c", "d", "d2", "e", "f"]
    assert later == ["g"]
    assert replayed == ["dead-1"]
    assert fixed == ["fixed-1"]
    assert shared == ["shared"]
    assert dead_only == [] and late == ["late-1"]


def test_a_sweep_whose_consumer_lost_its_metadata_reads_on_with_new_consumers(
        stack: StackEndpoints, topics: tuple[str, str]) -> None:
    # QA 39-b: after the broker's outage the sweep's changelog consumer failed every metadata
    # request for 8 minutes (event=cleanup_sweep_failed every 30 s), until the process ended.
    changelog, dead_letters = topics
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers,
                         "transactional.id": unique("sweep-renewed")})
    producer.init_transactions(30)
    _transaction(producer, changelog, dead_letters, ["a", "b"], ["dead-0"], commit=True)
    source = _sweep(stack, changelog, dead_letters)
    try:
        assert sorted(_all(source)) == ["a", "b"]
        source._changelog = WithoutMetadata(source._changelog)  # type: ignore[arg-type,assignment]
        source._listed = 0.0  # its partitions are listed again at the next call
        _transaction(producer, changelog, dead_letters, ["c"], ["dead-1"], commit=True)
        with pytest.raises(KafkaException, match="Failed to get metadata"):
            source.next(3)  # the cleaner logs it and asks again later
        assert _all(source) == ["c"]  # nothing twice, nothing passed over
    finally:
        source.close()


def test_marks_read_when_the_dead_letter_ends_could_not_be_asked_come_out_after_all(
        stack: StackEndpoints, topics: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 47-b F3: the marks were out of the changelog consumer when the lookup of the
    # dead-letter topic's ends failed (a broker outage), and never came out: their rows (a
    # killed predecessor's deliveries) stayed in the outbox until a restart.
    changelog, dead_letters = topics
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers,
                         "transactional.id": unique("sweep-ends")})
    producer.init_transactions(30)
    _transaction(producer, changelog, dead_letters, ["a", "b", "c", "d"], [], commit=True)
    source = _sweep(stack, changelog, dead_letters)
    asked = committed_ids.log_end_offsets
    failures = [KafkaException(KafkaError(KafkaError._TIMED_OUT))]

    def failing_once(*args: object, **kwargs: object) -> dict[int, int]:
        if failures:
            raise failures.pop()
        return asked(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(committed_ids, "log_end_offsets", failing_once)
    try:
        deadline = time.monotonic() + 30
        with pytest.raises(KafkaException):  # once marks were read, the lookup fails
            while time.monotonic() < deadline:
                assert source.next(3) == []
        assert sorted(_all(source)) == ["a", "b", "c", "d"]
    finally:
        source.close()


def test_a_dead_lettered_mark_is_no_delivery_once_its_letter_is_gone(
        stack: StackEndpoints, topics: tuple[str, str]) -> None:
    # QA, session 25: with the dead-letter topic's retention past (delete_records), the marks
    # of dead-lettered ids read as deliveries, and a restarted router's sweep deleted the rows
    # of 301 undelivered events. Marks keyed `dead:` need no letter.
    now_ms = int(time.time() * 1000)
    assert _committed_after(stack, topics, [
        *changelog_records(["h"], now_ms),
        *changelog_records(["dead-4", "dead-5"], now_ms, DEAD_LETTERED_KEY_PREFIX)]) == ["h"]


def test_another_pipelines_marks_on_a_shared_changelog_are_no_delivery(
        stack: StackEndpoints, topics: tuple[str, str]) -> None:
    # Review, session 26: two pipelines left dedup.changelog_topic at its default, both with
    # integer ids. The other pipeline's "1" proves nothing of ours: its row must stay.
    now_ms = int(time.time() * 1000)
    assert _committed_after(stack, topics, [
        *changelog_records(["1", "2"], now_ms, group="billing"),
        *changelog_records(["3"], now_ms, REPLAYED_KEY_PREFIX, group="billing"),
        *changelog_records(["2", "4"], now_ms, group="g")]) == ["2", "4"]


def test_marks_on_changelog_partitions_added_while_sweeping_come_out(
        stack: StackEndpoints, topics: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # QA, session 30: readers of the changelog listed its partitions once; the marks other
    # instances wrote to partitions added since were never read.
    monkeypatch.setattr(committed_ids, "_RELIST_S", 0.0)
    changelog, dead_letters = topics
    now_ms = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
    [first] = changelog_records(["before"], now_ms)
    producer.produce(changelog, key=first.key, value=first.value, partition=0)
    assert producer.flush(30) == 0
    source = _sweep(stack, changelog, dead_letters)
    try:
        assert _all(source) == ["before"]
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        admin.create_partitions([NewPartitions(changelog, 4)])[changelog].result(timeout=30)
        while 3 not in producer.list_topics(changelog, timeout=10).topics[changelog].partitions:
            time.sleep(0.2)
        [added] = changelog_records(["after"], now_ms)
        producer.produce(changelog, key=added.key, value=added.value, partition=3)
        assert producer.flush(30) == 0
        assert _all(source) == ["after"]
    finally:
        source.close()


def _committed_after(stack: StackEndpoints, topics: tuple[str, str],
                     marks: list[ChangelogRecord]) -> list[str]:
    """The ids group "g"'s sweep hands out once `marks` are committed to the changelog."""
    changelog, dead_letters = topics
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers,
                         "transactional.id": unique("sweep-m")})
    producer.init_transactions(30)
    producer.begin_transaction()
    for mark in marks:
        producer.produce(changelog, key=mark.key, value=mark.value)
    producer.commit_transaction(30)
    source = _sweep(stack, changelog, dead_letters)
    try:
        return _all(source)
    finally:
        source.close()
