"""No single row stops the router (issue #11), and at_least_once loses nothing (issue #12.1).

On the real stack: hostile rows among ordinary ones, each dead-lettered with its reason while
the ordinary rows are delivered; an at_least_once router killed with kill -9 while some of its
records are refused by the broker.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from confluent_kafka import Message
from confluent_kafka.admin import AdminClient

from tests.integration.pipeline import Pipeline, pipeline, set_topic_config
from tests.integration.support import StackEndpoints, read_to_end

pytestmark = pytest.mark.integration

AVRO_SCHEMA = Path(__file__).parents[1] / "unit" / "fixtures" / "avro" / "payment_confirmed.avsc"
NOW = "now() AT TIME ZONE 'utc'"
# Kafka Connect's storage topics in the local stack.
CONNECT_TOPICS = ("connect-configs", "connect-offsets", "connect-status")


def insert(pipe: Pipeline, rows: list[dict[str, Any]], per_transaction: int = 200) -> list[str]:
    """Outbox rows with any columns: id (default a new uuid), payload (text, cast to the
    column's type), headers (JSON text), created_at (an SQL timestamp literal, default now);
    their ids, in order."""
    ids = []
    with psycopg.connect(pipe.stack.postgres_dsn) as conn:
        for start in range(0, len(rows), per_transaction):
            for row in rows[start:start + per_transaction]:
                event_id = row.get("id") or str(uuid.uuid4())
                ids.append(event_id)
                conn.execute(
                    f"INSERT INTO public.{pipe.table} (id, aggregatetype, aggregateid, type, "
                    f"payload, headers, created_at) VALUES (%s, %s, %s, %s, %s::json, "
                    f"%s::json, COALESCE(%s::timestamp, {NOW}))",
                    (event_id, row.get("aggregate_type", "Order"), row.get("aggregate_id", "o-1"),
                     row.get("type", "OrderPaid"), row.get("payload", '{"n": 1}'),
                     row.get("headers"), row.get("created_at")))
            conn.commit()
    return ids


def ordinary(count: int) -> list[dict[str, Any]]:
    return [{"aggregate_id": f"order-{i % 40}", "payload": json.dumps({"seq": i})}
            for i in range(count)]


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def _letters_by_id(pipe: Pipeline, count: int | None,
                   timeout_s: float = 180) -> dict[str, dict[str, str]]:
    """Dead letters by event id (by source offset when the id was never decoded); all of them,
    to the topic's end offsets, when `count` is None."""
    letters = pipe.read(pipe.dlq_topic, count, timeout_s=timeout_s) if count is not None \
        else pipe.read_all(pipe.dlq_topic, settle_s=0)
    return {headers.get("dlq.event.id", "offset " + headers["dlq.source.offset"]): headers
            for headers in (
        {name: value.decode(errors="replace") for name, value in letter.headers()}
        for letter in letters)}


def test_hostile_rows_are_dead_lettered_and_the_router_never_stops(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # The limits of connectors/outbox-connector.json (MAX_RECORD_BYTES), so that a payload
    # over the router's max_payload_bytes reaches the router.
    big = {"producer.override.max.request.size": "16777216"}
    with pipeline(stack, tmp_path, partitions=2, connector=big) as pipe:
        set_topic_config(pipe, pipe.raw_topic, "max.message.bytes", "16777216")
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            # json, not jsonb: jsonb refuses a lone surrogate and NUL, json keeps the escapes
            # verbatim; and a text id, which may be any length.
            conn.execute(f"ALTER TABLE public.{pipe.table} ALTER COLUMN payload TYPE json, "
                         "ALTER COLUMN headers TYPE json, ALTER COLUMN id TYPE text")
        config = yaml.safe_load(pipe.config_path.read_text())
        config["routes"][:0] = [
            {"match": {"type": "PaymentConfirmed"}, "topic": pipe.events_topic,
             "format": "avro", "schema": str(AVRO_SCHEMA)},
            {"match": {"type": "CloudEvent"}, "topic": pipe.events_topic,
             "cloudevents": True, "ce_source": "/test"},
            {"match": {"type": "Hostile"}, "topic": "{aggregate_type}"}]
        pipe.config_path.write_text(yaml.safe_dump(config))
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        topics_before = set(admin.list_topics(timeout=10).topics)
        pipe.start_router()
        hostile = {
            "payload_3000_deep": {"payload": nested(3000)},
            "headers_3000_deep": {"headers": nested(3000)},
            "created_at_3h_ahead": {"created_at": None, "ahead": True},
            "created_at_year_12000": {"type": "CloudEvent", "created_at": "12000-01-01 00:00:00"},
            # Older than the topic's retention.ms (7 days): Kafka would delete it at once.
            "created_at_year_2000": {"created_at": "2000-01-01 00:00:00"},
            "lone_surrogate_avro": {"type": "PaymentConfirmed", "payload":
                                    '{"payment_id": "\\ud800", "order_id": 1, '
                                    '"amount_cents": 5}'},
            # librdkafka would cut the name at NUL into a second `id` header: a forged id.
            "header_name_nul": {"headers": '{"id\\u0000x": "00000000-0000-0000-0000-0000dead"}'},
            # 1.2 MB of JSON text, 2.4 MB as the change event's escaped string.
            "payload_1_2_mb": {"payload": json.dumps({"s": '"' * 600_000})},
            # Over the 1,024 bytes an id may have (compressible, for the primary key's index).
            "id_5000_bytes": {"id": "x" * 5_000},
        }
        # Names a templated route renders from row data: Connect's and the registry's storage
        # topics, the broker's, the router's own source, and one that does not exist.
        ghost = f"{pipe.name.replace('_', '-')}-ghost"
        rendered = [*CONNECT_TOPICS, "_schemas", "__consumer_offsets", pipe.raw_topic, ghost]
        hostile.update({f"renders {name}": {"type": "Hostile", "aggregate_type": name}
                        for name in rendered})
        rows = ordinary(2_000)
        positions = random.Random(11).sample(range(len(rows)), len(hostile))
        for position, (name, row) in sorted(zip(positions, hostile.items(), strict=True),
                                            reverse=True):
            row = dict(row, aggregate_id=name)
            if row.pop("ahead", False):
                with psycopg.connect(stack.postgres_dsn) as conn:
                    row["created_at"] = str(conn.execute(
                        f"SELECT {NOW} + interval '3 hours'").fetchone()[0])  # type: ignore[index]
            rows.insert(position, row)
        ids = insert(pipe, rows)
        hostile_ids = {row["aggregate_id"]: event_id for event_id, row in
                       zip(ids, rows, strict=True) if row.get("aggregate_id") in hostile}
        ordinary_ids = set(ids) - set(hostile_ids.values())
        letters = _letters_by_id(pipe, len(hostile))
        orders = pipe.read(pipe.orders_topic, len(ordinary_ids))
        settled = pipe.read_all(pipe.orders_topic, settle_s=3)
        more_letters = pipe.read_all(pipe.dlq_topic, settle_s=2)
        router = pipe.routers["a"]
        still_running = router.poll() is None
        topics_after = set(admin.list_topics(timeout=10).topics)
        log = pipe.router_log()
        leaked = [record for topic in CONNECT_TOPICS for record in
                  read_to_end(stack.bootstrap_servers, topic, isolation="read_uncommitted")
                  if any(event_id.encode() in (record.value() or b"")
                         for event_id in hostile_ids.values())]
    assert still_running, log[-3000:]
    assert len(settled) == len(ordinary_ids), log[-3000:]
    assert Counter(r.key().decode() for r in orders) == Counter(ordinary_ids)
    assert len(more_letters) == len(hostile)
    expected = {"payload_3000_deep": ("serialize", "SerializeError"),
                "headers_3000_deep": ("decode", "DecodeError"),
                "created_at_3h_ahead": ("produce", "DeliveryError"),
                "created_at_year_12000": ("route", "RouteError"),
                "created_at_year_2000": ("produce", "DeliveryError"),
                "lone_surrogate_avro": ("serialize", "SerializeError"),
                "header_name_nul": ("route", "RouteError"),
                "payload_1_2_mb": ("route", "RouteError")}
    expected["id_5000_bytes"] = ("decode", "DecodeError")
    for name, (stage, error_class) in expected.items():
        headers = letters.get(hostile_ids[name]) or next(  # a decode letter of no id
            h for h in letters.values() if h["dlq.stage"] == "decode"
            and ("5,000 bytes" in h["dlq.error.message"]) == (name == "id_5000_bytes"))
        assert (headers["dlq.stage"], headers["dlq.error.class"]) == (stage, error_class), name
        assert headers["dlq.error.message"], name
    assert "holds a NUL character" in letters[hostile_ids["header_name_nul"]]["dlq.error.message"]
    assert "over delivery.max_payload_bytes" in \
        letters[hostile_ids["payload_1_2_mb"]]["dlq.error.message"]
    assert "retention.ms of" in letters[hostile_ids["created_at_year_2000"]]["dlq.error.message"]
    timestamp_reason = letters[hostile_ids["created_at_3h_ahead"]]["dlq.error.message"]
    assert "INVALID_TIMESTAMP" in timestamp_reason
    assert "delivery.record_timestamp: now" in timestamp_reason
    for name in rendered:
        headers = letters[hostile_ids[f"renders {name}"]]
        assert (headers["dlq.stage"], headers["dlq.error.class"]) == ("route", "RouteError")
        assert name in headers["dlq.error.message"], headers
    assert leaked == [], "hostile rows reached Connect's storage topics"
    assert "cause=record_refused" not in log, \
        "the created_at the topic would refuse is dead-lettered before it is produced: no abort"
    assert "Traceback" not in log, log[-3000:]
    ours = pipe.name.replace("_", "-")
    assert {t for t in topics_after - topics_before if ours in t} == set()
    assert ghost not in topics_after


def test_at_least_once_kill_9_and_refused_records_lose_nothing(
        stack: StackEndpoints, tmp_path: Path) -> None:
    rng = random.Random(12)  # seeded: a failure replays with the same kill timings
    config = {"delivery": {"guarantee": "at_least_once"}}
    with pipeline(stack, tmp_path, partitions=2, config=config) as pipe:
        set_topic_config(pipe, pipe.orders_topic, "max.message.bytes", "20000")
        rows = ordinary(4_000)
        big = {"payload": json.dumps({"blob": "x" * 30_000})}  # refused: over the topic's limit
        for position in sorted(rng.sample(range(len(rows)), 6), reverse=True):
            rows.insert(position, dict(big, aggregate_id="refused"))
        pipe.start_router()
        ids: list[str] = []
        writer = threading.Thread(target=lambda: ids.extend(insert(pipe, rows, 50)))
        writer.start()
        kills = 0
        while kills < 4:
            _wait_assigned(pipe, kills + 1)  # kill a router at work, not one starting up
            time.sleep(rng.uniform(0.5, 2.0))
            pipe.kill_router()  # kill -9, by pid
            kills += 1
            pipe.start_router()
        writer.join()
        refused = {event_id for event_id, row in zip(ids, rows, strict=True)
                   if row.get("aggregate_id") == "refused"}
        good = set(ids) - refused
        orders = _read_until(pipe, pipe.orders_topic, good)
        # At least once: a dead letter may be there twice (kill -9 before the offsets).
        _read_until(pipe, pipe.dlq_topic, refused, _event_id_header)
        letters = _letters_by_id(pipe, None)  # _read_until saw every refused id there
        log = pipe.router_log()
    assert len(ids) == len(rows)
    delivered = {r.key().decode() for r in orders}
    lost = sorted(ids.index(event_id) for event_id in good - delivered)
    assert lost == [], f"lost {len(lost)} (rows {lost[:5]}..{lost[-5:]}): {log[-3000:]}"
    assert set(letters) >= refused
    assert {letters[i]["dlq.stage"] for i in refused} == {"produce"}


def _wait_assigned(pipe: Pipeline, times: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while pipe.router_log().count("event=assigned") < times:
        assert time.monotonic() < deadline, pipe.router_log()[-2000:]
        time.sleep(0.1)


def _key(record: Message) -> str:
    return (record.key() or b"").decode()


def _event_id_header(record: Message) -> str:
    return dict(record.headers() or []).get("dlq.event.id", b"").decode()


def _read_until(pipe: Pipeline, topic: str, wanted: set[str],
                event_id: Callable[[Message], str] = _key,
                timeout_s: float = 90) -> list[Message]:
    """Every record of `topic` once all of `wanted` are there (or the timeout passed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = pipe.read_all(topic, settle_s=3)
        if wanted <= {event_id(r) for r in records} or time.monotonic() > deadline:
            return records


def test_a_big_letter_fits_the_dead_letter_topic_when_the_producer_allows_bigger_records(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # Found in session 28: with kafka.producer message.max.bytes raised to 8 MB (for big
    # events) and the dead-letter topic at its 1 MB default, a 1.5 MB poison row's letter was
    # sized for 8 MB, refused by the topic, and the refusal stopped the router.
    big = {"producer.override.max.request.size": "16777216"}
    producer = {"kafka": {"producer": {"message.max.bytes": 8_000_000}}}
    with pipeline(stack, tmp_path, partitions=2, connector=big, config=producer) as pipe:
        set_topic_config(pipe, pipe.raw_topic, "max.message.bytes", "16777216")
        pipe.start_router()
        rows = ordinary(20)
        rows.insert(10, {"aggregate_id": "big", "payload": json.dumps({"s": "x" * 1_500_000})})
        ids = insert(pipe, rows)
        letters = pipe.read(pipe.dlq_topic, 1, timeout_s=120)
        orders = pipe.read(pipe.orders_topic, 20)
        still_running = pipe.routers["a"].poll() is None
        log = pipe.router_log()
    assert still_running and len(orders) == 20, log[-3000:]
    headers = dict(letters[0].headers())
    assert headers["dlq.event.id"].decode() == ids[10]
    assert "over delivery.max_payload_bytes" in headers["dlq.error.message"].decode()
    assert int(headers["dlq.value.dropped.bytes"]) > 1_500_000, "sent without its value"


def test_a_record_over_its_destinations_max_message_bytes_is_dead_lettered_before_producing(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 53-b F2: refused by the broker, each such record aborted batches (161 for 26 with
    # three instances), stalling their partitions for minutes. The router reads the topic's
    # max.message.bytes and dead-letters the record instead: no batch aborted.
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        set_topic_config(pipe, pipe.orders_topic, "max.message.bytes", "50000")
        pipe.start_router()
        rows = ordinary(60)
        for position in (5, 30, 55):
            rows.insert(position, {"aggregate_id": f"big-{position}",
                                   "payload": json.dumps({"s": "x" * 60_000})})
        ids = insert(pipe, rows)
        big = {event_id for event_id, row in zip(ids, rows, strict=True)
               if row["aggregate_id"].startswith("big")}
        letters = _letters_by_id(pipe, 3, timeout_s=120)
        orders = pipe.read(pipe.orders_topic, 60)
        extra = pipe.read_all(pipe.orders_topic, settle_s=3)
        log = pipe.router_log()
    assert set(letters) == big, log[-3000:]
    for headers in letters.values():
        assert headers["dlq.stage"] == "produce"
        reason = headers["dlq.error.message"]
        assert "MSG_SIZE_TOO_LARGE" in reason and "max.message.bytes (50000)" in reason, reason
        assert "dead-lettered before producing" in reason, reason
    delivered = Counter(message.key().decode() for message in extra)
    assert len(orders) == 60 and set(delivered) == set(ids) - big, log[-3000:]
    assert max(delivered.values()) == 1, "each delivered once"
    # Never produced: no abort, no refusal by the broker ("Kafka refused the record for ...").
    assert "event=batch_aborted" not in log and "Kafka refused the record" not in log, \
        log[-3000:]


def test_limits_lowered_while_the_router_runs_are_read_again_at_the_first_refusal(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 57-a F-1, F-3: the destination's max.message.bytes lowered while the router ran was
    # used stale for up to 5 minutes (173 aborted batches), and a dead-letter topic's lowered
    # below a letter stopped the router (exit 1) though a restart sent the letter without its
    # value. Both limits are read again at the first refusal: the router goes on.
    with pipeline(stack, tmp_path, partitions=2) as pipe:
        pipe.start_router()
        insert(pipe, ordinary(10))
        pipe.read(pipe.orders_topic, 10, timeout_s=120)  # the limits are read and cached
        set_topic_config(pipe, pipe.orders_topic, "max.message.bytes", "50000")
        set_topic_config(pipe, pipe.dlq_topic, "max.message.bytes", "40000")
        rows = ordinary(30)
        rows.insert(15, {"aggregate_id": "big", "payload": json.dumps({"s": "x" * 60_000})})
        ids = insert(pipe, rows)
        letters = _letters_by_id(pipe, 1, timeout_s=120)
        orders = pipe.read(pipe.orders_topic, 40)
        still_running = pipe.routers["a"].poll() is None
        log = pipe.router_log()
    assert still_running and list(letters) == [ids[15]], log[-3000:]
    headers = letters[ids[15]]
    assert "max.message.bytes (50000)" in headers["dlq.error.message"], headers
    assert int(headers["dlq.value.dropped.bytes"]) > 60_000, "sent without its value"
    assert len(orders) == 40, log[-3000:]
    assert log.count("event=batch_aborted") <= 4, log[-3000:]
    assert "event=dead_letter_limit_lowered" in log, log[-3000:]
