"""Processes the stack starts: pid files, port checks, health waits, stop by pid."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cdc_router.errors import StackError


def read_pid(pid_path: Path) -> int | None:
    try:
        return int(pid_path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def is_running(pid: int | None, marker: str) -> bool:
    """True if `pid` lives and its command line names `marker` (a pid may be reused)."""
    if pid is None:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return not exited_unreaped(pid) and marker.encode() in cmdline


def exited_unreaped(pid: int) -> bool:
    """True if `pid` has exited and its parent has not reaped it yet (a zombie, state Z)."""
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def environ_of(pid: int | None, name: str) -> str | None:
    """The value of variable `name` in process `pid`'s environment as it started (what a JVM
    read then), or None: unset, or the process gone or another user's."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = os.fsencode(name) + b"="
    found = next((item[len(prefix):] for item in environ if item.startswith(prefix)), None)
    return None if found is None else os.fsdecode(found)


def port_in_use(host: str, port: int) -> bool:
    """True if something listens on (or holds) host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # The JVMs and Postgres bind with SO_REUSEADDR too, so TIME_WAIT leftovers don't count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return True
            raise
    return False


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def port_taken(host: str, port: int, name: str, ranges: Path | None = None) -> str:
    """`local up`'s refusal of a port in use. QA 58-b F-4: in Linux's ephemeral range, a client
    reconnecting to a stopped broker was given the broker's port as its own (a TCP
    self-connection) while nothing listened, and Kafka could not start again for minutes."""
    option = f"--{name.replace(' ', '-')}-port"
    said = (f"port {port} ({name}) on {host} is already in use by another process: stop it, "
            f"or pick another port with `cdc-router local up {option} N`")
    ranges = ranges or EPHEMERAL_RANGE
    try:
        low, high = (int(bound) for bound in ranges.read_text().split())
    except (OSError, ValueError):
        return said
    if not low <= port <= high:
        return said
    return (f"{said}; {port} lies in Linux's ephemeral range ({low}-{high}, {ranges}), where a "
            "client reconnecting to a stopped part (Kafka's own clients, the router's) can be "
            "given that port as its own, a self-connection (`ss -tanp` shows it connected to "
            f"itself) while nothing listens: pick a port below {low}")


def spawn(command: Sequence[str], *, log_path: Path, pid_path: Path,
          env: Mapping[str, str] | None = None, user: str | None = None,
          cwd: Path | None = None) -> int:
    """Start a detached process whose output appends to `log_path`; record its pid."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None, cwd=cwd, **as_user(user),
            # Its own session: a Ctrl-C in the shell that ran `up` must not stop the stack.
            start_new_session=True,
        )
    try:
        pid_path.write_text(f"{process.pid}\n")
    except OSError:
        # Unrecorded, `local down` could never stop it and the next `up` would find its port
        # taken (review 48-b F3: a full disk left a running Postgres with an empty pid file).
        process.kill()
        process.wait()
        raise
    # Right after exec the kernel shows an empty command line for a moment; is_running()
    # reads it, so wait until the new program's arguments are visible.
    deadline = time.monotonic() + 5
    cmdline = Path(f"/proc/{process.pid}/cmdline")
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if cmdline.read_bytes():
                break
        except OSError:
            break
        time.sleep(0.005)
    return process.pid


def as_user(user: str | None) -> dict[str, Any]:
    """Popen arguments that run a child as `user` with that user's own group and no others:
    keeping root's groups would make root-group directories deny it (group bits win)."""
    if user is None:
        return {}
    return {"user": user, "group": user, "extra_groups": []}


# The user agent of `up`'s own health polls (urllib): the access lines they leave in Connect's
# and the registry's logs say nothing of why a part failed (review 48-b F11: a tail of only them).
_OUR_POLLS = "Python-urllib/"


def tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of a part's log, without the access lines of our health polls."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join([line for line in text if _OUR_POLLS not in line][-lines:])


def wait_until(check: Callable[[], bool], *, name: str, timeout_s: float, pid: int,
               marker: str, log_path: Path) -> float:
    """Poll `check` until true; fail with the log's last lines if the process dies or times out."""
    started = time.monotonic()
    while True:
        if check():
            return time.monotonic() - started
        if not is_running(pid, marker):
            raise StackError(f"{name} exited during start-up (log {log_path}):\n{tail(log_path)}")
        if time.monotonic() - started > timeout_s:
            raise StackError(f"{name} did not become healthy within {timeout_s:.0f}s "
                             f"(log {log_path}):\n{tail(log_path)}")
        time.sleep(0.5)


# SIGKILL takes effect as soon as the process leaves the kernel; one that is still there
# after this long is stuck in uninterruptible sleep (state D), and waiting longer won't help.
_KILL_WAIT_S = 10.0


def stop(pid: int, marker: str, *, sig: signal.Signals = signal.SIGTERM,
         timeout_s: float = 30.0) -> bool:
    """Signal `pid`, wait for it to exit, SIGKILL after `timeout_s`; False if it was not ours.

    StackError if it outlives SIGKILL by _KILL_WAIT_S."""
    if not is_running(pid, marker):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return True  # it exited since is_running looked: stopped, as asked
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_running(pid, marker):
            return True
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + _KILL_WAIT_S
    while is_running(pid, marker):
        if time.monotonic() > deadline:
            raise StackError(f"pid {pid} did not exit within {_KILL_WAIT_S:.0f}s of SIGKILL "
                             f"(stuck in the kernel? `ps -o pid,stat,wchan -p {pid}`): end it "
                             "or reboot, then run `cdc-router local down` again")
        time.sleep(0.1)
    return True


def check_java() -> None:
    """StackError unless a Java 17 or newer is on the PATH (Kafka 4, Connect, the registry)."""
    java = shutil.which("java")
    if java is None:
        raise StackError("java is not installed; Kafka and Connect need Java 17 or newer: "
                         "run `apt-get install -y openjdk-17-jre-headless`")
    result = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    first = (result.stderr or result.stdout).splitlines()[:1]
    version = first[0].split('"')[1] if first and '"' in first[0] else "?"
    major = version.split(".")[0]
    if not major.isdigit() or int(major) < 17:
        raise StackError(f"java {version} is too old: Kafka 4 needs Java 17 or newer")
