"""What a connector's settings mean for the router (connect/checks.py), and how `connectors
apply` shows it: QA 35-a F1 and F3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_router.connect.checks import reading_problems
from cdc_router.connect.spec import load_spec
from tests.unit.test_connect_client import (
    CONNECTOR_FILE,
    EVENTROUTER_FILE,
    ScriptedConnect,
    run_cli,
)

SHIPPED = dict(load_spec(CONNECTOR_FILE, {}).config)
UNWRAP = {"transforms": "unwrap",
          "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState"}


def test_the_shipped_connector_gives_the_router_nothing_to_warn_about() -> None:
    assert reading_problems(SHIPPED) == []


@pytest.mark.parametrize("decimals", [None, "precise", "PRECISE"])
def test_numerics_as_base64_without_schemas_are_warned_about(decimals: str | None) -> None:
    # QA 35-a F1: precise (Debezium's default) without schemas: 20 rows delivered with a
    # base64 aggregate id and key, no warning anywhere.
    config = {key: value for key, value in SHIPPED.items() if key != "decimal.handling.mode"}
    if decimals is not None:
        config["decimal.handling.mode"] = decimals
    [problem] = reading_problems(config)
    assert problem.startswith("decimal.handling.mode ")
    assert "value.converter.schemas.enable is false" in problem
    assert problem.endswith("set decimal.handling.mode=string")
    assert ("Debezium's default: precise" in problem) == (decimals is None)


@pytest.mark.parametrize("changes", [
    {"decimal.handling.mode": "string"}, {"decimal.handling.mode": "double"},
    {"decimal.handling.mode": "precise", "value.converter.schemas.enable": "true"},
    {"decimal.handling.mode": "precise", "value.converter": "io.confluent.AvroConverter"},
    {"decimal.handling.mode": "precise", "connector.class": "io.example.SinkConnector"},
])
def test_decimals_are_not_warned_about_when_the_router_reads_them_right(
        changes: dict[str, str]) -> None:
    assert reading_problems({**SHIPPED, **changes}) == []


@pytest.mark.parametrize(("transform", "says"), [
    ("io.debezium.transforms.ExtractNewRecordState", "strips the change event's envelope"),
    ("io.debezium.transforms.outbox.EventRouter", "the router's own job"),
])
def test_a_transform_that_reshapes_the_change_events_is_warned_about(transform: str,
                                                                     says: str) -> None:
    # QA 35-a F3: every record was dead-lettered, and apply had said nothing.
    config = {**SHIPPED, "transforms": "a, outbox", "transforms.a.type":
              "org.apache.kafka.connect.transforms.InsertHeader",
              "transforms.outbox.type": transform}
    [problem] = reading_problems(config)
    assert problem.startswith(f"transforms.outbox.type is {transform}: it ")
    assert says in problem and "dead-letter every record" in problem


def connector_json(tmp_path: Path, config: dict[str, str]) -> str:
    path = tmp_path / "outbox.json"
    path.write_text(json.dumps({"name": "outbox-connector", "config": config}))
    return str(path)


def test_apply_warns_about_what_the_router_cannot_read(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    connect = ScriptedConnect({"outbox-connector": {**SHIPPED, "name": "outbox-connector"}})
    changed = {**SHIPPED, "decimal.handling.mode": "precise", **UNWRAP}

    result = run_cli(monkeypatch, connect, "apply", "--yes", "-f",
                     connector_json(tmp_path, changed))

    assert result.exit_code == 0, result.output
    assert "outbox.json: outbox-connector: decimal.handling.mode is precise" in result.stderr
    assert "outbox-connector: transforms.unwrap.type is " in result.stderr


def test_apply_of_the_shipped_file_warns_about_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_cli(monkeypatch, ScriptedConnect({}), "apply", "--dry-run", "-f",
                     str(CONNECTOR_FILE))
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr and " ! " not in result.stdout
    # The SMT's own connector is no connector for the router, and apply says why.
    smt = run_cli(monkeypatch, ScriptedConnect({}), "apply", "--dry-run", "-f",
                  str(EVENTROUTER_FILE))
    assert "transforms.outbox.type is io.debezium.transforms.outbox.EventRouter" in smt.stderr
