"""A route's subject deleted in the registry (QA 66-a F-2, F-3): the router's start says the
subject has no version, not that the .avsc changed; `status` checks each route subject known
before any event and says critical, as that start would stop."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import yaml
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

from cdc_router.cli._status_text import as_text
from cdc_router.config.model import RouterConfig
from cdc_router.errors import RegistryError
from cdc_router.ops.registry import registry_state
from cdc_router.ops.verdict import judge, verdict
from cdc_router.serde.avro import AvroSerializer
from cdc_router.serde.avro_schema import load_schema
from cdc_router.serde.registry import registry_schema
from tests.unit.test_avro import PAYMENT, MockRegistry, registry
from tests.unit.test_status_verdict import SETTINGS, healthy


class Deleted(MockRegistry):  # type: ignore[misc,valid-type]
    """Apicurio after a soft delete of every subject: a lookup answers 40403 (Confluent's
    "schema not found"), the subject's latest 40401."""

    def lookup_schema(self, *args: Any, **kwargs: Any) -> Any:
        raise ClientError(404, 40403, "The given schema does not match any schema under "
                                      "the subject payments-value")

    def get_latest_version(self, *args: Any, **kwargs: Any) -> Any:
        raise ClientError(404, 40401, "Subject not found")


def _config(**registry_settings: Any) -> RouterConfig:
    document = yaml.safe_load(f"""
        source: {{topics: [outbox.public.outbox]}}
        routes:
          - {{match: {{type: PaymentConfirmed}}, topic: payments, format: avro, schema: {PAYMENT}}}
          - {{match: {{type: "Refund*"}}, topic: "x.{{aggregate_type}}", format: avro,
             schema: {PAYMENT}}}
          - {{topic: events}}
        """)
    document["schema_registry"] = {"url": "mock://deleted", **registry_settings}
    return RouterConfig.model_validate(document)


def test_a_start_after_the_subject_was_deleted_says_it_has_no_version() -> None:
    serializer = AvroSerializer(_config().routes, registry(),
                                registry_client=Deleted({"url": "mock://deleted"}))
    with pytest.raises(RegistryError) as raised:
        serializer.preflight()
    text = str(raised.value)
    assert "subject 'payments-value' has no version in the registry" in text
    assert "deleted" in text and "cdc-router schemas register" in text
    assert "registered versions" not in text and raised.value.missing


def test_a_subject_holding_other_versions_still_blames_the_avsc() -> None:
    client = MockRegistry({"url": "mock://other"})
    client.register_schema("payments-value", registry_schema_of({"type": "record", "name": "P",
                                                                   "fields": []}))
    serializer = AvroSerializer(_config().routes, registry(), registry_client=client)
    with pytest.raises(RegistryError) as raised:
        serializer.preflight()
    assert "has no version" not in str(raised.value) and raised.value.missing


def registry_schema_of(document: dict[str, Any]) -> Schema:
    return Schema(json.dumps(document), "AVRO")


def test_status_is_critical_for_a_route_subject_without_its_schema() -> None:
    state = registry_state(_config(), client=Deleted({"url": "mock://deleted"}))
    assert state is not None and state.error is None and state.answered
    assert len(state.lacking) == 1  # the data-named subject of routes[1] cannot be checked
    line = state.lacking[0]
    assert line.startswith("routes[0]: subject 'payments-value' has no version")
    assert "cdc-router schemas register" in line and "next start exits 1" in line
    report = replace(healthy(), registry=state)
    problems = judge(report, SETTINGS)
    assert verdict(problems) == "critical"
    assert f"critical: registry: {line}" in [str(p) for p in problems]
    assert "subjects, 1 route subjects lack their schema" in as_text(report, problems)


def test_status_is_ok_once_the_subject_holds_the_schema_again() -> None:
    client = MockRegistry({"url": "mock://again"})
    client.register_schema("payments-value", registry_schema(load_schema(str(PAYMENT))))
    state = registry_state(_config(), client=client)
    assert state is not None and state.lacking == ()
    assert verdict(judge(replace(healthy(), registry=state), SETTINGS)) == "ok"


def test_status_with_auto_register_finds_nothing_lacking() -> None:
    state = registry_state(_config(auto_register=True),
                           client=Deleted({"url": "mock://deleted"}))
    assert state is not None and state.lacking == ()
