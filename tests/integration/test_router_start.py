"""`cdc-router run` missing its own topics, on the real stack: the router's one line, and no
cleanup sweep before it (QA 61-a F-5: the sweep's `cleanup_sweep_failed` came first)."""

from __future__ import annotations

import subprocess
import sys
from contextlib import suppress
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.pipeline import REPO
from tests.integration.support import (
    StackEndpoints,
    create_outbox_table,
    drop_outbox_table,
    unique,
)

pytestmark = pytest.mark.integration


def test_a_router_missing_its_topics_says_so_first_and_its_cleanup_never_sweeps(
        stack: StackEndpoints, tmp_path: Path) -> None:
    name = unique("nosweep")
    dashed = name.replace("_", "-")
    source = f"{dashed}.public.{name}"  # Debezium's name for the table: no config warning
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.create_topics([NewTopic(source, 1, 1)])[source].result(timeout=30)
    create_outbox_table(stack.postgres_dsn, name)
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": stack.bootstrap_servers},
        "source": {"topics": [source], "group_id": name},
        "routes": [{"topic": f"{dashed}-orders"}],
        "dead_letter": {"topic": f"{dashed}-dlq"},
        "dedup": {"changelog_topic": f"{dashed}-dedup"},
        "cleanup": {"mode": "delete", "table": f"public.{name}", "dsn": stack.postgres_dsn,
                    "interval_ms": 200}}))
    try:
        result = subprocess.run(
            [sys.executable, "-m", "cdc_router", "run", "-c", str(config), "--metrics-port",
             "0", "--instance-id", name], capture_output=True, text=True, cwd=REPO,
            timeout=120, check=False)
    finally:
        drop_outbox_table(stack.postgres_dsn, name)
        for future in admin.delete_topics([source]).values():
            with suppress(Exception):
                future.result(timeout=30)
    assert result.returncode == 1, result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ") and "does not exist" in error and "Traceback" not in \
        result.stderr, result.stderr
    assert "cleanup_sweep_failed" not in result.stderr, result.stderr
