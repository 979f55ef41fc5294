"""What a connector's settings mean for the router (connect/checks.py), and how `connectors
apply` shows it: QA 35-a F1, F3 and F5."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from cdc_router.connect.checks import (
    include_move,
    login_hint,
    prefix_move,
    raw_topic,
    raw_topics,
    reading_problems,
)
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
    assert raw_topic(SHIPPED) == "outbox.public.outbox"


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
    problems = reading_problems({**SHIPPED, **changes})
    assert not any("decimal.handling.mode" in problem for problem in problems), problems


@pytest.mark.parametrize(("converter", "writes"), [
    ("io.confluent.connect.avro.AvroConverter", "each value is Avro framed for the registry "
                                                "(byte 0 and a 4-byte schema id)"),
    ("io.confluent.connect.json.JsonSchemaConverter", "each value is JSON Schema framed"),
    ("io.confluent.connect.protobuf.ProtobufConverter", "each value is Protobuf framed"),
    (" io.apicurio.registry.utils.converter.AvroConverter", "a schema-registry converter: "
                                                            "each value is framed"),
    ("org.apache.kafka.connect.storage.StringConverter", "not JsonConverter"),
])
def test_a_value_converter_the_router_cannot_read_is_warned_about(converter: str,
                                                                  writes: str) -> None:
    # Review 49-f F2: a schema-registry converter (the common EventRouter setup) passed apply
    # without a word, and every record was a decode letter.
    [problem] = reading_problems({**SHIPPED, "value.converter": converter})
    assert problem.startswith(f"value.converter is {converter.strip()}, ")
    assert writes in problem and "dead-letters every record" in problem
    assert problem.endswith("set value.converter=org.apache.kafka.connect.json.JsonConverter "
                            "and value.converter.schemas.enable=false (as "
                            "connectors/outbox-connector.json has it); a connector run for "
                            "other consumers of its topic may ignore this")
    # A converter left to the worker is not in the connector's config: nothing to tell.
    assert reading_problems({key: value for key, value in SHIPPED.items()
                             if key != "value.converter"}) == []
    assert reading_problems({**SHIPPED, "value.converter": converter,
                             "connector.class": "io.example.SinkConnector"}) == []


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
    assert says in problem and "dead-letters every record" in problem


def test_the_raw_topic_is_told_only_when_the_config_says_it() -> None:
    assert raw_topic({**SHIPPED, "topic.prefix": "my-app.cdc",
                      "table.include.list": "shop\\.ob_v8"}) == "my-app.cdc.shop.ob_v8"
    assert raw_topic({**SHIPPED, "topic.delimiter": "_"}) == "outbox_public_outbox"
    assert raw_topic({**SHIPPED, **UNWRAP}) == "outbox.public.outbox"  # renames no topic
    unknown = [
        {"table.include.list": "public.outbox,public.other"},
        {"table.include.list": "public.outbox_.*"},
        {"table.include.list": "public.Outbox"},
        {"topic.prefix": ""},
        {"topic.naming.strategy": "io.debezium.schema.HashTopicNamingStrategy"},
        # Review 35-2: <prefix>.<table> on PostgreSQL, and Debezium renames a $ in a name.
        {"topic.naming.strategy": "io.debezium.schema.DefaultTopicNamingStrategy"},
        {"table.include.list": "public.out$box"},
        {"transforms": "route", "transforms.route.type":
         "org.apache.kafka.connect.transforms.RegexRouter"},
        {"transforms": "route", "transforms.route.type": "com.example.OwnRouter"},
    ]
    for changes in unknown:
        assert raw_topic({**SHIPPED, **changes}) is None, changes


def test_each_table_of_the_include_list_has_its_raw_topic_when_all_are_plain() -> None:
    # QA 64-a F-1: status checks each one against source.topics.
    both = {**SHIPPED, "table.include.list": "public.outbox,shop\\.events"}
    assert raw_topics(both) == ("outbox.public.outbox", "outbox.shop.events")
    assert raw_topic(both) is None
    assert raw_topics(SHIPPED) == ("outbox.public.outbox",)
    assert raw_topics({**both, "table.include.list": "public.outbox,public.ev_.*"}) == ()
    assert raw_topics({**both, "topic.prefix": ""}) == ()


def test_a_topic_prefix_change_names_the_moved_raw_topic_and_source_topics() -> None:
    moved = prefix_move(SHIPPED, {**SHIPPED, "topic.prefix": "outbox2"})
    assert moved is not None
    assert "moves the raw topic outbox.public.outbox to outbox2.public.outbox" in moved
    assert "source.topics" in moved and "snapshots the table again" in moved
    several = {**SHIPPED, "table.include.list": "public.a,public.b"}
    assert "every raw topic from outbox.* to new.*" in str(
        prefix_move(several, {**several, "topic.prefix": "new"}))
    assert prefix_move(SHIPPED, dict(SHIPPED)) is None
    assert prefix_move({}, SHIPPED) is None


def connector_json(tmp_path: Path, config: dict[str, str]) -> str:
    path = tmp_path / "outbox.json"
    path.write_text(json.dumps({"name": "outbox-connector", "config": config}))
    return str(path)


def test_apply_warns_and_its_plan_says_where_the_raw_topic_moves(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # QA 35-a F5: apply printed `~ topic.prefix: my-app.cdc -> my-app.cdc2` and nothing else;
    # the router then read nothing, without a word.
    connect = ScriptedConnect({"outbox-connector": {**SHIPPED, "name": "outbox-connector"}})
    changed = {**SHIPPED, "topic.prefix": "outbox2", "decimal.handling.mode": "precise",
               **UNWRAP}

    result = run_cli(monkeypatch, connect, "apply", "--yes", "--wait", "0", "-f",
                     connector_json(tmp_path, changed))

    assert result.exit_code == 0, result.output
    assert "  ~ topic.prefix: outbox -> outbox2" in result.stdout
    assert "  ! topic.prefix outbox -> outbox2 moves the raw topic outbox.public.outbox to " \
           "outbox2.public.outbox: source.topics" in result.stdout
    assert "outbox.json: outbox-connector: decimal.handling.mode is precise" in result.stderr
    assert "outbox-connector: transforms.unwrap.type is " in result.stderr
    registry = {**SHIPPED, "value.converter": "io.confluent.connect.avro.AvroConverter"}
    avro = run_cli(monkeypatch, ScriptedConnect({}), "apply", "--dry-run", "-f",
                   connector_json(tmp_path, registry))
    assert avro.exit_code == 0, avro.output  # a warning: the file may serve other readers
    assert "outbox.json: outbox-connector: value.converter is io.confluent.connect.avro." \
           "AvroConverter, a schema-registry converter" in avro.stderr
    diff = run_cli(monkeypatch, ScriptedConnect({"outbox-connector": {**SHIPPED}}), "diff",
                   "-o", "json", "-f", connector_json(tmp_path, changed))
    [planned] = json.loads(diff.stdout)
    [note] = planned["notes"]
    assert note.startswith("topic.prefix outbox -> outbox2 moves the raw topic")


def test_the_plan_says_which_rows_a_new_table_or_a_no_data_snapshot_leaves_behind(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # QA 64-a F-2: public.outbox2 added to table.include.list while rows were written: 113
    # of its 1,092 rows never reached the raw topic, and the plan said only `~
    # table.include.list`. F-3: a new connector with snapshot.mode no_data skipped the 100
    # rows already in the outbox, no word either.
    connect = ScriptedConnect({"outbox-connector": {**SHIPPED, "name": "outbox-connector"}})
    both = {**SHIPPED, "table.include.list": "public.outbox,public.outbox2"}
    result = run_cli(monkeypatch, connect, "apply", "--dry-run", "-f",
                     connector_json(tmp_path, both))
    assert result.exit_code == 0, result.output
    # Review 65: the shipped file leaves the publication to the user (autocreate disabled):
    # the added table streams only once the publication publishes it (live: 0 of 5 rows).
    assert "  ! table.include.list adds public.outbox2: Debezium streams none of its rows " \
           "until publication cdc_router_outbox publishes it (publication.autocreate.mode " \
           "disabled): before this update, `ALTER PUBLICATION \"cdc_router_outbox\" ADD TABLE " \
           "\"public\".\"outbox2\"`, and `GRANT SELECT ON \"public\".\"outbox2\" TO " \
           "\"debezium\"` unless its role may read it (a snapshot reads it); nor does it " \
           "snapshot it, so its rows committed before this update are not delivered; " \
           "afterwards snapshot just the added table with Debezium's incremental snapshot, " \
           "which needs its signalling" in result.stdout, result.stdout
    assert "without it, `cdc-router connectors stop`, `reset-offsets`, `resume` snapshots " \
           "every table again" in result.stdout
    # Review 65: a snapshot's rows are op r, which source.snapshot_rows false skips.
    assert "or re-emit them with `cdc-router outbox republish` (the way for a router with " \
           "source.snapshot_rows false, which skips a snapshot's rows, op r)" in result.stdout
    filtered = {**both, "publication.autocreate.mode": "filtered"}  # Debezium updates it
    connect = ScriptedConnect({"outbox-connector": {**SHIPPED, "name": "outbox-connector",
                                                    "publication.autocreate.mode": "filtered"}})
    result = run_cli(monkeypatch, connect, "apply", "--dry-run", "-f",
                     connector_json(tmp_path, filtered))
    assert "  ! table.include.list adds public.outbox2: Debezium streams its inserts from now " \
           "on but does not snapshot it, so its rows committed" in result.stdout, result.stdout
    connect = ScriptedConnect({"outbox-connector": {**SHIPPED, "name": "outbox-connector"}})
    no_data = {**SHIPPED, "snapshot.mode": "no_data"}
    created = run_cli(monkeypatch, ScriptedConnect({}), "apply", "--dry-run", "-f",
                      connector_json(tmp_path, no_data))
    assert "  ! snapshot.mode no_data: a new connector delivers none of the rows already in " \
           "public.outbox, only those committed once its slot exists (one created again, " \
           "whose slot.name a deleted connector left behind, skips nothing: it streams from " \
           "that one's position)" in created.stdout
    updated = run_cli(monkeypatch, connect, "apply", "--dry-run", "-f",
                      connector_json(tmp_path, no_data))  # its offsets say where it is
    assert " ! " not in updated.stdout


def test_the_plan_names_the_incremental_snapshot_of_an_added_table(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Review 64 (low): the note of an added table advised stop/reset-offsets/resume alone, a
    # full re-snapshot of every table; with a signal table the connector can snapshot just
    # the added one (Debezium's execute-snapshot signal, an incremental snapshot).
    signalled = {**SHIPPED, "signal.data.collection": "public.debezium_signal"}
    connect = ScriptedConnect({"outbox-connector": {**signalled, "name": "outbox-connector"}})
    both = {**signalled, "table.include.list": "public.outbox,public.outbox2"}
    result = run_cli(monkeypatch, connect, "apply", "--dry-run", "-f",
                     connector_json(tmp_path, both))
    assert result.exit_code == 0, result.output
    assert "afterwards snapshot just the added table with an incremental snapshot, once the " \
           "connector runs with the new list: `INSERT INTO \"public\".\"debezium_signal\" " \
           "(id, type, data) VALUES (gen_random_uuid()::text, 'execute-snapshot', " \
           "'{\"data-collections\": [\"public.outbox2\"], \"type\": \"incremental\"}')`" \
           in result.stdout, result.stdout
    assert "or `cdc-router connectors stop`, `reset-offsets`, `resume` snapshots every table " \
           "again" in result.stdout


def test_apply_of_the_shipped_file_warns_about_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_cli(monkeypatch, ScriptedConnect({}), "apply", "--dry-run", "-f",
                     str(CONNECTOR_FILE))
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr and " ! " not in result.stdout
    # The SMT's own connector is no connector for the router, and apply says why.
    smt = run_cli(monkeypatch, ScriptedConnect({}), "apply", "--dry-run", "-f",
                  str(EVENTROUTER_FILE))
    assert "transforms.outbox.type is io.debezium.transforms.outbox.EventRouter" in smt.stderr


def probing(monkeypatch: pytest.MonkeyPatch, connect: ScriptedConnect) -> Any:
    """ops.connector.probe_connector, asking `connect`."""
    from cdc_router.connect.client import ConnectClient
    from cdc_router.ops.connector import probe_connector

    def build(url: str, **kwargs: Any) -> ConnectClient:
        return ConnectClient(url, transport=httpx.MockTransport(connect), **kwargs)

    monkeypatch.setattr("cdc_router.ops.connector.ConnectClient", build)
    return probe_connector


def test_status_reads_the_raw_topic_from_the_deployed_connectors_config(
        monkeypatch: pytest.MonkeyPatch) -> None:
    connect = ScriptedConnect({"outbox-connector": {**SHIPPED, "topic.prefix": "outbox2"}})
    probe_connector = probing(monkeypatch, connect)
    state, capture = probe_connector("http://connect:8083", "outbox-connector")
    assert state.raw_topic == "outbox2.public.outbox" and state.raw_topic_read is None
    assert capture is not None and capture.table == "public.outbox"
    # Review 49-b F6: a name Connect does not have is said with the names it has.
    missing, none = probe_connector("http://connect:8083", "nosuch")
    assert missing.exists is False and missing.error is None and none is None
    assert missing.deployed == ("outbox-connector",)


def test_the_login_hint_names_the_env_placeholder_the_password_comes_from() -> None:
    # Review 53-c F15: with `${env:NOPE_PASS}` unset in the worker, "password authentication
    # failed" came with a hint naming DB_HOST, DB_PORT, DB_USER only.
    config = {"database.hostname": "127.0.0.1", "database.port": "45432",
              "database.user": "debezium", "database.password": "${env:NOPE_PASS}"}
    hint = login_hint(config)
    assert hint is not None and hint.startswith(
        "the connector tried Postgres at 127.0.0.1:45432 as debezium (DB_HOST, DB_PORT, DB_USER")
    assert hint.endswith("; its password is ${env:NOPE_PASS}, which the Connect worker resolves "
                         "from its own environment, read when the worker started: NOPE_PASS set "
                         "in this shell does not reach it; set it where the worker runs, then "
                         "restart it (the local stack's: `cdc-router local down`, then `local "
                         "up`; its data stays)")
    assert "its password" not in (login_hint({**config, "database.password": "pw"}) or "")
    assert login_hint({**config, "database.user": ""}) is None


class RecordingConnect(ScriptedConnect):
    """ScriptedConnect that notes each request it is asked."""

    def __init__(self) -> None:
        super().__init__({})
        self.requests: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        return super().__call__(request)


@pytest.mark.parametrize(("tables", "entry"), [
    ('App."OutBox"', 'App."OutBox"'),
    ('"App"."OutBox"', '"App"."OutBox"'),
    ('public.outbox,App."OutBox"', 'App."OutBox"'),
])
@pytest.mark.parametrize("dry_run", [["--dry-run"], ["--yes"]])
def test_apply_refuses_an_include_list_entry_in_sql_quotes_before_asking_connect(
        monkeypatch: pytest.MonkeyPatch, tables: str, entry: str, dry_run: list[str]) -> None:
    # QA 53-h F3: OUTBOX_TABLE='App."OutBox"', the spelling `outbox init --table` takes, was
    # "created / RUNNING" and captured nothing: Debezium's include list is regexes over
    # unquoted names.
    monkeypatch.setenv("OUTBOX_TABLE", tables)
    connect = RecordingConnect()
    result = run_cli(monkeypatch, connect, "apply", *dry_run, "-f", str(CONNECTOR_FILE))
    assert result.exit_code == 1, result.output
    assert "field 'config.table.include.list': an entry has double quotes, which Debezium " \
           "does not strip" in result.stderr
    assert f"(got {entry!r}); write App.OutBox (OUTBOX_TABLE=App.OutBox" in result.stderr
    assert connect.requests == [] and connect.puts == []


def test_status_names_a_deployed_include_list_entry_in_sql_quotes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    connect = ScriptedConnect({"qaq": {**SHIPPED, "table.include.list": 'App."OutBox"'}})
    probe_connector = probing(monkeypatch, connect)
    state, capture = probe_connector("http://connect:8083", "qaq")
    assert state.quoted_tables == ('App."OutBox"',)
    assert capture is not None and capture.table is None  # its publication is not checked
    connect.configs["qaq"] = {**SHIPPED}
    plain, _ = probe_connector("http://connect:8083", "qaq")
    assert plain.quoted_tables == ()


def test_status_leaves_the_signal_tables_raw_topic_out_of_the_unread_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # rv64 (of QA 64-a F-1): a connector with its signal table in table.include.list, as
    # Debezium's signalling asks, was warned that no router reads the signal table's topic.
    from cdc_router.config.model import RouterConfig
    from cdc_router.ops.probe import reading

    signalled = {**SHIPPED, "table.include.list": "public.outbox,public.debezium_signal",
                 "signal.data.collection": "public.debezium_signal"}
    connect = ScriptedConnect({"outbox-connector": signalled})
    state, _ = probing(monkeypatch, connect)("http://connect:8083", "outbox-connector")
    assert state.raw_topics == ("outbox.public.outbox",)
    config = RouterConfig.model_validate({"source": {"topics": ["outbox.public.outbox"]},
                                          "routes": [{"topic": "dst"}]})
    assert reading(state, config).unread_topics == ()
    elsewhere = RouterConfig.model_validate({"source": {"topics": ["outbox2.public.outbox"]},
                                             "routes": [{"topic": "dst"}]})
    assert reading(state, elsewhere).unread_topics == ("outbox.public.outbox",)


def test_an_added_table_of_a_users_publication_names_no_role_the_worker_resolves() -> None:
    # Review 65: the GRANT the note gives names database.user, unless a config provider
    # reference (${file:...}) stands for it, which only the worker resolves.
    deployed = {**SHIPPED, "database.user": "${file:/opt/secrets.properties:user}"}
    note = include_move(deployed, {**deployed,
                                   "table.include.list": "public.outbox,public.outbox2"})
    assert note is not None
    assert 'GRANT SELECT ON "public"."outbox2" TO <its database.user>` unless' in note, note
    users = {**SHIPPED, "publication.autocreate.mode": "no_tables", "publication.name": ""}
    note = include_move(users, {**users, "table.include.list": "public.outbox,public.outbox2"})
    assert note is not None
    assert note.startswith("table.include.list adds public.outbox2: Debezium streams none of "
                           "its rows until publication dbz_publication publishes it "
                           "(publication.autocreate.mode no_tables)"), note
