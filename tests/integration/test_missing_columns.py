"""A `source.outbox` column the table calls otherwise (QA 48-a F-med-1), or a route's `key`
column the table lacks (QA 60-c F-2), on the real stack: the router stops with the field to
set instead of dead-lettering every event, and once the config is fixed it delivers each event
once."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psycopg
import yaml

from cdc_router.router.missing_columns import RUN_LIMIT
from tests.integration.pipeline import REPO, Pipeline, Row, pipeline
from tests.integration.support import StackEndpoints

EVENTS = 150  # more than router/missing_columns.RUN_LIMIT, fewer than one poll's batch
FIRST = 40  # fewer than RUN_LIMIT: dead letters before the run stops the router


def _dlq_replay(pipe: Pipeline) -> int:
    """`cdc-router dlq replay` of the pipeline's letters (exit 0); how many it delivered."""
    done = subprocess.run([sys.executable, "-m", "cdc_router", "dlq", "replay", "-c",
                           str(pipe.config_path), "-o", "json", "--yes"],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    delivered: int = json.loads(done.stdout)["committed"]["deliver"]
    return delivered


def test_a_misnamed_column_stops_the_router_and_the_fix_delivers_each_event_once(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, config={"source": {"outbox": {"payload": "body"}}}) as pipe:
        rows = [("Order", f"o-{n % 5}", "OrderPaid", {"n": n}) for n in range(EVENTS)]
        # A run short of RUN_LIMIT is each event's dead letter, committed: `dlq replay`
        # delivers them once the config is fixed.
        ids = pipe.insert(rows[:FIRST])
        pipe.start_router()
        assert len(pipe.read(pipe.dlq_topic, FIRST)) == FIRST
        ids += pipe.insert(rows[FIRST:])
        assert pipe.routers.pop("a").wait(timeout=180) == 1
        log = pipe.router_log()
        assert "field 'source.outbox.payload'" in log and "no column 'body'" in log
        assert "its rows have id, aggregatetype, aggregateid, type, payload" in log
        # The batch the stop aborted wrote no letter; one committed before the run reached
        # RUN_LIMIT kept its letters (a fetch may split the rest: CI, stop 58, 75 and 75).
        lettered = len(pipe.read_all(pipe.dlq_topic, settle_s=0))
        assert FIRST <= lettered < RUN_LIMIT

        config = yaml.safe_load(pipe.config_path.read_text())
        del config["source"]["outbox"]
        pipe.config_path.write_text(yaml.safe_dump(config))
        pipe.start_router("b")
        assert len(pipe.read(pipe.orders_topic, EVENTS - lettered)) == EVENTS - lettered
        assert _dlq_replay(pipe) == lettered
        delivered = Counter(record.key().decode()
                            for record in pipe.read_all(pipe.orders_topic))
        assert sorted(delivered) == sorted(ids) and set(delivered.values()) == {1}
        assert len(pipe.read_all(pipe.dlq_topic, settle_s=0)) == lettered


ORDERS = 150  # of routes[0], whose key column the table lacks: more than RUN_LIMIT
FIRST_ORDERS = 40  # fewer than RUN_LIMIT: route letters, committed, the router running on
# connectors/outbox-connector.json's: with Connect's default, true, JsonConverter writes a NULL
# in a column with a DEFAULT as the default ('eu' here), and the NULL row was delivered.
AS_SHIPPED = {"value.converter": "org.apache.kafka.connect.json.JsonConverter",
              "value.converter.schemas.enable": "false",
              "value.converter.replace.null.with.default": "false"}


def _orders_and_customers(count: int, start: int) -> list[Row]:
    """`count` Order events (routes[0]) with a Customer event (routes[1]) after every fourth:
    another route's events neither end nor lengthen routes[0]'s run."""
    rows: list[Row] = []
    for n in range(start, start + count):
        rows.append(("Order", f"o-{n % 5}", "OrderPaid", {"n": n}))
        if n % 4 == 3:
            rows.append(("Customer", f"c-{n}", "CustomerSeen", {"n": n}))
    return rows


def _reasons(pipe: Pipeline) -> dict[str, tuple[str, str]]:
    """Each dead letter's (stage, reason) by event id, to the topic's end."""
    letters = ({name: value.decode() for name, value in letter.headers()}
               for letter in pipe.read_all(pipe.dlq_topic, settle_s=0))
    return {h["dlq.event.id"]: (h["dlq.stage"], h["dlq.error.message"]) for h in letters}


def test_a_route_key_column_the_table_lacks_stops_the_router_and_the_fix_delivers_once(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 60-c F-2: `key: <column>` naming no column of the table dead-lettered every event of
    # the route as 'missing or null' (18,736 letters in 20 s), the router running on.
    with pipeline(stack, tmp_path, connector=AS_SHIPPED) as pipe:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE public.{pipe.table} ADD COLUMN region text DEFAULT 'eu'")
        config = yaml.safe_load(pipe.config_path.read_text())
        config["routes"][0]["key"] = "regoin"  # the table's column is `region`
        pipe.config_path.write_text(yaml.safe_dump(config))
        first = _orders_and_customers(FIRST_ORDERS, 0)
        rest = _orders_and_customers(ORDERS - FIRST_ORDERS, FIRST_ORDERS)
        ids = pipe.insert(first)
        pipe.start_router()
        assert len(pipe.read(pipe.dlq_topic, FIRST_ORDERS)) == FIRST_ORDERS
        reasons = _reasons(pipe)
        order_ids = [i for i, row in zip(ids, first, strict=True) if row[0] == "Order"]
        assert sorted(reasons) == sorted(order_ids)
        stage, reason = reasons[order_ids[0]]
        assert stage == "route", reason
        assert "key column 'regoin' of routes[0] is not a column of the row, whose other " \
               "columns are 'region': routes[0].key names a column the table does not have" \
               in reason, reason
        ids += pipe.insert(rest)
        assert pipe.routers.pop("a").wait(timeout=180) == 1
        log = " ".join(pipe.router_log().split())
        assert f"the last {RUN_LIMIT} events of routes[0] have no column 'regoin'" in log, \
            log[-3000:]
        assert "field 'routes[0].key'" in log
        assert "the rows' other columns are 'region': set routes[0].key to one of them" in log
        # The batch the stop aborted wrote no letter; those committed before it stay.
        lettered = len(_reasons(pipe))
        assert FIRST_ORDERS <= lettered < RUN_LIMIT

        config["routes"][0]["key"] = "region"
        pipe.config_path.write_text(yaml.safe_dump(config))
        pipe.start_router("b")
        customers = sum(row[0] == "Customer" for row in first + rest)
        assert len(pipe.read(pipe.orders_topic, ORDERS - lettered)) == ORDERS - lettered
        assert _dlq_replay(pipe) == lettered
        # A NULL in the column the table has is that row's letter only: the router runs on.
        with psycopg.connect(stack.postgres_dsn) as conn:
            null_id = str(conn.execute(
                f"INSERT INTO public.{pipe.table} (id, aggregatetype, aggregateid, type, "
                "payload, region) VALUES (gen_random_uuid(), 'Order', 'o-0', 'OrderPaid', "
                "'{}', NULL) RETURNING id").fetchone()[0])  # type: ignore[index]
        assert len(pipe.read(pipe.dlq_topic, lettered + 1, timeout_s=60)) == lettered + 1
        assert "key column 'region' of routes[0] is null in the row" in \
            _reasons(pipe)[null_id][1]
        orders = pipe.read_all(pipe.orders_topic)
        events = pipe.read_all(pipe.events_topic, settle_s=0)
        assert pipe.routers["b"].poll() is None, pipe.router_log("b")[-3000:]
    order_ids = [i for i, row in zip(ids, first + rest, strict=True) if row[0] == "Order"]
    delivered = Counter(record.key().decode() for record in orders)
    assert delivered == {"eu": ORDERS}  # keyed by the region column now
    assert sorted(dict(record.headers())["id"].decode() for record in orders) == \
        sorted(order_ids)
    assert Counter(record.key().decode() for record in events) == \
        Counter(i for i in ids if i not in order_ids)
    assert len(events) == customers
