"""`cdc-router relay`'s start on the real stack: what it says of its position topic, and which
error comes first when it cannot start (review 62 P-2, QA 61-a F-5)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
import yaml
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from tests.integration.relay_setup import STARTED, relay_failing, relay_setup
from tests.integration.support import StackEndpoints

pytestmark = pytest.mark.integration

WARNING = "event=position_topic_config"


def _unset_bounds(bootstrap: str, topic: str) -> None:
    """The position topic as one created before `topics apply` gave it its bounds."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, "", incremental_operation=AlterConfigOpType.DELETE)
        for name in ("segment.ms", "delete.retention.ms")])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def test_a_position_topic_without_the_bounds_of_topics_apply_is_one_warning_at_start(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with relay_setup(stack, tmp_path) as setup:
        setup.start("a")
        setup.wait_for("a", STARTED, 1)
        assert WARNING not in setup.log("a")  # topics apply made it
        setup.kill("a")
        _unset_bounds(stack.bootstrap_servers, setup.position_topic)
        setup.start("b")
        setup.wait_for("b", STARTED, 1)
        warned = [line for line in setup.log("b").splitlines() if WARNING in line]
        assert len(warned) == 1, setup.log("b")
        assert f"topic={setup.position_topic}" in warned[0]
        assert "segment.ms=604800000 (wanted 600000)" in warned[0]
        assert "delete.retention.ms=86400000 (wanted 600000)" in warned[0]
        assert "cdc-router topics apply -c <config>" in warned[0]


def test_a_relay_missing_a_topic_says_so_first_and_its_cleanup_never_sweeps(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 61-a F-5: the cleanup's `cleanup_sweep_failed` on the missing topic came first.
    with relay_setup(stack, tmp_path) as setup:
        config = yaml.safe_load(setup.config_path.read_text())
        config["dedup"]["changelog_topic"] = f"{setup.changelog_topic}-missing"
        config["dead_letter"]["topic"] = f"{setup.dlq_topic}-missing"
        error, stderr = relay_failing(setup, config)
    assert error.startswith("error: ") and f"topic {setup.dlq_topic}-missing does not exist" \
        in error, stderr
    assert "cleanup_sweep_failed" not in stderr, stderr


def test_a_role_without_usage_on_the_tables_schema_is_named_as_the_relays_table(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # Review rv62b: "field 'cleanup.dsn': not a Postgres connection string" (the server's
    # permission denied is a psycopg ProgrammingError, read as libpq's refusal of the DSN).
    with relay_setup(stack, tmp_path) as setup:
        schema, role = f"{setup.name}_s", f"{setup.name}_r"
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
            conn.execute(f"CREATE TABLE {schema}.outbox (LIKE public.{setup.table} "
                         "INCLUDING ALL)")
            conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'x'")
        try:
            dsn = psycopg.conninfo.make_conninfo(stack.postgres_dsn, user=role, password="x")
            config = yaml.safe_load(setup.config_path.read_text())
            config["relay"] |= {"table": f"{schema}.outbox", "dsn": dsn}
            config["cleanup"] |= {"table": f"{schema}.outbox", "dsn": dsn}
            error, stderr = relay_failing(setup, config)
        finally:
            with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")
                conn.execute(f"DROP ROLE {role}")
    assert f"field 'relay.table': the connection's role may not read the outbox table: " \
           f"permission denied for schema {schema}" in error, stderr
    assert "not a Postgres connection string" not in stderr, stderr
