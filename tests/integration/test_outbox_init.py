"""`outbox init` against what exists already, on the stack's Postgres (review 50-d)."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator

import psycopg
import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.ops.database import probe_database
from cdc_router.outbox import CaptureSetup, OutboxSchema, init_outbox
from tests.integration.support import StackEndpoints, unique

pytestmark = pytest.mark.integration


@pytest.fixture
def schema(stack: StackEndpoints) -> Iterator[str]:
    """A schema of its own for the test's tables; dropped with them, and the publications
    and roles named after it, at the end."""
    name = unique("init")
    yield name
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        for (publication,) in conn.execute("SELECT pubname FROM pg_publication WHERE pubname "
                                           "LIKE %s", (f"{name}%",)).fetchall():
            conn.execute(f"DROP PUBLICATION {publication}")
        for (role,) in conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE %s",
                                    (f"{name}%",)).fetchall():
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def _init(stack: StackEndpoints, *args: str,
          env: dict[str, str | None] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["outbox", "init", "--dsn", stack.postgres_dsn, *args],
                                env=env)
    return result.exit_code, result.stdout, result.stderr


def test_a_row_filter_or_column_list_on_the_outbox_is_said_by_init_and_status(
        stack: StackEndpoints, schema: str) -> None:
    # Review 50-d F13: init said "outbox ready (nothing changed)", status nothing, and the rows
    # the filter left out never reached Kafka.
    table = f"{schema}.outbox"
    assert _init(stack, "--table", table, "--publication", f"{schema}_p")[0] == 0
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE PUBLICATION {schema}_f FOR TABLE {table} WHERE "
                     "(aggregatetype <> 'Secret') WITH (publish = 'insert')")
        conn.execute(f"CREATE PUBLICATION {schema}_c FOR TABLE {table} (id, aggregatetype, "
                     "aggregateid, type, payload) WITH (publish = 'insert')")
    code, out, err = _init(stack, "--table", table, "--publication", f"{schema}_f")
    assert code == 0 and out.endswith("outbox ready (nothing changed)\n")
    assert f"warning: publication {schema}_f publishes {table} only WHERE (aggregatetype " \
           "<> 'Secret'::text): the rows it filters out never reach Kafka" in err, err
    code, _, err = _init(stack, "--table", table, "--publication", f"{schema}_c")
    assert code == 0 and f"warning: publication {schema}_c publishes only the columns id, " \
        f"aggregatetype, aggregateid, type, payload of {table}: every event lacks headers, " \
        "created_at" in err, err
    # Only the publication's lines: a role other tests on the stack made (debezium, writing
    # the default heartbeat table) is warned of when it cannot read this table (QA 65-b F-6).
    assert "warning: publication" not in _init(stack, "--table", table, "--publication",
                                               f"{schema}_p")[2]

    outbox = OutboxSchema(table=table)
    _, filtered, _ = probe_database(stack.postgres_dsn, [], f"{schema}_f", outbox)
    assert filtered.row_filter_problem is not None and filtered.column_list_problem is None
    assert "only WHERE (aggregatetype <> 'Secret'::text)" in filtered.row_filter_problem
    _, listed, _ = probe_database(stack.postgres_dsn, [], f"{schema}_c", outbox)
    assert listed.row_filter_problem is None and listed.column_list_problem is not None
    _, plain, _ = probe_database(stack.postgres_dsn, [], f"{schema}_p", outbox)
    assert (plain.row_filter_problem, plain.column_list_problem) == (None, None)


def test_inits_run_at_once_all_succeed(stack: StackEndpoints, schema: str) -> None:
    # Review 50-d F11: six at once (one per replica at a deploy): one ok, five UniqueViolation
    # on pg_namespace_nspname_index.
    conns = [psycopg.connect(stack.postgres_dsn) for _ in range(6)]
    barrier, outcomes = threading.Barrier(len(conns)), []

    def init(conn: psycopg.Connection[object]) -> None:
        barrier.wait()
        try:
            init_outbox(conn, OutboxSchema(table=f"{schema}.outbox"),
                        CaptureSetup(f"{schema}_p", f"{schema}.hb", f"{schema}_r"),
                        replication_password="pw")
            conn.commit()
            outcomes.append("ok")
        except psycopg.Error as error:
            outcomes.append(repr(error))

    threads = [threading.Thread(target=init, args=(conn,)) for conn in conns]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for conn in conns:
        conn.close()
    assert outcomes == ["ok"] * len(conns)


def test_an_existing_tables_payload_and_id_types_are_compared_with_the_flags(
        stack: StackEndpoints, schema: str) -> None:
    # Review 50-d F7: init said "exists" and, for --payload-type bytea on a jsonb outbox, a note
    # whose advice (source.payload_type bytes) dead-letters every event.
    table, publication = f"{schema}.outbox", f"{schema}_p"
    assert _init(stack, "--table", table, "--publication", publication)[0] == 0
    code, out, err = _init(stack, "--table", table, "--publication", publication,
                           "--payload-type", "bytea")
    assert code == 0 and "note:" not in out and "bytea" not in out
    assert f"warning: {table}'s payload column payload is jsonb, not bytea (--payload-type)" \
        in err, err
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {schema}.legacy (id bigint PRIMARY KEY, aggregatetype text, "
                     "aggregateid text, type text, payload bytea, headers jsonb, created_at "
                     "timestamp)")
    # A publication of its own: the first one leaves legacy out, which init now refuses to
    # call ready (QA 55-a F-5; this test's concern is the column types).
    code, out, err = _init(stack, "--table", f"{schema}.legacy", "--publication",
                           f"{publication}_legacy")
    assert code == 0 and "note: a bytea payload needs `source: {payload_type: bytes}`" in out, \
        out + err
    assert f"warning: {schema}.legacy's id column id is bigint: write_event and `outbox " \
        "write` always write a UUID" in err, err
    assert f"{schema}.legacy's payload column payload is bytea, not jsonb" in err, err


def test_an_existing_role_is_left_as_is_unless_asked(stack: StackEndpoints,
                                                     schema: str) -> None:
    # Review 50-d F12: `--replication-role appuser` set an application role's password (its
    # clients locked out at their next connection) and gave it REPLICATION, without asking.
    role, table = f"{schema}_app", f"{schema}.outbox"
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'app' CREATEDB")
    args = ("--table", table, "--publication", f"{schema}_p", "--heartbeat-table",
            f"{schema}.hb", "--replication-role", role, "--replication-password", "dbzpw")
    code, out, err = _init(stack, *args)
    assert code == 0, err
    assert f"left     role {role} LOGIN REPLICATION" in out
    assert f"password of role {role}: left as is" in out
    assert f"warning: role {role} exists and lacks LOGIN or REPLICATION" in err
    assert f"warning: role {role} existed before this run: its password was left as is" in err
    app = psycopg.conninfo.make_conninfo(stack.postgres_dsn, user=role, password="app")
    with psycopg.connect(app) as conn:  # its own password still works
        assert conn.execute("SELECT rolreplication FROM pg_roles WHERE rolname = %s",
                            (role,)).fetchone() == (False,)
        assert conn.execute("SELECT has_table_privilege(%s, 'SELECT')",  # the grants: asked
                            (table,)).fetchone() == (True,)
    code, out, err = _init(stack, *args, "--alter-role")
    assert code == 0 and f"password of role {role}: set" in out and "warning" not in err, err
    dbz = psycopg.conninfo.make_conninfo(stack.postgres_dsn, user=role, password="dbzpw")
    with psycopg.connect(dbz) as conn:
        assert conn.execute("SELECT rolreplication FROM pg_roles WHERE rolname = %s",
                            (role,)).fetchone() == (True,)
    # A role init creates gets both, and a rerun with the same password changes nothing.
    new = (*args[:-3], f"{schema}_dbz", "--replication-password", "pw")
    code, out, _ = _init(stack, *new)
    assert f"created  role {schema}_dbz" in out and f"password of role {schema}_dbz: set" in out
    code, out, err = _init(stack, *new)
    assert f"password of role {schema}_dbz: unchanged" in out and "warning" not in err, err
    # QA 50-h F3: a role left as is needs no password (it was asked for, only to compare);
    # one init creates does, and nothing is made without it.
    code, out, err = _init(stack, *args[:-2], env={"CDC_ROUTER_DB_PASSWORD": None})
    assert code == 0 and f"password of role {role}" not in out, err
    code, _, err = _init(stack, *args[:-3], f"{schema}_nopw",
                         env={"CDC_ROUTER_DB_PASSWORD": None})
    assert code == 1 and f"--replication-role {schema}_nopw needs a password: init creates " \
        "it" in err, err
    with psycopg.connect(stack.postgres_dsn) as conn:
        assert conn.execute("SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = %s)",
                            (f"{schema}_nopw",)).fetchone() == (False,)


@pytest.mark.skipif(shutil.which("psql") is None, reason="needs psql")
def test_the_printed_script_leaves_an_existing_role_as_is_unless_alter_role(
        stack: StackEndpoints, schema: str) -> None:
    # Review 53-c F14: `--print | psql -v replication_password=...` reset an application
    # role's password (its clients locked out) and gave it REPLICATION, unlike the live init.
    role = f"{schema}_app"
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'app'")
    args = ("--table", f"{schema}.outbox", "--publication", f"{schema}_p", "--heartbeat-table",
            f"{schema}.hb", "--replication-role", role)

    def print_and_run(*more: str) -> subprocess.CompletedProcess[str]:
        code, script, err = _init(stack, *args, *more, "--print")
        assert code == 0, err
        return subprocess.run(["psql", "-X", "-q", "-v", "replication_password=dbzpw", "-v",
                               "ON_ERROR_STOP=1", stack.postgres_dsn], input=script,
                              capture_output=True, text=True, check=True, timeout=60)

    ran = print_and_run()
    assert f"role {role} exists: its password and attributes were left as is" in ran.stderr
    assert f"role {role} exists and lacks LOGIN or REPLICATION" in ran.stderr
    app = psycopg.conninfo.make_conninfo(stack.postgres_dsn, user=role, password="app")
    with psycopg.connect(app) as conn:  # its own password still works, and it got its grants
        assert conn.execute("SELECT rolreplication, has_table_privilege(%s, 'SELECT') FROM "
                            "pg_roles WHERE rolname = %s", (f"{schema}.outbox", role)
                            ).fetchone() == (False, True)
    print_and_run("--alter-role")
    dbz = psycopg.conninfo.make_conninfo(stack.postgres_dsn, user=role, password="dbzpw")
    with psycopg.connect(dbz) as conn:
        assert conn.execute("SELECT rolreplication FROM pg_roles WHERE rolname = %s",
                            (role,)).fetchone() == (True,)


def test_the_outbox_as_heartbeat_table_is_refused_and_nothing_made(stack: StackEndpoints,
                                                                   schema: str) -> None:
    # Review 50-d F15: "outbox ready", with the role granted INSERT and UPDATE on the outbox.
    code, _, err = _init(stack, "--table", f"{schema}.outbox", "--heartbeat-table",
                         f"{schema}.outbox", "--replication-role", f"{schema}_r",
                         "--replication-password", "pw", "--publication", f"{schema}_p")
    assert code == 1 and err.startswith("error: field '--heartbeat-table': the heartbeat table "
                                        "is the outbox table"), err
    with psycopg.connect(stack.postgres_dsn) as conn:
        assert conn.execute("SELECT to_regclass(%s), EXISTS (SELECT FROM pg_roles WHERE "
                            "rolname = %s)", (f"{schema}.outbox", f"{schema}_r")
                            ).fetchone() == (None, False)


def test_a_schema_publication_with_no_table_yet_gets_a_publication_of_its_own(
        stack: StackEndpoints, schema: str) -> None:
    # Review 64 (low): init on a `FOR TABLES IN SCHEMA other` publication, no table in that
    # schema yet, advised ADD TABLE to it: that pipeline's connector would capture this outbox.
    other = f"{schema}_b"
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {other}")
        conn.execute(f"CREATE PUBLICATION {schema}_s FOR TABLES IN SCHEMA {other} "
                     "WITH (publish = 'insert')")
    try:
        code, out, err = _init(stack, "--table", f"{schema}.outbox", "--publication",
                               f"{schema}_s")
        assert code == 1, out + err
        assert f"publication {schema}_s does not include {schema}.outbox: Debezium captures " \
            f"nothing from it; it publishes every table of schema {other}, another pipeline's " \
            "most likely: give this outbox a publication of its own, `cdc-router outbox init " \
            f"--table {schema}.outbox --publication cdc_router_{schema}_outbox`" in out + err, \
            out + err
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {other} CASCADE")


def test_a_second_outbox_the_debezium_role_cannot_read_is_warned(stack: StackEndpoints,
                                                                 schema: str) -> None:
    # QA 65-b F-6: the second outbox's init, without --replication-role, granted the first
    # init's role nothing; its connector said RUNNING while the snapshot failed `permission
    # denied`, in Connect's log alone.
    role, heartbeat = f"{schema}_dbz", f"{schema}.hb"
    code, _, err = _init(stack, "--table", f"{schema}.outbox", "--publication", f"{schema}_a",
                         "--heartbeat-table", heartbeat, "--replication-role", role,
                         "--replication-password", "pw")
    assert code == 0 and "warning" not in err, err
    second = ("--table", f"{schema}.second", "--publication", f"{schema}_b",
              "--heartbeat-table", heartbeat)
    code, out, err = _init(stack, *second)
    assert code == 0 and "outbox ready" in out, err
    assert f"warning: role {role} (LOGIN REPLICATION; writes {heartbeat}, as Debezium's role " \
        f"does) cannot read {schema}.second: a connector logging in as {role} says RUNNING " \
        "while its snapshot fails `permission denied for table`" in err, err
    code, out, err = _init(stack, *second, "--replication-role", role)
    assert code == 0 and f"granted  SELECT on {schema}.second to {role}" in out, out
    assert "warning" not in err, err
    # Review 66: a fourth outbox with a role of its own, the heartbeat table shared: the
    # first role is another pipeline's, not warned of.
    code, out, err = _init(stack, "--table", f"{schema}.fourth", "--publication",
                           f"{schema}_d", "--heartbeat-table", heartbeat,
                           "--replication-role", f"{schema}_dbz4", "--replication-password", "pw")
    assert code == 0 and "outbox ready" in out and "warning" not in err, err
    # A third outbox in the second's publication: its role reads the second there.
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {schema}.third (LIKE {schema}.second INCLUDING ALL)")
        conn.execute(f"ALTER PUBLICATION {schema}_b ADD TABLE {schema}.third")
    code, _, err = _init(stack, "--table", f"{schema}.third", "--publication", f"{schema}_b",
                         "--heartbeat-table", f"{schema}.hb2")
    assert f"warning: role {role} (LOGIN REPLICATION; reads {schema}.second of publication " \
        f"{schema}_b, as Debezium's role does) cannot read {schema}.third" in err, err
