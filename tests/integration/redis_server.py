"""A real redis-server (Debian's) for tests: own process, free loopback port, stopped by pid.

Never the system service: each RedisServer runs `redis-server` as a plain child process with
its pid file, data and log under the given directory, so tests can kill and restart it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import redis

from tests.integration.support import free_port

INSTALL_HINT = "install Debian's redis-server: apt-get install -y redis-server"



class RedisServer:
    """One redis-server process; `persistent` turns on AOF with fsync on every write."""

    def __init__(self, directory: Path, *, persistent: bool = False,
                 port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(f"redis-server not found; {INSTALL_HINT}")
        self.binary = binary
        self.directory = directory
        self.persistent = persistent
        self.port = port or free_port()
        self.pid_file = directory / "redis.pid"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def start(self, timeout_s: float = 15.0) -> None:
        """Start the server and wait until it answers PING."""
        self.directory.mkdir(parents=True, exist_ok=True)
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent \
            else ["--appendonly", "no"]
        command = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                   "--daemonize", "no", "--pidfile", str(self.pid_file),
                   "--dir", str(self.directory), "--logfile", str(self.directory / "redis.log"),
                   "--save", "", *persistence]
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while True:
            if self._process.poll() is not None:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self._process.returncode}: {log}")
            try:
                if self.client().ping() and self.pid_file.exists():
                    return
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} not ready in {timeout_s}s")
            time.sleep(0.05)

    def _pid(self) -> int | None:
        if self.pid_file.exists():
            text = self.pid_file.read_text().strip()
            if text:
                return int(text)
        return self._process.pid if self._process is not None else None

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Signal our server by its pid and wait for it to exit (SIGKILL to crash it)."""
        pid = self._pid()
        process, self._process = self._process, None
        if pid is not None and process is not None and process.poll() is None:
            # Only the pid of the process we started: never a broad kill by name.
            assert pid == process.pid, f"pid file {pid} is not our process {process.pid}"
            os.kill(pid, sig)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                process.wait(timeout=15)
        self.pid_file.unlink(missing_ok=True)

    def restart(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop (or crash, with SIGKILL) and start again on the same port and directory."""
        self.stop(sig)
        self.start()
