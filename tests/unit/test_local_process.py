"""Pid files, port checks and stop-by-pid of the local stack's processes."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

from cdc_router.local import process


def test_port_in_use_sees_a_listener():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert process.port_in_use("127.0.0.1", port)
    assert not process.port_in_use("127.0.0.1", port)


def test_spawned_process_is_tracked_and_stopped_by_pid(tmp_path: Path):
    marker = str(tmp_path / "marker-arg")
    pid = process.spawn([sys.executable, "-c", "import time,sys; time.sleep(60)", marker],
                        log_path=tmp_path / "p.log", pid_path=tmp_path / "p.pid")
    assert process.read_pid(tmp_path / "p.pid") == pid
    assert process.is_running(pid, marker)
    # Another process's pid never matches our marker: pid reuse can't make us kill it.
    assert not process.is_running(pid, str(tmp_path / "other"))
    assert process.stop(pid, marker, timeout_s=10)
    time.sleep(0.1)
    assert not process.is_running(pid, marker)
    assert not process.stop(pid, marker)


def test_missing_or_garbled_pid_file_reads_as_none(tmp_path: Path):
    assert process.read_pid(tmp_path / "absent.pid") is None
    (tmp_path / "bad.pid").write_text("not a pid")
    assert process.read_pid(tmp_path / "bad.pid") is None
