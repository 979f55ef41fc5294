"""/healthz while a restore reads the dedup changelog inside the poll (QA 66-b), /readyz."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from cdc_router.cli.run import alive_while
from cdc_router.router.liveness import RestoreProgress
from cdc_router.router.metrics import RouterMetrics, serve


class FakeReader:
    """A ChangelogReader's surface: catch_up() and close()."""

    def __init__(self, records: list[tuple[bytes | None, bytes | None]]) -> None:
        self.records, self.closed = records, False

    def catch_up(self, timeout_s: float = 300.0) -> Iterator[tuple[bytes | None, bytes | None]]:
        yield from self.records

    def close(self) -> None:
        self.closed = True


def status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_healthz_stays_ok_while_a_restore_reads_past_the_stall_threshold() -> None:
    # The loop's last poll is 200 s old (the restore runs inside it, in the assignment
    # callback): a restore still reading records keeps the router alive; /healthz said 503
    # after 120 s and a liveness probe restarted the router into the same restore.
    process = SimpleNamespace(last_poll=time.monotonic() - 200.0)
    restore = RestoreProgress()
    fake = FakeReader([(b"k1", b"v1"), (b"k2", b"v2")])
    reader: Any = restore.reader(lambda config, topic: fake)({}, "cdc-router.dedup")
    metrics = RouterMetrics()
    server = serve(metrics, 0, alive_while(process, restore), host="127.0.0.1")  # type: ignore[arg-type]
    healthz = f"http://127.0.0.1:{server.server_port}/healthz"
    try:
        assert status(healthz) == (503, "stalled\n")  # no poll, no restore: stalled
        records = reader.catch_up()
        assert next(records) == (b"k1", b"v1")
        assert status(healthz) == (200, "ok\n")  # reading the changelog: alive
        assert list(records) == [(b"k2", b"v2")]
    finally:
        server.shutdown()
        server.server_close()
    reader.close()
    assert fake.closed  # anything but catch_up is the reader's own


def test_a_restore_that_stopped_reading_is_stalled_again() -> None:
    now = [1000.0]
    restore = RestoreProgress(clock=lambda: now[0])
    assert not restore.recent(120.0)
    reader: Any = restore.reader(lambda config, topic: FakeReader([(None, b"mark")]))({}, "t")
    assert list(reader.catch_up()) == [(None, b"mark")]
    now[0] += 119.0
    assert restore.recent(120.0)
    now[0] += 2.0
    assert not restore.recent(120.0)


def test_readyz_waits_for_the_group_then_follows_liveness() -> None:
    metrics, alive = RouterMetrics(), [True]
    server = serve(metrics, 0, lambda: alive[0], host="127.0.0.1", ready=lambda: metrics.joined)
    readyz = f"http://127.0.0.1:{server.server_port}/readyz"
    try:
        # Started, not in its group yet (a rolling update must not stop an old pod for it).
        assert status(readyz) == (503, "not in its group yet\n")
        metrics.assigned([], None)  # an assignment, even of nothing: joined
        assert status(readyz) == (200, "ready\n")
        alive[0] = False
        assert status(readyz) == (503, "stalled\n")
    finally:
        server.shutdown()
        server.server_close()


def test_readyz_without_a_readiness_is_liveness() -> None:
    metrics = RouterMetrics()
    server = serve(metrics, 0, lambda: True, host="127.0.0.1")
    try:
        assert status(f"http://127.0.0.1:{server.server_port}/readyz") == (200, "ready\n")
    finally:
        server.shutdown()
        server.server_close()
