"""The faults: a seeded schedule, and one injector per kind that waits for the recovery.

Recovery time of a fault: from the injection until the router has committed offsets past the
first raw record written after it, i.e. until an event born after the fault came through the
whole pipeline (source, router, transaction).
"""

from __future__ import annotations

import random
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from tests.chaos.routers import RouterFleet
from tests.chaos.stack import (
    AtLeastOnceWorker,
    Connect,
    LocalStack,
    debezium_config,
    wait_slot_released,
)
from tests.chaos.verifier import HangingAbort

MAIN = "main"
SESSION_TIMEOUT_S = 10  # the router's session.timeout.ms (cdc_router/router/clients.py)
RECOVERY_TIMEOUT_S = 300
# No progress this long after a fault: look for a transaction Kafka left hanging (and again
# every half of it).
HANGING_CHECK_S = 120
# The router's exit code for "restart me": a Kafka client call hung past its timeout
# (cdc_router/kafka/watchdog.py) or its static member was fenced (sysexits' EX_TEMPFAIL).
# Spelled here: the campaign drives the router as a user's supervisor would, by its command
# line and exit codes.
EXIT_RESTART = 75

PROFILES: dict[str, dict[str, int]] = {
    "short": {"router_kill": 1, "connect_kill": 1, "kafka_kill": 1, "postgres_stop": 1,
              "zombie": 1, "rebalance_storm": 1, "replay_phase": 1},
    "full": {"router_kill": 10, "connect_kill": 3, "kafka_kill": 2, "postgres_stop": 2,
             "zombie": 1, "rebalance_storm": 1, "replay_phase": 1},
}


@dataclass(frozen=True)
class PlannedFault:
    kind: str
    at_fraction: float  # of its load segment written before it fires
    pause_s: float  # how long the part stays down (Kafka), or the storm's step


def schedule(profile: str, seed: int) -> list[PlannedFault]:
    """The faults of a profile in a seeded order, each with seeded timings."""
    rng = random.Random(seed)
    kinds = [kind for kind, count in PROFILES[profile].items() for _ in range(count)]
    rng.shuffle(kinds)
    return [PlannedFault(kind, round(rng.uniform(0.2, 0.6), 2), round(rng.uniform(1, 4), 1))
            for kind in kinds]


@dataclass
class FaultRecord:
    kind: str
    started_s: float  # since the campaign's start
    recovery_s: float | None = None  # None: not recovered within RECOVERY_TIMEOUT_S
    notes: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    hanging_aborts: list[HangingAbort] = field(default_factory=list)


class Progress:
    """The raw topic's end offset and the router group's committed offset."""

    def __init__(self, bootstrap: str, raw_topic: str, group: str) -> None:
        self._partition = TopicPartition(raw_topic, 0)
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                   "enable.auto.commit": False,
                                   "isolation.level": "read_committed",
                                   # Broker outages are the point here: no log line per retry.
                                   "log_level": 0})

    def raw_end(self) -> int | None:
        try:
            return int(self._consumer.get_watermark_offsets(self._partition, timeout=5)[1])
        except Exception:  # broker down: no reading
            return None

    def committed(self) -> int | None:
        try:
            return int(self._consumer.committed([self._partition], timeout=5)[0].offset)
        except Exception:
            return None

    def close(self) -> None:
        self._consumer.close()


class ProgressSampler:
    """Samples the raw topic's end and the router's committed offset every `every_s`, for
    the report's timeline. Its own consumer: librdkafka handles are not shared across threads
    here, and the injector's probes must not wait behind a sample."""

    def __init__(self, bootstrap: str, raw_topic: str, group: str, start: float,
                 every_s: float = 5) -> None:
        self._progress = Progress(bootstrap, raw_topic, group)
        self._start = start
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress-sampler", daemon=True)
        self.samples: list[tuple[float, int | None, int | None]] = []  # (s, raw end, committed)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            self.samples.append((round(time.monotonic() - self._start, 1),
                                 self._progress.raw_end(), self._progress.committed()))

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._progress.close()


class Injector:
    """Injects each kind of fault into the stack and the fleet, and measures the recovery."""

    def __init__(self, stack: LocalStack, connect: Connect, fleet: RouterFleet,
                 progress: Progress, connector: tuple[str, dict[str, str]], workdir: Path,
                 clock: Callable[[], float], wait_written: Callable[[int], None],
                 dsn: str) -> None:
        self._dsn = dsn
        self._stack = stack
        self._connect = connect
        self._fleet = fleet
        self._progress = progress
        self._connector_name, self._connector_config = connector
        self._workdir = workdir
        self._clock = clock
        self._wait_more_written = wait_written
        self.extra_topics: list[str] = []

    def inject(self, fault: PlannedFault) -> FaultRecord:
        record = FaultRecord(fault.kind, round(self._clock(), 1))
        raw_end = self._wait_value(self._progress.raw_end)
        started = time.monotonic()
        getattr(self, f"_{fault.kind}")(fault, record)
        record.recovery_s = self._recovered(raw_end, started, record)
        for task in self._connect.failed_tasks(self._connector_name):
            record.findings.append(f"connector task FAILED after {fault.kind}: "
                                   f"{str(task.get('trace', ''))[:300]}")
            self._connect.restart_failed(self._connector_name)
        if record.recovery_s is None:
            record.findings.append(f"no end-to-end progress {RECOVERY_TIMEOUT_S}s after "
                                   f"{fault.kind}")
        return record

    def _restart_exited(self, record: FaultRecord) -> None:
        """Restart a router that exited on its own, as a supervisor would.

        Exit code EXIT_RESTART is the router's documented "restart me" (a librdkafka call hung
        past its timeout, or its static member fenced; README, "Guarantees"): a note. Any
        other exit is a finding.
        """
        main = self._fleet.live.get(MAIN)
        if main is None or main.process.poll() is None:
            return
        said = (f"router exited with code {main.process.returncode} after {record.kind}: "
                f"{last_words(main.log.read_text(errors='replace'))[:300]}")
        (record.notes if main.process.returncode == EXIT_RESTART else record.findings).append(said)
        self._fleet.live.pop(MAIN)
        self._fleet.start(MAIN, wait=False)

    def _recovered(self, raw_end: int, started: float, record: FaultRecord) -> float | None:
        deadline = started + RECOVERY_TIMEOUT_S
        next_check = started + HANGING_CHECK_S
        while time.monotonic() < deadline:
            self._restart_exited(record)
            if time.monotonic() > next_check:
                next_check += HANGING_CHECK_S / 2
                self._abort_hanging(record)
            committed = self._progress.committed()
            if committed is not None and committed > raw_end:
                return round(time.monotonic() - started, 1)
            time.sleep(0.2)
        return None

    def _abort_hanging(self, record: FaultRecord) -> None:
        """Kafka's defect, not the router's: a note, and the operator's remedy (README)."""
        aborted = self._stack.abort_hanging_transactions()
        if aborted:
            record.notes.append(f"Kafka left a hanging transaction after {record.kind}, "
                                f"aborted with kafka-transactions: "
                                f"{', '.join(map(str, aborted))}")
            record.hanging_aborts.extend(aborted)
            self._connect.restart_all(self._connector_name)

    @staticmethod
    def _wait_value(probe: Callable[[], int | None]) -> int:
        while (value := probe()) is None:
            time.sleep(0.5)
        return value

    # One method per kind ---------------------------------------------------------------------
    def _router_kill(self, fault: PlannedFault, record: FaultRecord) -> None:
        self._fleet.kill(MAIN)
        self._fleet.start(MAIN, wait=False)

    def _connect_kill(self, fault: PlannedFault, record: FaultRecord) -> None:
        pid = self._stack.signal("connect", signal.SIGKILL)
        self._stack.wait_dead(pid)
        self._stack.up()
        record.notes.append(f"connect pid {pid} killed, restarted by local up")

    def _kafka_kill(self, fault: PlannedFault, record: FaultRecord) -> None:
        pid = self._down_and_up("kafka", signal.SIGKILL, fault.pause_s)
        record.notes.append(f"kafka pid {pid} killed, down {fault.pause_s}s")

    def _postgres_stop(self, fault: PlannedFault, record: FaultRecord) -> None:
        # SIGQUIT to the postmaster is pg_ctl's `stop -m immediate`: no checkpoint, crash
        # recovery on the next start.
        pid = self._down_and_up("postgres", signal.SIGQUIT, fault.pause_s)
        record.notes.append(f"postgres pid {pid} stopped (immediate), down {fault.pause_s}s")

    def _down_and_up(self, part: str, sig: signal.Signals, pause_s: float) -> int:
        """Signal a part of the stack, wait for it to die, leave it down `pause_s`, start it
        again with `local up`; the pid it had."""
        pid = self._stack.signal(part, sig)
        self._stack.wait_dead(pid)
        time.sleep(pause_s)
        self._stack.up()
        return pid

    def _zombie(self, fault: PlannedFault, record: FaultRecord) -> None:
        """Freeze the router past its session timeout while a second instance takes over."""
        zombie = self._fleet.live[MAIN]
        log_mark = zombie.log.stat().st_size
        self._fleet.signal(MAIN, signal.SIGSTOP)
        frozen = time.monotonic()
        self._fleet.start("takeover", wait=True)
        time.sleep(max(0.0, SESSION_TIMEOUT_S + 5 - (time.monotonic() - frozen)))
        self._fleet.signal(MAIN, signal.SIGCONT)
        record.notes.append(f"router frozen {time.monotonic() - frozen:.0f}s "
                            f"(session.timeout.ms {SESSION_TIMEOUT_S * 1000})")
        time.sleep(10)
        after = zombie.log.read_bytes()[log_mark:].decode(errors="replace").splitlines()
        evidence = [line for line in after if "abort" in line or "fenced" in line.lower()
                    or "revoked" in line or "assigned" in line or "error" in line.lower()]
        record.notes.extend(f"zombie: {line[:240]}" for line in evidence[:4])
        code = zombie.process.poll()
        record.notes.append("zombie exited with code " + str(code) if code is not None
                            else "zombie still running (rejoined the group)")
        if code is not None:
            self._fleet.live.pop(MAIN, None)
        # The takeover leaves; a fresh main (or the rejoined zombie) carries on.
        self._fleet.stop("takeover")
        if MAIN not in self._fleet.live:
            self._fleet.start(MAIN, wait=False)

    def _rebalance_storm(self, fault: PlannedFault, record: FaultRecord) -> None:
        rng = random.Random(int(fault.pause_s * 1000))
        joined: list[str] = []
        for step in range(6):
            name = f"storm{step}"
            self._fleet.start(name, wait=False)
            joined.append(name)
            time.sleep(fault.pause_s)
            if len(joined) > 1:
                leaving = joined.pop(rng.randrange(len(joined)))
                if rng.random() < 0.5:
                    self._fleet.kill(leaving)
                else:
                    self._fleet.stop(leaving)
        for name in joined:
            self._fleet.stop(name)
        record.notes.append("6 instances joined, each left after about "
                            f"{fault.pause_s}s (half kill -9, half SIGTERM)")

    def _replay_phase(self, fault: PlannedFault, record: FaultRecord) -> None:
        """Move the connector to a worker without exactly-once source support, kill it -9,
        and move it back: Debezium replays, the router must drop the replays."""
        name = self._connector_name
        self._connect.delete(name)
        wait_slot_released(self._dsn, self._connector_config["slot.name"])
        worker = AtLeastOnceWorker(self._stack.config, self._workdir,
                                   f"{name}-alo-{uuid.uuid4().hex[:4]}")
        self.extra_topics.extend(worker.topics)
        try:
            worker.start()
            alo = Connect(worker.url)
            config = {k: v for k, v in self._connector_config.items()
                      if k not in ("exactly.once.support", "transaction.boundary")}
            alo.put(name, config)
            alo.wait_running(name)
            self._wait_more_written(500)
            worker.kill()
            record.notes.append("at-least-once worker killed -9 with unflushed offsets")
            worker.start()
            if not alo.wait_running(name):
                record.findings.append("connector not RUNNING on the restarted "
                                       "at-least-once worker")
            self._wait_more_written(300)
            alo.delete(name)
            wait_slot_released(self._dsn, self._connector_config["slot.name"])
        finally:
            worker.stop()
        self._connect.put(name, self._connector_config)
        self._connect.wait_running(name)


def last_words(log: str) -> str:
    """The router's last line of its own, past librdkafka's logger (its retries and
    disconnects come after the line that says why the router stopped)."""
    own = [line for line in log.splitlines()
           if line.strip() and "logger=cdc_router.librdkafka " not in line]
    return own[-1] if own else "(empty log)"


def register_connector(connect: Connect, dsn: str, table: str,
                       prefix: str) -> tuple[str, dict[str, str]]:
    config = debezium_config(dsn, table, prefix, exactly_once=True)
    connect.put(prefix, config)
    if not connect.wait_running(prefix):
        raise RuntimeError(f"chaos: connector {prefix} not RUNNING: {connect.state(prefix)}")
    return prefix, config
