"""A column's names over a rename (QA 63-a F-1, F-7): `source.outbox.<field>` and a route's
`key` as a list, validated at load, read as the first name a row (or table) has."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.config.compiled import compile_config
from cdc_router.config.load import load_config
from cdc_router.config.model import RouterConfig
from cdc_router.config.outbox_columns import OutboxColumnNames
from cdc_router.config.source import SourceSettings
from cdc_router.errors import ConfigError, DecodeError, MissingColumn, RouteError
from cdc_router.router.debezium import event_from_row
from cdc_router.router.missing_columns import MissingKeyColumn
from cdc_router.router.routing import Router
from tests.unit.router_fakes import raw_event

ROUTES = "routes: [{topic: x}]\n"


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "router.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        compile_config(load_config(path, {}).config)
    return str(caught.value)


@pytest.mark.parametrize(("outbox", "expected"), [
    ("{aggregatetype: []}", "field 'source.outbox.aggregatetype': an empty list names no "
     "column: name the column, or list its names over a rename (old and new, e.g. "
     "[aggregate_type, kind])"),
    ("{aggregatetype: [kind, kind]}", "field 'source.outbox.aggregatetype': lists 'kind' "
     "twice: each name once"),
    ("{aggregatetype: [kind, type]}", "field 'source.outbox.type': column 'type' is already "
     "used for aggregatetype"),
    ("{id: [event_id, uuid], type: [kind, uuid]}", "field 'source.outbox.type': column 'uuid' "
     "is already used for id"),
    ("{payload: [body, ' ']}", "field 'source.outbox.payload': a column name cannot be blank"),
    ("{payload: [body, 12]}", "field 'source.outbox.payload': lists the number 12, not a "
     "column name: quote it if it is one"),
    # rv64: Python's words showed, "YAML reads None as null ...: quote it".
    ("{payload: [body, null]}", "field 'source.outbox.payload': lists null, not a column "
     "name: quote it if it is one, or leave it out"),
    ("{headers: [h, 'x" + "y" * 70 + "']}", "field 'source.outbox.headers': not a usable "
     "Postgres identifier"),
])
def test_a_bad_list_of_names_is_refused_naming_the_field_and_value(
        tmp_path: Path, outbox: str, expected: str) -> None:
    text = f"source: {{topics: [a], outbox: {outbox}}}\n{ROUTES}"
    assert expected in _error(tmp_path, text)


@pytest.mark.parametrize(("key", "expected"), [
    ("[]", "field 'routes[0].key': an empty list names no column"),
    ("[zone, zone]", "field 'routes[0].key': lists 'zone' twice: each name once"),
    ("[zone, '']", "field 'routes[0].key': lists '', which is no column name"),
    ("[zone, null]", "field 'routes[0].key': lists null, which is no column name"),
    ("[aggregate_id, zone]", "field 'routes[0].key': a key's list names one column over a "
     "rename (old and new), and this is the event's own field or an outbox column, which "
     "every row has (got 'aggregate_id'); key by aggregate_id alone"),
    ("[zone, aggregateid]", "(got 'aggregateid')"),
    ("[zone, payload]", "field 'routes[0].key': the payload, headers or created_at column "
     "cannot be the key (got 'payload')"),
    ("['{zone}', zone_id]", "never a template"),
])
def test_a_bad_key_list_is_refused_naming_the_route(tmp_path: Path, key: str,
                                                    expected: str) -> None:
    text = f"source: {{topics: [a]}}\nroutes: [{{topic: x, key: {key}}}]\n"
    assert expected in _error(tmp_path, text)


def test_a_list_loads_and_one_name_stays_one_name(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("source: {topics: [a], outbox: {aggregatetype: [aggregate_type, kind], "
                    "type: [event_type]}}\nroutes: [{topic: x, key: [zone, zone_id]}]\n")
    compiled = compile_config(load_config(path, {}).config)
    outbox = compiled.config.source.outbox
    assert outbox.aggregatetype == ["aggregate_type", "kind"] and outbox.type == "event_type"
    assert outbox.first.aggregatetype == "aggregate_type"
    assert outbox.renamed == (("aggregatetype", ("aggregate_type", "kind")),)
    assert {"aggregate_type", "kind", "event_type"} <= outbox.named
    assert compiled.routes[0].key_field == "zone" and compiled.routes[0].key_others == \
        ("zone_id",)
    assert OutboxColumnNames().renamed == ()  # the common case lists nothing


def _row(**renames: str) -> dict[str, Any]:
    row: dict[str, Any] = json.loads(raw_event("e-1"))["after"]
    for old, new in renames.items():
        row[new] = row.pop(old)
    return row


def test_an_event_takes_the_first_listed_name_its_row_has() -> None:
    settings = SourceSettings(outbox=OutboxColumnNames(aggregatetype=["aggregatetype", "kind"]))
    old, new = _row(), _row(aggregatetype="kind")
    assert event_from_row(old, settings).aggregate_type == "Order"
    assert event_from_row(new, settings).aggregate_type == "Order"
    both = {**_row(), "kind": "Other"}  # a two-step migration writes both: the first wins
    assert event_from_row(both, settings).aggregate_type == "Order"
    assert "kind" not in dict(event_from_row(both, settings).extra_columns)  # a name given
    with pytest.raises(MissingColumn) as missing:
        event_from_row(_row(aggregatetype="category"), settings)
    assert missing.value.column == "aggregatetype" and "category" in missing.value.row_columns
    assert str(missing.value).startswith("event 'e-1': none of the columns 'aggregatetype', "
                                         "'kind' (source.outbox.aggregatetype) is in the row: "
                                         "list the column's name there; the row has 'id, "
                                         "aggregateid,"), str(missing.value)
    assert missing.value.event_id == "e-1"


def test_a_row_with_none_of_the_listed_id_names_names_them_all() -> None:
    # Review 64 (low): the id, decoded before the other columns' try block, was named by its
    # first name only ("column 'id' (event id) is missing from the row").
    settings = SourceSettings(outbox=OutboxColumnNames(id=["id", "event_id"]))
    assert event_from_row(_row(id="event_id"), settings).event_id == "e-1"
    with pytest.raises(MissingColumn) as missing:
        event_from_row(_row(id="uuid"), settings)
    assert missing.value.column == "id" and "uuid" in missing.value.row_columns
    assert str(missing.value).startswith("none of the columns 'id', 'event_id' "
                                         "(source.outbox.id) is in the row: list the column's "
                                         "name there; the row has 'aggregatetype,"), \
        str(missing.value)
    assert missing.value.event_id is None
    with pytest.raises(MissingColumn, match=r"^column 'id' \(event id\) is missing"):
        event_from_row(_row(id="uuid"), SourceSettings())  # one name: as before


def test_every_field_may_list_its_names() -> None:
    settings = SourceSettings(outbox=OutboxColumnNames(
        id=["id", "event_id"], aggregateid=["aggregateid", "agg"], type=["type", "kind"],
        payload=["payload", "body"], headers=["headers", "meta"],
        created_at=["created_at", "at"]))
    before = event_from_row(_row(), settings)
    after = event_from_row(_row(id="event_id", aggregateid="agg", type="kind",
                                payload="body", headers="meta", created_at="at"), settings)
    assert after == before


def test_a_table_or_status_takes_the_first_name_the_table_has() -> None:
    names = OutboxColumnNames(aggregatetype=["aggregate_type", "kind"], created_at=None)
    schema = names.outbox_schema("shop.outbox")
    table = ("id", "kind", "aggregateid", "type", "payload", "headers")
    assert schema.for_table(table).columns.aggregatetype == "kind"
    assert schema.for_table(table).listed == ()
    assert schema.choices(table) == (
        "source.outbox.aggregatetype lists aggregate_type, kind: the table has kind",)
    assert schema.choices(("id",)) == (
        "source.outbox.aggregatetype lists aggregate_type, kind: the table has none of them",)
    assert schema.for_table(("id",)).columns.aggregatetype == "aggregate_type"  # named missing
    assert names.for_table(table).created_at is None


def test_rules_check_shows_the_listed_names(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("source: {topics: [a], outbox: {aggregatetype: [aggregate_type, kind]}}\n"
                    "routes: [{topic: x, key: [zone, zone_id]}]\n")
    shown = CliRunner().invoke(main, ["rules", "check", "-c", str(path)])
    assert shown.exit_code == 0, shown.output
    assert "; aggregatetype the first of aggregate_type | kind)" in shown.output
    assert "key zone | zone_id" in shown.output
    shown = CliRunner().invoke(main, ["rules", "check", "-c", str(path), "-o", "json"])
    assert json.loads(shown.output)["config"]["source"]["outbox"]["aggregatetype"] == [
        "aggregate_type", "kind"]


def test_a_row_with_none_of_a_keys_names_is_a_route_letter_naming_them() -> None:
    config = RouterConfig.model_validate({"source": {"topics": ["a"]}, "routes": [
        {"topic": "x", "key": ["zone", "zone_id"]}], "dead_letter": {"topic": "dlq"}})
    compiled = compile_config(config)
    event = event_from_row(_row(), config.source)
    with pytest.raises(MissingKeyColumn, match=r"none of the key columns 'zone', 'zone_id' of "
                       r"routes\[0\] is a column of the row, whose other columns are"):
        Router(compiled, compiled.serializers).route(event, lambda topic: 1)


@pytest.mark.parametrize("names", [["aggregatetype", "kind"], ["kind", "aggregatetype"]])
def test_an_expand_and_contract_migration_takes_the_name_with_a_value(names: list[str]) -> None:
    # rv64: ADD COLUMN kind, the new writers fill it and leave aggregatetype null, the old
    # ones the reverse: every row has both names, and the first of them a row had was read,
    # so either order dead-lettered one writer's rows ("got null").
    settings = SourceSettings(outbox=OutboxColumnNames(aggregatetype=names))
    new_writer = {**_row(), "aggregatetype": None, "kind": "Order"}
    old_writer = {**_row(), "kind": None}
    assert event_from_row(new_writer, settings).aggregate_type == "Order"
    assert event_from_row(old_writer, settings).aggregate_type == "Order"
    with pytest.raises(DecodeError, match=f"column '{names[0]}' .* got null"):
        event_from_row({**_row(), "aggregatetype": None, "kind": None}, settings)


def test_a_key_list_takes_the_name_with_a_value() -> None:
    config = RouterConfig.model_validate({"source": {"topics": ["a"]}, "routes": [
        {"topic": "x", "key": ["zone", "zone_id"]}], "dead_letter": {"topic": "dlq"}})
    compiled = compile_config(config)
    router = Router(compiled, compiled.serializers)
    for zone, zone_id in (("eu", None), (None, "eu"), ("eu", "us")):
        event = event_from_row({**_row(), "zone": zone, "zone_id": zone_id}, config.source)
        routed = router.route(event, lambda topic: 1)
        assert getattr(routed, "key", None) == b"eu", (zone, zone_id)
    event = event_from_row({**_row(), "zone": None, "zone_id": None}, config.source)
    with pytest.raises(RouteError, match="key column 'zone' of routes\\[0\\] is null"):
        router.route(event, lambda topic: 1)
    event = event_from_row({**_row(), "zone_id": None}, config.source)
    with pytest.raises(RouteError, match="key column 'zone_id' of routes\\[0\\] is null"):
        router.route(event, lambda topic: 1)
