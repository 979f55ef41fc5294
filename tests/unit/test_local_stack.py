"""`local up` and `local down` on a home they cannot use, and their other refusals: no stack
started (Java, Maven and the parts are faked or never reached)."""

from __future__ import annotations

import contextlib
import errno
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.errors import StackError
from cdc_router.local import postgres as local_postgres
from cdc_router.local import stack
from cdc_router.local.config import StackConfig


def _free_ports() -> dict[str, int]:
    """Ports nothing listens on, one for each part `up` starts (another stack may hold the
    defaults). Every probe stays bound until all are picked: one closed at once could hand
    its port out again (two parts on one port, a failure of one run in many)."""
    names = ("postgres_port", "kafka_port", "controller_port", "connect_port")
    with contextlib.ExitStack() as probes:
        sockets = [probes.enter_context(socket.socket()) for _ in names]
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return {name: int(probe.getsockname()[1])
                for name, probe in zip(names, sockets, strict=True)}


@pytest.fixture
def no_java_no_jars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack.process, "check_java", lambda: None)
    monkeypatch.setattr(stack, "ensure_jars", lambda config, say: None)


def test_a_home_under_a_file_is_one_line_for_up_and_down(tmp_path: Path, no_java_no_jars: None):
    # Review 48-b F3: NotADirectoryError tracebacks from `up` (stack.json) and `down` (pid files).
    (tmp_path / "afile").touch()
    home = tmp_path / "afile" / "stack"
    for command in (["up"], ["down"]):
        ports = [f"--{name.replace('_', '-').replace('controller', 'kafka-controller')}={port}"
                 for name, port in _free_ports().items()]
        result = CliRunner().invoke(main, ["local", *command, "--home", str(home),
                                           *(ports if command == ["up"] else [])])
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
        assert f"error: cannot write the local stack's files at {home}" in result.output
        assert "Not a directory: pick another --home" in result.output


@pytest.mark.parametrize(("code", "advice"), [
    (errno.ENOSPC, "free space on its file system, or pick another --home"),
    (errno.EACCES, "pick another --home, one this user can write"),
    (errno.EPERM, "pick another --home, one this user can write")])
def test_an_os_error_on_the_home_names_the_path_and_what_to_do(tmp_path: Path, code: int,
                                                               advice: str):
    config = StackConfig(home=tmp_path / "home", jar_cache=tmp_path / "jars")
    in_home = OSError(code, "reason", str(config.home / "stack.json"))
    assert stack.files_error(config, in_home) == (
        f"cannot write the local stack's files at {config.home / 'stack.json'}: reason: {advice}")
    if code == errno.ENOSPC:  # a write names no file: the home's
        assert stack.files_error(config, OSError(code, "reason")) == (
            f"cannot write the local stack's files at {config.home}: reason: {advice}")
    in_cache = OSError(code, "reason", str(tmp_path / "jars" / "m2"))
    assert stack.files_error(config, in_cache).endswith(advice.replace("--home", "--jar-cache"))
    elsewhere = OSError(code, "reason", "/usr/bin/java")
    assert stack.files_error(config, elsewhere) == (
        "the local stack failed on /usr/bin/java: reason")


def test_an_os_error_of_no_file_is_not_blamed_on_the_home(tmp_path: Path):
    config = StackConfig(home=tmp_path / "home", jar_cache=tmp_path / "jars")
    socket_error = OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
    assert stack.files_error(config, socket_error) == (
        "the local stack failed: Cannot assign requested address")


def test_a_full_disk_in_up_is_a_stack_error(tmp_path: Path, no_java_no_jars: None,
                                            monkeypatch: pytest.MonkeyPatch):
    def full(config: StackConfig) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(stack, "save", full)
    with pytest.raises(StackError, match="No space left on device: free space"):
        stack.up(StackConfig(home=tmp_path / "home", jar_cache=tmp_path, **_free_ports()),
                 lambda line: None)


def test_saved_settings_that_cannot_be_read_are_one_line(tmp_path: Path):
    from cdc_router.errors import ConfigError
    from cdc_router.local.config import load_saved

    (tmp_path / "stack.json").mkdir()
    with pytest.raises(ConfigError, match="cannot be read: Is a directory; pick another --home"):
        load_saved(tmp_path)


def _connect_answering(plugins: list[dict[str, str]]) -> tuple[ThreadingHTTPServer, int]:
    """A Connect REST API that answers any GET with `plugins`, and its port."""

    class Plugins(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(plugins).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Plugins)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def test_connect_without_debezium_fails_at_once_naming_the_plugin_directory(tmp_path: Path):
    # Review 48-b F11: Connect answered `[]` (an incomplete jar cache); `up` waited 240 s, then
    # showed a log tail of its own polls.
    from cdc_router.connect.spec import POSTGRES_CONNECTOR

    server, port = _connect_answering([{"class": "org.apache.kafka.connect.mirror.X"}])
    config = StackConfig(home=tmp_path / "home", jar_cache=tmp_path / "jars", connect_port=port)
    try:
        with pytest.raises(StackError) as refused:
            stack._connect_healthy(config)
    finally:
        server.shutdown()
    plugin = config.plugin_path / "debezium-connector-postgres"
    assert f"runs without Debezium's {POSTGRES_CONNECTOR}" in str(refused.value)
    assert f"remove {plugin}, and run `cdc-router local up` again" in str(refused.value)
    server, port = _connect_answering([{"class": POSTGRES_CONNECTOR}])
    try:
        assert stack._connect_healthy(config.model_copy(update={"connect_port": port}))
    finally:
        server.shutdown()
    assert not stack._connect_healthy(config)  # nothing listens: not yet healthy


def test_a_start_failure_shows_the_log_without_our_health_polls(tmp_path: Path):
    log = tmp_path / "connect.log"
    log.write_text("[t] ERROR the real reason (o.a.k.c.X)\n" + "".join(
        f'[t] INFO 127.0.0.1 - - "GET /connector-plugins HTTP/1.1" 200 2 "-" '
        f'"Python-urllib/3.11" {n} (o.a.k.c.r.RestServer)\n' for n in range(30)))
    assert stack.process.tail(log) == "[t] ERROR the real reason (o.a.k.c.X)"


def test_a_port_refused_by_up_is_not_saved(tmp_path: Path, no_java_no_jars: None):
    # Review 48-b F7: `up --connect-port N` with N taken failed, but had saved N: `local env`
    # named the foreign listener, and the next plain `up` started Connect there.
    from cdc_router.local.config import load_saved, save

    home = tmp_path / "stack"
    save(StackConfig(home=home, jar_cache=tmp_path, **_free_ports()))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["local", "up", "--home", str(home),
                                           "--connect-port", str(port)])
    assert result.exit_code == 1 and f"port {port} (connect)" in result.output
    saved = load_saved(home)
    assert saved is not None and saved.connect_port != port


def test_up_waits_for_a_killed_part_to_be_reaped_then_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Review 48-b F6: `up` right after a kill -9 of Postgres started a new one while the old
    # postmaster was a zombie; it refused on its lock file, and the error gave no advice.
    import subprocess
    import sys

    config = StackConfig(home=tmp_path / "home", jar_cache=tmp_path)
    config.part_dir("postgres").mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])  # not reaped until .wait()
    config.pid_path("postgres").write_text(f"{dead.pid}\n")
    while not stack.process.exited_unreaped(dead.pid):
        time.sleep(0.01)
    monkeypatch.setattr(local_postgres, "REAP_WAIT_S", 0.3)
    with pytest.raises(StackError) as refused:
        local_postgres.await_reaped(stack.part_pid(config, "postgres"))
    assert str(refused.value).startswith(
        f"the previous postgres (pid {dead.pid}) has exited but its parent has not reaped it")
    assert str(refused.value).endswith("run `cdc-router local up` again once it is gone")
    monkeypatch.setattr(local_postgres, "REAP_WAIT_S", 10.0)
    threading.Timer(0.3, dead.wait).start()  # its parent reaps it meanwhile: up goes on
    started = time.monotonic()
    local_postgres.await_reaped(stack.part_pid(config, "postgres"))
    assert 0.2 < time.monotonic() - started < 5


def test_a_stale_pid_file_never_claims_another_process_naming_the_home(tmp_path: Path):
    # Review 48-b F2: the pid of a dead Connect, reused by `tail -F <home>/kafka/kafka.log`
    # (`local logs kafka -f`): `status` said running, `up` waited 240 s on it, `down` killed it.
    import subprocess
    import sys

    config = StackConfig(home=tmp_path / "home", jar_cache=tmp_path)
    tail = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             str(config.log_path("kafka"))])
    try:
        for part in ("kafka", "connect"):
            config.part_dir(part).mkdir(parents=True)
            config.pid_path(part).write_text(f"{tail.pid}\n")
        states = {s.part: s.state for s in stack.status(config)}
        assert states["kafka"] == "stale" and states["connect"] == "stale"
        said: list[str] = []
        stack.down(config, said.append, purge=False)
        assert "kafka     was not running" in said and "connect   was not running" in said
        assert tail.poll() is None
    finally:
        tail.kill()
        tail.wait()


def test_each_part_is_known_by_an_argument_of_its_own_command_line(tmp_path: Path):
    from cdc_router.local.config import nats_command
    from cdc_router.local.registry import registry_command

    config = StackConfig(home=tmp_path / "home", jar_cache=tmp_path)
    for part, command in (("nats", nats_command(config, "nats-server")),
                          ("registry", registry_command(config)),
                          ("postgres", ["postgres", "-D", str(config.postgres_data)])):
        assert stack.process_marker(config, part) in " ".join([*command, ""])


def test_an_initdb_killed_midway_leaves_no_data_directory_and_the_next_up_makes_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 48-b F18: initdb writes PG_VERSION first; killed hard after it, the half-made
    # directory counted as initialised, and every later `up` waited 60 s on it and failed.
    import subprocess

    from cdc_router.local import postgres
    from cdc_router.local.config import StackConfig

    config = StackConfig(home=tmp_path / "home", jar_cache=tmp_path / "jars")
    killed = [True]

    def initdb(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        target = Path(command[2])
        target.mkdir(parents=True)
        (target / "PG_VERSION").write_text("15\n")
        if killed[0]:
            return subprocess.CompletedProcess(command, -9, "", "")
        (target / "postgresql.conf").write_text("")
        (target / "base").mkdir()
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(postgres, "_postgres_user", lambda: (None, None, None))
    monkeypatch.setattr(postgres, "_pg_bin", lambda name: name)
    monkeypatch.setattr(postgres.subprocess, "run", initdb)
    monkeypatch.setattr(postgres.process, "spawn", lambda *args, **kwargs: 4242)
    with pytest.raises(StackError, match=r"initdb for .* was killed \(signal 9\)"):
        postgres.start_postgres(config)
    assert not config.postgres_data.exists()
    killed[0] = False
    assert postgres.start_postgres(config) == 4242
    assert (config.postgres_data / "base").is_dir()
    assert sorted(path.name for path in config.postgres_data.parent.iterdir()
                  if path.name.startswith("data")) == ["data"]


def test_down_stops_a_postmaster_restarted_by_hand_named_by_its_data_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 55-b F-3: after `pg_ctl restart` the saved pid was stale; `down` said "postgres was
    # not running" and left the new postmaster serving the stack's port.
    import subprocess
    import sys

    from cdc_router.local import process

    config = StackConfig(home=tmp_path / "stack", jar_cache=tmp_path / "jars")
    config.postgres_data.mkdir(parents=True)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    config.pid_path("postgres").parent.mkdir(parents=True, exist_ok=True)
    config.pid_path("postgres").write_text(f"{ended.pid}\n")  # the one `up` started, gone
    # The postmaster pg_ctl started: `postgres -D <data>`, its pid in postmaster.pid.
    postmaster = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-D",
                                   str(config.postgres_data)])
    # Another process that names no data directory of this stack is never stopped.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for _ in range(50):  # its command line is there once the interpreter started
            if process.is_running(postmaster.pid, stack.process_marker(config, "postgres")):
                break
            time.sleep(0.1)
        (config.postgres_data / "postmaster.pid").write_text(
            f"{postmaster.pid}\n{config.postgres_data}\n")
        # QA 57-b F-3: status and up know it by the same rule (status said stale; up took its
        # port for a stranger's and refused to start Connect).
        states = {s.part: (s.state, s.pid) for s in stack.status(config)}
        assert states["postgres"] == ("running", postmaster.pid)

        def refuse(config: StackConfig, running: set[str]) -> None:
            raise StackError(f"running {sorted(running)}")

        monkeypatch.setattr(stack, "_check_ports", refuse)
        monkeypatch.setattr(stack.process, "check_java", lambda: None)
        monkeypatch.setattr(stack, "ensure_jars", lambda config, say: None)
        with pytest.raises(StackError, match=r"running \['nats', 'postgres', 'registry'\]"):
            stack.up(config, print)
        said: list[str] = []
        stack.down(config, said.append, purge=False)
        assert f"postgres  stopped (pid {postmaster.pid})" in said
        assert postmaster.wait(timeout=10) is not None
        (config.postgres_data / "postmaster.pid").write_text(f"{stranger.pid}\n")
        said.clear()
        stack.down(config, said.append, purge=False)
        assert "postgres  was not running" in said and stranger.poll() is None
    finally:
        for child in (postmaster, stranger):
            child.kill()
            child.wait()


@pytest.mark.parametrize("part", ["registry", "nats"])
def test_an_optional_part_on_its_default_port_beside_moved_ones_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, part: str):
    # Low 57: `up --with registry` on other ports (a second stack) took 18081, the default
    # stack's registry port (nats' 14222 alike): one of the two stacks could not start it.
    started: list[tuple[StackConfig, Any]] = []
    monkeypatch.setattr(stack, "up", lambda config, say, optional: started.append(
        (config, optional)))
    ports = [f"--{name.replace('_', '-').replace('controller', 'kafka-controller')}={port}"
             for name, port in _free_ports().items()]
    home = tmp_path / "stack"
    refused = CliRunner().invoke(main, ["local", "up", "--home", str(home), *ports,
                                        "--with", part])
    default = StackConfig.model_fields[f"{part}_port"].default
    assert refused.exit_code == 2 and started == [] and not (home / "stack.json").exists()
    assert f"Invalid value for '--{part}-port'" in refused.output
    assert f"`--with {part}` would listen on {default}, the default stack's port" in \
        refused.output
    assert f"--{part}-port N (--{part}-port {default} to take the default anyway)" in \
        refused.output
    assert "postgres " in refused.output and "Traceback" not in refused.output

    given = CliRunner().invoke(main, ["local", "up", "--home", str(home), *ports,
                                      "--with", part, f"--{part}-port", "1234"])
    assert given.exit_code == 0, given.output
    assert getattr(started[-1][0], f"{part}_port") == 1234
    # Asked for by name, the default is taken; and a part this home started before keeps
    # its port (no option needed on the next `up`).
    for args in ([f"--{part}-port", str(default)], []):
        again = CliRunner().invoke(main, ["local", "up", "--home", str(home), *ports,
                                          "--with", part, *args])
        assert again.exit_code == 0, again.output
        (home / part).mkdir(parents=True, exist_ok=True)
    # The default stack's own ports: nothing moved, nothing refused.
    default_stack = CliRunner().invoke(main, ["local", "up", "--home", str(tmp_path / "d"),
                                              "--with", part])
    assert default_stack.exit_code == 0, default_stack.output
    assert getattr(started[-1][0], f"{part}_port") == default


def test_the_postgres_log_is_made_for_the_postgres_user_before_the_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 57-b F-3 (low): spawn made postgres.log as root, so `pg_ctl restart -l postgres.log`
    # as the postgres user failed ("could not start server") and left Postgres down.
    import os

    from cdc_router.local import postgres

    config = StackConfig(home=tmp_path / "home", jar_cache=tmp_path / "jars")
    (config.postgres_data).mkdir(parents=True)
    (config.postgres_data / "PG_VERSION").write_text("15\n")
    (config.postgres_data / "postgresql.conf").write_text("")
    owned: list[Path] = []
    monkeypatch.setattr(postgres, "_postgres_user", lambda: ("postgres", 999, 999))
    monkeypatch.setattr(postgres, "_let_postgres_reach", lambda *args: None)
    monkeypatch.setattr(postgres, "_pg_bin", lambda name: name)
    monkeypatch.setattr(postgres.os, "chown", lambda path, uid, gid: owned.append(Path(path)))

    def spawn(*args: object, log_path: Path, **kwargs: object) -> int:
        assert log_path.exists() and log_path in owned  # made and handed over before the start
        return 4242

    monkeypatch.setattr(postgres.process, "spawn", spawn)
    assert postgres.start_postgres(config) == 4242
    log = config.log_path("postgres")
    assert log in owned and os.path.getsize(log) == 0


class _Settings:
    """A connection answering settings_differing's pg_settings query with `rows`."""

    def __init__(self, rows: list[tuple[str, str, str | None]]) -> None:
        self.rows = rows

    def __enter__(self) -> _Settings:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def execute(self, query: str, params: tuple[list[str]]) -> _Settings:
        assert "pg_settings" in query and "wal_level" in params[0]
        return self

    def fetchall(self) -> list[tuple[str, str, str | None]]:
        return self.rows


def test_up_of_a_running_postgres_names_each_setting_it_would_start_it_with_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Stop 58: `up` said "postgres already running" and nothing of settings that differ.
    import psycopg

    config = StackConfig(home=tmp_path / "home", jar_cache=tmp_path)
    conf = str(config.postgres_data / "cdc-router.conf")
    rows = [("max_replication_slots", "20", conf), ("max_wal_senders", "10", conf),
            ("wal_level", "replica", str(config.postgres_data / "postgresql.auto.conf")),
            ("wal_writer_delay", "10ms", conf)]
    monkeypatch.setattr(psycopg, "connect", lambda *a, **k: _Settings(rows))
    assert local_postgres.settings_differing(config) == [
        "postgres  runs with max_wal_senders = '10', not '20' as `local up` starts it: "
        "`cdc-router local down`, then `cdc-router local up` (same --home) applies it",
        "postgres  runs with wal_level = 'replica', not 'logical' as `local up` starts it: "
        "`ALTER SYSTEM RESET wal_level`, then `cdc-router local down`, then `cdc-router local "
        "up` (same --home) applies it"]

    def refused(*args: object, **kwargs: object) -> None:
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(psycopg, "connect", refused)
    assert local_postgres.settings_differing(config) == []  # up's own wait says why
