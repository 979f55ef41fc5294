"""The router instances of a campaign: processes started, signalled and scraped by pid."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.chaos.stack import REPO, _free_port

_DROPPED = re.compile(r"^cdc_router_duplicates_dropped_total\s+([0-9.e+]+)$", re.M)
_ASSIGNED = "event=assigned"


@dataclass
class RouterProcess:
    name: str
    process: subprocess.Popen[bytes]
    metrics_port: int
    log: Path


class RouterFleet:
    """Starts `cdc-router run` instances of one config; counts the replays they dropped."""

    def __init__(self, config: Path, workdir: Path, run: str, env: dict[str, str]) -> None:
        self._config = config
        self._workdir = workdir
        self._run = run
        self._env = {**os.environ, **env}
        self.live: dict[str, RouterProcess] = {}
        self._dropped: dict[int, float] = {}  # pid -> last scraped duplicates_dropped
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._scraper = threading.Thread(target=self._scrape_loop, daemon=True)
        self._scraper.start()

    def start(self, name: str, *, wait: bool = True) -> RouterProcess:
        log = self._workdir / f"router-{name}.log"
        before = log.read_text(errors="replace").count(_ASSIGNED) if log.exists() else 0
        port = _free_port()
        with open(log, "ab") as out:
            child = subprocess.Popen(
                [sys.executable, "-m", "cdc_router", "-v", "run", "-c", str(self._config),
                 "--instance-id", f"{self._run}-{name}", "--metrics-port", str(port)],
                stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=self._env)
        router = RouterProcess(name, child, port, log)
        with self._lock:
            self.live[name] = router
        if wait:
            self.wait_assigned(router, before)
        return router

    def wait_assigned(self, router: RouterProcess, before: int, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while router.log.read_text(errors="replace").count(_ASSIGNED) <= before:
            if router.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chaos: router {router.name} got no partitions; "
                                   f"see {router.log}")
            time.sleep(0.1)

    def signal(self, name: str, sig: signal.Signals) -> int:
        router = self.live[name]
        os.kill(router.process.pid, sig)
        return router.process.pid

    def kill(self, name: str) -> None:
        """kill -9 and reap: no commit, no close, no leave-group."""
        router = self._forget(name)
        os.kill(router.process.pid, signal.SIGKILL)
        router.process.wait(timeout=60)

    def stop(self, name: str) -> int | None:
        """SIGTERM (finish the batch, commit, exit); the exit code."""
        router = self._forget(name)
        if router.process.poll() is None:
            self._scrape(router)
            router.process.send_signal(signal.SIGTERM)
        try:
            return router.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            router.process.kill()
            return router.process.wait()

    def stop_all(self) -> None:
        for name in list(self.live):
            self.stop(name)
        self._stop.set()

    def duplicates_dropped(self) -> int:
        """Replays the routers reported dropped (scraped each second: a lower bound when a
        router is killed between its last scrape and its death)."""
        with self._lock:
            return int(sum(self._dropped.values()))

    def _forget(self, name: str) -> RouterProcess:
        with self._lock:
            return self.live.pop(name)

    def _scrape_loop(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                routers = list(self.live.values())
            for router in routers:
                self._scrape(router)

    def _scrape(self, router: RouterProcess) -> None:
        try:
            text = httpx.get(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return  # stopped, starting, or SIGSTOPped: the last value stands
        match = _DROPPED.search(text)
        if match:
            with self._lock:
                self._dropped[router.process.pid] = float(match.group(1))
