"""`status`'s schema registry section (QA 55-c F-1: with the registry killed, `status` said ok
while the router's next start would exit 75 in a loop)."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from typing import Any

import yaml
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError
from prometheus_client import CollectorRegistry

from cdc_router.cli._status_text import as_json, as_text
from cdc_router.config.model import RouterConfig
from cdc_router.ops.exporter import StatusCollector
from cdc_router.ops.registry import registry_state
from cdc_router.ops.report import RegistryState
from cdc_router.ops.verdict import judge, verdict
from tests.unit.test_status_verdict import SETTINGS, healthy

MockRegistry: Any = type(SchemaRegistryClient.new_client({"url": "mock://class"}))


def _config(url: str | None) -> RouterConfig:
    document = yaml.safe_load("""
        source: {topics: [outbox.public.outbox]}
        routes: [{topic: orders}]
        """)
    if url is not None:
        document["schema_registry"] = {"url": url}
    return RouterConfig.model_validate(document)


def _free_port() -> int:
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        return int(closed.getsockname()[1])


def test_no_registry_in_the_config_no_section() -> None:
    assert registry_state(_config(None)) is None
    assert "registry" not in as_json(healthy(), [])
    assert "schema registry" not in as_text(healthy(), [])


def test_a_registry_that_answers_is_shown_and_no_problem() -> None:
    client = SchemaRegistryClient.new_client({"url": "mock://status"})
    state = registry_state(_config("mock://status"), client=client)
    assert state == RegistryState(answered=True, url="mock://status", subjects=0)
    report = replace(healthy(), registry=state)
    assert verdict(judge(report, SETTINGS)) == "ok"
    assert "schema registry mock://status: answers, 0 subjects" in as_text(report, [])
    assert json.loads(json.dumps(as_json(report, [])))["registry"] == {
        "error": None, "answered": True, "url": "mock://status", "subjects": 0, "lacking": []}


def test_a_registry_down_is_critical_and_says_the_next_start_exits_75() -> None:
    port = _free_port()
    url = f"http://user:secret@127.0.0.1:{port}"
    state = registry_state(_config(url), timeout_s=1.0)
    assert state is not None and state.error is not None and not state.answered
    shown = f"http://user:*****@127.0.0.1:{port}"
    assert state.url == shown and "secret" not in state.error
    assert f"the schema registry at {shown} did not answer" in state.error
    assert "next start exits 75" in state.error
    report = replace(healthy(), registry=state)
    problems = judge(report, SETTINGS)
    assert verdict(problems) == "critical"
    assert [str(p) for p in problems] == [f"critical: registry: cannot check it: {state.error}"]
    assert f"schema registry {shown}: NOT CHECKED: " in as_text(report, problems)
    document = json.loads(json.dumps(as_json(report, problems)))
    assert document["registry"]["answered"] is False and document["status"] == "critical"


def test_a_registry_that_refuses_us_answered_and_is_critical() -> None:
    class Refusing(MockRegistry):  # type: ignore[misc,valid-type]
        def get_subjects(self, *args: Any, **kwargs: Any) -> Any:
            raise ClientError(401, 40101, "Unauthorized")

    state = registry_state(_config("mock://refusing"),
                           client=Refusing({"url": "mock://refusing"}))
    assert state is not None and state.answered and state.error is not None
    assert "refused the credentials" in state.error and "exits 75" not in state.error
    assert verdict(judge(replace(healthy(), registry=state), SETTINGS)) == "critical"


def test_the_exporter_says_whether_the_registry_answered() -> None:
    collector = StatusCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    down = replace(healthy(), registry=RegistryState(error="down", url="http://r"))
    collector.update(down, judge(down, SETTINGS))
    assert registry.get_sample_value("cdc_router_status_up", {"part": "registry"}) == 0
    up = replace(healthy(), registry=RegistryState(answered=True, url="http://r", subjects=3))
    collector.update(up, judge(up, SETTINGS))
    assert registry.get_sample_value("cdc_router_status_up", {"part": "registry"}) == 1
    collector.update(healthy(), judge(healthy(), SETTINGS))
    assert registry.get_sample_value("cdc_router_status_up", {"part": "registry"}) is None
