"""A watchdog for librdkafka calls that can block past their own timeout.

librdkafka's transactional calls take a timeout, and nearly always honour it. Not always: after
the group coordinator's broker is killed and restarted, `send_offsets_to_transaction` can block
for good (librdkafka issues #5456 and #5511, both open in 2026: the coordinator request's
timeout is never checked, and a decommissioned coordinator is never looked up again). The chaos
campaign saw a router blocked there for more than five minutes past a 60 s timeout.

No Python code can interrupt a thread blocked inside a C call. So a thread of ours watches the
call, and when it outlives its timeout by far, it ends the process with EXIT_HUNG, for the
supervisor (docker's `restart: unless-stopped`, systemd, Kubernetes) to start it again. That is
safe for the guarantees: the transaction left open commits nothing; the next incarnation's
init_transactions fences this one and aborts it, and its consumer resumes from the last committed
offsets, so the batch is re-read and produced once.

A call made on a thread of its own can be given its own `on_hang` instead: the producer does so
for send_offsets_to_transaction, whose hang is the one seen, and gives up the blocked client
without ending the process (kafka/producer.py).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, NamedTuple

from cdc_router.errors import EXIT_RESTART

log = logging.getLogger("cdc_router.kafka")

EXIT_HUNG = EXIT_RESTART
OnHang = Callable[[str, float, float], None]  # (name, waited_s, timeout_s)
# The start of every hang's line, whatever is done about it.
_HUNG = ("event=client_call_hung call=%s waited_s=%.0f timeout_s=%.0f: librdkafka did not "
         "return within its own timeout (librdkafka issues #5456, #5511)")
# While a call is guarded the watchdog wakes each TICK_S; a wake this much later than asked
# means the process itself was stopped (SIGSTOP, `docker pause`, a frozen VM): that time is no
# call's, so it does not count (QA 32-b: a router paused 36 s exited 75 blaming librdkafka).
TICK_S = 1.0
PAUSED_S = 3.0


class _Guarded(NamedTuple):
    name: str
    started: float
    timeout_s: float
    on_hang: OnHang
    limit_s: float


def _exit_process(name: str, waited_s: float, timeout_s: float) -> None:
    log.critical(_HUNG + "; the process exits with %d for its supervisor to restart it; the "
                 "open transaction is aborted by the next incarnation", name, waited_s,
                 timeout_s, EXIT_HUNG)
    logging.shutdown()
    sys.stderr.flush()
    # sys.exit would only raise in this thread; the main thread is blocked in C.
    os._exit(EXIT_HUNG)


class CallWatchdog:
    """Calls `on_hang` when a guarded call lasts longer than `factor` x its timeout + `slack_s`.

    One call is guarded at a time (the producer's transactional calls run on one thread).
    """

    def __init__(self, *, factor: float = 1.0, slack_s: float = 15.0,
                 on_hang: OnHang = _exit_process,
                 clock: Callable[[], float] = time.monotonic, tick_s: float = TICK_S,
                 paused_s: float = PAUSED_S) -> None:
        self._factor = factor
        self._slack_s = slack_s
        self._tick_s, self._paused_s = tick_s, paused_s
        self._on_hang = on_hang
        self._clock = clock
        self._changed = threading.Condition()
        # The guarded call, None when nothing is guarded.
        self._call: _Guarded | None = None
        self._thread: threading.Thread | None = None

    def limit_s(self, timeout_s: float, slack_s: float | None = None) -> float:
        """How long a call with this timeout may block before the watchdog acts."""
        return self._factor * timeout_s + (self._slack_s if slack_s is None else slack_s)

    @contextmanager
    def guard(self, name: str, timeout_s: float, on_hang: OnHang | None = None,
              slack_s: float | None = None) -> Iterator[None]:
        """Watch the call made inside this block; `on_hang` and `slack_s`: this call's own,
        if not None."""
        self._start()
        with self._changed:
            self._call = _Guarded(name, self._clock(), timeout_s, on_hang or self._on_hang,
                                  self.limit_s(timeout_s, slack_s))
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._call = None
                self._changed.notify()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="cdc-router-watchdog",
                                            daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        watched: _Guarded | None = None  # the call this thread last waited on
        due = 0.0  # when it asked to wake for it
        while True:
            with self._changed:
                call = self._call
                if call is None:
                    self._changed.wait()
                    continue
                now = self._clock()
                # Woken far later than asked, or first seeing a call far after it started: the
                # process was stopped meanwhile, which is no call's time (review 32-2).
                paused_s = now - (due if call is watched else call.started)
                if paused_s > self._paused_s:
                    call = self._call = call._replace(started=call.started + paused_s)
                    log.warning("event=process_paused call=%s paused_s=%.0f: the process was "
                                "stopped (not the call hung); the call's time goes on from "
                                "here", call.name, paused_s)
                name, started, timeout_s, on_hang, limit_s = call
                waited_s = now - started
                if waited_s < limit_s:
                    asked_s = min(self._tick_s, limit_s - waited_s)
                    watched, due = call, now + asked_s
                    self._changed.wait(asked_s)
                    continue
                self._call = None
            on_hang(name, waited_s, timeout_s)


# Calls given up and still blocked, in the whole process (see blocked_calls).
_abandoned = 0
_abandoned_lock = threading.Lock()


def blocked_calls() -> int:
    """How many calls given up by their AbandonableCall have not returned yet: each holds a
    client, its threads and sockets until it does (review 38: a cap on the rate of renewals
    alone would let them pile up over weeks, if librdkafka never returned)."""
    return _abandoned


def count_blocked(call: Future[Any]) -> None:
    """Count `call`, given up by its caller, with the blocked calls until it ends."""
    global _abandoned
    with _abandoned_lock:
        _abandoned += 1

    def ended(_: Future[Any]) -> None:
        global _abandoned
        with _abandoned_lock:
            _abandoned -= 1
    call.add_done_callback(ended)  # at once if it has ended already


class AbandonableCall:
    """One blocking call on a daemon thread of its own, so that its caller can stop waiting.

    run() returns True once the call has returned (and raises what it raised), False when
    hung() was called first (give it as the guard's `on_hang`): the call may go on blocking
    its thread for good, and whatever it uses must be left to it.
    """

    def __init__(self, name: str, call: Callable[[], object]) -> None:
        self._name = name
        self._call: Callable[[], object] | None = call
        self._woken = threading.Event()
        self._returned = False
        self._given_up = False
        self._error: BaseException | None = None
        self.waited_s = 0.0

    def hung(self, name: str, waited_s: float, timeout_s: float) -> None:
        log.error(_HUNG + "; the client is given up to the blocked thread", name, waited_s,
                  timeout_s)
        self._give_up(waited_s)

    def _give_up(self, waited_s: float) -> None:
        global _abandoned
        with _abandoned_lock:
            if not self._returned and not self._given_up:
                self._given_up = True
                _abandoned += 1
        self.waited_s = waited_s
        self._woken.set()

    def run(self, wait_s: float | None = None) -> bool:
        """As the class says; with `wait_s`, the call is also given up once it blocked that
        long (its caller says so)."""
        threading.Thread(target=self._target, name=f"cdc-router-{self._name}",
                         daemon=True).start()
        if not self._woken.wait(wait_s):
            self._give_up(wait_s or 0.0)
        if not self._returned:
            return False
        if self._error is not None:
            raise self._error
        return True

    def _target(self) -> None:
        try:
            assert self._call is not None  # run() starts this thread once
            self._call()
        except BaseException as error:  # handed to run()'s caller
            # Without its traceback, whose frame holds this object: a cycle would keep the
            # client until the collector destroyed it on the router's thread (review 38).
            self._error = error.with_traceback(None)
        finally:
            # The client goes with this thread's last reference to it, here, not elsewhere.
            self._call = None
            self._release()
            self._woken.set()

    def _release(self) -> None:
        global _abandoned
        with _abandoned_lock:
            self._returned = True
            if self._given_up:
                _abandoned -= 1
                log.info("event=abandoned_call_returned call=%s still_blocked=%d", self._name,
                         _abandoned)
