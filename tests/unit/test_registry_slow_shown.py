"""Where a slow registry lookup is said (reread 55-r F-4): the router and the relay log
event=registry_slow; a one-shot command, which sets up no logging, said it through Python's
last resort as that bare line, with a hint about batches. It now shows its own `warning:` line,
and `status` none: its registry section is its word on the registry."""

from __future__ import annotations

import logging
import sys
import types
from typing import Any

import click
import pytest
from click.testing import CliRunner
from confluent_kafka.schema_registry import SchemaRegistryClient

from cdc_router import cli
from cdc_router.ops.registry import registry_state
from cdc_router.serde import registry_answers
from cdc_router.serde.registry_answers import SlowLookups
from tests.unit.test_status_registry import _config

URL = "http://user:secret@registry:8081"
SHOWN = ("warning: the schema registry at http://user:*****@registry:8081 took 3.0 s to list the "
         "subjects; check its load and the network to it")


def _slow_command(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """`cdc-router <name>` becomes a command whose one registry lookup takes 3 s."""
    now = [0.0]

    def lookup() -> str:
        now[0] += 3.0
        return "subjects"

    @click.command()
    def command() -> None:
        SlowLookups(lambda: now[0]).timed(URL, "list the subjects", lookup)
        click.echo("done")

    module = types.ModuleType("slow_registry_command")
    module.cli = command  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(cli.COMMAND_MODULES, name, module.__name__)


@pytest.mark.parametrize("name", ["schemas", "rules", "dlq"])
def test_a_one_shot_command_shows_a_slow_lookup_as_its_own_warning_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str) -> None:
    _slow_command(monkeypatch, name)
    with caplog.at_level(logging.WARNING):
        result = CliRunner().invoke(cli.main, [name])
    assert result.exit_code == 0, result.output
    assert result.stdout == "done\n"
    assert result.stderr == SHOWN + "\n"
    assert "event=registry_slow" not in caplog.text and "secret" not in result.output
    assert not registry_answers.log.filters  # undone with the command


def test_the_router_still_logs_event_registry_slow(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _slow_command(monkeypatch, "run")
    with caplog.at_level(logging.WARNING):
        result = CliRunner().invoke(cli.main, ["run"])
    assert result.exit_code == 0, result.output
    assert "warning:" not in result.stderr
    assert "event=registry_slow url=http://user:*****@registry:8081 seconds=3.0" in caplog.text


def test_status_says_nothing_of_a_slow_lookup_beside_its_registry_section(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(registry_answers, "SLOW_LOOKUP_S", 0.0)  # every lookup counts as slow
    monkeypatch.setattr("cdc_router.serde.registry.SLOW", SlowLookups())
    client: Any = SchemaRegistryClient.new_client({"url": "mock://slow"})
    with caplog.at_level(logging.WARNING):
        state = registry_state(_config("mock://slow"), client=client)
    assert state is not None and state.answered and state.subjects == 0
    assert "registry_slow" not in caplog.text
    assert capsys.readouterr().err == ""
    assert not registry_answers.log.filters
