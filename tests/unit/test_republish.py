"""`outbox republish`: rows as Debezium's change events, read back by the router's decoder,
and produced onto the raw topic where Kafka Connect would have put them."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from typing import Any

import pytest
from confluent_kafka import KafkaError

from cdc_router.config.model import RouterConfig
from cdc_router.errors import ConfigError, DeliveryError
from cdc_router.outbox.republish import change_event, key_columns
from cdc_router.outbox.table import OutboxSchema
from cdc_router.router import debezium
from cdc_router.router.partitioner import java_default_partition
from cdc_router.router.republish import raw_topic, republish
from tests.unit.router_fakes import RAW, FakeCluster, FakeProducer

EVENT_ID = uuid.UUID("73484e51-061a-454f-81ea-e90c17837bc9")
CREATED = datetime(2026, 12, 1, 9, 30, 0, 123456)  # naive: `timestamp` holds UTC


def row(**changes: Any) -> dict[str, Any]:
    """A row as psycopg returns it, with json(b) columns as their Postgres text."""
    return {"id": EVENT_ID, "aggregatetype": "Order", "aggregateid": "42",
            "type": "OrderPaid", "payload": '{"total": "19.90"}',
            "headers": '{"tenant": "acme"}', "created_at": CREATED, "region": "eu",
            **changes}


def config(**top: Any) -> RouterConfig:
    return RouterConfig.model_validate({"source": {"topics": [RAW]},
                                        "routes": [{"topic": "orders"}], **top})


def test_a_row_becomes_the_event_the_router_decodes_from_debezium() -> None:
    settings = config().source
    event = change_event(row(), OutboxSchema(), binary_handling="base64", ts_ms=5)
    assert event.key == b'{"id":"73484e51-061a-454f-81ea-e90c17837bc9"}'
    decoded = debezium.decode_change(event.key, event.value, topic=RAW, settings=settings)
    assert isinstance(decoded, debezium.OutboxEvent)
    assert (decoded.event_id, decoded.aggregate_type, decoded.aggregate_id, decoded.type) == (
        str(EVENT_ID), "Order", "42", "OrderPaid")
    assert decoded.payload == b'{"total": "19.90"}' and decoded.payload_is_json
    assert decoded.headers == (("tenant", "acme"),)
    assert decoded.created_at_ms == int(CREATED.replace(tzinfo=UTC).timestamp() * 1000)
    assert decoded.op == "c" and decoded.column("region") == "eu"


@pytest.mark.parametrize("handling", ["base64", "hex"])
def test_a_bytea_payload_is_encoded_as_the_connector_says(handling: str) -> None:
    settings = config(source={"topics": [RAW], "binary_handling": handling,
                              "payload_type": "bytes"}).source
    event = change_event(row(payload=b"\xc3\x01avro"), OutboxSchema(),
                         binary_handling=handling, ts_ms=5)
    decoded = debezium.decode_change(None, event.value, topic=RAW, settings=settings)
    assert isinstance(decoded, debezium.OutboxEvent) and decoded.payload == b"\xc3\x01avro"


def test_events_land_on_the_partition_kafka_connect_gives_their_key() -> None:
    cluster = FakeCluster(partitions={RAW: 4})
    events = [change_event(row(id=uuid.UUID(int=n)), OutboxSchema(), binary_handling="base64",
                           ts_ms=5) for n in range(6)]
    done = republish(config(), RAW, events,
                     producer_factory=lambda conf: FakeProducer(cluster, conf),
                     operations_factory=cluster.operations_factory)
    assert done == 6
    stored = {s.key: (s.partition, s.value) for s in cluster.committed(RAW)}
    assert stored == {e.key: (java_default_partition(e.key, 4), e.value) for e in events}
    assert len({partition for partition, _ in stored.values()}) > 1


def test_a_change_event_kafka_refuses_stops_the_republish_in_one_line_naming_its_id() -> None:
    # Debezium's events may be 16 MiB (connectors/outbox-connector.json): so may ours; one the
    # cluster still refuses is named, after the batches before it (none here) committed.
    cluster = FakeCluster(partitions={RAW: 1}, max_message_bytes=2000)
    configs: list[dict[str, Any]] = []

    def factory(conf: dict[str, Any]) -> FakeProducer:
        configs.append(conf)
        return FakeProducer(cluster, conf)

    big = change_event(row(payload='"' + "x" * 3000 + '"'), OutboxSchema(),
                       binary_handling="base64", ts_ms=5)
    with pytest.raises(DeliveryError, match=rf"republish stopped after 0 committed events: Kafka "
                                            rf"refused the change event of {EVENT_ID} \(\d+ bytes"):
        republish(config(), RAW, [big], producer_factory=factory,
                  operations_factory=cluster.operations_factory)
    assert configs[0]["message.max.bytes"] == 16 * 1024 * 1024


def test_a_change_event_the_broker_refuses_is_named_too() -> None:
    # QA 33-c: a raw topic whose max.message.bytes is under the producer's: the broker's
    # refusal named no row, and running it again hit the same one.
    big_id = uuid.UUID(int=7)
    cluster = FakeCluster(partitions={RAW: 1}, refuse=lambda topic, value, timestamp: (
        KafkaError.MSG_SIZE_TOO_LARGE if value is not None and len(value) > 2000 else None))
    small = change_event(row(), OutboxSchema(), binary_handling="base64", ts_ms=5)
    big = change_event(row(id=big_id, payload='"' + "x" * 3000 + '"'), OutboxSchema(),
                       binary_handling="base64", ts_ms=5)
    with pytest.raises(DeliveryError, match=rf"\(the biggest refused change event: {big_id}, "
                                            r"\d+ bytes; raise the raw topic's max.message"):
        republish(config(), RAW, [small, big],
                  producer_factory=lambda conf: FakeProducer(cluster, conf),
                  operations_factory=cluster.operations_factory)


def test_republish_refuses_a_missing_topic_and_a_router_without_dedup() -> None:
    cluster = FakeCluster(partitions={})
    with pytest.raises(DeliveryError, match="does not exist"):
        republish(config(), RAW, [], producer_factory=lambda conf: FakeProducer(cluster, conf),
                  operations_factory=cluster.operations_factory)
    with pytest.raises(ConfigError, match="dedup"):
        republish(config(dedup={"enabled": False}), RAW, [])


def test_a_raw_topic_the_principal_may_not_write_to_is_refused_before_producing() -> None:
    # Review 51-d F10: the refusal came in AddPartitionsToTxn, and the line said only
    # "Kafka transaction step 'abort' failed for good: INVALID_TXN_STATE".
    cluster = FakeCluster(partitions={RAW: 1}, add_partitions_refused={RAW},
                          granted={RAW: frozenset({"DESCRIBE", "READ"})})
    cluster.abort_failures.append(KafkaError(KafkaError.INVALID_TXN_STATE,
                                             "Failed to end transaction", fatal=True))
    event = change_event(row(), OutboxSchema(), binary_handling="base64", ts_ms=5)
    with pytest.raises(DeliveryError, match=f"nothing was republished: .*may not write topic "
                                            f"{RAW} .*grant it Write on the topic"):
        republish(config(), RAW, [event],
                  producer_factory=lambda conf: FakeProducer(cluster, conf),
                  operations_factory=cluster.operations_factory)
    assert cluster.committed(RAW) == [] and cluster.producers_initialised == 0


def test_the_raw_topic_is_the_configs_one_source_unless_named() -> None:
    assert raw_topic(config(), None) == RAW
    assert raw_topic(config(source={"topics": ["^outbox.*"]}), "outbox.x") == "outbox.x"
    with pytest.raises(ConfigError, match="--topic"):
        raw_topic(config(source={"topics": ["a", "b"]}), None)
    assert raw_topic(config(source={"topics": ["a", "b"]}), "b") == "b"
    relay = RouterConfig.model_validate({"source": {"group_id": "qr"},
                                         "routes": [{"topic": "orders"}],
                                         "relay": {"table": "public.outbox_relay"}})
    for topic in (None, "outbox.public.outbox_relay"):  # QA 47-d F6: a circle of errors
        with pytest.raises(ConfigError, match=r"field 'source\.topics': names no raw topic"):
            raw_topic(relay, topic)


@pytest.mark.parametrize("topic", ["orders", "dlq", "changelog", "outbox.y.z", "nosuch"])
def test_only_a_topic_the_router_reads_takes_republished_change_events(topic: str) -> None:
    # QA, session 25: `--topic` wrote Debezium envelopes onto a destination topic and the
    # changelog, and said the router would drop what it delivered.
    with pytest.raises(ConfigError, match=rf"'--topic': is not a topic the router reads.*{topic}"):
        raw_topic(config(source={"topics": ["^outbox\\.x\\..*", RAW]}), topic)


@pytest.mark.parametrize(("setting", "columns"), [
    (None, ("id",)),
    ("aggregateid", ("aggregateid",)),
    (" aggregateid , type ", ("aggregateid", "type")),
    ("public.outbox:aggregateid", ("aggregateid",)),
    ("public.other:id;public.out.*:aggregateid,type", ("aggregateid", "type")),
    # Review 45-3: as Debezium matches them: case-blind, every matching entry's columns.
    ("PUBLIC.Outbox:aggregateid", ("aggregateid",)),
    ("public.outbox:aggregateid;.*:type,aggregateid", ("aggregateid", "type")),
])
def test_key_columns_take_the_connectors_setting_or_the_columns_alone(
        setting: str | None, columns: tuple[str, ...]) -> None:
    assert key_columns(setting, OutboxSchema()) == columns
    # A table named without its schema is public's, as Postgres takes it.
    assert key_columns(setting, OutboxSchema(table="outbox")) == columns


def test_a_non_ascii_key_is_written_as_jackson_writes_it() -> None:
    # Review 45-3: "caf\u00e9" is other bytes than Debezium's "café", so another partition.
    event = change_event(row(aggregateid="café"), OutboxSchema(), binary_handling="base64",
                         ts_ms=5, key=("aggregateid",))
    assert event.key == '{"aggregateid":"café"}'.encode()


@pytest.mark.parametrize(("setting", "problem"), [
    ("", "names no column"), (" , ", "names no column"), ("public.outbox:", "names no column"),
    ("public.other:id", "no entry names the outbox table public.outbox"),
])
def test_key_columns_that_name_nothing_here_are_refused(setting: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as refused:
        key_columns(setting, OutboxSchema())
    assert refused.value.field == "--key-columns"


def test_the_key_takes_its_columns_in_the_tables_order_as_debezium_does() -> None:
    event = change_event(row(), OutboxSchema(), binary_handling="base64", ts_ms=5,
                         key=("type", "aggregateid"))
    assert event.key == b'{"aggregateid":"42","type":"OrderPaid"}'



# Debezium's own expectations (AbstractRecordsProducerTest, adaptive_time_microseconds), for
# 2016-11-04T13:51:30.123456: TIMESTAMP(3) as epoch milliseconds, TIMESTAMP and TIMESTAMP(6)
# as microseconds, DATE as epoch days, TIME as microseconds past midnight; a timestamptz with
# its precision's fraction digits ("2020-04-01T11:51:02.000000Z").
_MICROS = 1478267490123456


@pytest.mark.parametrize(("sql_type", "value", "keyed"), [
    ("timestamp(3) without time zone", _MICROS - 456, 1478267490123),
    ("timestamp(0) without time zone", _MICROS - 123456, 1478267490000),
    ("timestamp(0) without time zone", -1, -1),  # 1969-12-31 23:59:59.999999 floored, as Java
    ("timestamp without time zone", _MICROS, _MICROS),
    ("timestamp(4) without time zone", _MICROS - 56, _MICROS - 56),
    ("date", date(2016, 11, 4), 17109),
    ("time without time zone", time(13, 51, 30), 49_890_000_000),
    ("time(3) without time zone", time(13, 51, 30, 123000), 49_890_123_000),
    ("timestamp with time zone", datetime(2020, 4, 1, 11, 51, 2, tzinfo=UTC),
     "2020-04-01T11:51:02.000000Z"),
    ("timestamp(3) with time zone",
     datetime(2020, 4, 1, 13, 51, 2, 120000, tzinfo=timezone(timedelta(hours=2))),
     "2020-04-01T11:51:02.120Z"),
    ("timestamp(0) with time zone", datetime(2020, 4, 1, 11, 51, 2, tzinfo=UTC),
     "2020-04-01T11:51:02Z"),
    ("text", "42", "42"),
])
def test_a_key_column_is_encoded_as_debezium_encodes_its_type_and_precision(
        sql_type: str, value: Any, keyed: Any) -> None:
    # Review 46: a timestamp(3) key column went as microseconds, Debezium's as milliseconds:
    # other key bytes, so another raw partition, whose router instance had not seen the row.
    event = change_event(row(aggregateid=value), OutboxSchema(), binary_handling="base64",
                         ts_ms=5, key=("aggregateid",), types={"aggregateid": sql_type})
    assert json.loads(event.key) == {"aggregateid": keyed}


def test_a_millisecond_timestamp_goes_as_milliseconds_in_the_value_too() -> None:
    # Review 46: the value's timestamp(3) created_at went as microseconds, which a router with
    # source.created_at_unit millis read as a time some 46,000 years on.
    types = {"created_at": "timestamp(3) without time zone", "aggregateid": "text"}
    event = change_event(row(created_at=_MICROS - 456), OutboxSchema(), binary_handling="base64",
                         ts_ms=5, types=types)
    assert json.loads(event.value)["after"]["created_at"] == 1478267490123
    micros = change_event(row(created_at=_MICROS), OutboxSchema(), binary_handling="base64",
                          ts_ms=5, types={"created_at": "timestamp(6) without time zone"})
    assert json.loads(micros.value)["after"]["created_at"] == _MICROS
