"""A watching `status` runs each check in a worker process: a crash costs that check only."""

from __future__ import annotations

import os
import signal

import pytest

from cdc_router.ops.isolated import CRASHED, HUNG, IsolatedChecks


def check(value: int, *, crash: bool = False) -> int:
    if crash:
        os.kill(os.getpid(), signal.SIGSEGV)  # as librdkafka did (QA, session 28)
    if value < 0:
        raise ValueError(f"no check of {value}")
    return value


def test_a_crashed_check_is_a_reason_and_the_next_check_gets_a_new_worker() -> None:
    checks = IsolatedChecks(check)
    try:
        assert checks(1) == 1
        assert checks(2, crash=True) == CRASHED
        assert checks(3) == 3
        with pytest.raises(ValueError, match="no check of -1"):
            checks(-1)  # a failure of the check is raised, not taken for a crash
        assert checks(4) == 4
    finally:
        checks.close()


def test_a_single_status_whose_check_crashed_exits_3_cannot_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 33-a: a one-shot status segfaulted (exit 139) as the broker stopped; probes read its
    # exit code as the verdict (0 to 3).
    from pathlib import Path

    from click.testing import CliRunner

    from cdc_router.cli import main
    from cdc_router.cli import status as status_command

    class Crashing:
        def __init__(self, check: object) -> None:
            pass

        def __call__(self, *args: object, **kwargs: object) -> str:
            return CRASHED

        def close(self) -> None:
            pass

    monkeypatch.setattr(status_command, "IsolatedChecks", Crashing)
    example = Path(__file__).parents[2] / "cdc_router" / "examples" / "router.yaml"
    result = CliRunner().invoke(main, ["status", "-c", str(example)])
    assert result.exit_code == 3, result.output
    assert "the check's process died (librdkafka can crash when Kafka restarts during a " \
           "check): run it again" in result.output

    class Interrupted(Crashing):  # review 33-3: Ctrl-C during a single check exited 0, "ok"
        def __call__(self, *args: object, **kwargs: object) -> str:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_command, "IsolatedChecks", Interrupted)
    assert CliRunner().invoke(main, ["status", "-c", str(example)]).exit_code == 3


def stuck(seconds: float) -> float:
    import time
    time.sleep(seconds)
    return seconds


def test_a_check_past_its_deadline_is_ended_and_the_next_one_gets_a_new_worker() -> None:
    # Review 49-b F1: a lock on the outbox held the check, and --watch/--serve with it, for as
    # long as the lock lasted; the exporter kept the previous check's gauges meanwhile.
    # A deadline a spawned worker meets on a loaded machine too (1 s failed at load 15: its
    # start, imports included, is inside the deadline).
    checks = IsolatedChecks(stuck, deadline_s=8)
    try:
        assert checks(60) == HUNG
        assert checks(0) == 0
    finally:
        checks.close()


def test_an_exporter_whose_check_gave_no_report_says_critical_and_every_part_down() -> None:
    from cdc_router.ops.exporter import StatusCollector
    from cdc_router.ops.report import SECTIONS

    collector = StatusCollector()
    assert list(collector.collect()) == []  # nothing checked yet: nothing to say
    collector.failed()
    families = {family.name: family for family in collector.collect()}
    assert [s.value for s in families["cdc_router_status"].samples] == [2]
    assert {s.labels["part"]: s.value for s in families["cdc_router_status_up"].samples} == \
        dict.fromkeys(SECTIONS, 0)
    assert "cdc_router_status_reported_timestamp_seconds" not in families


def stops_itself() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)  # a frozen cgroup, a debugger: SIGTERM stays pending


def test_a_stopped_check_past_its_deadline_is_killed_not_waited_for() -> None:
    # QA 49-h F1: terminate() left SIGTERM pending on a stopped child and join() waited for
    # ever: the exporter kept the previous check's gauges.
    checks = IsolatedChecks(stops_itself, deadline_s=1)
    try:
        assert checks() == HUNG
    finally:
        checks.close()
