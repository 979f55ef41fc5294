"""A prepared transaction (two-phase commit) left pending, on the real stack (QA 57-b F-2):
`status` said ok while one held outbox rows back and pinned every slot's WAL. The stack's
Postgres runs with max_prepared_transactions = 10 (cdc_router/local/config.py) so that this can
be made here; the unit tests (tests/unit/test_status_prepared.py) cover the wording."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.integration.pipeline import REPO, Pipeline, pipeline
from tests.integration.support import StackEndpoints, unique

# The prepared transaction is the server's: every `status` run sees it, and Postgres counts it
# as running, so a replication slot created meanwhile (any other test's connector) waits for it
# to end (reread 58-r F-3). It runs alone (exclusive: make test's second pass).
pytestmark = [pytest.mark.integration, pytest.mark.exclusive]
# Its gids start so; one a killed run left behind is rolled back before the next run's.
GID_PREFIX = "cdc_router_test_prepared"


def _prepared_problems(pipe: Pipeline, gid: str) -> tuple[list[str], dict[str, Any]]:
    """`status`'s problems that name the prepared transaction `gid` (others' are not ours),
    with a 1 s threshold; and its report."""
    done = subprocess.run(
        [sys.executable, "-m", "cdc_router", "status", "-c", str(pipe.config_path),
         "--connector", pipe.name.replace("_", "-"), "--connect-url", pipe.stack.connect_url,
         "--dsn", pipe.stack.postgres_dsn, "--bootstrap-servers", pipe.stack.bootstrap_servers,
         "--threshold", "prepared_xact_warning_s=1", "-o", "json"],
        capture_output=True, text=True, cwd=REPO, check=False, timeout=120)
    assert done.stdout, done.stderr
    report = json.loads(done.stdout)
    return [problem["message"] for problem in report["problems"]
            if f"prepared transaction '{gid}'" in problem["message"]], report


@contextmanager
def _prepared(pipe: Pipeline, gid: str) -> Iterator[None]:
    """An outbox row written in a transaction prepared as `gid` and left pending, its session
    closed; rolled back on the way out, whatever happened (a leftover one pins the WAL of every
    slot of the server, and its lock on the table stops the table's DROP)."""
    with psycopg.connect(pipe.stack.postgres_dsn, autocommit=True) as conn:
        for (left,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s "
                                    "AND database = current_database()",
                                    (f"{GID_PREFIX}%",)).fetchall():
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(left)))
        if conn.execute("SHOW max_prepared_transactions").fetchone() == ("0",):
            pytest.skip("the stack's Postgres refuses PREPARE TRANSACTION "
                        "(max_prepared_transactions = 0): it was started before the stack set "
                        "it; `cdc-router local down`, then `local up`, applies it")
        conn.execute("BEGIN")
        conn.execute(sql.SQL("INSERT INTO public.{} (id, aggregatetype, aggregateid, type, "
                             "payload) VALUES (%s, 'Order', 'o-prepared', 'OrderPaid', '{{}}')"
                             ).format(sql.Identifier(pipe.table)), (str(uuid.uuid4()),))
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    try:
        yield
    finally:
        with psycopg.connect(pipe.stack.postgres_dsn, autocommit=True) as conn:
            pending = conn.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s",
                                   (gid,)).fetchone()
            if pending is not None:
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


def test_status_names_a_pending_prepared_transaction_until_it_is_rolled_back(
        stack: StackEndpoints, tmp_path: Path) -> None:
    gid = unique(GID_PREFIX)
    # The transaction ends before the pipeline's teardown drops its table (it holds a lock).
    with pipeline(stack, tmp_path, partitions=1) as pipe, _prepared(pipe, gid):
        time.sleep(2)  # over the 1 s threshold
        found, report = _prepared_problems(pipe, gid)
        assert len(found) == 1, report["problems"]
        line = found[0]
        age = re.search(r"pending for (\d+)s \(warning at 1s\)", line)
        assert age is not None and 2 <= int(age.group(1)) < 120, line
        assert f"prepared transaction '{gid}' (database postgres, owner postgres)" in line
        assert "any outbox rows it wrote are not streamed until it ends" in line
        assert f"in database postgres: COMMIT PREPARED '{gid}' (or ROLLBACK PREPARED to " \
               "discard it)" in line
        level = [problem["level"] for problem in report["problems"]
                 if problem["message"] == line]
        assert level == ["warning"]
        assert gid in [xact["gid"] for xact in report["wal"]["prepared"]]
        with psycopg.connect(pipe.stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        found, report = _prepared_problems(pipe, gid)
        assert found == [], found
        assert gid not in [xact["gid"] for xact in report["wal"]["prepared"]]
