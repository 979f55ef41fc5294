"""`schemas register`'s plan asks the registry's compatibility test (review 53-c F6): a dry run
planned `register` (exit 0) for a schema `--yes` then saw refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka.schema_registry import Schema

from cdc_router.cli import main
from cdc_router.serde import registry as registry_module
from tests.unit.test_avro_schemas import CompatibleMock


def _schema(*fields: dict[str, Any]) -> str:
    return json.dumps({"type": "record", "name": "O", "namespace": "t", "fields": list(fields)})


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CompatibleMock:
    monkeypatch.chdir(tmp_path)  # plans name schema files relative to it
    client = CompatibleMock({"url": "mock://plan"})
    client.register_schema("rv.orders-value", Schema(_schema({"name": "n", "type": "long"}),
                                                     "AVRO"))
    monkeypatch.setattr(registry_module.SchemaRegistryClient, "new_client",
                        staticmethod(lambda conf: client))
    return client


def _config(folder: Path, *fields: dict[str, Any]) -> Path:
    (folder / "order.avsc").write_text(_schema(*fields))
    path = folder / "router.yaml"
    path.write_text("source: {topics: [raw]}\nschema_registry: {url: 'mock://plan'}\nroutes:\n"
                    "  - {topic: rv.orders, format: avro, schema: order.avsc}\n", "utf-8")
    return path


def test_a_dry_run_plans_the_refusal_of_an_incompatible_schema(
        tmp_path: Path, registry: CompatibleMock) -> None:
    config = _config(tmp_path, {"name": "n", "type": "string"}, {"name": "m", "type": "int"})
    for mode in ("--dry-run", "--yes"):
        result = CliRunner().invoke(main, ["schemas", "register", "-c", str(config), mode])
        assert result.exit_code == 1, result.output
        assert result.stdout == (
            "refused   rv.orders-value <- order.avsc: incompatible (field 'n': the new type "
            "string cannot read the old type long; field 'm': added without a default, so "
            "data written with the old schema has no value for it)\n")
        assert result.stderr.startswith(f"error: {config}: the registry refuses the schema of "
                                        "rv.orders-value (order.avsc) as incompatible: nothing "
                                        "registered; ")
        assert "(a default for each new field)" in result.stderr
    assert registry.get_subjects() == ["rv.orders-value"]
    assert len(registry.get_versions("rv.orders-value")) == 1  # nothing written


def test_a_dry_run_still_plans_a_compatible_schema(tmp_path: Path,
                                                   registry: CompatibleMock) -> None:
    config = _config(tmp_path, {"name": "n", "type": "long"},
                     {"name": "m", "type": "int", "default": 0})
    result = CliRunner().invoke(main, ["schemas", "register", "-c", str(config), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "register  rv.orders-value <- order.avsc\n"
    assert len(registry.get_versions("rv.orders-value")) == 1


def test_a_subject_holding_another_type_of_schema_is_not_mended_by_defaults(
        tmp_path: Path, registry: CompatibleMock) -> None:
    # QA 60-b F-2: the subject held a string schema, the route's is a record: the hint said
    # to add a default for each new field, which no default mends.
    registry.register_schema("rv.other-value", Schema('"string"', "AVRO"))
    config = _config(tmp_path, {"name": "n", "type": "long"})
    config.write_text(config.read_text("utf-8").replace("rv.orders,", "rv.other,"), "utf-8")
    result = CliRunner().invoke(main, ["schemas", "register", "-c", str(config), "--dry-run"])
    assert result.exit_code == 1, result.output
    assert result.stdout == (
        "refused   rv.other-value <- order.avsc: incompatible (field '(top level)': the new "
        "type record t.O cannot read the old type string)\n")
    assert "default" not in result.stderr.replace("no field's default", "")
    assert "rv.other-value holds a schema of type string, and this one is of type record t.O: no " \
           "field's default makes this schema read its data; route to another subject " \
           "(another topic, or schema_registry.subject_name_strategy), or give the route a " \
           "schema that reads the subject's" in " ".join(result.stderr.split())
