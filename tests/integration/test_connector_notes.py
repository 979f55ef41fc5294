"""What `connectors apply`'s notes say, run on the real stack (review 64): the incremental
snapshot of a table added to table.include.list, a no_data connector created again."""

from __future__ import annotations

import re
from contextlib import suppress
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_router.connect.checks import include_move, skipped_rows
from cdc_router.connect.client import ConnectClient
from tests.integration.pipeline import pipeline
from tests.integration.support import (
    StackEndpoints,
    create_outbox_table,
    drop_outbox_table,
    wait_connector_running,
)

pytestmark = pytest.mark.integration


def test_the_signal_the_plan_gives_snapshots_just_the_added_table(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # The rows of a table added to the include list, committed before the update, reach its
    # raw topic once the note's INSERT is run, as op r rows; the outbox is not read again.
    with pipeline(stack, tmp_path, partitions=1, connector={
            "signal.data.collection": "public.{table}_signal"}) as pipe:
        added, signals = f"{pipe.name}_b", f"public.{pipe.name}_signal"
        dashed = pipe.name.replace("_", "-")
        added_topic = f"{dashed}.public.{added}"
        # Debezium writes the signal table's rows (and its window markers) to a raw topic
        # too: without it (the stack creates no topic by itself) the task blocks on it.
        signal_topic = f"{dashed}.public.{pipe.name}_signal"

        def run_sql(statement: str) -> None:
            with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
                conn.execute(statement)

        create_outbox_table(stack.postgres_dsn, added)  # and its own publication, unused
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        try:
            run_sql(f"CREATE TABLE {signals} (id varchar(42) PRIMARY KEY, type varchar(32) "
                    "NOT NULL, data varchar(2048))")
            run_sql(f'ALTER PUBLICATION "{pipe.name}" ADD TABLE {signals}')
            for future in admin.create_topics([NewTopic(added_topic, 1, 1),
                                               NewTopic(signal_topic, 1, 1)]).values():
                future.result(timeout=30)
            pipe.insert([("Order", "o-1", "OrderCreated", {"n": 1})])  # the outbox's own
            before = [f"b-{index}" for index in range(20)]
            with psycopg.connect(stack.postgres_dsn) as conn:
                conn.cursor().executemany(
                    f"INSERT INTO public.{added} (id, aggregatetype, aggregateid, type, "
                    "payload) VALUES (gen_random_uuid(), 'Order', %s, 'OrderCreated', '{}')",
                    [(aggregate,) for aggregate in before])
            # QA 64-a F-2's case: a table with rows, then published and added to the list.
            run_sql(f'ALTER PUBLICATION "{pipe.name}" ADD TABLE public.{added}')
            with ConnectClient(stack.connect_url) as client:
                deployed = client.get_config(dashed)
                desired = {**deployed, "table.include.list":
                           f"{deployed['table.include.list']},public.{added}"}
                note = include_move(deployed, desired)
                assert note is not None
                [statement] = re.findall(r"`(INSERT INTO [^`]+)`", note)
                client.put_config(dashed, {key: value for key, value in desired.items()
                                           if key != "name"})
            # The task restarts with the new list: a probe row a few seconds apart until one
            # is streamed (an insert), so that the signal reaches the task that has the table.
            probes = 0
            while True:
                probes += 1
                assert probes <= 30, "the added table's inserts were never streamed"
                with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
                    conn.execute(f"INSERT INTO public.{added} (id, aggregatetype, aggregateid, "
                                 "type, payload) VALUES (gen_random_uuid(), 'Order', %s, "
                                 "'OrderCreated', '{}')", (f"probe-{probes}",))
                if pipe.read(added_topic, 1, timeout_s=5):
                    break
            run_sql(statement)
            wanted = {*before, *(f"probe-{index}" for index in range(1, probes + 1))}
            read: set[str] = set()
            streamed: set[str] = set()
            for record in pipe.read(added_topic, probes + len(wanted), timeout_s=180):
                value = record.value() or b""
                found = re.search(rb'"aggregateid":"([^"]+)"', value)
                assert found is not None, value
                (read if b'"op":"r"' in value else streamed).add(found.group(1).decode())
            assert not streamed & set(before), "streamed: not the case the note is for"
            assert read == wanted, sorted(wanted - read)
            assert len(pipe.read_all(pipe.raw_topic, settle_s=2)) == 1  # not re-snapshotted
        finally:
            with suppress(Exception):
                run_sql(f"DROP TABLE IF EXISTS {signals}")
            drop_outbox_table(stack.postgres_dsn, added)
            for future in admin.delete_topics([added_topic, signal_topic]).values():
                with suppress(Exception):
                    future.result(timeout=30)


def test_a_no_data_connector_created_again_on_its_slot_skips_nothing(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # Review 64 (low): the no_data note of `connectors apply` also shows for a connector
    # deleted and created again, whose slot (and offsets) stayed: the row written meanwhile
    # is delivered, as the note now says.
    with pipeline(stack, tmp_path, partitions=1) as pipe:  # snapshot.mode no_data
        dashed = pipe.name.replace("_", "-")
        pipe.insert([("Order", "o-1", "OrderCreated", {"n": 1})])
        assert len(pipe.read(pipe.raw_topic, 1, timeout_s=120)) == 1
        with ConnectClient(stack.connect_url) as client:
            config = client.get_config(dashed)
            config.pop("name", None)
            note = skipped_rows(config)
            assert note is not None and "skips nothing" in note, note
            client.delete(dashed)
            pipe.insert([("Order", "o-2", "OrderCreated", {"n": 2})])  # while it is gone
            client.put_config(dashed, config)
        wait_connector_running(stack.connect_url, dashed)
        pipe.insert([("Order", "o-3", "OrderCreated", {"n": 3})])
        ids = [re.search(rb'"aggregateid":"([^"]+)"', record.value() or b"").group(1)
               for record in pipe.read(pipe.raw_topic, 3, timeout_s=120)]  # type: ignore[union-attr]
        assert sorted(ids) == [b"o-1", b"o-2", b"o-3"], ids
