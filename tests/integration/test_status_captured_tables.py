"""`status` of a connector capturing two outbox tables checks both (QA 55-a F-4: only
cleanup.table was checked; the other table's 10,620 rows and its age went unseen)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from tests.integration.pipeline import pipeline
from tests.integration.support import StackEndpoints

pytestmark = pytest.mark.integration


def _problems(report: dict[str, Any]) -> list[str]:
    return [f"{p['level']}: {p['component']}: {p['message']}" for p in report["problems"]]


def test_each_table_the_connector_captures_is_checked(stack: StackEndpoints,
                                                      tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, partitions=1, connector={
            "table.include.list": "public.{table},public.{table}_legacy"}) as pipe:
        legacy = f"public.{pipe.name}_legacy"
        config = yaml.safe_load(pipe.config_path.read_text())
        config["cleanup"] = {"table": f"public.{pipe.table}"}
        config["status"] = {"outbox_rows_warning": 3}
        pipe.config_path.write_text(yaml.safe_dump(config))
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {legacy} (LIKE public.{pipe.table} INCLUDING ALL)")
            conn.execute(f"INSERT INTO {legacy} (id, aggregatetype, aggregateid, type, payload) "
                         "SELECT gen_random_uuid(), 'Order', 'o-' || n, 'OrderPaid', '{}' "
                         "FROM generate_series(1, 4) AS n")
        try:
            done = pipe.status("-o", "json")
            report = json.loads(done.stdout)
            [other] = report["outbox"]["others"]
            assert (other["table"], other["rows"], other["is_cleanup_table"]) == (
                legacy, 4, False), other
            assert other["oldest_age_s"] is not None and other["size_bytes"] > 0
            assert report["outbox"]["table"] == f"public.{pipe.table}"
            assert report["outbox"]["rows"] == 0
            problems = _problems(report)
            # Not in the connector's publication yet: Debezium never streams its rows.
            assert any(line.startswith("critical: publication: ") and
                       f'ADD TABLE "public"."{pipe.name}_legacy"' in line
                       for line in problems), problems
            assert f"warning: outbox: {legacy} holds 4 rows (warning at 3): the router's " \
                "cleanup deletes from cleanup.table alone" in "\n".join(problems), problems
            with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
                conn.execute(f'ALTER PUBLICATION "{pipe.name}" ADD TABLE {legacy}')
            done = pipe.status()
            assert done.returncode == 1, done.stdout + done.stderr
            outbox = [line for line in done.stdout.splitlines() if line.startswith("outbox ")]
            assert outbox[0].startswith(f"outbox public.{pipe.table}: 0 rows"), done.stdout
            assert outbox[1].startswith(f"outbox {legacy}: 4 rows, oldest "), done.stdout
            assert "critical" not in done.stdout, done.stdout
        finally:
            with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
                conn.execute(f"DROP TABLE IF EXISTS {legacy}")


def test_with_cleanup_off_the_outbox_is_a_captured_table(stack: StackEndpoints,
                                                         tmp_path: Path) -> None:
    """QA 57-d F-2: cleanup off (cleanup.table the default public.outbox, another pipeline's)
    and two captured tables: status took public.outbox as this pipeline's outbox and called a
    healthy pipeline critical, advising to add it to the publication."""
    with pipeline(stack, tmp_path, partitions=1, connector={
            "table.include.list": "public.{table},public.{table}_legacy"}) as pipe:
        legacy = f"public.{pipe.name}_legacy"
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {legacy} (LIKE public.{pipe.table} INCLUDING ALL)")
            conn.execute(f'ALTER PUBLICATION "{pipe.name}" ADD TABLE {legacy}')
        try:
            done = pipe.status("-o", "json")
            report = json.loads(done.stdout)
            assert report["outbox"]["table"] == f"public.{pipe.table}", report["outbox"]
            assert [other["table"] for other in report["outbox"]["others"]] == [legacy]
            problems = _problems(report)
            assert not [line for line in problems if line.startswith("critical")], problems
            assert "public.outbox " not in done.stdout + done.stderr
        finally:
            with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
                conn.execute(f"DROP TABLE IF EXISTS {legacy}")


def test_a_captured_table_another_pipeline_reads_is_not_warned_of_once_named(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # Review 64 (low): one connector capturing two pipelines' outboxes, each router reading
    # its own raw topic, kept a warning for ever; status.read_elsewhere names the other one.
    with pipeline(stack, tmp_path, partitions=1, connector={
            "table.include.list": "public.{table},public.{table}_other"}) as pipe:
        other_topic = f"{pipe.name.replace('_', '-')}.public.{pipe.name}_other"
        unread = json.loads(pipe.status("-o", "json").stdout)["connector"]["unread_topics"]
        assert unread == [other_topic], unread
        config = yaml.safe_load(pipe.config_path.read_text())
        config["status"] = {"read_elsewhere": [other_topic]}
        pipe.config_path.write_text(yaml.safe_dump(config))
        report = json.loads(pipe.status("-o", "json").stdout)
        assert report["connector"]["unread_topics"] == [], report["connector"]
        assert not [line for line in _problems(report) if other_topic in line], report
