"""The watchdog of blocking librdkafka calls (kafka/watchdog.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc_router.errors import EXIT_RESTART, ProducerHung
from cdc_router.kafka.producer import OFFSETS_SLACK_S, LatchingProducer
from cdc_router.kafka.watchdog import EXIT_HUNG, CallWatchdog, blocked_calls


class _HangingClient:
    """A producer client whose send_offsets_to_transaction blocks, as librdkafka's did after a
    broker kill -9 (issues #5456, #5511), until `release` is set."""

    def __init__(self, release: threading.Event, *, hang_commit: bool = False,
                 failure: BaseException | None = None) -> None:
        self.release, self.hang_commit, self.failure = release, hang_commit, failure
        self.returned = threading.Event()

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout_s: float) -> None:
        if self.failure is not None:
            raise self.failure
        assert self.release.wait(30), "the test never released it"
        self.returned.set()

    def commit_transaction(self, timeout_s: float) -> None:
        if self.hang_commit:
            assert self.release.wait(30), "the watchdog never acted"


def test_a_call_outliving_its_timeout_is_reported_with_its_name() -> None:
    release = threading.Event()
    hung: list[tuple[str, float, float]] = []

    def on_hang(name: str, waited_s: float, timeout_s: float) -> None:
        hung.append((name, waited_s, timeout_s))
        release.set()

    producer = LatchingProducer({}, lambda conf: _HangingClient(release, hang_commit=True),
                                watchdog=CallWatchdog(factor=2.0, slack_s=0.05, on_hang=on_hang))
    producer.commit_transaction(0.01)

    [(name, waited_s, timeout_s)] = hung
    assert name == "commit_transaction"
    assert timeout_s == 0.01
    assert waited_s >= 2.0 * 0.01 + 0.05


def test_calls_that_return_are_never_reported() -> None:
    hung: list[str] = []
    watchdog = CallWatchdog(factor=1.0, slack_s=1.0, on_hang=lambda name, *_: hung.append(name))
    producer = LatchingProducer({}, lambda conf: _HangingClient(threading.Event()),
                                watchdog=watchdog)
    for _ in range(3):
        producer.commit_transaction(0.01)
    # Well past the 1.01 s limit of those calls: the watchdog was disarmed when each returned.
    time.sleep(1.5)
    assert hung == []


def test_the_limit_scales_with_the_timeout() -> None:
    assert CallWatchdog().limit_s(60.0) == 75.0


def test_by_default_a_hung_call_ends_the_process_with_exit_hung() -> None:
    # The main thread is blocked (here in sleep, in the router in librdkafka's C code): only
    # ending the process from the watchdog's thread gets the router going again.
    script = ("import time\n"
              "from cdc_router.kafka.watchdog import CallWatchdog\n"
              "with CallWatchdog(factor=1.0, slack_s=0.2).guard('commit_transaction', 0.1):\n"
              "    time.sleep(60)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=50)
    assert done.returncode == EXIT_HUNG
    assert "event=client_call_hung call=commit_transaction" in done.stderr


def test_a_process_stopped_and_continued_is_not_a_hung_call() -> None:
    # QA 32-b: a router paused 36 s (SIGSTOP; docker pause, a frozen VM alike) exited 75 with
    # a line blaming librdkafka: the paused time counted as the call's. The child stops itself
    # inside the guarded call, so that how fast this (loaded) test process reacts counts for
    # nothing; the stop lasts past the call's 4 s limit.
    script = ("import os, signal, time\n"
              "from cdc_router.kafka.watchdog import CallWatchdog\n"
              "watchdog = CallWatchdog(factor=1.0, slack_s=2.0, tick_s=0.2, paused_s=1.0)\n"
              "with watchdog.guard('flush', 2.0):\n"
              "    time.sleep(0.2)\n"
              "    os.kill(os.getpid(), signal.SIGSTOP)\n"
              "    time.sleep(1.0)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while _state(child.pid) != "T":
        assert child.poll() is None and time.monotonic() < deadline, "the child never stopped"
        time.sleep(0.05)
    time.sleep(5)
    child.send_signal(signal.SIGCONT)
    _, stderr = child.communicate(timeout=60)
    assert child.returncode == 0, stderr
    assert "event=process_paused call=flush" in stderr
    assert "client_call_hung" not in stderr


def _state(pid: int) -> str:
    """A process's state letter in /proc (T: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def test_a_hung_send_offsets_gives_its_client_up_and_the_next_call_builds_a_new_one() -> None:
    # QA 37-a: send_offsets_to_transaction blocked past its timeout at 5 of 10 instance-moves
    # of the group coordinator on a 3-broker cluster (librdkafka #5456, #5511), and each
    # process exited 75 for its supervisor: 43-127 s without delivery.
    release = threading.Event()
    clients: list[_HangingClient] = []

    def factory(conf: dict[str, Any]) -> _HangingClient:
        clients.append(_HangingClient(release))
        return clients[-1]

    exits: list[str] = []
    producer = LatchingProducer({}, factory, watchdog=CallWatchdog(
        factor=1.0, slack_s=0.05, on_hang=lambda name, *_: exits.append(name)))
    blocked = blocked_calls()
    with pytest.raises(ProducerHung, match="send_offsets_to_transaction blocked .* past its "
                                           r"own 0 s timeout \(librdkafka issues #5456"):
        producer.send_offsets_to_transaction([], None, 0.01)
    assert exits == [], "the process goes on"
    assert producer.client is not clients[0] and len(clients) == 2
    assert blocked_calls() == blocked + 1  # counted until it returns (review 38 F3)
    release.set()  # the abandoned call may still return one day: nothing waits for it
    assert clients[0].returned.wait(10)
    deadline = time.monotonic() + 10
    while blocked_calls() != blocked and time.monotonic() < deadline:
        time.sleep(0.01)  # the thread's finally runs just after the call returned
    assert blocked_calls() == blocked
    producer.send_offsets_to_transaction([], None, 0.01)  # the new client's returns at once


def test_a_send_offsets_that_fails_on_its_thread_raises_its_error_to_the_caller() -> None:
    refused = KafkaException(KafkaError(KafkaError._TIMED_OUT, "coordinator moving"))
    producer = LatchingProducer({}, lambda conf: _HangingClient(threading.Event(),
                                                                failure=refused))
    with pytest.raises(KafkaException) as raised:
        producer.send_offsets_to_transaction([], None, 0.01)
    assert raised.value is refused


def test_a_hung_producer_exits_for_a_restart_where_nothing_renews_it() -> None:
    assert ProducerHung("blocked").exit_code == EXIT_RESTART


def test_send_offsets_is_given_up_five_seconds_past_its_timeout_not_fifteen() -> None:
    # QA 38-a: each hang cost 35 s without delivery, although the coordinator aborts the
    # transaction at the call's own timeout already.
    assert OFFSETS_SLACK_S == 5.0
    assert CallWatchdog().limit_s(20.0, OFFSETS_SLACK_S) == 25.0
    assert CallWatchdog().limit_s(20.0) == 35.0


_ENTRY = """
import atexit, sys
import cdc_router.cli as cli
from cdc_router.kafka import watchdog
atexit.register(lambda: print("finalized", flush=True))
watchdog._abandoned = int(sys.argv[1])
if sys.argv[2] == "crash":
    def crash():
        raise RuntimeError("no command made this an error")
    cli.main = crash
sys.argv = ["cdc-router", *sys.argv[2:]]
cli.entry()
"""


@pytest.mark.parametrize(("blocked", "finalized"), [(0, True), (1, False)])
def test_the_program_exits_without_finalizers_while_a_given_up_call_is_still_blocked(
        blocked: int, finalized: bool) -> None:
    # Review 38 F4: an abandoned client's librdkafka threads still run at exit; C atexit
    # handlers (OpenSSL's cleanup) under a broker thread inside SSL can crash the exit.
    for arg, code, said in (("--version", 0, "cdc-router, version"), ("no-such", 2, ""),
                            ("crash", 1, "")):
        done = subprocess.run([sys.executable, "-c", _ENTRY, str(blocked), arg],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == code, done.stderr
        assert said in done.stdout  # written out before the exit
        assert ("finalized" in done.stdout) is finalized
        assert ("RuntimeError: no command made" in done.stderr) is (arg == "crash")
