"""A second, at-least-once Kafka Connect worker, for tests that need Debezium to replay."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from cdc_router.local import process
from cdc_router.local.config import StackConfig, connect_properties, load_saved, to_properties
from cdc_router.local.stack import java_command
from tests.integration.support import POSTGRES_CONNECTOR, free_port, unique

REPO = Path(__file__).resolve().parents[2]



@dataclass
class ConnectWorker:
    """One Connect worker process started by a test, stopped by its pid."""

    stack: StackConfig
    workdir: Path
    properties: Path
    url: str
    pid: int = 0

    @property
    def log(self) -> Path:
        return self.workdir / "connect.log"

    def start(self) -> None:
        self.pid = process.spawn(
            java_command(self.stack, 512, "org.apache.kafka.connect.cli.ConnectDistributed",
                         str(self.properties)),
            log_path=self.log, pid_path=self.workdir / "connect.pid", env=dict(os.environ))
        process.wait_until(self._healthy, name="test connect worker", timeout_s=180,
                           pid=self.pid, marker=str(self.properties), log_path=self.log)

    def kill(self) -> None:
        """kill -9, by pid: no offset flush, no clean task stop."""
        os.kill(self.pid, 9)
        while process.is_running(self.pid, str(self.properties)):
            time.sleep(0.05)  # not a busy loop: two cores are shared with the stack

    def stop(self) -> None:
        process.stop(self.pid, str(self.properties))

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/connector-plugins", timeout=3) as reply:
                plugins = json.loads(reply.read())
        except OSError:
            return False
        return any(p.get("class") == POSTGRES_CONNECTOR for p in plugins)


@contextmanager
def at_least_once_worker(workdir: Path, flush_interval_ms: int = 600_000) -> Iterator[
        ConnectWorker]:
    """A worker without exactly-once source support that flushes offsets rarely, so that
    a kill -9 makes Debezium replay what it sent since the last flush."""
    home = Path(os.environ.get("CDC_ROUTER_HOME", REPO / ".cdc-router")).resolve()
    stack = load_saved(home)
    assert stack is not None, f"no local stack under {home}: its jars start the worker"
    name = unique("aloconnect")
    port = free_port()
    props = {
        **connect_properties(stack),
        "group.id": name,
        "config.storage.topic": f"{name}-configs",
        "offset.storage.topic": f"{name}-offsets",
        "status.storage.topic": f"{name}-status",
        "exactly.once.source.support": "disabled",
        "offset.flush.interval.ms": str(flush_interval_ms),
        "listeners": f"http://127.0.0.1:{port}",
        "rest.advertised.port": str(port),
    }
    workdir.mkdir(parents=True, exist_ok=True)
    properties = workdir / f"{name}.properties"
    properties.write_text(to_properties(props))
    worker = ConnectWorker(stack, workdir, properties, f"http://127.0.0.1:{port}")
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        topics = [props["config.storage.topic"], props["offset.storage.topic"],
                  props["status.storage.topic"]]
        for future in admin.delete_topics(topics).values():
            with suppress(Exception):
                future.result(timeout=30)
