"""The stack's optional nats-server with JetStream (`local up --with nats`): Debian's binary."""

from __future__ import annotations

import json
import shutil
import socket

from cdc_router.errors import StackError
from cdc_router.local import process
from cdc_router.local.config import StackConfig, nats_command, nats_server_conf


def nats_executable() -> str:
    found = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/bin")
    if found is None:
        raise StackError("nats-server is not installed: run `apt-get install -y nats-server` "
                         "(or `sudo make system-deps`)")
    return found


def start_nats(config: StackConfig) -> int:
    """Spawn nats-server with its config under the home; its pid."""
    base = config.part_dir("nats")
    config.nats_data.mkdir(parents=True, exist_ok=True)
    (base / "nats-server.conf").write_text(nats_server_conf(config))
    return process.spawn(nats_command(config, nats_executable()),
                         log_path=config.log_path("nats"), pid_path=config.pid_path("nats"),
                         cwd=base)


def nats_healthy(config: StackConfig) -> bool:
    """The server greets with its INFO line, and JetStream is on in it."""
    try:
        with socket.create_connection((config.host, config.nats_port), timeout=2) as conn:
            greeting = conn.recv(4096)
    except OSError:
        return False
    if not greeting.startswith(b"INFO "):
        return False
    try:
        info = json.loads(greeting[5:].split(b"\r\n")[0])
    except ValueError:
        return False
    return bool(info.get("jetstream"))
