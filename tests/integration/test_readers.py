"""The topic readers every integration test relies on, and the package's own (kafka/reader.py,
used by `dlq list` and the changelog restore): deterministic, whatever the timing."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from confluent_kafka import (
    Consumer,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

from cdc_router.dead_letter import dead_letter_headers
from cdc_router.errors import DeliveryError
from cdc_router.kafka import reader as reader_module
from cdc_router.kafka.changelog_reader import ChangelogReader
from cdc_router.kafka.consumer import readable_headers, record_headers
from cdc_router.kafka.reader import TopicReader
from tests.integration.c_producer import produce_with_header
from tests.integration.pipeline import REPO
from tests.integration.support import (
    StackEndpoints,
    WithoutMetadata,
    read_to_end,
    read_topic,
    unique,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def topic(stack: StackEndpoints) -> Iterator[str]:
    name = unique("readers").replace("_", "-")
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for future in admin.create_topics([NewTopic(name, 3, 1)]).values():
        future.result(timeout=30)
    yield name
    for future in admin.delete_topics([name]).values():
        future.result(timeout=30)


def _transactional(stack: StackEndpoints, topic: str) -> Producer:
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers,
                         "transactional.id": unique(topic)})
    producer.init_transactions(30)
    return producer


def _values(records: list[Message]) -> list[bytes]:
    return sorted(record.value() for record in records)


def test_read_to_end_returns_exactly_the_committed_records_without_waiting(
        stack: StackEndpoints, topic: str) -> None:
    writer, other = _transactional(stack, topic), _transactional(stack, topic)
    committed = [f"c{i}".encode() for i in range(30)]
    writer.begin_transaction()
    for i, value in enumerate(committed):
        writer.produce(topic, value=value, partition=i % 3)
    writer.commit_transaction(30)
    writer.begin_transaction()
    writer.produce(topic, value=b"aborted", partition=1)
    writer.flush(30)  # on the broker, then aborted
    writer.abort_transaction(30)
    other.begin_transaction()
    other.produce(topic, value=b"open", partition=0)
    other.flush(30)  # left open while we read: it must not hold the reader up
    try:
        started = time.monotonic()
        records = read_to_end(stack.bootstrap_servers, topic)
        took = time.monotonic() - started
        uncommitted = read_to_end(stack.bootstrap_servers, topic, isolation="read_uncommitted")
    finally:
        other.abort_transaction(30)
    assert _values(records) == sorted(committed)
    assert _values(uncommitted) == sorted([*committed, b"aborted", b"open"])
    assert took < 15, f"reading to the end took {took:.1f}s"


def test_read_to_end_of_an_empty_topic_is_empty_at_once(stack: StackEndpoints,
                                                        topic: str) -> None:
    started = time.monotonic()
    assert read_to_end(stack.bootstrap_servers, topic) == []
    assert time.monotonic() - started < 15


def test_read_topic_waits_for_a_topic_that_does_not_exist_yet(stack: StackEndpoints) -> None:
    name = unique("readers_late").replace("_", "-")
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})

    def create_and_write() -> None:
        time.sleep(2)
        for future in admin.create_topics([NewTopic(name, 2, 1)]).values():
            future.result(timeout=30)
        producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
        for i in range(10):
            producer.produce(name, value=f"v{i}".encode(), partition=i % 2)
        assert producer.flush(30) == 0

    late = threading.Thread(target=create_and_write)
    late.start()
    try:
        records = read_topic(stack.bootstrap_servers, name, 10, timeout_s=60)
        until = read_topic(stack.bootstrap_servers, name, 100, timeout_s=60,
                           until=lambda record: record.value() == b"v4")
    finally:
        late.join()
        for future in admin.delete_topics([name]).values():
            future.result(timeout=30)
    assert _values(records) == sorted(f"v{i}".encode() for i in range(10))
    assert until[-1].value() == b"v4" and len(until) <= 10


# cdc_router.kafka.reader ----------------------------------------------------------------

def _commit(producer: Producer, topic: str, values: list[bytes],
            headers: list[tuple[str, bytes]] | None = None) -> None:
    producer.begin_transaction()
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % 3, headers=headers or [])
    producer.commit_transaction(30)


def _reader(stack: StackEndpoints, topic: str) -> TopicReader:
    return TopicReader({"bootstrap.servers": stack.bootstrap_servers}, topic,
                       group_id=unique("reader"), what="test")


def test_stable_end_is_the_committed_records_and_an_open_transaction_does_not_hold_it(
        stack: StackEndpoints, topic: str) -> None:
    writer, other = _transactional(stack, topic), _transactional(stack, topic)
    committed = [f"c{i}".encode() for i in range(30)]
    _commit(writer, topic, committed)
    writer.begin_transaction()
    writer.produce(topic, value=b"aborted", partition=1)
    writer.flush(30)
    writer.abort_transaction(30)
    other.begin_transaction()
    other.produce(topic, value=b"open", partition=0)
    other.flush(30)
    reader = _reader(stack, topic)
    try:
        started = time.monotonic()
        values = sorted(m.value() for m in reader.read_to_end(end="stable", timeout_s=30))
        took = time.monotonic() - started
        # Partition 1: partition 0's stable end stays below the open transaction.
        writer.begin_transaction()
        writer.produce(topic, value=b"later", partition=1)
        writer.commit_transaction(30)
        again = [m.value() for m in reader.read_to_end(end="stable", timeout_s=30)]
    finally:
        reader.close()
        other.abort_transaction(30)
    assert values == sorted(committed)
    assert took < 15, f"reading to the end took {took:.1f}s"
    assert again == [b"later"]  # the second read goes on where the first stopped


def test_log_end_waits_for_a_transaction_open_when_called(stack: StackEndpoints,
                                                          topic: str) -> None:
    writer = _open_transaction(stack, topic)
    committer = threading.Timer(3.0, writer.commit_transaction, args=(30,))
    reader = ChangelogReader({"bootstrap.servers": stack.bootstrap_servers}, topic)
    committer.start()
    try:
        marks = list(reader.catch_up(timeout_s=60))
    finally:
        committer.join()
        reader.close()
    assert sorted(value for _, value in marks if value) == [b"first", b"second"]


def _open_transaction(stack: StackEndpoints, topic: str) -> Producer:
    """A producer that committed b"first" and holds b"second" (partition 2) in a transaction
    it left open."""
    writer = _transactional(stack, topic)
    _commit(writer, topic, [b"first"])
    writer.begin_transaction()
    writer.produce(topic, key=b"id-2", value=b"second", partition=2)
    writer.flush(30)
    return writer


class _Said(logging.Handler):
    """Sets `said` when a line holding `text` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.said = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.said.set()


def test_a_read_held_by_an_open_transaction_waits_with_the_same_consumer(
        stack: StackEndpoints, topic: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 39-2: a restore renewed its consumer every 30 s while a transaction held it,
    # though a new one waits the same. The commit comes once the hold is said.
    monkeypatch.setattr(reader_module, "_STALLED_S", 4.0)
    caplog.set_level(logging.INFO, logger="cdc_router")
    writer = _open_transaction(stack, topic)
    held = _Said("event=read_held")
    logging.getLogger("cdc_router.kafka").addHandler(held)
    committer = threading.Thread(target=lambda: held.said.wait(60) and
                                 writer.commit_transaction(30))
    reader = ChangelogReader({"bootstrap.servers": stack.bootstrap_servers}, topic)
    committer.start()
    try:
        marks = list(reader.catch_up(timeout_s=60))
    finally:
        held.said.set()
        committer.join()
        reader.close()
        logging.getLogger("cdc_router.kafka").removeHandler(held)
    assert sorted(value for _, value in marks if value) == [b"first", b"second"]
    assert "event=read_held" in caplog.text and "reader_renewed" not in caplog.text


def test_a_catch_up_reads_the_partitions_added_since_the_last_one(stack: StackEndpoints,
                                                                 topic: str) -> None:
    # QA, session 30: a router listed the changelog's partitions once; the marks other
    # instances wrote to partitions added since were never read, and replays went out again.
    writer = _transactional(stack, topic)
    _commit(writer, topic, [b"first"])
    reader = ChangelogReader({"bootstrap.servers": stack.bootstrap_servers}, topic)
    try:
        assert [value for _, value in reader.catch_up(timeout_s=60)] == [b"first"]
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        for future in admin.create_partitions([NewPartitions(topic, 5)]).values():
            future.result(timeout=30)
        added = Producer({"bootstrap.servers": stack.bootstrap_servers})
        while 4 not in added.list_topics(topic, timeout=10).topics[topic].partitions:
            time.sleep(0.2)  # the producer's metadata knows the new partitions
        added.produce(topic, value=b"on-4", partition=4)
        added.produce(topic, value=b"on-0", partition=0)
        assert added.flush(30) == 0
        assert sorted(value for _, value in reader.catch_up(timeout_s=60)) == [b"on-0", b"on-4"]
    finally:
        reader.close()


def test_a_changelog_reader_left_without_metadata_reads_on_from_where_it_stood(
        stack: StackEndpoints, topic: str) -> None:
    writer = _transactional(stack, topic)
    _commit(writer, topic, [b"a", b"b", b"c"])  # one on each of the 3 partitions
    reader = ChangelogReader({"bootstrap.servers": stack.bootstrap_servers}, topic)

    def renewed_read(values: list[bytes]) -> list[bytes]:
        reader._consumer = WithoutMetadata(reader.consumer)  # type: ignore[assignment]
        _commit(writer, topic, values)
        read = sorted(value for _, value in reader.catch_up(timeout_s=90))
        assert isinstance(reader.consumer, Consumer)  # a new one
        return read

    try:
        assert sorted(value for _, value in reader.catch_up(timeout_s=60)) == [b"a", b"b", b"c"]
        # Partitions 1 and 2 get nothing new: the new consumer must take them for read to
        # their end (review 39: its position() says nothing of a partition it read nothing of).
        assert renewed_read([b"d"]) == [b"d"]
        # Renewed again: nothing read twice, partitions 1 and 2 included.
        assert renewed_read([b"e", b"f"]) == [b"e", b"f"]
        _commit(writer, topic, [b"g"])
        assert [value for _, value in reader.catch_up(timeout_s=60)] == [b"g"]
    finally:
        reader.close()


def test_an_undecodable_header_name_is_caught_however_often_it_is_read(stack: StackEndpoints,
                                                                        topic: str) -> None:
    # The full suite, session 30: once CPython had specialized a `message.headers()` call
    # site, it returned the list with the decode error pending and a NULL name inside, no
    # SystemError; the idempotent consumer then segfaulted. Fresh records, read 20 times.
    produce_with_header(stack.bootstrap_servers, topic, key=b"k", value=b"v",
                        header_name=b"\xff", header_value=b"x", partition=0)
    consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": unique("h"),
                         "enable.auto.commit": False})
    try:
        seen = []
        for _ in range(20):
            consumer.assign([TopicPartition(topic, 0, 0)])
            message = None
            while message is None or message.error() is not None:
                message = consumer.poll(10)
            seen.append(readable_headers(message))
            seen.append(readable_headers(message))  # a second read: the cached list
        assert seen == [None] * 40
        assert record_headers(message) == [("dlq.headers.dropped", b"a header name is not UTF-8")]
    finally:
        consumer.close()


def test_a_missing_topic_is_one_line_naming_it(stack: StackEndpoints) -> None:
    missing = unique("no_such_topic").replace("_", "-")
    reader = _reader(stack, missing)
    with pytest.raises(DeliveryError, match=f"the test topic {missing} does not exist"):
        list(reader.read_to_end())
    reader.close()


def _dead_letter_config(stack: StackEndpoints, topic: str, tmp_path: Path) -> Path:
    """A router config whose dead-letter topic is `topic`, its letters of source `raw`."""
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({
        "source": {"topics": ["raw"]}, "routes": [{"topic": "out"}],
        "kafka": {"bootstrap_servers": stack.bootstrap_servers},
        "dead_letter": {"topic": topic}}))
    return config


def test_dlq_list_shows_the_committed_dead_letters_at_once(stack: StackEndpoints, topic: str,
                                                          tmp_path: Path) -> None:
    writer, other = _transactional(stack, topic), _transactional(stack, topic)
    headers = dead_letter_headers(topic="raw", partition=0, offset=5, stage="route",
                                  error=ValueError("no route"), event_id="e-1")
    _commit(writer, topic, [b"v1", b"v2"], headers)
    other.begin_transaction()
    other.produce(topic, value=b"open", partition=0, headers=headers)
    other.flush(30)
    config = _dead_letter_config(stack, topic, tmp_path)
    try:
        started = time.monotonic()
        listed = subprocess.run([sys.executable, "-m", "cdc_router", "dlq", "list", "-c",
                                 str(config), "-o", "json"], capture_output=True, text=True,
                                check=True, timeout=60)
        took = time.monotonic() - started
    finally:
        other.abort_transaction(30)
    shown = json.loads(listed.stdout)
    assert [(entry["stage"], entry["source"], entry["event_id"], entry["error"],
             entry["reason"]) for entry in shown] == [
        ("route", "raw[0]@5", "e-1", "ValueError", "no route")] * 2
    # QA 62-b: both letters are at offset 0, one on each of two partitions: the offset alone
    # did not tell them apart.
    assert sorted((entry["partition"], entry["offset"]) for entry in shown) == [(0, 0), (1, 0)]
    assert took < 20, f"dlq list took {took:.1f}s"


def test_topics_apply_refuses_in_its_plan_what_the_cluster_would_refuse(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA, session 25: `--dry-run` planned an unknown topic config key as a change, and only
    # the apply failed. The plan asks the controller first (validate_only); nothing is made.
    name = unique("tv").replace("_", "-")
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": stack.bootstrap_servers},
        "source": {"topics": [f"{name}.raw"]}, "routes": [{"topic": f"{name}.orders"}],
        "dead_letter": {"topic": f"{name}.dlq", "config": {"bogus.key": "1"}},
        "dedup": {"changelog_topic": f"{name}.dedup"}}))
    for extra in ("--dry-run", "--yes"):
        done = subprocess.run([sys.executable, "-m", "cdc_router", "topics", "apply", "-c",
                               str(config), extra], capture_output=True, text=True, cwd=REPO,
                              check=False)
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"Kafka would refuse creating topic {name}.dlq: Unknown topic config name: " \
               "bogus.key" in done.stderr.strip().splitlines()[-1]
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    assert not [t for t in admin.list_topics(timeout=30).topics if t.startswith(name)]


def test_topics_apply_never_lowers_a_shared_changelog_s_retention_below_another_window(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 35-c: two pipelines sharing a changelog; `topics apply` of the one with a 1 h window
    # cut the other's 7 d retention to 1 h, without a word: its ids forgotten, replays again.
    name = unique("tr").replace("_", "-")
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})

    def apply(window_ms: int) -> str:
        config = tmp_path / f"router-{window_ms}.yaml"
        config.write_text(yaml.safe_dump({
            "kafka": {"bootstrap_servers": stack.bootstrap_servers},
            "source": {"topics": [f"{name}.raw"], "group_id": f"{name}-{window_ms}"},
            "routes": [{"topic": f"{name}.orders"}], "dead_letter": {"topic": f"{name}.dlq"},
            "dedup": {"changelog_topic": f"{name}.dedup", "window_ms": window_ms}}))
        done = subprocess.run([sys.executable, "-m", "cdc_router", "topics", "apply", "-c",
                               str(config), "--yes"], capture_output=True, text=True, cwd=REPO,
                              check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def retention() -> str:
        resource = ConfigResource(ConfigResource.Type.TOPIC, f"{name}.dedup")
        return str(admin.describe_configs([resource])[resource].result(30)["retention.ms"].value)

    try:
        apply(604_800_000)
        assert retention() == "604800000"
        shown = apply(3_600_000)
        assert retention() == "604800000"
        assert "retention.ms 604800000 kept: the config needs at least 3600000" in shown, shown
        apply(1_209_600_000)  # a longer window raises it
        assert retention() == "1209600000"
    finally:
        admin.delete_topics([f"{name}.dedup", f"{name}.dlq"])


def _topics_apply(stack: StackEndpoints, tmp_path: Path, name: str,
                  sections: dict[str, object]) -> str:
    """`topics apply --yes` of a router config named after `name`, with `sections` over it."""
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": stack.bootstrap_servers},
        "source": {"topics": [f"{name}.raw"], "group_id": name},
        "routes": [{"topic": f"{name}.orders"}], "dead_letter": {"topic": f"{name}.dlq"},
        "dedup": {"changelog_topic": f"{name}.dedup"}, **sections}))
    done = subprocess.run([sys.executable, "-m", "cdc_router", "topics", "apply", "-c",
                           str(path), "--yes"], capture_output=True, text=True, cwd=REPO,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_topics_apply_warns_of_a_setting_taken_out_of_the_config(stack: StackEndpoints,
                                                                 tmp_path: Path) -> None:
    # QA 62-a: retention.ms removed from a topic's config: planned "unchanged", and the
    # topic kept it.
    name = unique("tu").replace("_", "-")
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})

    def apply(config: dict[str, str]) -> str:
        return _topics_apply(stack, tmp_path, name, {"topics": [
            {"name": f"{name}.orders", "config": config}]})

    try:
        assert "warning" not in apply({"retention.ms": "86400000"})
        shown = apply({})
        assert f"unchanged {name}.orders\n  warning: retention.ms 86400000 is set on the " \
            "topic, not in the config: left as is" in shown, shown
    finally:
        admin.delete_topics([f"{name}.orders", f"{name}.dedup", f"{name}.dlq"])


def test_topics_apply_keeps_the_changelog_as_long_as_the_retention_cleanup_needs_it(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # Review 49-b F2: the changelog kept its marks for dedup.window_ms alone; with cleanup.mode
    # retention and a longer retention_ms, the rows delivered more than the window before a
    # restart, younger than the retention, were in neither the cleanup's memory nor the
    # changelog its sweep reads back: they stayed in the outbox for good.
    name = unique("tk").replace("_", "-")
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})

    def apply(cleanup: dict[str, object]) -> None:
        _topics_apply(stack, tmp_path, name, {"cleanup": cleanup, "dedup": {
            "changelog_topic": f"{name}.dedup", "window_ms": 3_600_000}})

    def retention() -> str:
        resource = ConfigResource(ConfigResource.Type.TOPIC, f"{name}.dedup")
        return str(admin.describe_configs([resource])[resource].result(30)["retention.ms"].value)

    try:
        apply({"mode": "delete"})
        assert retention() == "3600000"  # the window
        apply({"mode": "retention", "retention_ms": 86_400_000})  # an existing one is raised
        assert retention() == str(86_400_000 + 3_600_000)
    finally:
        admin.delete_topics([f"{name}.dedup", f"{name}.dlq"])


@pytest.mark.parametrize("newest", [False, True])
def test_dlq_list_takes_the_oldest_and_newest_letters_across_partitions(
        stack: StackEndpoints, topic: str, tmp_path: Path, newest: bool) -> None:
    # QA 62-b: on a dead-letter topic of 3 partitions `dlq list --newest -n 200` showed 65 of
    # the 200 newest letters (the tail of the partition read last), and the default the head
    # of the partition read first. Two letters a partition, written p0, p1, p2, p0, p1, p2.
    writer = _transactional(stack, topic)
    writer.begin_transaction()
    now_ms = int(time.time() * 1000)
    for n in range(6):
        headers = dead_letter_headers(topic="raw", partition=0, offset=n, stage="route",
                                      error=ValueError("no route"), event_id=f"e-{n}")
        writer.produce(topic, value=b"v", partition=n % 3, headers=headers,
                       timestamp=now_ms - 60_000 + n * 1_000)
    writer.commit_transaction(30)
    config = _dead_letter_config(stack, topic, tmp_path)
    listed = subprocess.run([sys.executable, "-m", "cdc_router", "dlq", "list", "-c",
                             str(config), "-o", "json", "-n", "2"]
                            + (["--newest"] if newest else []), capture_output=True, text=True,
                            check=True, timeout=60)
    shown = [entry["event_id"] for entry in json.loads(listed.stdout)]
    assert shown == (["e-4", "e-5"] if newest else ["e-0", "e-1"]), listed.stdout
