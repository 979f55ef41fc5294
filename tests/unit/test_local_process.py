"""Pid files, port checks and stop-by-pid of the local stack's processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cdc_router.errors import StackError
from cdc_router.local import process, stack
from cdc_router.local.config import StackConfig


def test_port_in_use_sees_a_listener():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert process.port_in_use("127.0.0.1", port)
    assert not process.port_in_use("127.0.0.1", port)


def test_a_port_in_use_in_the_ephemeral_range_says_a_client_may_hold_it(tmp_path: Path):
    # QA 58-b F-4: Kafka on 39092 (inside 32768-60999) could not start again after an outage:
    # a client reconnecting to it had been given 39092 as its own port (a self-connection),
    # and `local up` said only "in use by another process".
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    plain = ("port {port} (kafka) on 127.0.0.1 is already in use by another process: stop it, "
             "or pick another port with `cdc-router local up --kafka-port N`")
    assert process.port_taken("127.0.0.1", 39092, "kafka", ranges) == plain.format(
        port=39092) + (
        f"; 39092 lies in Linux's ephemeral range (32768-60999, {ranges}), where a client "
        "reconnecting to a stopped part (Kafka's own clients, the router's) can be given that "
        "port as its own, a self-connection (`ss -tanp` shows it connected to itself) while "
        "nothing listens: pick a port below 32768")
    assert process.port_taken("127.0.0.1", 29092, "kafka", ranges) == plain.format(port=29092)
    assert process.port_taken("127.0.0.1", 39092, "kafka", tmp_path / "absent") == \
        plain.format(port=39092)
    assert "`cdc-router local up --kafka-controller-port N`" in process.port_taken(
        "127.0.0.1", 29093, "kafka controller", ranges)


def test_local_up_refuses_a_taken_port_with_the_ephemeral_hint(tmp_path: Path, monkeypatch):
    ranges = tmp_path / "range"
    ranges.write_text("1024 65535\n")
    monkeypatch.setattr(process, "EPHEMERAL_RANGE", ranges)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        config = StackConfig(home=tmp_path, jar_cache=tmp_path, postgres_port=port)
        with pytest.raises(StackError, match="lies in Linux's ephemeral range"):
            stack._check_ports(config, set())


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


def test_a_home_never_claims_the_processes_of_a_home_it_is_a_prefix_of(tmp_path: Path):
    # Review 31: the marker was the home without its slash, so `local down --home /x/stack`
    # with a stale pid file stopped a process of /x/stack2.
    from cdc_router.local.config import StackConfig
    from cdc_router.local.stack import process_marker

    other = tmp_path / "stack2"
    mine = process_marker(StackConfig(home=tmp_path / "stack", jar_cache=tmp_path))
    theirs = process_marker(StackConfig(home=other, jar_cache=tmp_path))
    pid = process.spawn([sys.executable, "-c", "import time; time.sleep(60)",
                         str(other / "kafka" / "server.properties")],
                        log_path=tmp_path / "p.log", pid_path=tmp_path / "p.pid")
    try:
        assert not process.is_running(pid, mine)
        assert process.is_running(pid, theirs)
    finally:
        assert process.stop(pid, theirs, timeout_s=10)


def _up_moving_kafka_while(part: str, properties: str, home: Path) -> Any:
    """`local up --kafka-port 28999` on a home saved with 28092 whose `part` runs (a sleep
    naming its properties file under the home, as the pid check reads it)."""
    from click.testing import CliRunner

    from cdc_router.cli import main
    from cdc_router.local.config import StackConfig, save

    save(StackConfig(home=home, jar_cache=home.parent, kafka_port=28092))
    (home / part).mkdir()
    pid = process.spawn([sys.executable, "-c", "import time; time.sleep(60)",
                         str(home / part / properties)],
                        log_path=home.parent / f"{part}.log", pid_path=home / part / f"{part}.pid")
    try:
        return CliRunner().invoke(main, ["local", "up", "--home", str(home),
                                         "--kafka-port", "28999"])
    finally:
        assert process.stop(pid, f"{home}/", timeout_s=10)


def test_up_refuses_to_move_a_running_part_to_another_port(tmp_path: Path):
    # Review 31: `up --kafka-port N` on a running stack saved N, and `env`, `status` and later
    # starts pointed at a port nothing listened on.
    from cdc_router.local.config import load_saved

    moved = _up_moving_kafka_while("kafka", "server.properties", tmp_path / "stack")
    assert moved.exit_code == 2
    assert "'--kafka-port'" in moved.output and "kafka is running with 28092" in moved.output
    saved = load_saved(tmp_path / "stack")
    assert saved is not None and saved.kafka_port == 28092


def test_up_refuses_to_move_kafka_under_a_running_connect(tmp_path: Path):
    # Review 31-2: Kafka stopped, Connect running: the new port was taken, Connect kept
    # dialing the old one.
    moved = _up_moving_kafka_while("connect", "connect-distributed.properties",
                                   tmp_path / "stack")
    assert moved.exit_code == 2 and "connect is running with 28092" in moved.output


@pytest.mark.parametrize("args", [["--postgres-port", "0"], ["--kafka-port", "70000"],
                                  ["--connect-offset-flush-interval-ms", "5"], ["--home", "FILE"]])
def test_up_refuses_bad_options_in_one_line(tmp_path: Path, args: list[str]):
    # Review 31: a pydantic traceback, and a FileExistsError for a --home that is a file.
    from click.testing import CliRunner

    from cdc_router.cli import main

    (tmp_path / "file").touch()
    args = [str(tmp_path / "file") if arg == "FILE" else arg for arg in args]
    home = [] if "--home" in args else ["--home", str(tmp_path / "stack")]
    refused = CliRunner().invoke(main, ["local", "up", *home, *args])
    assert refused.exit_code == 2 and refused.exception is not None
    assert f"'{args[0]}'" in refused.output and "Traceback" not in refused.output
    assert not (tmp_path / "stack").exists()


def test_a_running_part_that_does_not_answer_is_waited_for_then_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Left out at stop 32: a Postgres sent SIGTERM waits for its clients to leave and answers
    # nobody meanwhile; `local up` said "already running" and the next step failed far from it.

    config = StackConfig(home=tmp_path / "home", jar_cache=tmp_path)
    config.pid_path("postgres").parent.mkdir(parents=True)
    pid = process.spawn([sys.executable, "-c", "import time; time.sleep(60)",
                         str(config.home / "postgres" / "data")],
                        log_path=config.log_path("postgres"), pid_path=config.pid_path("postgres"))
    said: list[str] = []
    answers = iter([False, False, True])
    monkeypatch.setattr(stack, "_TIMEOUTS_S", {"postgres": 1.2})
    try:
        stack._already_running(config, "postgres", lambda _: next(answers), said.append)
        assert said[0].startswith(f"postgres  running but not answering yet (pid {pid}")
        assert said[1].startswith("postgres  healthy in")
        with pytest.raises(StackError) as refused:
            stack._already_running(config, "postgres", lambda _: False, said.append)
        assert "did not become healthy within 1s" in str(refused.value)
        assert str(refused.value).endswith("stop the stack (`cdc-router local down`) and start "
                                           "it again")
        stack._already_running(config, "postgres", lambda _: True, said.append)
        assert said[-1] == "postgres  already running"

        def stops_it(_: object) -> bool:
            process.stop(pid, f"{config.home}/", timeout_s=10)
            return False

        with pytest.raises(StackError) as ended:  # review 33-2: a part gone while waited for
            stack._already_running(config, "postgres", stops_it, said.append)
        assert str(ended.value) == (
            f"postgres (pid {pid}) exited while `local up` waited for it (log "
            f"{config.log_path('postgres')}): run `cdc-router local up` again to start it")
    finally:
        process.stop(pid, f"{config.home}/", timeout_s=10)


def test_a_process_that_exits_just_before_the_signal_counts_as_stopped(
        monkeypatch: pytest.MonkeyPatch):
    # Review L4: it lived at is_running, was gone at os.kill; `local down` died with a
    # ProcessLookupError traceback.
    monkeypatch.setattr(process, "is_running", lambda pid, marker: True)

    def gone(pid: int, sig: int) -> None:
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(process.os, "kill", gone)
    assert process.stop(4242, "marker")


def test_a_process_that_outlives_sigkill_is_named_not_waited_for_forever(
        monkeypatch: pytest.MonkeyPatch):
    # Review L4: a process stuck in the kernel (state D) ignores SIGKILL; `local down` hung.
    monkeypatch.setattr(process, "_KILL_WAIT_S", 0.3, raising=False)
    signals: list[int] = []
    monkeypatch.setattr(process.os, "kill", lambda pid, sig: signals.append(sig))
    started: list[float] = []

    def stuck(pid: int, marker: str) -> bool:
        if signals[-1:] == [process.signal.SIGKILL]:
            started[:] = started or [time.monotonic()]
            assert time.monotonic() - started[0] < 5, "still waiting 5s after SIGKILL"
        return True

    monkeypatch.setattr(process, "is_running", stuck)
    with pytest.raises(process.StackError, match="pid 4242 did not exit") as refused:
        process.stop(4242, "marker", timeout_s=0.2)
    assert "SIGKILL" in str(refused.value)


def test_a_child_whose_pid_cannot_be_recorded_is_not_left_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Review 48-b F3: on a full disk the pid file stayed empty and the part ran on, out of
    # reach of `local down`.
    import subprocess

    started: list[subprocess.Popen[bytes]] = []

    class Recorded(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(process.subprocess, "Popen", Recorded)
    with pytest.raises(OSError):
        process.spawn([sys.executable, "-c", "import time; time.sleep(60)"],
                      log_path=tmp_path / "p.log", pid_path=tmp_path / "absent" / "p.pid")
    assert len(started) == 1 and started[0].returncode is not None


def test_environ_of_reads_a_process_environment_as_it_started() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); "
                              "time.sleep(30)"], stdout=subprocess.PIPE,
                             env={**os.environ, "CDC_ROUTER_TEST_VARIABLE": "a=b c"})
    try:
        # Popen returns once the child's exec began, before the kernel has set up its new
        # environment: /proc/PID/environ read then is empty (15% of 200 tries; review rv62b).
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        assert process.environ_of(child.pid, "CDC_ROUTER_TEST_VARIABLE") == "a=b c"
        assert process.environ_of(child.pid, "CDC_ROUTER_TEST_UNSET") is None
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert process.environ_of(child.pid, "CDC_ROUTER_TEST_VARIABLE") is None  # gone
    assert process.environ_of(None, "CDC_ROUTER_TEST_VARIABLE") is None
