"""A route's subject deleted in the stack's registry (Apicurio's Confluent API; QA 66-a F-2,
F-3): `status`'s registry section says critical with the subject, the route and what to do,
and the router's start says the subject has no version; after `schemas register`, ok."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka.schema_registry import SchemaRegistryClient

from cdc_router.config.model import RouterConfig
from cdc_router.errors import RegistryError
from cdc_router.ops.registry import registry_state
from cdc_router.ops.report import Report
from cdc_router.ops.verdict import judge, verdict
from cdc_router.serde.avro import AvroSerializer
from tests.integration.pipeline import REPO
from tests.unit.test_status_verdict import SETTINGS

pytestmark = pytest.mark.integration

SCHEMA = Path(__file__).parents[1] / "unit" / "fixtures" / "avro" / "payment_confirmed.avsc"


def _register(config: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "cdc_router", "schemas", "register", "-c",
                           str(config), "--yes"], cwd=REPO, capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _lacking(config: RouterConfig) -> tuple[str, ...]:
    state = registry_state(config)
    assert state is not None and state.error is None, state
    report = Report(checked_at="2026-12-07T00:00:00+00:00", registry=state)
    problems = [str(p) for p in judge(report, SETTINGS) if p.component == "registry"]
    assert problems == [f"critical: registry: {line}" for line in state.lacking]
    if state.lacking:
        assert verdict(judge(report, SETTINGS)) == "critical"
    return state.lacking


@pytest.mark.parametrize("hard", [False, True], ids=["soft", "hard"])
def test_a_deleted_route_subject_is_critical_in_status_until_registered_again(
        registry_url: str, tmp_path: Path, hard: bool) -> None:
    topic = f"fx66del{uuid.uuid4().hex[:10]}"  # the stack's registry outlives each run
    subject = f"{topic}-value"
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({
        "source": {"topics": ["raw"]}, "schema_registry": {"url": registry_url},
        "routes": [{"topic": topic, "format": "avro", "schema": str(SCHEMA)}]}))
    config = RouterConfig.model_validate(yaml.safe_load(path.read_text()))
    _register(path)
    assert _lacking(config) == ()

    client = SchemaRegistryClient({"url": registry_url})
    client.delete_subject(subject)
    if hard:
        client.delete_subject(subject, permanent=True)
    lacking = _lacking(config)
    assert len(lacking) == 1, lacking
    assert lacking[0].startswith(f"routes[0]: subject '{subject}' has no version in the "
                                 "registry (never registered, or deleted)"), lacking
    assert "cdc-router schemas register" in lacking[0]
    with pytest.raises(RegistryError, match=f"subject '{subject}' has no version"):
        AvroSerializer(config.routes, config.schema_registry).preflight()

    _register(path)
    assert _lacking(config) == ()
    AvroSerializer(config.routes, config.schema_registry).preflight()
