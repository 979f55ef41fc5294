"""The outbox DDL as rendered, the schema value, write_event()'s inputs, and `outbox` CLI edges."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from psycopg import sql
from psycopg.types.json import Jsonb

from cdc_router.cli import main
from cdc_router.errors import ConfigError
from cdc_router.outbox import (
    CaptureSetup,
    InvalidEventError,
    OutboxColumns,
    OutboxSchema,
    init_outbox,
    init_steps,
    new_event_id,
    render_psql,
    write_event,
)
from cdc_router.outbox.existing import (
    NothingCaptured,
    column_type_warnings,
    own_publication,
    publication_warnings,
)
from cdc_router.outbox.role import PASSWORD_LEFT, ensure_password, password_matches
from cdc_router.outbox.setup import (
    INIT_LOCK,
    InitReport,
    add_size_check_statement,
)
from cdc_router.postgres import regclass_text, split_table

# Postgres 15's verifier for the password "correct horse" (SET password_encryption =
# 'scram-sha-256'; CREATE ROLE ... PASSWORD 'correct horse'; SELECT rolpassword ...).
SCRAM_VERIFIER = ("SCRAM-SHA-256$4096:h35dCNSeG1hQvF0sfh8Dbg==$Fhk6KKKPUrKsDCQbW0f+tOSZtBRWUvAU6"
                  "BJKKwn4aZY=:yYXNAzglNpJ3tkfNqkv8ZRloHw7PaczP7UVtnyD8FM4=")


def script(schema: OutboxSchema | None = None, **setup: Any) -> str:
    return render_psql(init_steps(schema or OutboxSchema(), CaptureSetup(**setup)),
                       setup.get("replication_role"))


# -- OutboxSchema ----------------------------------------------------------------------


def test_the_default_schema_uses_the_event_router_column_names() -> None:
    schema = OutboxSchema()

    assert schema.table == "public.outbox"
    assert schema.columns == OutboxColumns()
    assert schema.columns.model_dump() == {
        "id": "id", "aggregatetype": "aggregatetype", "aggregateid": "aggregateid",
        "type": "type", "payload": "payload", "headers": "headers", "created_at": "created_at"}
    assert schema.payload_type == "jsonb"


def test_columns_are_renamed_by_their_default_names() -> None:
    schema = OutboxSchema().with_columns({"aggregatetype": "kind", "payload": "body"})

    assert (schema.columns.aggregatetype, schema.columns.payload) == ("kind", "body")
    with pytest.raises(ConfigError, match="unknown outbox column"):
        OutboxSchema().with_columns({"aggregate_type": "kind"})


def test_a_rename_onto_a_column_in_use_is_refused_by_name() -> None:
    # Before the one column model, this reached Postgres as a CREATE TABLE with "id" twice.
    with pytest.raises(ConfigError, match="field 'type': column 'id' is already used for id"):
        OutboxSchema().with_columns({"type": "id"})
    with pytest.raises(ConfigError, match="field 'payload': a column name cannot be blank"):
        OutboxSchema().with_columns({"payload": " "})


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"table": "a.b.c"}, "schema.table"),
    ({"table": "public."}, "identifier"),
    ({"table": "x" * 64}, "identifier"),
    ({"columns": OutboxColumns(headers="h" * 64)}, "identifier"),
    ({"payload_type": "json"}, "jsonb or bytea"),
])
def test_bad_schemas_are_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        OutboxSchema(**kwargs)


@pytest.mark.parametrize(("written", "parts", "regclass"), [
    ("outbox", ("public", "outbox"), '"public"."outbox"'),
    ("public.OutBox", ("public", "OutBox"), '"public"."OutBox"'),
    ('public."OutBox"', ("public", "OutBox"), '"public"."OutBox"'),
    ('"My.Schema"."a""b"', ("My.Schema", 'a"b'), '"My.Schema"."a""b"'),
])
def test_table_names_keep_their_case_and_may_be_quoted(written: str, parts: tuple[str, str],
                                                       regclass: str) -> None:
    # ::regclass folds an unquoted name to lower case: lookups must get the quoted form.
    assert split_table(written) == parts
    assert regclass_text(written) == regclass


@pytest.mark.parametrize("written", ['"OutBox', 'public."Out"Box', '"a".b.c'])
def test_badly_quoted_table_names_are_config_errors(written: str) -> None:
    with pytest.raises(ConfigError, match="table"):
        split_table(written)


# -- the DDL ---------------------------------------------------------------------------


def test_the_outbox_table_has_the_designed_columns() -> None:
    text = script()

    assert 'CREATE TABLE IF NOT EXISTS "public"."outbox" (' in text
    for column in ('"id" uuid PRIMARY KEY', '"aggregatetype" text NOT NULL',
                   '"aggregateid" text NOT NULL', '"type" text NOT NULL',
                   '"payload" jsonb NOT NULL', '"headers" jsonb,',
                   "\"created_at\" timestamp(6) NOT NULL DEFAULT (now() AT TIME ZONE 'UTC')"):
        assert column in text


def test_a_new_outbox_refuses_rows_too_big_for_the_pipeline() -> None:
    # Debezium's producer would refuse their change events and its task would die on them.
    check = 'CONSTRAINT "cdc_router_event_size" CHECK ({} <= 4000000)\n)'
    assert check.format('octet_length(concat("payload")) + octet_length(concat("headers"))'
                        ) in script()
    no_headers = script(OutboxSchema(columns=OutboxColumns(headers=None)))
    assert check.format('octet_length(concat("payload"))') in no_headers
    bytea = script(OutboxSchema(payload_type="bytea", columns=OutboxColumns(headers=None)))
    assert check.format('octet_length("payload")') in bytea  # its bytes, not its hex text
    assert "ALTER TABLE" not in script()  # init never alters a table in use


def test_the_size_check_for_an_existing_table_is_printed_not_valid() -> None:
    assert add_size_check_statement(OutboxSchema()).as_string(None) == (
        'ALTER TABLE "public"."outbox" ADD CONSTRAINT "cdc_router_event_size" CHECK ('
        'octet_length(concat("payload")) + octet_length(concat("headers")) <= 4000000)'
        " NOT VALID")


def test_a_table_the_config_reads_without_headers_or_created_at_is_created_without_them() -> None:
    # The same OutboxColumns as router.yaml's source.outbox, where null means "no such column".
    text = script(OutboxSchema(columns=OutboxColumns(headers=None, created_at=None)))

    assert '"payload" jsonb NOT NULL,\n    CONSTRAINT "cdc_router_event_size"' in text
    assert '"headers"' not in text and '"created_at"' not in text


def test_a_bytea_payload_and_renamed_columns_reach_the_ddl() -> None:
    text = script(OutboxSchema(table="app.events", payload_type="bytea").with_columns(
        {"id": "event_id"}))

    assert 'CREATE SCHEMA IF NOT EXISTS "app"' in text
    assert '"event_id" uuid PRIMARY KEY' in text
    assert '"payload" bytea NOT NULL' in text


def test_names_are_quoted_identifiers_never_spliced_text() -> None:
    text = script(OutboxSchema(table='public.Out"box; DROP TABLE x'),
                  publication="Pub", replication_role="dbz; --")

    assert 'CREATE TABLE IF NOT EXISTS "public"."Out""box; DROP TABLE x"' in text
    assert 'CREATE PUBLICATION "Pub" FOR TABLE "public"."Out""box; DROP TABLE x"' in text
    assert 'CREATE ROLE "dbz; --" WITH LOGIN REPLICATION;' in text


def test_the_publication_is_insert_only_on_the_outbox_and_created_only_if_absent() -> None:
    text = script(publication="cdc_router_outbox")

    assert ("SELECT NOT (SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = "
            "'cdc_router_outbox')) AS missing \\gset\n\\if :missing\n  CREATE PUBLICATION "
            "\"cdc_router_outbox\" FOR TABLE \"public\".\"outbox\" WITH (publish = 'insert', "
            "publish_via_partition_root = true);\n"
            "\\endif") in text


def test_the_heartbeat_table_exists_but_stays_out_of_the_publication() -> None:
    text = script()

    assert ('CREATE TABLE IF NOT EXISTS "public"."debezium_heartbeat" '
            "(id int PRIMARY KEY, ts timestamptz NOT NULL)") in text
    assert "debezium_heartbeat" not in text.split("CREATE PUBLICATION")[1].split(";")[0]


def test_the_role_may_replicate_and_read_only_the_outbox_and_heartbeat() -> None:
    text = script(replication_role="debezium")
    grants = [line for line in text.splitlines() if line.startswith("GRANT")]

    assert 'CREATE ROLE "debezium" WITH LOGIN REPLICATION;' in text
    assert grants == ['GRANT USAGE ON SCHEMA "public" TO "debezium";',
                      'GRANT SELECT ON "public"."outbox" TO "debezium";',
                      'GRANT SELECT, INSERT, UPDATE ON "public"."debezium_heartbeat" '
                      'TO "debezium";']
    assert "CREATE ON" not in text and "ALL PRIVILEGES" not in text


def test_no_role_no_role_statements() -> None:
    text = script()

    assert "ROLE" not in text and "GRANT" not in text


def test_the_printed_password_is_a_psql_variable() -> None:
    text = script(replication_role="debezium")

    assert "  ALTER ROLE \"debezium\" WITH PASSWORD :'replication_password';\n" in text
    altered = render_psql(init_steps(OutboxSchema(), CaptureSetup(replication_role="debezium")),
                          "debezium", alter_role=True)
    assert altered.rstrip().endswith(
        "ALTER ROLE \"debezium\" WITH PASSWORD :'replication_password';")


def test_the_printed_script_leaves_a_role_that_exists_as_is_unless_alter_role() -> None:
    # Review 53-c F14: without --alter-role the script still reset an existing role's password
    # and gave it REPLICATION, which the live init refuses to do (it warns instead).
    steps = init_steps(OutboxSchema(), CaptureSetup(replication_role="app'role"))
    blocks = render_psql(steps, "app'role").split("\n\n")
    exists = "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = 'app''role')"
    assert f"SELECT NOT ({exists}) AS missing \\gset\n\\if :missing\n" \
        "  CREATE ROLE \"app'role\" WITH LOGIN REPLICATION;\n" \
        "  ALTER ROLE \"app'role\" WITH PASSWORD :'replication_password';\n\\else\n" \
        "  \\warn 'role app\\'role exists: its password and attributes were left as is, not " \
        "set to replication_password" in "\n\n".join(blocks)
    [attributes] = [block for block in blocks if "rolreplication" in block]
    assert attributes.splitlines()[1:] == [
        "\\if :missing", "  \\warn 'role app\\'role exists and lacks LOGIN or REPLICATION, "
        "which Debezium needs; it was left as is (init did not create it, and it may serve "
        "others): name a role of Debezium\\'s own, or pass --alter-role'", "\\endif"]
    text = "\n\n".join(blocks)
    assert "WITH LOGIN REPLICATION;" not in text.replace("CREATE ROLE \"app'role\" WITH", "")
    assert text.count("PASSWORD") == 1
    altered = render_psql(steps, "app'role", alter_role=True)
    assert "  ALTER ROLE \"app'role\" WITH LOGIN REPLICATION;\n" in altered
    assert "\\warn" not in altered and altered.count("PASSWORD") == 1


def test_every_step_that_creates_something_can_tell_it_is_done() -> None:
    for step in init_steps(OutboxSchema(), CaptureSetup(replication_role="r")):
        assert isinstance(step.done_query, sql.Composed)
        assert step.done_query.as_string(None).startswith("SELECT ")


# -- password verifiers ----------------------------------------------------------------


def test_a_scram_verifier_matches_only_its_password() -> None:
    assert password_matches(SCRAM_VERIFIER, "correct horse", "anyone")
    assert not password_matches(SCRAM_VERIFIER, "correct horse!", "anyone")


def test_an_md5_verifier_is_salted_with_the_role_name() -> None:
    verifier = "md5" + hashlib.md5(b"pwdebezium").hexdigest()

    assert password_matches(verifier, "pw", "debezium")
    assert not password_matches(verifier, "pw", "other")
    assert not password_matches(None, "pw", "debezium")
    assert not password_matches("SCRAM-SHA-256$garbage", "pw", "debezium")


# -- write_event -----------------------------------------------------------------------


class RecordingConnection:
    """Stands in for a psycopg connection: records what write_event() executes."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []
        self.commits = 0

    def execute(self, query: Any, params: tuple[Any, ...]) -> None:
        self.calls.append((query, params))

    def commit(self) -> None:
        self.commits += 1


def test_write_event_inserts_one_row_and_never_commits() -> None:
    conn = RecordingConnection()

    event_id = write_event(conn, aggregate_type="Order", aggregate_id="42",  # type: ignore[arg-type]
                           type="OrderPaid", payload={"total": 10}, headers={"tenant": "t1"})

    [(query, params)] = conn.calls
    assert conn.commits == 0
    assert query.as_string(None) == (
        'INSERT INTO "public"."outbox" ("id", "aggregatetype", "aggregateid", "type", '
        '"payload", "headers") VALUES (%s, %s, %s, %s, %s, %s)')
    assert params[:4] == (event_id, "Order", "42", "OrderPaid")
    assert isinstance(params[4], Jsonb) and params[4].obj == {"total": 10}
    assert isinstance(params[5], Jsonb) and params[5].obj == {"tenant": "t1"}


def test_write_event_keeps_a_given_id_and_stores_bytes_in_a_bytea_column() -> None:
    conn = RecordingConnection()
    given = uuid.uuid4()

    event_id = write_event(conn, aggregate_type="A", aggregate_id="1",  # type: ignore[arg-type]
                           type="T", payload=b"\x00avro", event_id=given,
                           schema=OutboxSchema(payload_type="bytea"))

    assert event_id == str(given)
    assert conn.calls[0][1][4] == b"\x00avro"
    assert conn.calls[0][1][5] is None


def test_a_dict_for_a_bytea_column_is_stored_as_json_bytes() -> None:
    conn = RecordingConnection()

    write_event(conn, aggregate_type="A", aggregate_id="1", type="T",  # type: ignore[arg-type]
                payload={"a": [1, 2]}, schema=OutboxSchema(payload_type="bytea"))

    assert conn.calls[0][1][4] == b'{"a":[1,2]}'


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"payload": b"x"}, "bytes payload for a jsonb column"),
    ({"payload": '{"a": 1}'}, "parse JSON text first"),
    ({"payload": {}, "event_id": "not-a-uuid"}, "not a UUID"),
    ({"payload": {}, "headers": {"n": 1}}, "header 'n' is int 1: header values are strings"),
    # QA, session 26: rows the router could only dead-letter were committed.
    ({"payload": {}, "headers": {"id": "forged"}}, "header name 'id' is reserved"),
    ({"payload": {}, "headers": {"ce_type": "x"}}, "header name 'ce_type' is reserved"),
    ({"payload": {}, "headers": {"a\x00b": "x"}}, "holds a NUL character"),
])
def test_bad_events_are_refused_before_any_sql(kwargs: dict[str, Any], message: str) -> None:
    conn = RecordingConnection()

    with pytest.raises(InvalidEventError, match=message):
        write_event(conn, aggregate_type="A", aggregate_id="1", type="T",  # type: ignore[arg-type]
                    **kwargs)

    assert conn.calls == []


@pytest.mark.parametrize(("field", "value", "message"), [
    ("aggregate_type", "", "aggregate_type must be non-empty text, not ''"),
    ("aggregate_id", " ", "aggregate_id is blank: ' '; the router would dead-letter"),
    ("type", "\t\n", "type is blank"),
    ("aggregate_id", 4.2, "aggregate_id must be non-empty text, not 4.2"),
    ("aggregate_id", True, "aggregate_id must be non-empty text, not True"),
    ("type", "Paid\x00", "type holds a NUL or a lone surrogate"),
    ("aggregate_id", "\ud800", "aggregate_id holds a NUL or a lone surrogate"),
])
def test_columns_the_router_could_only_dead_letter_are_refused_before_any_sql(
        field: str, value: object, message: str) -> None:
    # The router dead-letters an empty column at decode; psycopg raised UnicodeEncodeError on
    # a lone surrogate (review, session 25).
    conn = RecordingConnection()
    columns: dict[str, Any] = {"aggregate_type": "A", "aggregate_id": "1", "type": "T",
                               field: value}
    with pytest.raises(InvalidEventError, match=re.escape(message)):
        write_event(conn, payload={}, **columns)  # type: ignore[arg-type]
    assert conn.calls == []


def test_an_integer_aggregate_id_is_stored_as_its_text_as_before() -> None:
    conn = RecordingConnection()
    write_event(conn, aggregate_type="A", aggregate_id=42, type="T",  # type: ignore[arg-type]
                payload={})
    assert conn.calls[0][1][2] == "42"


def test_without_a_headers_column_the_row_has_none_and_headers_are_refused() -> None:
    conn = RecordingConnection()
    schema = OutboxSchema(columns=OutboxColumns(headers=None))

    write_event(conn, aggregate_type="A", aggregate_id="1", type="T",  # type: ignore[arg-type]
                payload={}, schema=schema)
    with pytest.raises(InvalidEventError, match="no headers column"):
        write_event(conn, aggregate_type="A", aggregate_id="1", type="T",  # type: ignore[arg-type]
                    payload={}, headers={"tenant": "t1"}, schema=schema)

    [(query, params)] = conn.calls
    assert query.as_string(None) == (
        'INSERT INTO "public"."outbox" ("id", "aggregatetype", "aggregateid", "type", "payload")'
        " VALUES (%s, %s, %s, %s, %s)")
    assert len(params) == 5


def test_purge_needs_a_created_at_column_to_tell_age() -> None:
    # outbox_stats counts such an outbox's rows without an age (review 34-2; the relay's
    # status test in tests/integration/test_relay.py runs it).
    from cdc_router.outbox import purge

    schema = OutboxSchema(columns=OutboxColumns(created_at=None))
    with pytest.raises(ConfigError, match="no created_at column"):
        purge(None, schema, 1000, 10)  # type: ignore[arg-type]


class _StatsConnection:
    """Answers outbox_stats' one query with (rows, size) and records it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def execute(self, query: Any, params: tuple[Any, ...]) -> Any:
        self.calls.append((query.as_string(None), params))
        return self

    def fetchone(self) -> tuple[int, int]:
        return 6, 10_715_136


def test_the_size_of_a_partitioned_outbox_is_its_partitions() -> None:
    # QA 53-h F1: pg_total_relation_size of a partitioned table's root is 0: `status` and
    # `outbox stats` showed 0 B for an outbox of 10 MB.
    from cdc_router.outbox import outbox_stats

    conn = _StatsConnection()
    schema = OutboxSchema("Sales.Outbox_part", OutboxColumns(created_at=None))
    stats = outbox_stats(conn, schema)  # type: ignore[arg-type]

    [(query, params)] = conn.calls
    assert query == (
        "SELECT count(*), (SELECT coalesce(sum(pg_total_relation_size(relid)), "
        "pg_total_relation_size(%s::regclass)) FROM pg_partition_tree(%s::regclass)) "
        'FROM "Sales"."Outbox_part"')
    assert params == ('"Sales"."Outbox_part"',) * 2
    assert (stats.rows, stats.table_bytes) == (6, 10_715_136)


def test_new_event_ids_are_uuid7_ordered_by_time() -> None:
    first = uuid.UUID(new_event_id())
    time.sleep(0.002)
    second = uuid.UUID(new_event_id())

    assert (first.version, first.variant) == (7, uuid.RFC_4122)
    assert str(first) < str(second)
    assert abs((first.int >> 80) - time.time_ns() // 1_000_000) < 60_000


def test_new_event_ids_of_one_millisecond_still_sort_in_the_order_they_were_made() -> None:
    # Review 44: within a millisecond the random bits decided, so an incremental snapshot
    # (by primary key) read one writer's events out of order.
    made = [new_event_id() for _ in range(20_000)]
    assert made == sorted(made) and len(set(made)) == len(made)
    assert len({uuid.UUID(i).int >> 80 for i in made}) < len(made)  # shared milliseconds
    assert {(uuid.UUID(i).version, uuid.UUID(i).variant) for i in made} == {(7, uuid.RFC_4122)}


def test_forked_children_never_make_the_same_event_id(monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 44-3: children forked in the parent's millisecond (here: a parent whose clock
    # stepped back a minute) counted on from its last id, each making the same ones.
    from cdc_router.outbox import writer

    monkeypatch.setattr(writer, "_last_id", (time.time_ns() // 1_000_000 + 60_000, 0))
    # Bare os.fork, the child doing nothing but make ids: a multiprocessing pool forked while
    # its own threads (or another test's) held a lock, and its workers hung the suite.
    children = []
    for _ in range(4):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.write(write, " ".join(new_event_id() for _ in range(50)).encode())
            finally:
                os._exit(0)
        os.close(write)
        children.append((pid, read))
    made = []
    for pid, read in children:
        with os.fdopen(read, "rb") as pipe:
            made.append(pipe.read().decode().split())
        os.waitpid(pid, 0)
    assert [len(ids) for ids in made] == [50] * 4
    assert len({i for ids in made for i in ids}) == 200


class _Publication:
    """Answers publication_warnings()'s two queries: read_publication()'s catalog row, then
    whether the table is in the publication and partitioned."""

    def __init__(self, *, insert: bool = True, update: bool = False, includes: bool = True,
                 row_filter: str | None = None, columns: list[str] | None = None,
                 others: tuple[str, ...] = (), partitioned: bool = False,
                 schemas: tuple[str, ...] = ()) -> None:
        # (pubinsert, pubupdate, pubdelete, pubtruncate, tables, pubviaroot)
        self.publication = (insert, update, False, False,
                            (["public.outbox"] if includes else []) + list(others), True)
        self.membership = (includes, partitioned)  # (includes the table, partitioned)
        self.filter = (row_filter, columns)  # pg_publication_rel's, Postgres 15 and later
        self.info = SimpleNamespace(server_version=150004)
        self.schemas = schemas  # pg_publication_namespace's: FOR TABLES IN SCHEMA
        self.query = ""

    def execute(self, query: Any, params: tuple[Any, ...]) -> _Publication:
        self.query = str(query)
        return self

    def fetchone(self) -> tuple[Any, ...]:
        if "prqual" in self.query:
            return self.filter
        return self.publication if "pubinsert" in self.query else self.membership

    def fetchall(self) -> list[tuple[str]]:
        assert "pg_publication_namespace" in self.query, self.query
        return [(schema,) for schema in self.schemas]


@pytest.mark.parametrize(("relay", "warned"), [(False, True), (True, False)])
def test_a_relay_table_left_out_of_the_publication_is_no_warning(relay: bool,
                                                                  warned: bool) -> None:
    # QA 36-c: the relay needs no publication; the advice to ADD TABLE would make Debezium
    # capture the relay's table too.
    warnings = publication_warnings(_Publication(includes=False),  # type: ignore[arg-type]
                                     OutboxSchema(table="public.relay_outbox"), "cdc_router_outbox",
                                     relay=relay)
    assert any("does not include public.relay_outbox" in w for w in warnings) is warned


def test_another_pipelines_publication_is_not_advised_to_take_the_outbox() -> None:
    # QA 63-b L-4: `outbox init --table teamc.outbox` on the publication of another team's
    # outbox (both left on the default --publication) advised ADD TABLE to it, which would
    # have that team's connector capture this outbox too.
    theirs = _Publication(includes=False, others=("orders.outbox",))
    [warning] = publication_warnings(theirs,  # type: ignore[arg-type]
                                     OutboxSchema(table="teamc.outbox"), "cdc_router_outbox")
    assert isinstance(warning, NothingCaptured)  # init still ends "outbox not ready"
    assert warning.startswith(
        "publication cdc_router_outbox does not include teamc.outbox: Debezium captures nothing "
        "from it; it publishes orders.outbox, another pipeline's most likely: give this outbox "
        "a publication of its own, `cdc-router outbox init --table teamc.outbox --publication "
        "cdc_router_teamc_outbox`, named in its connector's publication.name"), warning
    assert '(`ALTER PUBLICATION "cdc_router_outbox" ADD TABLE "teamc"."outbox"` only if one ' \
        "connector captures both); then `cdc-router outbox republish`" in warning
    many = _Publication(includes=False, others=("a.outbox", "b.outbox", "c.outbox", "d.x"))
    [warning] = publication_warnings(many,  # type: ignore[arg-type]
                                     OutboxSchema(table="Team-C.OutBox"), "p")
    assert "publishes a.outbox, b.outbox, c.outbox and 1 more, " in warning
    assert "--publication cdc_router_team_c_outbox`" in warning
    # An empty publication (init's own, say) is still told to take the table; so is one
    # listing a partitioned outbox's partitions under their own names.
    for publication in (_Publication(includes=False), _Publication(
            includes=False, others=("public.outbox_2026",), partitioned=True)):
        [warning] = publication_warnings(publication,  # type: ignore[arg-type]
                                         OutboxSchema(), "p")
        assert "own" not in warning and 'ADD TABLE "public"."outbox"' in warning, warning


def test_a_schema_publication_with_no_table_yet_is_another_pipeline_s() -> None:
    # Review 64 (low): `FOR TABLES IN SCHEMA other`, no table there yet, read as an empty
    # publication and was told to ADD TABLE the outbox, which its connector would capture.
    schema = _Publication(includes=False, schemas=("billing",))
    [warning] = publication_warnings(schema,  # type: ignore[arg-type]
                                     OutboxSchema(), "cdc_router_outbox")
    assert "it publishes every table of schema billing, another pipeline's most likely: give " \
        "this outbox a publication of its own, `cdc-router outbox init --table public.outbox " \
        "--publication cdc_router_public_outbox`" in warning, warning


def test_the_publication_advised_for_a_long_name_is_cut_with_a_hash() -> None:
    # Review 64 (low): cdc_router_<schema>_<table> was cut at 63 characters, so two long
    # names sharing their first 63 met in one publication name.
    assert own_publication("public.outbox") == "cdc_router_public_outbox"
    one, two = own_publication("s." + "t" * 60 + "_a"), own_publication("s." + "t" * 60 + "_b")
    assert len(one) == len(two) == 63 and one != two, (one, two)
    assert one.startswith("cdc_router_s_" + "t" * 40) and re.fullmatch(r".*_[0-9a-f]{8}", one)


def test_a_publication_that_does_not_publish_inserts_is_warned_about_with_its_fix() -> None:
    # Review L7: publish = 'update' (pubinsert false) was no warning, though Debezium then
    # captures no outbox row at all.
    update_only = _Publication(insert=False, update=True)
    warnings = publication_warnings(update_only,  # type: ignore[arg-type]
                                     OutboxSchema(), "cdc_router_outbox")
    assert any(w.startswith("publication cdc_router_outbox does not publish inserts "
                            "(publish = 'update'): Debezium captures no outbox row; run "
                            """`ALTER PUBLICATION "cdc_router_outbox" SET (publish = 'insert')`"""
                            ) for w in warnings), warnings
    assert any("publishes more than inserts" in w for w in warnings)
    assert publication_warnings(_Publication(),  # type: ignore[arg-type]
                                 OutboxSchema(), "cdc_router_outbox") == []
    # The relay reads its table with SQL: what the publication streams is no matter to it.
    relayed = publication_warnings(_Publication(insert=False),  # type: ignore[arg-type]
                                    OutboxSchema(), "cdc_router_outbox", relay=True)
    assert not any("does not publish inserts" in w for w in relayed)


def test_a_row_filter_or_a_column_list_on_the_outbox_is_warned_about() -> None:
    # Review 50-d F13: a row filter drops the rows it filters out for good, a column list
    # every event's headers and created_at; init said "outbox ready" without a word.
    filtered = _Publication(row_filter="((aggregatetype)::text <> 'Secret'::text)")
    assert publication_warnings(filtered,  # type: ignore[arg-type]
                                OutboxSchema(), "pf") == [
        "publication pf publishes public.outbox only WHERE ((aggregatetype)::text <> "
        "'Secret'::text): the rows it filters out never reach Kafka, nor later when it is "
        "dropped; publish the outbox without it (`ALTER PUBLICATION \"pf\" SET TABLE "
        "\"public\".\"outbox\"` where the publication serves nothing else), then `cdc-router "
        "outbox republish` for the rows written before"]
    listed = _Publication(columns=["id", "aggregatetype", "aggregateid", "type", "payload"])
    [warning] = publication_warnings(listed, OutboxSchema(), "pc")  # type: ignore[arg-type]
    assert warning.startswith("publication pc publishes only the columns id, aggregatetype, "
                              "aggregateid, type, payload of public.outbox: every event lacks "
                              "headers, created_at; publish the outbox without it")
    # A list of every outbox column (and more) loses nothing of the event; older servers
    # have neither, and are not asked.
    complete = _Publication(columns=["id", "aggregatetype", "aggregateid", "type", "payload",
                                     "headers", "created_at", "tenant"])
    assert publication_warnings(complete, OutboxSchema(), "p") == []  # type: ignore[arg-type]
    old_server = _Publication(row_filter="x")
    old_server.info.server_version = 140010
    assert publication_warnings(old_server, OutboxSchema(), "p") == []  # type: ignore[arg-type]
    # The relay reads its table with SQL: the publication's filters are no matter to it.
    assert publication_warnings(filtered, OutboxSchema(), "pf",  # type: ignore[arg-type]
                                relay=True) == []


class _Columns:
    """Answers column_types()'s query with a table's (name, type) rows."""

    def __init__(self, **types: str) -> None:
        self.rows = list(types.items())

    def execute(self, query: Any, params: Any = None) -> _Columns:
        return self

    def fetchall(self) -> list[tuple[str, str]]:
        return self.rows


OUTBOX_TYPES = {"id": "uuid", "aggregatetype": "text", "aggregateid": "text", "type": "text",
                "payload": "jsonb", "headers": "jsonb", "created_at": "timestamp(6) without time "
                                                                     "zone"}


def test_init_says_what_an_existing_tables_payload_and_id_types_make_of_its_flags() -> None:
    # Review 50-d F7: a jsonb outbox with --payload-type bytea got "exists" and a note whose
    # advice dead-lettered every event; a bigint id, "exists", then write_event refused.
    bytea = OutboxSchema(payload_type="bytea")
    assert column_type_warnings(_Columns(**OUTBOX_TYPES), bytea) == [  # type: ignore[arg-type]
        "public.outbox's payload column payload is jsonb, not bytea (--payload-type): "
        "write_event and `outbox write` need the table's type (--payload-type jsonb), and "
        "router.yaml's source.payload_type auto or json (bytes dead-letters every event)"]
    binary = _Columns(**{**OUTBOX_TYPES, "payload": "bytea"})
    [warning] = column_type_warnings(binary, OutboxSchema())  # type: ignore[arg-type]
    assert "is bytea, not jsonb (--payload-type): write_event and `outbox write` need the " \
        "table's type (--payload-type bytea), and router.yaml's source.payload_type bytes" \
        in warning
    assert column_type_warnings(binary, bytea) == []  # type: ignore[arg-type]
    for id_type in ("uuid", "text", "character varying(255)"):
        fitting = _Columns(**{**OUTBOX_TYPES, "id": id_type})
        assert column_type_warnings(fitting, OutboxSchema()) == []  # type: ignore[arg-type]
    bigint = _Columns(**{**OUTBOX_TYPES, "id": "bigint"})
    assert column_type_warnings(bigint, OutboxSchema()) == [  # type: ignore[arg-type]
        "public.outbox's id column id is bigint: write_event and `outbox write` always write a "
        "UUID, which it refuses; write its rows with your own INSERT, or give the outbox a uuid "
        "id"]
    assert column_type_warnings(_Columns(), bytea) == []  # type: ignore[arg-type]


class _Authid:
    """A session that may not read pg_authid; keeps the statements it is sent."""

    def __init__(self) -> None:
        self.statements: list[str] = []
        self.pgconn = SimpleNamespace(encrypt_password=lambda *args: b"SCRAM-SHA-256$x")

    def execute(self, query: Any, params: Any = None) -> Any:
        self.statements.append(query if isinstance(query, str) else query.as_string(None))
        answer = (False,) if "pg_authid" in str(query) else ("scram-sha-256",)
        return SimpleNamespace(fetchone=lambda: answer)


def test_the_password_of_a_role_init_did_not_create_is_left_as_is() -> None:
    # Review 50-d F12: `--replication-role appuser` replaced an application role's password
    # (its clients locked out) and granted it REPLICATION, without asking.
    conn = _Authid()
    assert ensure_password(conn, "appuser", "pw", alter=False) == "left as is"  # type: ignore[arg-type]
    assert not any("ALTER ROLE" in statement for statement in conn.statements)
    assert ensure_password(conn, "appuser", "pw") == "set"  # type: ignore[arg-type]
    assert conn.statements[-1] == 'ALTER ROLE "appuser" WITH PASSWORD \'SCRAM-SHA-256$x\''
    [alter] = [step for step in init_steps(OutboxSchema(), CaptureSetup(replication_role="r"))
               if step.alters_role]
    assert alter.statement.as_string(None) == 'ALTER ROLE "r" WITH LOGIN REPLICATION'


def test_the_password_left_warning_claims_nothing_init_cannot_know() -> None:
    # Reread 50-i F8: on a re-run of the init that created the role, with pg_authid
    # unreadable, it said "init did not create the role".

    warning = PASSWORD_LEFT.format(role="debezium")
    assert warning.startswith("role debezium existed before this run: its password was left")
    assert "did not create" not in warning


@pytest.mark.parametrize("heartbeat", ["public.outbox", "outbox", '"public"."outbox"'])
def test_the_outbox_as_heartbeat_table_is_refused(heartbeat: str) -> None:
    # Review 50-d F15: it was accepted, and the replication role granted INSERT and UPDATE on
    # the outbox.
    with pytest.raises(ConfigError, match=r"field '--heartbeat-table': the heartbeat table is "
                                          r"the outbox table"):
        init_steps(OutboxSchema(), CaptureSetup(heartbeat_table=heartbeat,
                                                replication_role="debezium"))
    assert init_steps(OutboxSchema(), CaptureSetup(heartbeat_table="public.Outbox"))


class _Stop(Exception):
    pass


class _FirstStatement:
    """A connection that keeps the first statement sent in its transaction, and stops."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, Any]] = []

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        yield

    def execute(self, query: Any, params: Any = None) -> None:
        self.statements.append((query if isinstance(query, str) else query.as_string(None),
                                params))
        raise _Stop


def test_init_takes_its_lock_before_it_reads_or_creates_anything() -> None:
    # Review 50-d F11: inits run at once (one per replica) failed but one on CREATE SCHEMA /
    # TABLE IF NOT EXISTS racing on the catalog's unique index.
    conn = _FirstStatement()
    with pytest.raises(_Stop):
        init_outbox(conn, OutboxSchema(table="s9.outbox"),  # type: ignore[arg-type]
                    CaptureSetup("p9", "s9.hb", "role9"), replication_password="pw")
    assert conn.statements == [("SELECT pg_advisory_xact_lock(%s)", (INIT_LOCK,))]


def test_init_relay_tells_init_outbox_the_table_is_the_relays(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from cdc_router.cli import outbox as cli_outbox

    seen: dict[str, Any] = {}

    def fake_init(conn: Any, schema: Any, setup: Any, **kwargs: Any) -> InitReport:
        seen.update(kwargs)
        return InitReport((), None, ())

    class _Conn:
        info = SimpleNamespace(host="h", port=5432, dbname="db")  # init says where (QA 55-b)

        def commit(self) -> None:
            pass

    monkeypatch.setattr(cli_outbox, "database", lambda dsn: contextlib.nullcontext(_Conn()))
    monkeypatch.setattr(cli_outbox, "partitioned_by", lambda *args: False)
    monkeypatch.setattr(cli_outbox, "seq_not_null_fix", lambda *args: None)
    monkeypatch.setattr(cli_outbox, "rewrite_warning", lambda *args: None)  # an empty table
    monkeypatch.setattr(cli_outbox, "add_relay_columns", lambda *args: False)
    monkeypatch.setattr(cli_outbox, "init_outbox", fake_init)
    result = CliRunner().invoke(main, ["outbox", "init", "--dsn", "postgresql://x@h/db",
                                       "--relay", "--table", "public.relay_outbox"])

    assert result.exit_code == 0, result.output
    assert seen["relay"] is True


@pytest.mark.parametrize("publication", [_Publication(includes=False),
                                         _Publication(insert=False)])
def test_init_on_a_publication_that_captures_nothing_is_not_ready_exit_1(
        monkeypatch: pytest.MonkeyPatch, publication: _Publication) -> None:
    # QA 55-a F-5: a second table on an existing publication that leaves it out: "outbox
    # ready", exit 0, under the warning that Debezium captures nothing from it.
    from cdc_router.cli import outbox as cli_outbox

    warnings = publication_warnings(publication,  # type: ignore[arg-type]
                                    OutboxSchema(table="shop.legacy"), "shop_outbox")
    report = InitReport((("exists", "publication shop_outbox", False),), None,
                        ("public.outbox has no size check", *warnings))
    [problem] = report.not_ready
    assert problem in warnings and "Debezium captures" in problem

    class _Conn:
        info = SimpleNamespace(host="h", port=5432, dbname="db")  # init says where (QA 55-b)

        def commit(self) -> None:
            pass

    monkeypatch.setattr(cli_outbox, "database", lambda dsn: contextlib.nullcontext(_Conn()))
    monkeypatch.setattr(cli_outbox, "init_outbox", lambda *args, **kwargs: report)
    result = CliRunner().invoke(main, ["outbox", "init", "--dsn", "postgresql://x@h/db",
                                       "--table", "shop.legacy", "--publication", "shop_outbox"])
    assert result.exit_code == 1, result.output
    assert "outbox ready" not in result.output
    assert f"error: outbox not ready: {problem}\n" in result.stderr
    assert f"warning: {problem}" not in result.stderr  # said once, as the error
    assert "warning: public.outbox has no size check" in result.stderr
    assert "exists   publication shop_outbox" in result.stdout
    healthy = InitReport((), None, tuple(publication_warnings(
        _Publication(), OutboxSchema(), "p")))  # type: ignore[arg-type]
    assert healthy.not_ready == ()


# -- the CLI's edges (no database reached) ---------------------------------------------


def test_print_shows_sql_and_never_the_password() -> None:
    result = CliRunner().invoke(main, ["outbox", "init", "--print", "--replication-role",
                                       "debezium", "--replication-password", "hunter2"])

    assert result.exit_code == 0, result.output
    assert "CREATE TABLE IF NOT EXISTS" in result.stdout
    assert "hunter2" not in result.stdout
    assert ":'replication_password'" in result.stdout


def test_alter_role_without_a_password_is_one_line() -> None:
    # Without --alter-role the database says whether the role is created (QA 50-h F3).
    result = CliRunner().invoke(main, ["outbox", "init", "--replication-role", "debezium",
                                       "--alter-role"], env={"CDC_ROUTER_DB_PASSWORD": None})

    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert "--alter-role needs a password" in result.stderr


@pytest.mark.parametrize(("payload", "message"), [
    ("{oops", "not valid JSON"), ("42", "JSON object or array"),
    ('{"a": ' + "9" * 5000 + "}", "4300 digits"),  # review 50-d F17: tracebacks
    ("[" * 30_000 + "]" * 30_000, "nested deeper than the router reads (256 levels)")])
def test_write_checks_the_payload_before_connecting(payload: str, message: str) -> None:
    result = CliRunner().invoke(main, ["outbox", "write", "--dsn", "postgresql://x@127.0.0.1:9/db",
                                       "--aggregate-type", "A", "--aggregate-id", "1",
                                       "--type", "T", "--payload", payload])

    assert result.exit_code == 1
    assert message in result.stderr


def test_an_unreachable_database_is_one_line_without_the_password() -> None:
    result = CliRunner().invoke(main, ["outbox", "write", "--dsn",
                                       "postgresql://u:hunter2@127.0.0.1:9/db",
                                       "--aggregate-type", "A", "--aggregate-id", "1",
                                       "--type", "T", "--payload", "{}"])

    assert result.exit_code == 1
    assert result.stderr.startswith("error: Postgres at 127.0.0.1:9/db: ")
    assert "check --dsn (env CDC_ROUTER_PG_DSN)" in result.stderr
    assert result.stderr.count("\n") == 1
    assert "hunter2" not in result.stderr


@pytest.mark.parametrize("size", ["0", "-5"])
def test_purge_refuses_a_batch_size_below_one_before_connecting(size: str) -> None:
    # A batch of 0 deletes 0 rows, which is "less than a full batch" never: it looped forever.
    result = CliRunner().invoke(main, ["outbox", "purge", "--dsn", "postgresql://x@127.0.0.1:9/db",
                                       "--older-than", "7d", "--batch-size", size, "--yes"])

    assert result.exit_code == 2, result.output
    assert "--batch-size" in result.stderr
    assert "Postgres at" not in result.stderr


def test_purge_itself_refuses_a_batch_size_below_one() -> None:
    from cdc_router.outbox import purge

    with pytest.raises(ConfigError, match="batch_size"):
        purge(None, OutboxSchema(), 1000, 0)  # type: ignore[arg-type]


def test_a_missing_column_names_the_option_that_renames_it() -> None:
    # QA 48-a F-low-1: `outbox stats` on a table whose created_at is occurred_at said only
    # 'column "created_at" does not exist'.
    import psycopg

    from cdc_router.postgres import column_hint

    assert "--column DEFAULT=NAME" in column_hint(psycopg.errors.UndefinedColumn("no such"))
    assert column_hint(psycopg.errors.UndefinedTable("no such")) == ""


def test_init_refuses_an_existing_table_without_a_named_optional_column() -> None:
    # Review 53-c F10: init on a table without created_at (or headers) said "outbox ready",
    # and `outbox write` and `stats` then failed; as a required column's, it is refused.
    from cdc_router.outbox.existing import check_existing_table

    without = _Columns(**{k: v for k, v in OUTBOX_TYPES.items()
                          if k not in ("headers", "created_at")})
    with pytest.raises(ConfigError) as refused:
        check_existing_table(without, OutboxSchema())  # type: ignore[arg-type]
    assert str(refused.value) == (
        "field '--table': the table exists without its headers column 'headers' (the default "
        "name) (got 'public.outbox'); name the table's headers column with --column "
        "headers=NAME, or give --column headers= for a table without one")
    renamed = OutboxSchema().with_columns({"headers": None, "created_at": "ts"})
    with pytest.raises(ConfigError, match=r"without its created_at column 'ts' \(--column "
                                          r"created_at=ts\).*--column created_at= for a table"):
        check_existing_table(without, renamed)  # type: ignore[arg-type]
    absent = OutboxSchema().with_columns({"headers": None, "created_at": None})
    check_existing_table(without, absent)  # type: ignore[arg-type]
    check_existing_table(_Columns(**OUTBOX_TYPES), OutboxSchema())  # type: ignore[arg-type]
    check_existing_table(_Columns(), OutboxSchema())  # type: ignore[arg-type]  # a new table


class _Rows:
    """A connection that answers every query with `rows`, and keeps its parameters."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows
        self.params: list[Any] = []

    def execute(self, query: Any, params: Any = None) -> Any:
        self.params.append(params)
        return SimpleNamespace(fetchall=lambda: self.rows)


def test_a_debezium_role_that_cannot_read_the_new_outbox_is_warned() -> None:
    # QA 65-b F-6: a second outbox without --replication-role; the first init's role could not
    # read it, and only Connect's log said so (the connector RUNNING, no raw topic).
    from cdc_router.outbox.role import unread_by_debezium_roles
    conn = _Rows([("debezium", True, None), ("reader", False, "public.outbox"),
                  ("app", False, None)])
    warnings = unread_by_debezium_roles(conn,  # type: ignore[arg-type]
                                        "public.nats_outbox", "nats_pub", "public.hb", None)
    assert conn.params == [{"table": '"public"."nats_outbox"', "publication": "nats_pub",
                            "heartbeat": '"public"."hb"'}]
    assert warnings == [
        "role debezium (LOGIN REPLICATION; writes public.hb, as Debezium's role does) cannot "
        "read public.nats_outbox: a connector logging in as debezium says RUNNING while its "
        "snapshot fails `permission denied for table` (in Connect's log only) and no raw topic "
        "appears; if it is this outbox's connector's role, run init again with "
        "--replication-role debezium, or `GRANT SELECT ON \"public\".\"nats_outbox\" TO "
        "\"debezium\"`",
        "role reader (LOGIN REPLICATION; reads public.outbox of publication nats_pub, as "
        "Debezium's role does) cannot read public.nats_outbox: a connector logging in as "
        "reader says RUNNING while its snapshot fails `permission denied for table` (in "
        "Connect's log only) and no raw topic appears; if it is this outbox's connector's "
        "role, run init again with --replication-role reader, or `GRANT SELECT ON "
        "\"public\".\"nats_outbox\" TO \"reader\"`"]


def test_no_other_role_is_warned_of_when_the_init_names_the_connector_s_role() -> None:
    # Review 66 of lw66 9ab94e1: two pipelines, each with a role of its own (least privilege),
    # both writing the default heartbeat table; the second's init, naming its role, warned of
    # the first's and told to grant it the second's outbox.
    from cdc_router.outbox.role import unread_by_debezium_roles
    conn = _Rows([("dbz_a", True, None)])
    assert unread_by_debezium_roles(conn,  # type: ignore[arg-type]
                                    "public.b", "pub_b", "public.debezium_heartbeat",
                                    "dbz_b") == []
    assert conn.params == []  # not even asked
