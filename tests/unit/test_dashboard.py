"""docker/monitoring: the Grafana dashboard and the alert rules name only metrics that exist,
and the compose profile `monitoring` wires Prometheus and Grafana to them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from cdc_router.ops.exporter import StatusCollector
from cdc_router.ops.verdict import judge
from cdc_router.router.metrics import RouterMetrics, cleanup_metrics
from tests.unit.compose_drift import load_compose, mounts
from tests.unit.test_status_verdict import SETTINGS, healthy

MONITORING = Path(__file__).resolve().parents[2] / "docker" / "monitoring"
DASHBOARD = MONITORING / "grafana" / "cdc-router.json"
_METRIC = re.compile(r"\bcdc_router_[a-z_]+")


def known_metrics() -> set[str]:
    """Every series name the router's /metrics and the status exporter can expose."""
    collector = StatusCollector()
    collector.update(healthy(), judge(healthy(), SETTINGS))
    router = RouterMetrics()
    cleanup_metrics(router.registry)  # the cleanup's, on the router's registry (cli/run.py)
    families = [*router.registry.collect(), *collector.collect()]
    return {family.name + suffix for family in families
            for suffix in ("", "_total", "_bucket", "_count", "_sum")}


def test_the_dashboard_is_a_grafana_dashboard_over_known_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "cdc-router" and dashboard["schemaVersion"] >= 36
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    used = set()
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}, panel["title"]
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys()
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used |= set(_METRIC.findall(target["expr"]))
    assert used - known_metrics() == set()
    # Every gauge of the exporter is on the dashboard, and the router's lag and commit age.
    assert {"cdc_router_slot_retained_wal_bytes", "cdc_router_connector_state",
            "cdc_router_outbox_rows", "cdc_router_group_lag", "cdc_router_dlq_records",
            "cdc_router_dlq_topic_records", "cdc_router_consumer_lag",
            "cdc_router_last_commit_age_seconds"} <= used


def test_the_alert_rules_use_known_metrics() -> None:
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"][0]["rules"]
    used = {name for rule in rules for name in _METRIC.findall(rule["expr"])}
    assert used and used - known_metrics() == set()


def test_the_monitoring_profile_wires_prometheus_and_grafana() -> None:
    services = load_compose()["services"]
    profile = {name for name, service in services.items()
               if "monitoring" in service.get("profiles", [])}
    assert profile == {"status-exporter", "prometheus", "grafana"}
    assert services["status-exporter"]["command"][:2] == ["status", "-c"]
    assert "--serve" in services["status-exporter"]["command"]
    scrape = yaml.safe_load((MONITORING / "prometheus.yml").read_text())["scrape_configs"]
    targets = {target for job in scrape for c in job["static_configs"] for target in c["targets"]}
    assert targets == {"router:9102", "status-exporter:9103"}
    docker = MONITORING.parent
    for service in ("prometheus", "grafana"):
        for host in mounts(services[service]).values():
            assert (docker / host).resolve().exists(), host
    datasources = yaml.safe_load((MONITORING / "grafana" / "datasources.yml").read_text())
    assert datasources["datasources"][0]["uid"] == "prometheus"


def test_the_group_s_commit_age_panel_shows_its_stalest_partition() -> None:
    # QA 54-b F-7: `min by (group)` showed the freshest partition: one frozen partition was
    # hidden by any that committed (status and the stall alert judge partition by partition).
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [" ".join(target["expr"].split()) for panel in dashboard["panels"]
             for target in panel.get("targets", ())]
    ages = [expr for expr in exprs if "cdc_router_group_last_commit_age_seconds" in expr]
    assert ages and all(not expr.startswith("min") for expr in ages), ages
