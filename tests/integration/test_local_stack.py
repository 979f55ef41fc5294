"""`cdc-router local` on a second, private stack: kill -9 recovery, status after down, ports."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_router.local import process
from cdc_router.local.config import load_saved
from tests.integration.support import free_ports, read_topic

# A whole second stack starting beside a test on the shared one would starve it of the 2 cores.
pytestmark = [pytest.mark.integration, pytest.mark.exclusive]

REPO = Path(__file__).resolve().parents[2]
# The private stack's ports: free ones, clear of the shared stack and of any other on the host.
PORT_OPTIONS = ("--postgres-port", "--kafka-port", "--kafka-controller-port", "--connect-port")


def _port_flags(options: tuple[str, ...]) -> list[str]:
    """`--option PORT` pairs, each with a free port of its own."""
    return [item for option, port in zip(options, free_ports(len(options)), strict=True)
            for item in (option, str(port))]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cdc_router", "local", *args], cwd=REPO,
                          capture_output=True, text=True, check=False, timeout=600,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def private_home() -> Iterator[Path]:
    # Beside the shared stack's home: the postgres user can reach it (pytest's tmp is 0700).
    home = REPO / f".cdc-router-private-{uuid.uuid4().hex[:8]}"
    started = _cli("up", "--home", str(home), *_port_flags(PORT_OPTIONS))
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield home
    finally:
        _cli("down", "--home", str(home), "--purge")
        shutil.rmtree(home, ignore_errors=True)


def test_kill_9_of_kafka_then_up_brings_back_its_topics_and_data(private_home: Path) -> None:
    config = load_saved(private_home)
    assert config is not None
    topic = f"survivor-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": config.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(timeout=30)
    producer = Producer({"bootstrap.servers": config.bootstrap_servers, "acks": "all"})
    for i in range(100):
        producer.produce(topic, key=str(i).encode(), value=f"record-{i}".encode())
    assert producer.flush(30) == 0
    pid = process.read_pid(config.pid_path("kafka"))
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    status = _cli("status", "--home", str(private_home))
    assert "kafka     stale" in status.stdout, status.stdout
    again = _cli("up", "--home", str(private_home))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "postgres  already running" in again.stdout
    assert "connect   already running" in again.stdout

    metadata = AdminClient({"bootstrap.servers": config.bootstrap_servers}).list_topics(
        timeout=30)
    assert len(metadata.topics[topic].partitions) == 3
    values = sorted(m.value() for m in read_topic(config.bootstrap_servers, topic, 100))
    assert values == sorted(f"record-{i}".encode() for i in range(100))


def test_up_without_with_names_the_optional_parts_that_run(private_home: Path) -> None:
    [nats_port] = free_ports(1)
    started = _cli("up", "--home", str(private_home), "--with", "nats",
                   "--nats-port", str(nats_port))
    assert started.returncode == 0, started.stdout + started.stderr

    again = _cli("up", "--home", str(private_home))

    assert again.returncode == 0, again.stdout + again.stderr
    assert (f"nats url           nats://127.0.0.1:{nats_port}  (running: an earlier "
            "`local up --with nats` started it)") in again.stdout, again.stdout
    assert "registry url" not in again.stdout  # not this stack's


def test_up_says_when_connect_runs_with_another_db_password(private_home: Path) -> None:
    config = load_saved(private_home)
    assert config is not None
    started_with = process.environ_of(process.read_pid(config.pid_path("connect")),
                                      "CDC_ROUTER_DB_PASSWORD")
    assert started_with is not None

    same = _cli("up", "--home", str(private_home),
                env={"CDC_ROUTER_DB_PASSWORD": started_with})
    other = _cli("up", "--home", str(private_home),
                 env={"CDC_ROUTER_DB_PASSWORD": started_with + "-changed"})

    assert same.returncode == other.returncode == 0, same.stderr + other.stderr
    line = "connect   runs with another CDC_ROUTER_DB_PASSWORD than this shell's"
    assert line not in same.stdout, same.stdout
    assert line in other.stdout, other.stdout
    assert started_with not in other.stdout  # never the password itself


def test_up_fails_naming_a_port_another_process_holds(private_home: Path,
                                                      tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        others = tuple(option for option in PORT_OPTIONS if option != "--kafka-port")
        result = _cli("up", "--home", str(tmp_path / "other"), "--kafka-port", str(port),
                      *_port_flags(others))
    assert result.returncode == 1
    assert f"port {port} (kafka)" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "other" / "postgres" / "postgres.pid").exists()


def test_status_after_down_says_nothing_runs(private_home: Path) -> None:
    down = _cli("down", "--home", str(private_home))
    assert down.returncode == 0
    status = _cli("status", "--home", str(private_home))
    assert status.stdout.startswith("nothing is running"), status.stdout
    for part in ("postgres", "kafka", "connect"):
        assert not (private_home / part / f"{part}.pid").exists()
