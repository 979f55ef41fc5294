"""The stack end to end below the router: an outbox insert becomes a Debezium change event."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from tests.integration.support import (
    POSTGRES_CONNECTOR,
    StackEndpoints,
    connector,
    read_topic,
    unique,
)

pytestmark = pytest.mark.integration


def test_outbox_insert_reaches_the_raw_topic(stack: StackEndpoints) -> None:
    table = unique("outbox_capture")
    prefix = unique("capture").replace("_", "-")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"""CREATE TABLE public.{table} (
            id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL,
            type text NOT NULL, payload jsonb NOT NULL, headers jsonb,
            created_at timestamp(6) NOT NULL DEFAULT now())""")
        conn.execute(f"CREATE PUBLICATION {table} FOR TABLE public.{table} "
                     "WITH (publish = 'insert')")
    user, password = _credentials(stack.postgres_dsn)
    config = {
        "connector.class": POSTGRES_CONNECTOR,
        "database.hostname": "127.0.0.1",
        "database.port": str(psycopg.conninfo.conninfo_to_dict(stack.postgres_dsn)["port"]),
        "database.user": user,
        "database.password": password,
        "database.dbname": "postgres",
        "topic.prefix": prefix,
        "plugin.name": "pgoutput",
        "slot.name": table,
        "publication.name": table,
        "publication.autocreate.mode": "disabled",
        "table.include.list": f"public.{table}",
        "snapshot.mode": "no_data",
        # Logical decoding messages (another connector's heartbeats) are database-wide.
        "message.prefix.exclude.list": ".*",
        "exactly.once.support": "required",
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
    }
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
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP PUBLICATION IF EXISTS {table}")
            conn.execute(f"DROP TABLE IF EXISTS public.{table}")
    assert len(records) == 1
    envelope = json.loads(records[0].value())
    payload = envelope.get("payload", envelope)
    assert payload["op"] == "c"
    assert payload["after"]["id"] == event_id
    assert json.loads(payload["after"]["payload"]) == {"total": 10}
    assert isinstance(payload["source"]["lsn"], int) and payload["source"]["lsn"] > 0
    assert json.loads(records[0].key())["id"] == event_id or \
        json.loads(records[0].key())["payload"]["id"] == event_id


def _credentials(dsn: str) -> tuple[str, str]:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    return str(params["user"]), str(params.get("password", ""))
