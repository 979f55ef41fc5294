"""SIGHUP in every long-running process is logged and ignored (signals.py; QA 54-a F-3,
review 54-k F-2: `status --serve/--watch`, `dedup purge --every` and the consumer example
died on it with no line, and `run` did too during its start)."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from cdc_router.cli import dedup, status
from cdc_router.cli.run import cli as run_cli
from cdc_router.examples import fulfillment

EXAMPLE = Path(__file__).resolve().parents[2] / "cdc_router" / "examples" / "router.yaml"


@pytest.fixture(autouse=True)
def _signals_restored() -> Iterator[None]:
    saved = {number: signal.getsignal(number)
             for number in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)


def _refuses(caplog: pytest.LogCaptureFixture, handler: Any) -> None:
    """`handler` is SIGHUP's, and it logs sighup_ignored (called, not sent: the old default
    would end the test run)."""
    assert callable(handler), handler
    with caplog.at_level(logging.WARNING):
        handler(signal.SIGHUP, None)
    assert "event=sighup_ignored" in caplog.text and "reloads nothing" in caplog.text


def test_run_refuses_a_reload_from_its_start(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    # Its config is not read yet (here: none at all), and SIGHUP is already taken.
    result = CliRunner().invoke(run_cli, ["-c", str(tmp_path / "missing.yaml"),
                                          "--metrics-port", "0"])
    assert result.exit_code != 0
    _refuses(caplog, signal.getsignal(signal.SIGHUP))


def test_a_watching_status_refuses_a_reload(monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    seen: list[Any] = []

    class Checks:
        def __init__(self, check: Callable[..., Any]) -> None:
            pass

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            seen.append(signal.getsignal(signal.SIGHUP))
            raise KeyboardInterrupt  # the watch's Ctrl-C

        def close(self) -> None:
            pass

    monkeypatch.setattr(status, "IsolatedChecks", Checks)
    result = CliRunner().invoke(status.cli, ["-c", str(EXAMPLE), "--watch", "5"])
    assert result.exit_code == 0 and seen, result.output
    _refuses(caplog, seen[0])


def test_a_repeating_dedup_purge_refuses_a_reload(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(dedup, "run_purge_loop",
                        lambda *args, **kwargs: seen.append(signal.getsignal(signal.SIGHUP)))
    dedup._purge_forever(SimpleNamespace(), (timedelta(days=1), "1d"),  # type: ignore[arg-type]
                         (timedelta(hours=1), "1h"), 100, None)
    _refuses(caplog, seen[0])


def test_the_consumer_example_refuses_a_reload(monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    seen: list[Any] = []

    class Consumer:
        stats = SimpleNamespace(processed=0, duplicates=0, dead_lettered=0, retries=0)

        def run(self) -> None:
            seen.append(signal.getsignal(signal.SIGHUP))

        def stop(self) -> None:
            pass

    monkeypatch.setattr(fulfillment, "build", lambda args: Consumer())
    fulfillment.main(["--bootstrap", "127.0.0.1:1", "--dsn", "postgresql://x/y",
                      "--topic", "payments"])
    _refuses(caplog, seen[0])


def test_a_stop_signal_before_the_process_exists_is_held_and_a_second_one_ends_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Fixer 63, item 7: a SIGTERM in the relay's first seconds (imports, start checks) met the
    # default action: exit -15, no line.
    from cdc_router import signals

    monkeypatch.setattr(signals, "_held", [])
    signals.hold_stop_signals()
    held = signal.getsignal(signal.SIGTERM)
    assert callable(held) and signal.getsignal(signal.SIGINT) is held
    assert signals.stopped_early() is None
    held(signal.SIGTERM, None)  # called, not sent: the default would end the test run
    assert signals.stopped_early() == "SIGTERM"
    with pytest.raises(SystemExit) as ended:
        held(signal.SIGINT, None)
    assert ended.value.code == 128 + signal.SIGINT


def test_a_stop_held_during_the_start_ends_the_command_before_its_process_runs(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from cdc_router import signals
    from cdc_router.cli.run import run_until_stopped

    monkeypatch.setattr(signals, "_held", [signal.SIGTERM])
    process, cleaner = SimpleNamespace(run=lambda: pytest.fail("started")), SimpleNamespace(
        stopped=False)
    cleaner.stop = lambda: setattr(cleaner, "stopped", True)  # type: ignore[attr-defined]
    with caplog.at_level(logging.INFO):
        run_until_stopped(process, cleaner, None, 0, "relay", None)  # type: ignore[arg-type]
    assert "event=stopped_before_start signal=SIGTERM" in caplog.text and cleaner.stopped
