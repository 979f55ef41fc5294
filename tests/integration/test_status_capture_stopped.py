"""A connector whose role may no longer log in, on the real stack (QA 54-b F-4): Debezium
retries it with the connector and its task RUNNING and the slot inactive; `status --watch`
points at Connect's log at once and says capture stopped (critical) past
status.capture_stopped_critical_s (120 s by default; 20 s here, so the watch is held about 25 s)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tests.integration.pipeline import REPO, pipeline
from tests.integration.support import StackEndpoints, unique

pytestmark = [pytest.mark.integration]

# A few ticks of the watch (--watch 5): warning lines first, then the critical one.
CAPTURE_STOPPED_S = 20


def test_a_running_connector_that_cannot_log_in_is_capture_stopped(
        stack: StackEndpoints, tmp_path: Path) -> None:
    role = unique("dbz")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} REPLICATION LOGIN PASSWORD 'pw'")
        conn.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {role}")
    try:
        with pipeline(stack, tmp_path, partitions=1,
                      connector={"database.user": role, "database.password": "pw"}) as pipe:
            with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
                conn.execute(f"ALTER ROLE {role} NOLOGIN")
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_replication "
                             "WHERE usename = %s", (role,))
            log = tmp_path / "watch.log"
            with log.open("w") as out_file:
                watch = subprocess.Popen(
                    [sys.executable, "-m", "cdc_router", "status", "-c", str(pipe.config_path),
                     "--connector", pipe.name.replace("_", "-"), "--connect-url",
                     pipe.stack.connect_url, "--dsn", pipe.stack.postgres_dsn,
                     "--bootstrap-servers", pipe.stack.bootstrap_servers, "--watch", "5",
                     "--threshold", f"capture_stopped_critical_s={CAPTURE_STOPPED_S}"],
                    stdout=out_file, stderr=subprocess.STDOUT, text=True, cwd=REPO)
            try:
                # Until the critical line (about CAPTURE_STOPPED_S plus a tick or two).
                deadline = time.monotonic() + CAPTURE_STOPPED_S + 60
                while time.monotonic() < deadline and watch.poll() is None and \
                        "critical: wal:" not in log.read_text():
                    time.sleep(1)
            finally:
                # SIGTERM, not SIGINT: a pytest started in the background by a
                # non-interactive shell (CI) ignores SIGINT, and so does this child.
                watch.send_signal(signal.SIGTERM)
                watch.wait(timeout=60)
            out = log.read_text()
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE SELECT ON TABLES "
                         f"FROM {role}")
            # The default privileges also granted it SELECT on the tables other tests
            # created meanwhile (pytest-xdist): DROP OWNED revokes those, or DROP ROLE fails.
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE IF EXISTS {role}")
    wal = [line for line in out.splitlines()
           if line.startswith(("warning: wal:", "critical: wal:"))]
    assert any("say RUNNING" in line and "read Connect's log" in line for line in wal), out
    assert any(line.startswith("warning: wal:") and "if it lasts" in line for line in wal), out
    assert any(line.startswith(f"critical: wal: slot {pipe.name} inactive for ") and
               f"(critical at {CAPTURE_STOPPED_S}s)" in line and "capture stopped" in line
               for line in wal), out
