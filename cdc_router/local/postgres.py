"""The stack's Postgres: Debian's binaries, its data and settings under the home, run as the
`postgres` user when `up` runs as root."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

from cdc_router.errors import StackError
from cdc_router.local import process
from cdc_router.local.config import StackConfig, pg_hba_conf, postgres_conf, postgres_settings


def _postgres_user() -> tuple[str | None, int | None, int | None]:
    """Postgres refuses to run as root: as root, run it as the `postgres` system user."""
    if os.geteuid() != 0:
        return None, None, None
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError as error:
        raise StackError("running as root, but there is no `postgres` user to run Postgres as: "
                         "install Debian's postgresql package (apt-get install -y postgresql)") \
            from error
    return "postgres", entry.pw_uid, entry.pw_gid


def _pg_bin(name: str) -> str:
    for directory in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (directory / name).exists():
            return str(directory / name)
    found = shutil.which(name)
    if found is None:
        raise StackError(f"PostgreSQL's {name} was not found: install Debian's postgresql "
                         "package (apt-get install -y postgresql-15)")
    return found


def _let_postgres_reach(path: Path, uid: int, gid: int) -> None:
    """Give the postgres user search (x) permission on the parents of its data, if it lacks it.

    A checkout under /root (mode 700) would otherwise stop initdb; only search is granted,
    never read, and only where needed.
    """
    for parent in reversed(path.parents):
        info = parent.stat()
        reachable = (info.st_mode & 0o001 or (info.st_uid == uid and info.st_mode & 0o100)
                     or (info.st_gid == gid and info.st_mode & 0o010))
        if not reachable:
            os.chmod(parent, info.st_mode | 0o001)


def start_postgres(config: StackConfig) -> int:
    """Initialise the data directory if new, write our settings, spawn the postmaster; its pid."""
    user, uid, gid = _postgres_user()
    base = config.part_dir("postgres")
    for directory in (base, config.postgres_socket_dir):
        directory.mkdir(parents=True, exist_ok=True)
        if uid is not None and gid is not None:
            os.chown(directory, uid, gid)
    if uid is not None and gid is not None:
        _let_postgres_reach(base, uid, gid)
    data = config.postgres_data
    log = config.log_path("postgres")
    if not (data / "PG_VERSION").exists():
        # Into a directory of its own, renamed once complete (review 48-b F18: an initdb killed
        # hard left a data directory without its `postgres` database, which PG_VERSION, written
        # first, called initialised: every later `up` waited 60 s on it and failed).
        fresh = data.with_name(data.name + ".initdb")
        shutil.rmtree(fresh, ignore_errors=True)  # a killed initdb's
        pwfile = base / ".pwfile"
        pwfile.write_text(config.postgres_password + "\n")
        if uid is not None and gid is not None:
            os.chown(pwfile, uid, gid)
        result = subprocess.run(
            [_pg_bin("initdb"), "-D", str(fresh), "-U", "postgres", "-E", "UTF8", "--locale=C",
             "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"],
            capture_output=True, text=True, check=False, cwd=base, **process.as_user(user))
        pwfile.unlink(missing_ok=True)
        if result.returncode < 0:  # QA 48-g F3: a kill was blamed on permissions
            raise StackError(f"initdb for {data} was killed (signal {-result.returncode}): "
                             "run `cdc-router local up` again, which starts it afresh")
        if result.returncode != 0:
            raise StackError(f"initdb failed for {data}: {result.stderr.strip()[-500:]}"
                             " (the postgres user needs to reach that directory)")
        if data.exists():  # an earlier version's half-made one (no PG_VERSION in it)
            shutil.rmtree(data)
        fresh.rename(data)
    (data / "cdc-router.conf").write_text(postgres_conf(config))
    (data / "pg_hba.conf").write_text(pg_hba_conf())
    main_conf = data / "postgresql.conf"
    include = "include_if_exists = 'cdc-router.conf'\n"
    if include not in main_conf.read_text():
        with open(main_conf, "a") as handle:
            handle.write(include)
    if uid is not None and gid is not None:
        for name in ("cdc-router.conf", "pg_hba.conf"):
            os.chown(data / name, uid, gid)
        # Made here, not by spawn as root: `pg_ctl restart -l <it>` as postgres appends to it
        # (QA 57-b F-3: a root-owned log made that restart fail and leave Postgres down).
        log.touch()
        os.chown(log, uid, gid)
    return process.spawn([_pg_bin("postgres"), "-D", str(data)], log_path=log,
                         pid_path=config.pid_path("postgres"), user=user, cwd=base)


def postgres_healthy(config: StackConfig) -> bool:
    """A connection with the stack's DSN answers SELECT 1."""
    import psycopg

    try:
        with psycopg.connect(config.postgres_dsn, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def postmaster_pid(config: StackConfig, saved: int | None, marker: str) -> int | None:
    """The stack's postmaster, for status, up and down: the one `up` started (`saved`) while it
    runs, else the one the data directory's postmaster.pid names (QA 55-b F-3: after a restart
    by hand with pg_ctl, `down` said "postgres was not running" and left it on the stack's
    port; 57-b F-3: status called it stale, up refused its port). Still a pid, running only if
    its command line names the stack's data directory (`marker`)."""
    if process.is_running(saved, marker):
        return saved
    return process.read_pid(config.postgres_data / "postmaster.pid") or saved


def settings_differing(config: StackConfig) -> list[str]:
    """A line for each setting of postgres_conf that the running Postgres has another value of
    (stop 58: `up` of a running stack said only "already running", and kept it): the setting,
    its value, the one `up` starts Postgres with, and how to apply it; [] when it cannot tell."""
    import psycopg

    wanted = {name: value.strip("'") for name, value in postgres_settings(config).items()}
    try:
        with psycopg.connect(config.postgres_dsn, connect_timeout=2) as conn:
            rows = conn.execute("SELECT name, current_setting(name), sourcefile FROM pg_settings "
                                "WHERE name = ANY(%s) ORDER BY name", (list(wanted),)).fetchall()
    except psycopg.Error:
        return []
    lines = []
    for name, value, sourcefile in rows:
        if value == wanted[name]:
            continue
        # ALTER SYSTEM's file is read after ours: a restart alone would keep its value.
        altered = f"`ALTER SYSTEM RESET {name}`, then " if str(sourcefile or "").endswith(
            "postgresql.auto.conf") else ""
        lines.append(f"postgres  runs with {name} = {value!r}, not {wanted[name]!r} as `local "
                     f"up` starts it: {altered}`cdc-router local down`, then `cdc-router local "
                     "up` (same --home) applies it")
    return lines


# A part killed (kill -9) is a zombie until its parent reaps it: PID 1, here within seconds.
# Postgres refuses to start while the pid in its postmaster.pid lives, and a zombie does.
REAP_WAIT_S = 10.0


def await_reaped(pid: int | None) -> None:
    """Wait for Postgres's previous postmaster `pid`, if a zombie, to be reaped: its lock file
    names that pid (review 48-b F6). Other parts need only their ports, which a zombie released (CI:
    a test's nats-server, killed and not yet reaped, failed its restart after 10 s)."""
    deadline = time.monotonic() + REAP_WAIT_S
    while pid is not None and process.exited_unreaped(pid):
        if time.monotonic() > deadline:
            raise StackError(f"the previous postgres (pid {pid}) has exited but its parent has "
                             f"not reaped it in {REAP_WAIT_S:.0f}s (`ps -o ppid= -p {pid}` "
                             "names the parent): run `cdc-router local up` again once it is "
                             "gone")
        time.sleep(0.1)
