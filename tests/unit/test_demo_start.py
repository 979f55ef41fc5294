"""The demo's start: Postgres down is one line, and no sample is written before the router
polls (review 50-d F9)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.config.load import load_config
from cdc_router.errors import CdcRouterError, ConfigError
from cdc_router.local import demo
from cdc_router.router.dlq_letters import read_letter

EXAMPLE = Path(__file__).resolve().parents[2] / "cdc_router" / "examples" / "router.yaml"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_postgres_down_is_one_line_naming_where() -> None:
    port = _closed_port()
    result = CliRunner().invoke(main, ["demo", "-c", str(EXAMPLE), "--dsn",
                                       f"postgresql://u:secret@127.0.0.1:{port}/shop"])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: Postgres at 127.0.0.1:{port}/shop: connection "
                                    "failed"), result.stderr
    assert result.stderr.rstrip().endswith("check --dsn (env CDC_ROUTER_PG_DSN)")
    assert "Traceback" not in result.output and "secret" not in result.output


class _FailingRouter:
    """A router whose run() fails as one with Kafka down does, after its init."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.last_poll = 0.0

    def run(self) -> None:
        raise ConfigError("Kafka transaction step 'init' still fails")

    def stop(self) -> None:
        pass


def test_no_sample_is_written_before_the_router_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 50-d F9: with Kafka down the two samples were committed to the outbox first.
    written: list[Any] = []
    monkeypatch.setattr(demo, "OutboxRouter", _FailingRouter)
    monkeypatch.setattr(demo, "write_event", lambda *a, **k: written.append(k))
    monkeypatch.setattr(demo.psycopg, "connect", lambda *a, **k: pytest.fail("connected"))
    compiled = load_config(EXAMPLE, env={})
    with pytest.raises(CdcRouterError, match="step 'init' still fails"):
        demo.run_demo(compiled, "postgresql://", print)
    assert written == []


def _example_without(tmp_path: Path, *keys: str, **changes: Any) -> Path:
    config = yaml.safe_load(EXAMPLE.read_text())
    for key in keys:
        config.pop(key)
    config.update(changes)
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_samples_are_read_where_the_routes_send_them(tmp_path: Path) -> None:
    # Review 50-d F10: the demo subscribed to the topics under `topics:`; a config without
    # them (topics made by Terraform) was a Kafka error "Failed to set subscription".
    compiled = load_config(_example_without(tmp_path, "topics"), env={})
    samples = {f"id-{i}": event for i, event in enumerate(demo.sample_events("7"))}
    assert demo.sample_destinations(compiled, samples) == {"id-0": "orders.OrderPaid",
                                                           "id-1": "payments.confirmed"}


def test_a_sample_no_route_takes_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    routes = [{"match": {"aggregate_type": "Order"}, "topic": "orders"}]
    compiled = load_config(_example_without(tmp_path, "topics", routes=routes), env={})
    samples = {f"id-{i}": event for i, event in enumerate(demo.sample_events("7"))}
    with pytest.raises(CdcRouterError, match=r"the demo's sample PaymentConfirmed \(aggregate "
                                             r"Payment, headers \{'tenant': 'acme-eu'\}\) "
                                             "matches no route in this config"):
        demo.sample_destinations(compiled, samples)


def test_a_sample_dead_lettered_is_said_with_its_reason() -> None:
    # Review 50-d F12 (last part): the router dead-lettered a sample at once, and the demo
    # waited 60 s, then blamed the connector.
    letter = read_letter(0, 0, 0, None, None, [
        ("dlq.event.id", b"id-1"), ("dlq.stage", b"route"),
        ("dlq.error.message", b"destination topic payments.confirmed does not exist")])
    with pytest.raises(CdcRouterError) as raised:
        demo.raise_if_dead_lettered(letter, {"id-0", "id-1"})
    assert str(raised.value) == (
        "the sample event id-1 was dead-lettered (stage route): destination topic "
        "payments.confirmed does not exist; `cdc-router dlq list -c ... --newest` shows it")
    demo.raise_if_dead_lettered(letter, {"id-0"})  # another event's letter
    demo.raise_if_dead_lettered(read_letter(0, 0, 0, None, None, []), {"id-0"})
