"""Bring the local stack up, report on it, and take it down: Postgres, Kafka, Connect, and
nats-server (JetStream) and the schema registry when asked for."""

from __future__ import annotations

import base64
import errno
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from cdc_router.connect.spec import POSTGRES_CONNECTOR
from cdc_router.errors import StackError
from cdc_router.local import process
from cdc_router.local.config import (
    OPTIONAL_PARTS,
    PARTS,
    Part,
    StackConfig,
    connect_properties,
    kafka_properties,
    log4j2_properties,
    save,
    to_properties,
)
from cdc_router.local.jars import ensure_jars, ensure_registry
from cdc_router.local.nats_server import nats_healthy, start_nats
from cdc_router.local.postgres import (
    await_reaped,
    postgres_healthy,
    postmaster_pid,
    settings_differing,
    start_postgres,
)
from cdc_router.local.registry import registry_healthy, start_registry

Say = Callable[[str], None]

# Start-up limits for 2 cores: Connect scans its plugins, the registry (Quarkus) takes 8-36 s
# loaded, Kafka after a kill -9 recovers its logs (over 110 s at load 24, session 56's chaos run).
_TIMEOUTS_S: dict[Part, float] = {"postgres": 60, "kafka": 240, "connect": 240, "nats": 30,
                                  "registry": 180}


@dataclass(frozen=True)
class PartStatus:
    """What `status` knows of one part."""

    part: Part
    state: str  # running | stopped | stale (pid file of a dead process)
    pid: int | None
    address: str | None  # None: an optional part the stack does not have (StackConfig.has)
    log: str


def process_marker(config: StackConfig, part: Part | None = None) -> str:
    """What a part's command line names, for is_running (a pid may be reused): the home with
    its slash for any part of it (review 31: `/x/stack` matched the processes of `/x/stack2`);
    for `part`, its own config or data path as a whole argument, which `tail -F
    <home>/kafka/kafka.log` (`local logs -f`) or an editor of the home's files does not have
    (review 48-b F2: `down` stopped such a process, found by a stale pid file)."""
    if part is None:
        return f"{config.home}/"
    # /proc's NULs between arguments read as spaces; argv[0] is the program, never this.
    return f" {_OWN_ARGUMENT[part](config)} "


_OWN_ARGUMENT: dict[Part, Callable[[StackConfig], str]] = {
    "postgres": lambda config: str(config.postgres_data),  # -D
    "kafka": lambda config: str(config.part_dir("kafka") / "server.properties"),
    "connect": lambda config: str(config.part_dir("connect") / "connect-distributed.properties"),
    "nats": lambda config: str(config.part_dir("nats") / "nats-server.conf"),  # -c
    "registry": lambda config: f"-Djava.io.tmpdir={config.part_dir('registry') / 'tmp'}",
}


def _address(config: StackConfig, part: Part) -> str:
    return {"postgres": config.postgres_dsn, "kafka": config.bootstrap_servers,
            "connect": config.connect_url, "nats": config.nats_url,
            "registry": config.registry_url}[part]


def part_pid(config: StackConfig, part: Part) -> int | None:
    """A part's pid, by its pid file; Postgres's by postmaster_pid: one rule for status, up and
    down (QA 57-b F-3: status called a postmaster pg_ctl restarted stale, up a stranger's)."""
    saved, marker = process.read_pid(config.pid_path(part)), process_marker(config, part)
    return postmaster_pid(config, saved, marker) if part == "postgres" else saved


def status(config: StackConfig) -> list[PartStatus]:
    """Each part's state, read from pid files and /proc, without touching the network."""
    result = []
    for part in PARTS:
        pid = part_pid(config, part)
        running = process.is_running(pid, process_marker(config, part))
        state = "running" if running else "stale" if pid is not None else "stopped"
        result.append(PartStatus(part, state, pid if running else None,
                                 _address(config, part) if config.has(part) else None,
                                 str(config.log_path(part))))
    return result


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _files_named(command: Callable[Concatenate[StackConfig, _P], _R]
                 ) -> Callable[Concatenate[StackConfig, _P], _R]:
    """An OSError on the stack's files becomes one line naming the path, the reason and what to
    do (review 48-b F3: a home under a file, not writable or on a full disk gave a traceback)."""
    @functools.wraps(command)
    def named(config: StackConfig, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return command(config, *args, **kwargs)
        except OSError as error:
            raise StackError(files_error(config, error)) from error
    return named


def files_error(config: StackConfig, error: OSError) -> str:
    """The line for an OSError on `config`'s files: a full disk's on a write names no file,
    and is the home's; any other without a file (a socket's) is not a file's."""
    reason = error.strerror or str(error)
    if not error.filename and error.errno not in (errno.ENOSPC, errno.EDQUOT):
        return f"the local stack failed: {reason}"
    path = Path(error.filename) if error.filename else config.home
    if path.is_relative_to(config.jar_cache):
        option = "--jar-cache"
    elif path.is_relative_to(config.home):
        option = "--home"
    else:
        return f"the local stack failed on {path}: {reason}"
    full = error.errno in (errno.ENOSPC, errno.EDQUOT)
    denied = error.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
    return (f"cannot write the local stack's files at {path}: {reason}: "
            f"{'free space on its file system, or ' if full else ''}pick another {option}"
            f"{', one this user can write' if denied else ''}")


@_files_named
def up(config: StackConfig, say: Say, *, optional: Collection[Part] = ()) -> None:
    """Start what is not running, wait until each part is healthy; what runs is left alone.
    nats-server and the schema registry (OPTIONAL_PARTS) are started only when in `optional`."""
    config.check_ports_distinct()
    process.check_java()
    ensure_jars(config, say)
    _prepare(config, optional, say)
    running = {s.part for s in status(config) if s.state == "running"}
    _check_ports(config, running | (set(OPTIONAL_PARTS) - set(optional)))
    if "postgres" not in running:
        await_reaped(part_pid(config, "postgres"))
    # Only now: a port refused above must not become the stack's (review 48-b F7: `env` then
    # named the foreign listener, and the next plain `up` used it).
    save(config)
    # Postgres and Kafka start side by side; Connect needs Kafka, so it waits for it.
    starts: tuple[tuple[Part, Callable[[StackConfig], int], Callable[[StackConfig], bool]], ...] = (
        ("postgres", start_postgres, postgres_healthy), ("kafka", _start_kafka, _kafka_healthy))
    started: dict[Part, int] = {}
    for part, start, check in starts:
        if part in running:
            _already_running(config, part, check, say)
        else:
            started[part] = start(config)
    for part, _, check in starts:
        if part in started:
            _wait(config, part, started[part], check, say)
    if "postgres" in running:  # stop 58: its settings are left as it runs
        for line in settings_differing(config):
            say(line)
    if "connect" in running:
        _already_running(config, "connect", _connect_healthy, say)
        # QA 62-b F-4: exported after `local up`, it reached no connector, and nothing said so.
        started_with = process.environ_of(part_pid(config, "connect"), "CDC_ROUTER_DB_PASSWORD")
        if started_with not in (None, os.environ.get("CDC_ROUTER_DB_PASSWORD",
                                                     config.replication_password)):
            say("connect   runs with another CDC_ROUTER_DB_PASSWORD than this shell's: its "
                "connectors' ${env:CDC_ROUTER_DB_PASSWORD} is the one it started with; "
                "`cdc-router local down`, then `local up`, restarts it with this one (its "
                "data stays)")
    else:
        _wait(config, "connect", _start_connect(config), _connect_healthy, say)
    for part in sorted(optional):
        _up_optional(config, part, say, part in running)
    say("")
    say(f"bootstrap servers  {config.bootstrap_servers}")
    say(f"connect url        {config.connect_url}")
    say(f"postgres dsn       {config.postgres_dsn}")
    for part in sorted(optional):
        say(f"{part + ' url':<19}{_address(config, part)}")
    for part in sorted((running & set(OPTIONAL_PARTS)) - set(optional)):  # QA 62-b F-5
        say(f"{part + ' url':<19}{_address(config, part)}  (running: an earlier "
            f"`local up --with {part}` started it)")


def _prepare(config: StackConfig, parts: Collection[Part], say: Say) -> None:
    """What an optional part needs before it starts: the registry, Java and its bundle."""
    if "registry" in parts:
        process.check_java()
        ensure_registry(config, say)


# The optional parts: how each starts, and when it is healthy.
_OPTIONAL: dict[Part, tuple[Callable[[StackConfig], int], Callable[[StackConfig], bool]]] = {
    "nats": (start_nats, nats_healthy), "registry": (start_registry, registry_healthy)}


@_files_named
def up_alone(config: StackConfig, part: Part, say: Say) -> None:
    """Start one optional part alone, nats-server (no Java, no jars) or the schema registry:
    for tests, and a JetStream-only setup."""
    config.check_ports_distinct()
    _prepare(config, (part,), say)
    running = process.is_running(part_pid(config, part), process_marker(config, part))
    if not running:
        _check_ports(config, set(PARTS) - {part})
    save(config)
    _up_optional(config, part, say, running)


def _up_optional(config: StackConfig, part: Part, say: Say, running: bool) -> None:
    start, healthy = _OPTIONAL[part]
    if running:
        _already_running(config, part, healthy, say)
    else:
        _wait(config, part, start(config), healthy, say)


def _already_running(config: StackConfig, part: Part, check: Callable[[StackConfig], bool],
                     say: Say) -> None:
    """A part an earlier `up` started: healthy, or waited for as a start is (a Postgres sent
    SIGTERM waits for its clients to leave and answers no one: it was reported running)."""
    if check(config):
        say(f"{part:<9} already running")
        return
    pid = part_pid(config, part) or 0
    try:
        _wait(config, part, pid, check, say, doing="running but not answering yet")
    except StackError as error:
        if not process.is_running(pid, process_marker(config, part)):  # it ended meanwhile
            raise StackError(f"{part} (pid {pid}) exited while `local up` waited for it "
                             f"(log {config.log_path(part)}): run `cdc-router local up` "
                             "again to start it") from None
        raise StackError(f"{error}\nstop the stack (`cdc-router local down`) and start it "
                         "again") from None


@_files_named
def down(config: StackConfig, say: Say, *, purge: bool) -> None:
    """Stop the parts this stack started (by pid file), Connect first; purge removes the data.
    An optional part it never started (StackConfig.has) is not named (fixer 57-y N-4)."""
    stop_signal: dict[Part, signal.Signals] = {
        # SIGINT is Postgres' fast shutdown: SIGTERM would wait for Debezium's replication
        # connection, which only ends when Connect is gone.
        "postgres": signal.SIGINT, "kafka": signal.SIGTERM, "connect": signal.SIGTERM,
        # nats-server's graceful stop flushes JetStream's store and closes its clients;
        # Quarkus' (the registry's) finishes its requests and closes the H2 file.
        "nats": signal.SIGTERM, "registry": signal.SIGTERM,
    }
    for part in reversed(PARTS):
        pid, marker = part_pid(config, part), process_marker(config, part)
        if pid and process.stop(pid, marker, sig=stop_signal[part]):
            say(f"{part:<9} stopped (pid {pid})")
        elif config.has(part):
            say(f"{part:<9} was not running")
        config.pid_path(part).unlink(missing_ok=True)
    if purge:
        for part in PARTS:
            shutil.rmtree(config.part_dir(part), ignore_errors=True)
        (config.home / "stack.json").unlink(missing_ok=True)
        say(f"removed the stack's data under {config.home}")


def _check_ports(config: StackConfig, running: set[Part]) -> None:
    owned: dict[str, Part] = {"postgres": "postgres", "kafka": "kafka",
                              "kafka controller": "kafka", "connect": "connect", "nats": "nats",
                              "registry": "registry"}
    for name, port in config.ports().items():
        if owned[name] in running:
            continue
        if process.port_in_use(config.host, port):
            raise StackError(process.port_taken(config.host, port, name))


def _wait(config: StackConfig, part: Part, pid: int, check: Callable[[StackConfig], bool],
          say: Say, *, doing: str = "starting") -> None:
    say(f"{part:<9} {doing} (pid {pid}, log {config.log_path(part)})")
    seconds = process.wait_until(lambda: check(config), name=part, timeout_s=_TIMEOUTS_S[part],
                                 pid=pid, marker=process_marker(config, part),
                                 log_path=config.log_path(part))
    say(f"{part:<9} healthy in {seconds:.1f}s  {_address(config, part)}")


# Kafka ---------------------------------------------------------------------------------------

def java_command(config: StackConfig, heap_mb: int, main: str, *args: str) -> list[str]:
    """The java command line of one of the stack's JVMs (Kafka's jars, our logging)."""
    java = shutil.which("java") or "java"
    return [java, f"-Xms{heap_mb}m", f"-Xmx{heap_mb}m", "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile=file:{config.home / 'log4j2.properties'}",
            "-cp", f"{config.kafka_libs}/*", main, *args]


def kafka_cluster_id(random_bytes: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A new cluster id as Kafka writes one: 16 random bytes, URL-safe base64 without padding.

    Like Kafka's own ``Uuid.randomUuid()``, an id that starts with ``-`` is drawn again: one
    in 64 does, and ``kafka-storage format`` reads such an id as an option.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(random_bytes()).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _start_kafka(config: StackConfig) -> int:
    base = config.part_dir("kafka")
    base.mkdir(parents=True, exist_ok=True)
    (config.home / "log4j2.properties").write_text(log4j2_properties())
    properties = base / "server.properties"
    properties.write_text(to_properties(kafka_properties(config)))
    if not (config.kafka_data / "meta.properties").exists():
        command = java_command(config, 256, "kafka.tools.StorageTool", "format",
                                f"--cluster-id={kafka_cluster_id()}",
                                f"--config={properties}")
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise StackError(f"formatting Kafka's log directory failed: "
                             f"{(result.stderr or result.stdout).strip()[-500:]}")
    return process.spawn(java_command(config, config.kafka_heap_mb, "kafka.Kafka",
                                       str(properties)),
                         log_path=config.log_path("kafka"), pid_path=config.pid_path("kafka"),
                         cwd=base)


def _kafka_healthy(config: StackConfig) -> bool:
    from confluent_kafka.admin import AdminClient

    quiet = logging.getLogger("cdc_router.local.probe")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    settings: dict[str, object] = {"bootstrap.servers": config.bootstrap_servers, "logger": quiet}
    # confluent-kafka takes a Python logger here, though its type stubs only list scalars.
    admin = AdminClient(settings)  # type: ignore[arg-type]
    try:
        admin.list_topics(timeout=2)
        return True
    except Exception:  # KafkaException while the broker is not yet listening
        return False


# Connect -------------------------------------------------------------------------------------

def _start_connect(config: StackConfig) -> int:
    base = config.part_dir("connect")
    base.mkdir(parents=True, exist_ok=True)
    properties = base / "connect-distributed.properties"
    properties.write_text(to_properties(connect_properties(config)))
    env = dict(os.environ)
    # Connector configs reference the Debezium role's password as ${env:CDC_ROUTER_DB_PASSWORD}.
    env.setdefault("CDC_ROUTER_DB_PASSWORD", config.replication_password)
    return process.spawn(
        java_command(config, config.connect_heap_mb,
                      "org.apache.kafka.connect.cli.ConnectDistributed", str(properties)),
        log_path=config.log_path("connect"), pid_path=config.pid_path("connect"), env=env,
        cwd=base)


def _connect_healthy(config: StackConfig) -> bool:
    """Connect answers its plugin list; StackError if Debezium's connector is not in it.

    Connect scans plugin.path before its REST server starts, so a list without the connector
    is final: waiting would only fail 240 s later (review 48-b F11, an incomplete jar cache).
    """
    try:
        with urllib.request.urlopen(f"{config.connect_url}/connector-plugins", timeout=3) as reply:
            plugins = json.loads(reply.read())
    except (urllib.error.URLError, OSError, ValueError):
        return False
    if any(plugin.get("class") == POSTGRES_CONNECTOR for plugin in plugins):
        return True
    plugin = config.plugin_path / "debezium-connector-postgres"
    raise StackError(f"Kafka Connect at {config.connect_url} runs without Debezium's "
                     f"{POSTGRES_CONNECTOR}: its plugin directory {plugin} is incomplete; "
                     f"stop the stack (`cdc-router local down`), remove {plugin}, and run "
                     "`cdc-router local up` again, which downloads it anew")
