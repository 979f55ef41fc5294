"""cdc_router_info on the router's, the relay's and `status --serve`'s /metrics: which pipeline
and process a scrape target is (QA 63-b L-1: two routers exported the same
cdc_router_consumer_lag{topic,partition}, told apart only by their scrape targets)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest

from cdc_router import __version__
from cdc_router.cli import main
from cdc_router.config.load import load_config
from cdc_router.ops import exporter
from cdc_router.ops.exporter import StatusCollector
from cdc_router.router.metrics import RouterMetrics
from cdc_router.router.process_info import process_info

ROUTER = ("source: {topics: [orders.public.outbox], group_id: team-orders}\n"
          "routes:\n  - topic: orders\n")
RELAY = ("source: {group_id: team-shipping}\nroutes:\n  - topic: shipments\n"
         "relay: {table: outbox, dsn: 'postgresql://u@127.0.0.1:1/db'}\n")


def info_line(registry: CollectorRegistry) -> str:
    lines = [line for line in generate_latest(registry).decode().splitlines()
             if line.startswith("cdc_router_info")]
    assert len(lines) == 1, lines
    return lines[0]


def started(monkeypatch: pytest.MonkeyPatch, command: str,
            *stubbed: str) -> list[RouterMetrics]:
    """Where the RouterMetrics `command` (cli.run or cli.relay) hands its process will be;
    `stubbed`: the command module's names that would reach Postgres or Kafka, made to do
    nothing."""
    module = __import__(f"cdc_router.cli.{command}", fromlist=["cli"])
    handed: list[RouterMetrics] = []

    def run_until_stopped(process: Any, cleaner: Any, metrics: RouterMetrics,
                          *args: Any, **kwargs: Any) -> None:
        handed.append(metrics)

    monkeypatch.setattr(module, "run_until_stopped", run_until_stopped)
    for name in stubbed:
        monkeypatch.setattr(module, name, lambda *args, **kwargs: None)
    return handed


@pytest.mark.parametrize("command, config, stubbed, expected", [
    # No label named `instance`: Prometheus gives every series its scrape target's.
    ("run", ROUTER, ("OutboxRouter",),
     'group="team-orders",instance_id="host-1",process="router",topics="orders.public.outbox",'
     'transactional_id="team-orders-host-1"'),
    # The relay's transactional id is its table's, shared by its standbys.
    ("relay", RELAY, ("OutboxRelay", "check_cleanup_database", "check_table", "check_cleanup"),
     'group="team-shipping",instance_id="host-1",process="relay",table="public.outbox",'
     'transactional_id="team-shipping-relay-public.outbox"')])
def test_the_processs_metrics_name_its_pipeline_instance_and_transactional_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, config: str,
        stubbed: tuple[str, ...], expected: str) -> None:
    handed = started(monkeypatch, command, *stubbed)
    (tmp_path / "router.yaml").write_text(config, "utf-8")
    ran = CliRunner().invoke(main, [command, "-c", str(tmp_path / "router.yaml"),
                                    "--instance-id", "host-1", "--metrics-port", "0"])
    assert ran.exit_code == 0, ran.output
    assert info_line(handed[0].registry) == \
        f'cdc_router_info{{{expected},version="{__version__}"}} 1.0'


def test_at_least_once_has_no_transactional_id_label(tmp_path: Path) -> None:
    (tmp_path / "router.yaml").write_text(
        ROUTER + "delivery: {guarantee: at_least_once}\n", "utf-8")
    config = load_config(tmp_path / "router.yaml", {}).config
    from cdc_router.router import clients

    labels = process_info(config, "router", instance_id="h",
                          transactional_id=clients.transactional_id(config, "h"))
    assert "transactional_id" not in labels and labels["group"] == "team-orders"


def test_the_status_exporter_names_its_group_and_connector(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[CollectorRegistry] = []
    monkeypatch.setattr(exporter, "start_http_server",
                        lambda port, addr, registry: served.append(registry))
    (tmp_path / "router.yaml").write_text(ROUTER, "utf-8")
    config = load_config(tmp_path / "router.yaml", {}).config
    exporter.serve(StatusCollector(), 9999, process_info(config, "status", connector="orders"))
    assert info_line(served[0]) == ('cdc_router_info{connector="orders",group="team-orders",'
                                    f'process="status",version="{__version__}"}} 1.0')


def test_a_router_metrics_made_without_info_has_none() -> None:
    # Tests and library users building RouterMetrics() directly: no cdc_router_info.
    assert "cdc_router_info" not in generate_latest(RouterMetrics().registry).decode()
