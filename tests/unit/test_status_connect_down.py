"""`status` with Kafka Connect down (QA 57-b F-6): the publication, in Postgres, which answered,
was named in the critical line "publication, connector: cannot check it"; it is not checked
(its name is in the connector's config), said on its own line, and not critical."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from cdc_router.cli._status_text import as_text
from cdc_router.config.model import RouterConfig
from cdc_router.ops import probe
from cdc_router.ops.exporter import StatusCollector
from cdc_router.ops.report import ConnectorState, OutboxState, PublicationState, WalState
from cdc_router.ops.verdict import judge

DOWN = "Kafka Connect unreachable at http://127.0.0.1:1: [Errno 111] Connection refused"


def test_connect_down_leaves_the_publication_unchecked_and_not_critical(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "probe_connector", lambda url, name: (
        ConnectorState(name=name, error=DOWN), None))
    monkeypatch.setattr(probe, "probe_database", lambda *args, **kwargs: (
        WalState(answered=True), PublicationState(answered=False),
        OutboxState(table="public.outbox", rows=0, answered=True)))
    monkeypatch.setattr(probe, "admin_client", lambda conf: None)
    monkeypatch.setattr(probe, "_kafka_down", lambda admin: None)
    monkeypatch.setattr(probe, "_kafka", lambda read, failed, grants: failed("not asked"))
    config = RouterConfig.model_validate({"source": {"topics": ["raw"]},
                                          "routes": [{"topic": "out"}]})
    report = probe.check(config, probe.Endpoints("postgresql://x", "http://127.0.0.1:1", {}))
    assert report.publication.error is None and report.publication.name is None
    critical = [str(problem) for problem in judge(report, config.status)
                if problem.level == "critical" and DOWN in str(problem)]
    assert critical == [f"critical: connector: cannot check it: {DOWN}"]
    text: Any = as_text(report, judge(report, config.status))
    assert "publication: not checked (the connector's config names it, and Kafka Connect did " \
           "not give it: see the connector line)" in str(text)
    # review 57-b F-8: the exporter said the publication was checked (status_checked 1).
    collector, registry = StatusCollector(), CollectorRegistry()
    registry.register(collector)
    collector.update(report, judge(report, config.status))
    assert registry.get_sample_value("cdc_router_status_checked", {"part": "publication"}) == 0
    assert registry.get_sample_value("cdc_router_status_checked", {"part": "wal"}) == 1


@pytest.mark.parametrize("relay_alone", [True, False])
def test_kafka_down_leaves_out_the_parts_the_config_does_not_have(
        monkeypatch: pytest.MonkeyPatch, relay_alone: bool) -> None:
    # QA 61-a F-4: a relay-only config with dedup disabled, Kafka down, listed a changelog it
    # disables and a router group it does not have as NOT CHECKED, critical.
    kafka_down = "Kafka unreachable: _TRANSPORT"
    monkeypatch.setattr(probe, "probe_connector", lambda url, name: (
        ConnectorState(name=name, exists=True, state="RUNNING"), None))
    monkeypatch.setattr(probe, "probe_database", lambda *args, **kwargs: (
        WalState(answered=True), PublicationState(answered=False),
        OutboxState(table="public.outbox", rows=0, answered=True)))
    monkeypatch.setattr(probe, "admin_client", lambda conf: None)
    monkeypatch.setattr(probe, "_kafka_down", lambda admin: kafka_down)
    config = RouterConfig.model_validate({
        "source": {"group_id": "shop", "topics": [] if relay_alone else ["raw"]},
        "routes": [{"topic": "out"}], "dedup": {"enabled": False},
        "dead_letter": {"topic": "shop-dlq"}, "relay": {"table": "public.outbox"}})
    report = probe.check(config, probe.Endpoints("postgresql://x", "http://127.0.0.1:1", {}))
    text = str(as_text(report, judge(report, config.status)))
    assert "dedup changelog: disabled (dedup.enabled false)" in text
    assert "dedup changelog cdc-router.dedup" not in text
    critical = [str(problem) for problem in judge(report, config.status)
                if problem.level == "critical"]
    if relay_alone:
        assert "router group shop: no raw topic (a relay-only config" in text
        assert critical == [f"critical: dead_letters: cannot check it: {kafka_down} "
                            f"(bootstrap servers {config.kafka.bootstrap_servers})"]
    else:
        assert "router group shop: NOT CHECKED" in text
        assert critical == [f"critical: router, dead_letters: cannot check it: {kafka_down} "
                            f"(bootstrap servers {config.kafka.bootstrap_servers})"]
