"""The stack end to end below the router: an outbox insert becomes a Debezium change event."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from tests.integration.support import (
    StackEndpoints,
    connector,
    create_outbox_table,
    debezium_config,
    drop_outbox_table,
    read_topic,
    unique,
)

pytestmark = pytest.mark.integration


def test_outbox_insert_reaches_the_raw_topic(stack: StackEndpoints) -> None:
    table = unique("outbox_capture")
    prefix = unique("capture").replace("_", "-")
    create_outbox_table(stack.postgres_dsn, table)
    config = debezium_config(stack, name=table, prefix=prefix,
                             **{"exactly.once.support": "required",
                                "topic.creation.default.replication.factor": "1",
                                "topic.creation.default.partitions": "1"})
    event_id = str(uuid.uuid4())
    try:
        with connector(stack, prefix, config):
            with psycopg.connect(stack.postgres_dsn) as conn:
                conn.execute(
                    f"INSERT INTO public.{table} (id, aggregatetype, aggregateid, type, payload)"
                    " VALUES (%s, 'Order', '42', 'OrderPaid', %s)",
                    (event_id, json.dumps({"total": 10})))
            records = read_topic(stack.bootstrap_servers, f"{prefix}.public.{table}", 1)
    finally:
        drop_outbox_table(stack.postgres_dsn, table)
    assert len(records) == 1
    envelope = json.loads(records[0].value())
    payload = envelope.get("payload", envelope)
    assert payload["op"] == "c"
    assert payload["after"]["id"] == event_id
    assert json.loads(payload["after"]["payload"]) == {"total": 10}
    assert isinstance(payload["source"]["lsn"], int) and payload["source"]["lsn"] > 0
    assert json.loads(records[0].key())["id"] == event_id or \
        json.loads(records[0].key())["payload"]["id"] == event_id

