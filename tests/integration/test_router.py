"""The router on the real stack: routing, order, exactly once under crashes, dead letters."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from contextlib import suppress
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_router.config.load import load_config
from cdc_router.errors import DeliveryError
from cdc_router.kafka.errors import ErrorAction, classify
from cdc_router.kafka.producer import LatchingProducer
from cdc_router.router.destinations import MISSING_RECHECK_S
from cdc_router.router.loop import OutboxRouter
from cdc_router.router.partitioner import java_default_partition
from cdc_router.router.routing import Router
from tests.integration.c_producer import produce_with_header
from tests.integration.connect_worker import at_least_once_worker
from tests.integration.pipeline import REPO, apply_topics, pipeline, set_topic_config
from tests.integration.support import StackEndpoints, replay_seed, unique

pytestmark = pytest.mark.integration


def _orders(count: int, aggregates: int) -> list[tuple[str, str, str, dict[str, int]]]:
    """`count` events spread round-robin over `aggregates`, each with its sequence number."""
    return [("Order", f"order-{i % aggregates}", "OrderPaid", {"seq": i}) for i in range(count)]


def test_10k_events_over_50_aggregates_each_once_in_order(stack: StackEndpoints,
                                                          tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, partitions=4) as pipe:
        pipe.start_router()
        ids = pipe.insert(_orders(10_000, 50))
        records = pipe.read(pipe.orders_topic, 10_000)
        extra = pipe.read_all(pipe.orders_topic, settle_s=3)
        assert len(extra) == 10_000, pipe.router_log()[-3000:]
    _assert_each_once_in_commit_order(records, ids, partitions=4, aggregates=50)


def _assert_each_once_in_commit_order(records: list[Any], ids: list[str], *, partitions: int,
                                      aggregates: int) -> None:
    """Every id once, keyed and partitioned by the contract, each aggregate in seq order."""
    keys = Counter(record.key().decode() for record in records)
    assert keys == Counter(ids), "every event id exactly once"
    by_aggregate: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for record in records:
        headers = {name: value.decode() for name, value in record.headers()}
        assert headers["id"] == record.key().decode()
        assert headers["aggregatetype"] == "Order" and headers["type"] == "OrderPaid"
        aggregate = headers["aggregateid"]
        assert record.partition() == java_default_partition(aggregate.encode(), partitions)
        seq = json.loads(record.value())["seq"]
        by_aggregate[aggregate].append((record.partition(), record.offset(), seq))
    assert len(by_aggregate) == aggregates
    for aggregate, entries in by_aggregate.items():
        seqs = [seq for _, _, seq in sorted(entries)]
        assert seqs == sorted(seqs), f"{aggregate}'s events out of commit order"


def test_scale_out_raw_partitions_keyed_by_aggregate_two_instances_keep_its_order(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # README, "Scaling out": Debezium keys the raw topic by the aggregate id
    # (message.key.columns), so an aggregate's events share a raw partition in commit order,
    # and each instance of one group owns whole raw partitions. One instance is killed -9
    # midway: its partitions move, and its open batch is re-read by the other.
    with pipeline(stack, tmp_path, partitions=4, raw_partitions=2,
                  connector={"message.key.columns": "public.{table}:aggregateid"}) as pipe:
        pipe.start_router("a", wait=True)
        pipe.start_router("b", wait=True)
        rows = _orders(4_000, 40)
        ids = pipe.insert(rows[:2_000], per_transaction=50)
        pipe.read(pipe.orders_topic, 1_000)
        pipe.kill_router("b")
        ids += pipe.insert(rows[2_000:], per_transaction=50)
        records = pipe.read(pipe.orders_topic, 4_000)
        settled = pipe.read_all(pipe.orders_topic, settle_s=3)
        raw = pipe.read_all(pipe.raw_topic, settle_s=1)
    assert len(settled) == 4_000
    raw_partitions: dict[str, set[int]] = defaultdict(set)
    for record in raw:
        raw_partitions[json.loads(record.value())["after"]["aggregateid"]].add(
            record.partition())
    assert all(len(found) == 1 for found in raw_partitions.values()), "one raw partition each"
    assert {p for found in raw_partitions.values() for p in found} == {0, 1}
    _assert_each_once_in_commit_order(records, ids, partitions=4, aggregates=40)


def test_kill_9_of_the_router_five_times_loses_and_doubles_nothing(stack: StackEndpoints,
                                                                   tmp_path: Path) -> None:
    rows = _orders(20_000, 50)
    with pipeline(stack, tmp_path, partitions=4) as pipe:
        pipe.start_router(wait=True)
        writer = threading.Thread(target=lambda: ids.extend(pipe.insert(rows, 100)))
        ids: list[str] = []
        writer.start()
        seed = replay_seed(5)
        pauses = seed.random()
        kills = 0
        while kills < 5:
            time.sleep(pauses.uniform(1.0, 2.5))
            pipe.kill_router()
            kills += 1
            pipe.start_router(wait=True)
        writer.join()
        records = pipe.read(pipe.orders_topic, 20_000)
        settled = pipe.read_all(pipe.orders_topic, settle_s=5)
        log = pipe.router_log()
    assert kills == 5
    assert len(ids) == 20_000
    assert len(settled) == 20_000, f"{seed}\n{log[-3000:]}"
    keys = Counter(record.key().decode() for record in records)
    assert keys == Counter(ids), f"every event id exactly once after five kill -9; {seed}"


def test_poison_rows_become_dead_letters_and_the_stream_goes_on(stack: StackEndpoints,
                                                               tmp_path: Path) -> None:
    config = {"dead_letter": {}, "delivery": {"max_payload_bytes": 5_000}}
    with pipeline(stack, tmp_path, partitions=2, config=config) as pipe:
        customers = f"{pipe.name.replace('_', '-')}-customers"
        _add_templated_route(pipe.config_path, customers)
        apply_topics(pipe)
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        topics_before = set(admin.list_topics(timeout=10).topics)
        pipe.start_router()
        hostile = ["__consumer_offsets", "__transaction_state", "../x", "a" * 300,
                   "bad\r\nname", "naïve", pipe.dlq_topic, f"{customers}-undeclared"]
        bad: list[tuple[str, str, str, object]] = []
        for i in range(90):
            bad.append((hostile[i % len(hostile)], f"agg-{i}", "Poison", {"i": i}))
        for i in range(10):
            bad.append(("Order", f"agg-big-{i}", "TooBig", {"blob": "x" * 6_000}))
        good = _orders(9_000, 50) + [(customers, f"c-{i}", "CustomerCreated", {"i": i})
                                     for i in range(1_000)]
        rows = good + bad
        random.Random(7).shuffle(rows)
        ids = pipe.insert(rows)
        bad_ids = {event_id for event_id, row in zip(ids, rows, strict=True)
                   if row[2] in ("Poison", "TooBig")}
        orders = pipe.read(pipe.orders_topic, 9_000)
        customer_records = pipe.read(customers, 1_000)
        letters = pipe.read(pipe.dlq_topic, 100)
        settled = {topic: len(pipe.read_all(topic, settle_s=3))
                   for topic in (pipe.orders_topic, customers, pipe.dlq_topic)}
        topics_after = set(admin.list_topics(timeout=10).topics)
    assert settled == {pipe.orders_topic: 9_000, customers: 1_000, pipe.dlq_topic: 100}
    good_keys = Counter(r.key().decode() for r in orders + customer_records)
    assert good_keys == Counter(set(ids) - bad_ids)
    letter_ids = set()
    for letter in letters:
        headers = {name: value.decode(errors="replace") for name, value in letter.headers()}
        assert headers["dlq.stage"] == "route"
        assert headers["dlq.error.class"] == "RouteError"
        assert headers["dlq.source.topic"] == pipe.raw_topic
        assert headers["dlq.error.message"]
        letter_ids.add(headers["dlq.event.id"])
        assert json.loads(letter.value())["after"]["id"] == headers["dlq.event.id"]
    assert letter_ids == bad_ids
    # Only names this test's rows could have produced (other clients may create topics too).
    ours = pipe.name.replace("_", "-")
    new_topics = {t for t in topics_after - topics_before if ours in t or t in hostile}
    assert new_topics <= {customers}, f"topics created beyond the config: {new_topics}"


def test_a_jsonb_number_beyond_a_double_is_a_dead_letter_and_the_stream_goes_on(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 45-a F1: Postgres stores 1e400 in a jsonb column as 1 and 400 zeros, an integer that
    # was delivered where Go's and Rust's readers refuse it, like the 1e400 the README names.
    with pipeline(stack, tmp_path, partitions=1, config={"dead_letter": {}}) as pipe:
        pipe.start_router()
        rows = [("Order", "big", "OrderPlaced", '{"n": 1e400}'),
                ("Order", "big", "OrderPlaced", '{"n": -1e309, "ok": false}'),
                ("Order", "fine", "OrderPlaced", '{"n": 1e308, "m": 1e-400}'),
                *_orders(20, 2)]
        ids = pipe.insert(rows)
        letters = pipe.read(pipe.dlq_topic, 2)
        orders = pipe.read(pipe.orders_topic, 21)
        settled = {topic: len(pipe.read_all(topic, settle_s=3))
                   for topic in (pipe.orders_topic, pipe.dlq_topic)}
    assert settled == {pipe.orders_topic: 21, pipe.dlq_topic: 2}
    assert Counter(record.key().decode() for record in orders) == Counter(ids[2:])
    for letter, event_id in zip(letters, ids[:2], strict=True):
        headers = {name: value.decode() for name, value in letter.headers()}
        assert (headers["dlq.event.id"], headers["dlq.stage"]) == (event_id, "serialize")
        assert "beyond a double" in headers["dlq.error.message"], headers


# A change event as Confluent's JsonSchemaConverter frames it: byte 0, schema id 7, the JSON.
_FRAMED = b"\x00" + (7).to_bytes(4, "big") + b'{"op": "c", "after": {"id": "x"}}'


def test_undecodable_raw_records_are_dead_lettered(stack: StackEndpoints, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, partitions=1) as pipe:
        producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
        for value in (b"{not json", b'{"payload": {"op": "c"}}', b"\xff\xfe", *[b"{"] * 10,
                      _FRAMED):
            producer.produce(pipe.raw_topic, key=b"k", value=value)
        producer.flush(10)
        # Review, session 30: confluent-kafka cannot read a header name that is not UTF-8
        # (a SystemError), and reading the letter's headers stopped the router for good;
        # after the 13 letters above CPython no longer checks a specialized call site.
        produce_with_header(stack.bootstrap_servers, pipe.raw_topic, key=b"k",
                            value=b"{header", header_name=b"\xff", header_value=b"v")
        pipe.start_router()
        ids = pipe.insert(_orders(10, 2))
        letters = pipe.read(pipe.dlq_topic, 15)
        orders = pipe.read(pipe.orders_topic, 10)
        listed = subprocess.run([sys.executable, "-m", "cdc_router", "dlq", "list", "-c",
                                 str(pipe.config_path), "-o", "json"], capture_output=True,
                                text=True, check=True)
        # QA 43-a F8: after an alert the newest letters are the ones wanted.
        newest, since = (json.loads(subprocess.run(
            [sys.executable, "-m", "cdc_router", "dlq", "list", "-c", str(pipe.config_path),
             "-o", "json", *extra], capture_output=True, text=True, check=True).stdout)
            for extra in (["--newest", "-n", "3"], ["--since", "1h", "-n", "2"]))
    shown = json.loads(listed.stdout)
    assert [entry["offset"] for entry in newest] == [entry["offset"] for entry in shown][-3:]
    assert [entry["offset"] for entry in since] == [entry["offset"] for entry in shown][:2]
    assert [entry["stage"] for entry in shown] == ["decode"] * 15
    assert all(entry["source"].startswith(pipe.raw_topic) and entry["reason"] for entry in shown)
    assert sorted(letter.value() for letter in letters) == sorted(
        [b"{not json", b'{"payload": {"op": "c"}}', b"\xff\xfe", *[b"{"] * 10, _FRAMED,
         b"{header"])
    # Review 49-f F2: a JSON Schema record was "malformed JSON at line 1, column 1".
    [framed] = [dict(letter.headers()) for letter in letters if letter.value() == _FRAMED]
    assert framed["dlq.error.message"].decode().startswith(
        "the value starts with byte 0 and a 4-byte schema id (7): it looks like "
        "schema-registry framing"), framed
    assert {dict(letter.headers())["dlq.stage"] for letter in letters} == {b"decode"}
    assert dict(letters[-1].headers())["dlq.headers.dropped"] == b"a header name is not UTF-8"
    assert sorted(r.key().decode() for r in orders) == sorted(ids)


def _add_templated_route(config_path: Path, customers: str) -> None:
    config = yaml.safe_load(config_path.read_text())
    config["routes"].insert(1, {"match": {"type": ["Poison", "CustomerCreated"]},
                                "topic": "{aggregate_type}"})
    config["topics"].append({"name": customers, "partitions": 2})
    config_path.write_text(yaml.safe_dump(config))


def test_debezium_replays_after_a_connect_kill_reach_no_destination(stack: StackEndpoints,
                                                                    tmp_path: Path) -> None:
    with at_least_once_worker(tmp_path / "connect") as worker, \
            pipeline(stack, tmp_path, partitions=2, connect_url=worker.url) as pipe:
        pipe.start_router()
        first = pipe.insert(_orders(3_000, 20))
        assert len(pipe.read(pipe.orders_topic, 3_000)) == 3_000
        worker.kill()  # no offset was flushed: Debezium resends from the slot's start
        worker.start()
        second = pipe.insert(_orders(1_000, 20))
        raw = pipe.read(pipe.raw_topic, 4_001, timeout_s=120)
        records = pipe.read(pipe.orders_topic, 4_000)
        settled = pipe.read_all(pipe.orders_topic, settle_s=5)
    raw_ids = Counter(json.loads(r.value())["after"]["id"] for r in raw)
    assert len(raw) > 4_000 and max(raw_ids.values()) >= 2, "Connect replayed nothing"
    assert len(settled) == 4_000
    assert Counter(r.key().decode() for r in records) == Counter(first + second)


def test_two_instances_share_the_raw_partitions_and_sigterm_commits_and_exits_0(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, partitions=2, raw_partitions=2) as pipe:
        pipe.start_router("a")
        pipe.start_router("b")
        deadline = time.monotonic() + 60
        while not all("event=assigned" in pipe.router_log(i) for i in "ab"):
            assert time.monotonic() < deadline, "the two instances never both got partitions"
            time.sleep(0.2)
        ids = pipe.insert(_orders(3_000, 30))
        first = pipe.read(pipe.orders_topic, 3_000)
        exit_code = pipe.kill_router("b", signal.SIGTERM)  # b's partitions move to a
        more = pipe.insert(_orders(2_000, 30))
        records = pipe.read(pipe.orders_topic, 5_000)
        settled = pipe.read_all(pipe.orders_topic, settle_s=3)
        log_b = pipe.router_log("b")
        log_a = pipe.router_log("a")
    assert len(first) == 3_000
    assert exit_code == 0, log_b[-2000:]
    assert "event=stopped" in log_b
    assert "event=assigned" in log_a and "event=assigned" in log_b
    assert len(settled) == 5_000
    assert Counter(r.key().decode() for r in records) == Counter(ids + more)


def _last_assignment(log: str) -> str | None:
    """The partitions of the last `event=assigned` line of a router's log, or None."""
    lines = [line for line in log.splitlines() if "event=assigned partitions=" in line]
    return lines[-1].split("partitions=", 1)[1].split(" ", 1)[0] if lines else None


def test_two_instances_share_two_one_partition_raw_topics(stack: StackEndpoints,
                                                          tmp_path: Path) -> None:
    """QA 55-a F-7: with the range assignor, each one-partition raw topic went to the first
    member and a second instance idled; roundrobin gives each instance one."""
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        second = f"{pipe.raw_topic}-second"  # no connector writes it: it only has to exist
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        for future in admin.create_topics([NewTopic(second, 1, 1)]).values():
            future.result(timeout=30)
        try:
            config = yaml.safe_load(pipe.config_path.read_text())
            config["source"]["topics"].append(second)
            pipe.config_path.write_text(yaml.safe_dump(config))
            pipe.start_router("a", wait=True)
            pipe.start_router("b")
            deadline = time.monotonic() + 90
            while not all(_last_assignment(pipe.router_log(i)) for i in "ab"):
                assert time.monotonic() < deadline, (
                    "the second instance got no raw partition: "
                    f"{[_last_assignment(pipe.router_log(i)) for i in 'ab']}")
                time.sleep(0.2)
            ids = pipe.insert(_orders(500, 10))
            records = pipe.read(pipe.orders_topic, 500)
            settled = pipe.read_all(pipe.orders_topic, settle_s=3)
            owners = {i: _last_assignment(pipe.router_log(i)) for i in "ab"}
        finally:
            for future in admin.delete_topics([second]).values():
                with suppress(Exception):
                    future.result(timeout=30)
    assert sorted(owners.values()) == sorted([f"{pipe.raw_topic}[0]", f"{second}[0]"]), owners
    assert len(settled) == 500
    assert Counter(r.key().decode() for r in records) == Counter(ids)


def test_a_record_the_broker_refuses_is_dead_lettered_and_the_rest_flows(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        set_topic_config(pipe, pipe.orders_topic, "max.message.bytes", "200000")
        pipe.start_router()
        rows = _orders(3_000, 20)
        rows.insert(1_500, ("Order", "order-big", "OrderPaid", {"blob": "x" * 300_000}))
        ids = pipe.insert(rows)
        big = ids[1_500]
        letters = pipe.read(pipe.dlq_topic, 1, timeout_s=120)
        records = pipe.read(pipe.orders_topic, 3_000)
        settled = pipe.read_all(pipe.orders_topic, settle_s=3)
        more_letters = pipe.read_all(pipe.dlq_topic, settle_s=2)
    assert len(settled) == 3_000
    assert Counter(r.key().decode() for r in records) == Counter(set(ids) - {big})
    assert len(more_letters) == 1
    headers = dict(letters[0].headers())
    assert headers["dlq.stage"] == b"produce"
    assert headers["dlq.event.id"].decode() == big
    # QA 53-b F2: dead-lettered before it is produced (the broker's refusal, MSG_SIZE_TOO_LARGE,
    # stays the fallback of a compressing producer: unit tests on the fake cluster)
    assert b"(MSG_SIZE_TOO_LARGE): the record is " in headers["dlq.error.message"]
    assert b"over the topic's max.message.bytes (200000)" in headers["dlq.error.message"]


def test_a_dead_letter_too_big_for_kafka_keeps_its_reason_without_the_value(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, partitions=1) as pipe:
        producer = Producer({"bootstrap.servers": stack.bootstrap_servers,
                             "message.max.bytes": 2_000_000})
        producer.produce(pipe.raw_topic, key=b"k", value=b"x" * 1_005_000)
        assert producer.flush(30) == 0
        pipe.start_router()
        ids = pipe.insert(_orders(20, 2))
        letters = pipe.read(pipe.dlq_topic, 1)
        orders = pipe.read(pipe.orders_topic, 20)
    assert len(letters) == 1
    headers = dict(letters[0].headers())
    assert letters[0].value() is None
    assert headers["dlq.value.dropped.bytes"] == b"1005000"
    assert headers["dlq.stage"] == b"decode"
    assert sorted(r.key().decode() for r in orders) == sorted(ids)


def test_an_unexpected_error_mid_batch_commits_nothing_and_loses_nothing(
        stack: StackEndpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        ids = pipe.insert(_orders(50, 5))
        assert len(pipe.read(pipe.raw_topic, 50)) == 50
        config = load_config(pipe.config_path)
        real_route = Router.route
        calls = {"n": 0}

        def route_failing_once(self: Router, event: Any, partitions_for: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 25:
                # Process-level: a record's own exceptions are dead letters, this one is not.
                raise MemoryError("injected: out of memory mid-batch")
            return real_route(self, event, partitions_for)

        monkeypatch.setattr(Router, "route", route_failing_once)
        with pytest.raises(MemoryError, match="injected"):
            OutboxRouter(config, instance_id=f"{pipe.name}-inproc").run()
        monkeypatch.setattr(Router, "route", real_route)
        pipe.start_router()
        records = pipe.read(pipe.orders_topic, 50)
        settled = pipe.read_all(pipe.orders_topic, settle_s=3)
    assert len(settled) == 50
    assert Counter(r.key().decode() for r in records) == Counter(ids)


def test_a_producer_fenced_by_a_second_one_with_its_transactional_id_is_one_line(
        stack: StackEndpoints) -> None:
    # QA, session 25: a second router with the same --instance-id ended the first with a
    # SystemError traceback: confluent-kafka served a delivery report while the fatal _FENCED
    # it raised was pending. The flush now says what happened, as a fatal DeliveryError.
    topic = unique("fenced").replace("_", "-")
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(timeout=30)
    config = {"bootstrap.servers": stack.bootstrap_servers, "transactional.id": topic}
    first = LatchingProducer(config)
    try:
        first.client.init_transactions(30)
        first.client.begin_transaction()
        first.produce(topic, key=b"k", value=b"v", headers=[])
        Producer(config).init_transactions(30)  # the second instance fences the first
        with pytest.raises(DeliveryError) as raised:
            for _ in range(3):
                first.produce(topic, key=b"k", value=b"v", headers=[])
                first.flush(30)
        if raised.value.kafka_error is None:
            # confluent-kafka's SystemError without its cause (kafka/producer.py
            # _fatal_unwrapped; session 60, under load): one line, and the abort that follows
            # meets the fence itself, which the router then handles as fatal.
            assert str(raised.value).startswith("the producer failed in confluent-kafka (")
            with pytest.raises(KafkaException) as aborted:
                first.client.abort_transaction(30)
            error = aborted.value.args[0]
        else:
            assert "_FENCED" in str(raised.value)
            error = raised.value.kafka_error
        assert classify(error) is ErrorAction.FATAL
    finally:
        for future in admin.delete_topics([topic]).values():
            future.result(timeout=30)


def test_header_numbers_arrive_as_written_and_a_missing_dead_letter_topic_stops_the_start(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # Review, session 27: a jsonb header 1.10 went through a float and arrived as "1.1" (and a
    # match on "1.10" missed); QA, session 27: without its dead-letter topic the router ran
    # until the first poison event.
    with pipeline(stack, tmp_path) as pipe:
        event_id = str(uuid.uuid4())
        with psycopg.connect(stack.postgres_dsn) as conn:
            conn.execute(f"INSERT INTO public.{pipe.table} (id, aggregatetype, aggregateid, "
                         "type, payload, headers) VALUES (%s, 'Order', 'o-1', 'OrderPaid', "
                         "'{}', '{\"version\": 1.10, \"amount\": 19.90, \"big\": "
                         "12345678901234567890.5}')", (event_id,))
        pipe.start_router()
        [record] = pipe.read(pipe.orders_topic, 1)
        headers = {name: value.decode() for name, value in record.headers()}
        config = yaml.safe_load(pipe.config_path.read_text())
        config["dead_letter"]["topic"] = unique("missing-dlq").replace("_", "-")
        missing = tmp_path / "missing-dlq.yaml"
        missing.write_text(yaml.safe_dump(config))
        started = subprocess.run(
            [sys.executable, "-m", "cdc_router", "run", "-c", str(missing), "--metrics-port",
             "0", "--instance-id", unique("nodlq")], capture_output=True, text=True,
            timeout=120, check=False)
    assert record.key().decode() == event_id
    assert (headers["version"], headers["amount"], headers["big"]) == (
        "1.10", "19.90", "12345678901234567890.5")
    assert started.returncode == 1, started.stdout + started.stderr
    assert f"field 'dead_letter.topic': topic {config['dead_letter']['topic']} does not " \
        "exist" in started.stderr and "topics apply" in started.stderr
    assert "Traceback" not in started.stderr


def test_a_row_without_created_at_gives_its_record_the_change_events_ts_ms(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # Review 34: with the EventRouter SMT's own table (no created_at) the record took the
    # router's clock; the SMT's takes Debezium's ts_ms, and so does the router's now.
    with pipeline(stack, tmp_path, config={"source": {"outbox": {"created_at": None}}}) as pipe:
        [event_id] = pipe.insert([("Order", "o-1", "OrderPaid", {"n": 1})])
        [raw] = pipe.read(pipe.raw_topic, 1)
        time.sleep(1.5)  # the router's clock moves past Debezium's
        pipe.start_router()
        [record] = pipe.read(pipe.orders_topic, 1)
    assert record.key().decode() == event_id
    assert record.timestamp()[1] == json.loads(raw.value())["ts_ms"]


def test_a_headers_column_renamed_under_the_router_is_one_warning_not_silence(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 34-e: after `RENAME COLUMN headers TO hdrs` every event went without its headers,
    # with no line anywhere (and `status` said ok).
    with pipeline(stack, tmp_path) as pipe:
        pipe.start_router(wait=True)
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE public.{pipe.table} RENAME COLUMN headers TO hdrs")
            for n in range(3):
                conn.execute(f"INSERT INTO public.{pipe.table} (id, aggregatetype, aggregateid, "
                             "type, payload, hdrs) VALUES (gen_random_uuid(), 'Order', 'o-1', "
                             "'OrderPaid', %s, '{\"tenant\": \"t1\"}')", (json.dumps({"n": n}),))
        records = pipe.read(pipe.orders_topic, 3)
        log = pipe.router_log()
    assert len(records) == 3
    assert all("tenant" not in dict(record.headers()) for record in records)
    assert log.count("event=column_missing") == 1, log[-2000:]
    assert "column=headers field=source.outbox.headers" in log


def _wait_topic_gone(bootstrap: str, topic: str, timeout_s: float = 60) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"{topic} is still listed"
        time.sleep(0.5)


def test_a_destination_topic_deleted_under_the_router_dead_letters_its_events_until_recreated(
        stack: StackEndpoints, tmp_path: Path) -> None:
    customers = [("Customer", f"customer-{i % 3}", "CustomerMoved", {"seq": i})
                 for i in range(30)]
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        pipe.start_router(wait=True)
        before = pipe.insert(_orders(50, 5))
        delivered_before = pipe.read(pipe.orders_topic, 50)
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        admin.delete_topics([pipe.orders_topic])[pipe.orders_topic].result(timeout=30)
        _wait_topic_gone(stack.bootstrap_servers, pipe.orders_topic)
        orphans = pipe.insert([row for pair in zip(_orders(30, 3), customers, strict=True)
                               for row in pair])[0::2]
        letters = pipe.read(pipe.dlq_topic, 30, timeout_s=180)
        moved = pipe.read(pipe.events_topic, 30, timeout_s=60)
        recreated_too_early = pipe.orders_topic in admin.list_topics(timeout=10).topics
        apply_topics(pipe)  # `topics apply`, as the dead letters' reason says
        time.sleep(MISSING_RECHECK_S + 1)  # the router asks for a missing topic again so
        after = pipe.insert(_orders(20, 5))
        delivered_after = pipe.read(pipe.orders_topic, 20, timeout_s=180)
        settled_letters = pipe.read_all(pipe.dlq_topic, settle_s=2)
        still_running = pipe.routers["a"].poll() is None
        log = pipe.router_log()
    assert Counter(r.key().decode() for r in delivered_before) == Counter(before)
    assert not recreated_too_early, "the router never creates topics"
    assert len(moved) == 30, "the other route flows meanwhile"
    assert len(settled_letters) == 30, log[-3000:]
    by_id = {dict(letter.headers())["dlq.event.id"].decode():
             dict(letter.headers()) for letter in letters}
    assert set(by_id) == set(orphans), log[-3000:]
    for headers in by_id.values():
        assert headers["dlq.stage"] in (b"route", b"produce"), headers
        assert pipe.orders_topic.encode() in headers["dlq.error.message"], headers
    assert Counter(r.key().decode() for r in delivered_after) == Counter(after), log[-3000:]
    assert still_running and "Traceback" not in log, log[-3000:]


def test_a_destination_deleted_under_traffic_dead_letters_its_events_and_holds_no_route(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 50-a F2: deleted while its records were in flight, a destination held every route
    # for 139 s (the broker refused them, and their re-reads produced them alone to the topic
    # librdkafka still had metadata for; test_router_loop has that path). Here the deletion
    # usually takes README's other path: a flush that times out, then an abort Kafka refuses,
    # then a new producer. Either way: the other route flows, each letter once, no exit.
    rows = [row for i in range(200) for row in (
        ("Order", f"order-{i % 5}", "OrderPaid", {"seq": i}),
        ("Customer", f"customer-{i % 3}", "CustomerMoved", {"seq": i}))]
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        pipe.start_router(wait=True)
        inserted: list[str] = []
        writer = threading.Thread(target=lambda: [
            (inserted.extend(pipe.insert(rows[start:start + 10])), time.sleep(0.1))
            for start in range(0, len(rows), 10)])
        writer.start()
        pipe.read(pipe.orders_topic, 20)  # records of the topic flow, some of them in flight
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        admin.delete_topics([pipe.orders_topic])[pipe.orders_topic].result(timeout=30)
        writer.join()
        customers = inserted[1::2]
        moved = pipe.read(pipe.events_topic, len(customers), timeout_s=180)
        letters = pipe.read_all(pipe.dlq_topic, settle_s=3)
        still_running = pipe.routers["a"].poll() is None
        log = pipe.router_log()
    assert Counter(r.key().decode() for r in moved) == Counter(customers), log[-3000:]
    lettered = Counter(dict(letter.headers())["dlq.event.id"].decode() for letter in letters)
    assert lettered and set(lettered) <= set(inserted[0::2]), log[-3000:]
    assert max(lettered.values()) == 1, log[-3000:]
    assert still_running and "Traceback" not in log, log[-3000:]


def test_a_router_whose_producer_is_fenced_once_renews_it_and_delivers_every_event_once(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA, session 28: a transaction that outlived transaction.timeout.ms (a JetStream stream
    # refusing every batch) was aborted by its coordinator, which bumps the producer's epoch,
    # and the router exited 1 on the fence that followed. Here another init_transactions of
    # the router's transactional id bumps the epoch the same way.
    with pipeline(stack, tmp_path) as pipe:
        pipe.start_router(wait=True)
        before = pipe.insert(_orders(20, 4))
        delivered_before = pipe.read(pipe.orders_topic, 20)
        rival = Producer({"bootstrap.servers": stack.bootstrap_servers,
                          "transactional.id": f"{pipe.name}-{pipe.name}-a"})
        rival.init_transactions(30)
        after = pipe.insert(_orders(20, 4))
        pipe.read(pipe.orders_topic, 40, timeout_s=120)
        settled = pipe.read_all(pipe.orders_topic, settle_s=2)
        still_running = pipe.routers["a"].poll() is None
        log = pipe.router_log()
    assert Counter(r.key().decode() for r in delivered_before) == Counter(before)
    assert Counter(r.key().decode() for r in settled) == Counter(before + after), log[-3000:]
    # The fence itself (_FENCED), or the fatal state it left for the next produce (_FATAL).
    assert "event=producer_renewed" in log, log[-3000:]
    assert still_running and "Traceback" not in log, log[-3000:]


def test_of_two_routers_with_one_instance_id_the_older_stops_for_good_each_event_once(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 65-a F-3: two processes with one --instance-id fenced each other in turn until one
    # renewal budget ran out, and the one left was a race (the newer lost on a loaded
    # machine). KIP-345: the newer's join fences the older's static member; the older now asks
    # the group, finds another member under its id and stops for good (exit 1: a supervisor
    # restarting on 75 does not bring it back); the newer runs on.
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        pipe.start_router(wait=True)
        first = pipe.routers["a"]
        ids = pipe.insert(_orders(100, 10))
        with open(tmp_path / "router-second.log", "wb") as log:
            second = subprocess.Popen(
                [sys.executable, "-m", "cdc_router", "run", "-c", str(pipe.config_path),
                 "--instance-id", f"{pipe.name}-a", "--metrics-port", "0"],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            for _ in range(10):
                ids += pipe.insert(_orders(20, 10))
                time.sleep(0.5)
            pipe.read(pipe.orders_topic, len(ids), timeout_s=180)
            settled = pipe.read_all(pipe.orders_topic, settle_s=3)
            deadline = time.monotonic() + 60
            while first.poll() is None and second.poll() is None and \
                    time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(3)  # the survivor, fenced by nobody now, goes on running
            exits = (first.poll(), second.poll())
        finally:
            second.terminate()
            second.wait(timeout=60)
        logs = pipe.router_log() + (tmp_path / "router-second.log").read_text()
    assert Counter(r.key().decode() for r in settled) == Counter(ids), logs[-3000:]
    assert exits == (1, None), (exits, logs[-3000:])
    assert f"error: field '--instance-id': another process took this instance's " \
        f"group.instance.id '{pipe.name}-a." in logs, logs[-3000:]
    assert "so this one stops for good and the newer runs on" in logs
    assert "Traceback" not in logs, logs[-3000:]


def test_a_changelog_kept_shorter_than_the_dedup_window_stops_the_router_until_applied(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA, session 29 (DUPLICATE): a changelog kept 20 s forgot the ids of 24 of 30 events by
    # the next start, and their replays were delivered again.
    with pipeline(stack, tmp_path) as pipe:
        set_topic_config(pipe, pipe.changelog_topic, "retention.ms", "20000")
        refused = subprocess.run(
            [sys.executable, "-m", "cdc_router", "run", "-c", str(pipe.config_path),
             "--metrics-port", "0", "--instance-id", unique("short")], capture_output=True,
            text=True, cwd=REPO, timeout=120, check=False)
        apply_topics(pipe)  # as the error says: the topic's retention back to the window
        pipe.start_router(wait=True)
        ids = pipe.insert(_orders(5, 1))
        delivered = pipe.read(pipe.orders_topic, 5, timeout_s=60)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert (f"field 'dedup.changelog_topic': topic {pipe.changelog_topic} keeps its records "
            "20000 ms (retention.ms)") in refused.stderr and "topics apply" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert [record.key().decode() for record in delivered] == ids


def test_rules_check_cluster_finds_a_destination_created_outside_the_config(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA, session 28: a topic made by Terraform, not under `topics:`, was "dead letter" (exit
    # 1) for `rules check --explain`, while the router delivered to it.
    topic = unique("terraformed").replace("_", "-")
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    # Kept for ever: the fixture's row is from 2026, and the check applies the topic's
    # retention.ms as the router does (a topic deleting by time would refuse it some day).
    admin.create_topics([NewTopic(topic, 3, 1, config={"retention.ms": "-1"})])[topic].result(
        timeout=30)
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": stack.bootstrap_servers},
        "source": {"topics": ["outbox.public.outbox"]}, "routes": [{"topic": topic}]}))
    event = Path(__file__).parents[1] / "unit" / "fixtures" / "debezium" / \
        "create_text.noschema.json"
    try:
        def check(*extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "cdc_router", "rules", "check", "-c",
                                   str(config), "--explain", str(event), "-o", "json", *extra],
                                  capture_output=True, text=True, cwd=REPO, check=False)
        offline, online = check(), check("--cluster")
        config.write_text(config.read_text().replace(topic, topic + "-nowhere"))
        nowhere = check("--cluster")
    finally:
        admin.delete_topics([topic])[topic].result(timeout=30)
    assert offline.returncode == 1 and "--cluster" in offline.stdout, offline.stdout
    assert online.returncode == 0, online.stdout + online.stderr
    [explained] = json.loads(online.stdout)["events"]
    assert explained["outcome"] == "routed" and explained["record"]["topic"] == topic
    assert nowhere.returncode == 1 and "does not exist" in nowhere.stdout, nowhere.stdout
    # QA 43-a F1: without --explain, `rules check` said valid, and nothing more.
    warned = {run: [warning for warning in json.loads(result.stdout)["warnings"]
                    if warning.startswith("routes[0] sends to topic")]
              for run, result in (("offline", offline), ("online", online),
                                  ("nowhere", nowhere))}
    assert warned["online"] == []
    assert [f"{topic}, which is not declared under `topics:`" in warning
            for warning in warned["offline"]] == [True]
    assert [f"{topic}-nowhere, which does not exist in the cluster" in warning
            for warning in warned["nowhere"]] == [True]


def test_numeric_columns_of_decimal_handling_precise_are_read_as_their_decimal_text(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 31-a: with decimal.handling.mode=precise (Debezium's default) a numeric aggregate id
    # went out as its base64 bytes (19.90 as B8Y=), and partitioned by them. With a schema in
    # the envelope the router reads it back as the number; a key: <column> route too.
    connector = {"decimal.handling.mode": "precise", "value.converter.schemas.enable": "true",
                 "value.converter": "org.apache.kafka.connect.json.JsonConverter"}
    with pipeline(stack, tmp_path, partitions=1, connector=connector,
                  config={"source": {"outbox": {"aggregateid": "amount"}}}) as pipe:
        config = yaml.safe_load(pipe.config_path.read_text())
        config["routes"][0]["key"] = "total"
        pipe.config_path.write_text(yaml.safe_dump(config))
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE public.{pipe.table} ADD COLUMN amount numeric(10,2), "
                         "ADD COLUMN total numeric")
            conn.execute(f"INSERT INTO public.{pipe.table} (id, aggregatetype, aggregateid, "
                         "type, payload, amount, total) VALUES (%s, 'Order', 'unused', "
                         "'OrderPaid', '{}', 19.90, -1234.5)", (str(uuid.uuid4()),))
        pipe.start_router(wait=True)
        [record] = pipe.read(pipe.orders_topic, 1)
    headers = dict(record.headers() or [])
    assert headers["aggregateid"] == b"19.90"
    assert record.key() == b"-1234.5"


def test_a_bytea_payload_of_a_base64_url_safe_connector_goes_through_as_its_bytes(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 31-a: Debezium's binary.handling.mode=base64-url-safe writes - and _ for + and /; a
    # payload with those bytes was a dead letter, one without them went through.
    payload = b"\xfb\xff\xfe" + bytes(range(256))
    with pipeline(stack, tmp_path, partitions=1,
                  connector={"binary.handling.mode": "base64-url-safe"},
                  config={"source": {"payload_type": "bytes",
                                     "binary_handling": "base64-url-safe"}}) as pipe:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE public.{pipe.table} ALTER COLUMN payload TYPE bytea "
                         "USING convert_to(payload::text, 'UTF8')")
            conn.execute(f"INSERT INTO public.{pipe.table} (id, aggregatetype, aggregateid, "
                         "type, payload) VALUES (%s, 'Order', 'o-1', 'OrderPaid', %s)",
                         (str(uuid.uuid4()), payload))
        pipe.start_router(wait=True)
        [record] = pipe.read(pipe.orders_topic, 1)
        letters = pipe.read_all(pipe.dlq_topic, settle_s=0)
    assert record.value() == payload
    assert letters == []


def test_raw_records_deleted_before_the_group_read_them_are_reported_with_the_runbook(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 31-b: with the router stopped, the raw topic's log start passed the group's committed
    # offset (retention; here DeleteRecords, which moves it the same way): librdkafka went on
    # from the log start with a line of its own, and 55 events were skipped unsaid.
    with pipeline(stack, tmp_path, partitions=1) as pipe:
        pipe.start_router(wait=True)
        pipe.insert(_orders(3, 1), per_transaction=1)
        pipe.read(pipe.orders_topic, 3)
        # QA 54-a F-3: SIGHUP (a reload, a closed terminal) ended the router at once, mid-batch
        # and unsaid; it is logged and ignored, and the SIGTERM after it still stops it cleanly.
        os.kill(pipe.routers["a"].pid, signal.SIGHUP)
        deadline = time.monotonic() + 30
        while "event=sighup_ignored" not in pipe.router_log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "event=sighup_ignored" in pipe.router_log()
        assert pipe.kill_router(sig=signal.SIGTERM) == 0
        later = pipe.insert(_orders(4, 1), per_transaction=1)
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        raw = pipe.read(pipe.raw_topic, 7, timeout_s=120)  # Debezium's commits come when
        assert len(raw) == 7 and len(pipe.read_all(pipe.raw_topic, settle_s=0)) == 7  # they do
        start = raw[5].offset()  # the last two of the four later events stay
        for future in admin.delete_records([TopicPartition(pipe.raw_topic, 0, start)]).values():
            future.result(timeout=30)
        pipe.start_router(wait=True)
        delivered = pipe.read(pipe.orders_topic, 5)
        settled = pipe.read_all(pipe.orders_topic, settle_s=2)
        log = pipe.router_log()
    assert [r.key().decode() for r in delivered[3:]] == later[2:] and len(settled) == 5
    [line] = [line for line in log.splitlines() if "event=raw_records_deleted" in line]
    assert f"topic={pipe.raw_topic} partition=0" in line and "ERROR" in line
    # Review 50-b F9: without -c the command exited 2 (Missing option '-c' / '--config').
    assert "`cdc-router outbox republish -c CONFIG --since TIME --dry-run`" in line


def test_the_grants_lookup_reads_a_topics_authorized_operations_from_the_broker(
        stack: StackEndpoints) -> None:
    # router/grants.py (QA 31-c): the broker says what the principal may do on a topic; this
    # stack has no authorizer, so every operation, and nothing for a topic that is not there.
    from cdc_router.router.grants import admin_operations, refused

    topic = unique("grants").replace("_", "-")
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    try:
        operations = admin_operations({"bootstrap.servers": stack.bootstrap_servers})
        granted = operations(topic, 10)
        missing = operations(topic + "-nowhere", 10)
    finally:
        admin.delete_topics([topic])[topic].result(timeout=30)
    assert granted is not None and {"READ", "WRITE", "DESCRIBE"} <= granted
    assert refused(topic, granted, "WRITE") is None
    assert missing is None


def test_after_a_rebalance_replays_of_ids_restored_before_it_still_drop(
        stack: StackEndpoints, tmp_path: Path) -> None:
    """Review 59-r F-1, on the real changelog reader: an assignment's restore emptied the
    replay filter and read the changelog on from its last read, so an instance that restored
    marks at its start forgot them at its next assignment, and Debezium's replays of those
    events went out again."""
    events = 60  # under the replay lines' cap (SAID_PER_MINUTE): each drop has its line
    with pipeline(stack, tmp_path, partitions=2, raw_partitions=2) as pipe:
        pipe.start_router("first", wait=True)
        ids = pipe.insert(_orders(events, 6))
        assert len(pipe.read(pipe.orders_topic, events)) == events
        raw = pipe.read(pipe.raw_topic, events)
        assert pipe.kill_router("first", signal.SIGTERM) == 0
        # "a" restores the marks at its start; "b" joining makes it restore again.
        pipe.start_router("a", wait=True)
        before = pipe.router_log("a").count("event=assigned")
        pipe.start_router("b", wait=True)
        deadline = time.monotonic() + 60
        while pipe.router_log("a").count("event=assigned") <= before:
            assert time.monotonic() < deadline, "a was never assigned again"
            time.sleep(0.2)
        producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
        for record in raw:  # Debezium's replays: the same change events again
            producer.produce(pipe.raw_topic, key=record.key(), value=record.value(),
                             partition=record.partition())
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 120
        while sum(pipe.router_log(i).count("event=replay_dropped") for i in "ab") < events:
            assert time.monotonic() < deadline, pipe.router_log("a")[-3000:]
            time.sleep(0.5)
        delivered = Counter(r.key().decode() for r in pipe.read_all(pipe.orders_topic))
    assert delivered == Counter(ids)
