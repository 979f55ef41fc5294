"""The Kafka Connect client against a scripted transport, connector files, plans and the CLI."""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.config.redact import redact
from cdc_router.connect import (
    ConfigChange,
    ConnectClient,
    ConnectorAction,
    ConnectorStatus,
    TaskStatus,
    UnknownConnectorError,
    diff_config,
    load_spec,
    parse_spec,
    plain_secrets,
    plan,
)
from cdc_router.connect.checks import reading_problems
from cdc_router.errors import ConfigError, ConnectError

URL = "http://connect.test:8083"
CONNECTOR_FILE = Path(__file__).resolve().parents[2] / "connectors" / "outbox-connector.json"
# A Debezium outbox connector with Debezium's own EventRouter SMT, as its docs write it.
EVENTROUTER_FILE = Path(__file__).parent / "fixtures" / "connectors" / "eventrouter-connector.json"
Handler = Callable[[httpx.Request], httpx.Response]


class FakeClock:
    """time.monotonic and time.sleep for wait_for_state, without waiting."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def client(handler: Handler, clock: FakeClock | None = None, **kwargs: Any) -> ConnectClient:
    clock = clock or FakeClock()
    return ConnectClient(URL, transport=httpx.MockTransport(handler), sleep=clock.sleep,
                         clock=clock, **kwargs)


def status_json(name: str, state: str, *tasks: str, trace: str | None = None) -> dict[str, Any]:
    return {"name": name, "type": "source",
            "connector": {"state": state, "worker_id": "w:8083"},
            "tasks": [{"id": index, "state": task, "worker_id": "w:8083",
                       **({"trace": trace} if task == "FAILED" else {})}
                      for index, task in enumerate(tasks)]}


# -- the client ---------------------------------------------------------------------------


def test_constructing_a_client_makes_no_request() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"unexpected request {request.url}")

    with client(refuse) as connect:
        assert connect.url == URL


def test_reads_parse_connects_answers() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/connectors" and not request.url.params:
            return httpx.Response(200, json=["b", "a"])
        if request.url.path == "/connectors":
            assert request.url.params["expand"] == "status"
            return httpx.Response(200, json={"x": {"status": status_json("x", "RUNNING",
                                                                           "RUNNING")}})
        if request.url.path == "/connectors/x/config":
            return httpx.Response(200, json={"name": "x", "tasks.max": "1"})
        return httpx.Response(200, json=status_json("x", "RUNNING", "RUNNING", "FAILED",
                                                    trace="boom\n at here"))

    connect = client(answer)

    assert connect.list() == ["a", "b"]
    assert [status.name for status in connect.list_statuses()] == ["x"]
    assert connect.get_config("x") == {"name": "x", "tasks.max": "1"}
    status = connect.get_status("x")
    assert status.state == "RUNNING"
    assert [(task.id, task.state) for task in status.tasks] == [(0, "RUNNING"), (1, "FAILED")]
    assert status.tasks[1].trace == "boom\n at here"
    assert not status.reached("RUNNING")


def test_put_config_tells_created_from_updated() -> None:
    bodies = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        assert (request.method, request.url.raw_path) == ("PUT", b"/connectors/my%20c/config")
        return httpx.Response(201 if len(bodies) == 1 else 200, json={})

    connect = client(answer)

    assert connect.put_config("my c", {"k": "v"}) is True
    assert connect.put_config("my c", {"k": "w"}) is False
    assert bodies == [{"k": "v"}, {"k": "w"}]


def test_validate_returns_the_per_field_errors() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == ("/connector-plugins/io.debezium.connector.postgresql."
                                    "PostgresConnector/config/validate")
        assert json.loads(request.content)["connector.class"].endswith("PostgresConnector")
        return httpx.Response(200, json={"error_count": 1, "configs": [
            {"value": {"name": "snapshot.mode", "errors": ["Value must be one of initial"]}},
            {"value": {"name": "slot.name", "errors": []}},
            {"definition": {"name": "internal.x"}, "value": None},
        ]})

    verdict = client(answer).validate("io.debezium.connector.postgresql.PostgresConnector",
                                      {"snapshot.mode": "sometimes"})

    assert not verdict.ok
    assert verdict.errors == {"snapshot.mode": ("Value must be one of initial",)}


@pytest.mark.parametrize(("tasks", "query"), [
    ({}, "includeTasks=false&onlyFailed=false"),
    ({"include_tasks": True, "only_failed": True}, "includeTasks=true&onlyFailed=true"),
    ({"include_tasks": True}, "includeTasks=true&onlyFailed=false"),
])
def test_restart_passes_the_task_options(tasks: dict[str, bool], query: str) -> None:
    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.url.query.decode()))
        return httpx.Response(204)

    client(answer).restart("c", **tasks)

    assert seen == [("POST", "/connectors/c/restart", query)]


def test_pause_resume_stop_reset_offsets_delete_use_their_endpoints() -> None:
    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        return httpx.Response(202 if request.method == "PUT" else 204)

    connect = client(answer)
    connect.pause("c")
    connect.resume("c")
    connect.stop("c")
    connect.reset_offsets("c")
    connect.delete("c")

    assert seen == [("PUT", "/connectors/c/pause"), ("PUT", "/connectors/c/resume"),
                    ("PUT", "/connectors/c/stop"), ("DELETE", "/connectors/c/offsets"),
                    ("DELETE", "/connectors/c")]


def test_basic_auth_is_sent() -> None:
    headers = []

    def answer(request: httpx.Request) -> httpx.Response:
        headers.append(request.headers["Authorization"])
        return httpx.Response(200, json=[])

    client(answer, auth=("admin", "s3cret")).list()

    assert headers == ["Basic " + base64.b64encode(b"admin:s3cret").decode()]


def test_an_unknown_connector_is_named() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error_code": 404, "message": "Connector x not found"})

    with pytest.raises(UnknownConnectorError) as caught:
        client(answer).get_status("x")

    assert str(caught.value) == f"unknown connector 'x' (Kafka Connect at {URL})"


@pytest.mark.parametrize("page", [
    httpx.Response(404, text="<html>Not Found</html>"),
    httpx.Response(404, json={"error_code": 40401, "message": "Subject not found."}),
])
def test_a_404_that_is_not_connects_is_a_wrong_url_not_an_unknown_connector(
        page: httpx.Response) -> None:
    # Review 48-b F16: a web server or the schema registry at a wrong --url answered 404:
    # `diff` planned a create (exit 2), `status` and `delete` said "unknown connector".
    with pytest.raises(ConnectError, match=r"answered 404 to GET /connectors/x/status without "
                       r"Kafka Connect's error JSON: is this Kafka Connect's REST URL \(or a "
                       r"worker still starting\)\?"):
        client(lambda request: page).get_status("x")
    with pytest.raises(ConnectError, match=r"answered 404 to GET /connectors without Kafka "):
        client(lambda request: page).list()  # QA 48-g F1: no connector named, same cause


def test_an_error_answer_carries_status_and_connects_message_on_one_line() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error_code": 400, "message":
                                         "Connector configuration is invalid:\nA\nB\n"})

    with pytest.raises(ConnectError) as caught:
        client(answer).put_config("c", {})

    assert str(caught.value) == ("Kafka Connect answered 400 to PUT /connectors/c/config: "
                                 "Connector configuration is invalid:; A; B")


def test_an_unreachable_connect_names_the_url() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    with pytest.raises(ConnectError) as caught:
        client(refuse).list()

    assert str(caught.value) == (f"Kafka Connect unreachable at {URL}: "
                                 "[Errno 111] Connection refused")


def test_a_password_in_the_url_is_masked_in_every_error() -> None:
    # Review 31: httpx sends a URL's user:password as basic auth, and the errors printed it.
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    def unknown(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error_code": 404, "message": "not found"})

    url = "http://admin:s3cret@connect.test:8083"
    errors = []
    for handler, call in ((refuse, "list"), (unknown, "get_status")):
        with pytest.raises(ConnectError) as caught:
            made = ConnectClient(url, transport=httpx.MockTransport(handler))
            made.list() if call == "list" else made.get_status("x")
        errors.append(str(caught.value))
    with pytest.raises(ConnectError) as caught:
        ConnectClient("http://admin:s3cret@connect.test:abc").list()
    errors.append(str(caught.value))
    assert all("s3cret" not in error and "admin:" in error for error in errors), errors
    assert "--url" in errors[-1]


@pytest.mark.parametrize("call", ["list", "list_statuses", "list_configs", "get", "get_config",
                                  "get_status", "validate"])
@pytest.mark.parametrize(("body", "content_type"), [
    (b"# HELP python_info\n", "text/plain; version=0.0.4"),  # a Prometheus port
    (b"<html>Sign in</html>", "text/html"),  # a login page in front of Connect
    (b"null", "application/json"),
    (b"[1, 2]", "application/json"),
    (b'{"name": 5, "connector": 7, "tasks": [{"id": "x"}]}', "application/json"),
])
def test_an_answer_that_is_not_connects_json_is_one_line_naming_the_url(
        call: str, body: bytes, content_type: str) -> None:
    # Review 31: a JSONDecodeError (or TypeError) traceback, and `status` exited 1, "warning".
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": content_type})

    made = client(answer)
    calls: dict[str, Callable[[], Any]] = {
        "list": made.list, "list_statuses": made.list_statuses,
        "list_configs": made.list_configs, "get": lambda: made.get("c"),
        "get_config": lambda: made.get_config("c"), "get_status": lambda: made.get_status("c"),
        "validate": lambda: made.validate("io.debezium.X", {})}
    if call == "get_config" and body.startswith(b"{"):
        calls[call]()  # a config is any object
        return
    with pytest.raises(ConnectError) as caught:
        calls[call]()
    assert URL in str(caught.value) and "Kafka Connect's" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_timeout_is_one_line_too() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(ConnectError, match=r"did not answer GET /connectors within 30s "
                       r"\(ReadTimeout\): is the worker stuck or overloaded\? try again"):
        client(slow).list()


def test_reads_wait_30_s_and_writes_100_s() -> None:
    # Review 48-b F8: `connectors status` on a stopped worker waited 100 s, the timeout argued
    # for writes that Connect forwards to its leader (90 s).
    waits: dict[str, float] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        waits[request.method] = request.extensions["timeout"]["read"]
        return httpx.Response(200, json={"name": "c"} if request.method == "GET" else {})

    made = client(answer)
    made.get_config("c")
    made.put_config("c", {})
    assert waits == {"GET": 30.0, "PUT": 100.0}


def test_a_conflict_during_a_rebalance_is_retried() -> None:
    answers = iter([httpx.Response(409, json={"message": "rebalance in progress"}),
                    httpx.Response(200, json=["c"])])
    clock = FakeClock()

    assert client(lambda request: next(answers), clock).list() == ["c"]
    assert clock.now == 1.0


def test_a_500_saying_a_rebalance_is_expected_is_retried_like_a_conflict() -> None:
    # CI rehearsal, session 54: `connectors apply` failed on 'Kafka Connect answered 500 to
    # GET /connectors/x/config: Request cannot be completed because a rebalance is expected'.
    answers = iter([httpx.Response(500, json={"error_code": 500, "message": "Request cannot be "
                                              "completed because a rebalance is expected"}),
                    httpx.Response(200, json=["c"])])
    clock = FakeClock()

    assert client(lambda request: next(answers), clock).list() == ["c"]
    assert clock.now == 1.0


def test_wait_for_state_polls_until_every_task_runs() -> None:
    answers = iter([httpx.Response(404, json={"error_code": 404, "message": "No status found"}),
                    httpx.Response(200, json=status_json("c", "RUNNING")),
                    httpx.Response(200, json=status_json("c", "RUNNING", "UNASSIGNED")),
                    httpx.Response(200, json=status_json("c", "RUNNING", "RUNNING"))])

    status = client(lambda request: next(answers)).wait_for_state("c", "RUNNING", 30)

    assert status.reached("RUNNING")


def test_wait_for_state_polls_through_a_worker_that_refuses_connections() -> None:
    # QA 64-a F-8: `connectors wait NAME --timeout 90` right after a worker's restart failed
    # in 4 s with "Kafka Connect unreachable ... Connection refused".
    # Then its web server answered a plain 404 for 6 s, then Connect's own 404, then 200.
    clock = FakeClock()
    answers = iter(["refused"] * 3 + [
        httpx.Response(404, text="<html><title>Error 404 Not Found</title></html>"),
        httpx.Response(404, json={"error_code": 404, "message": "No status found for c"}),
        httpx.Response(200, json=status_json("c", "RUNNING", "RUNNING"))])

    def answer(request: httpx.Request) -> httpx.Response:
        if (next_answer := next(answers)) == "refused":
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        assert isinstance(next_answer, httpx.Response)
        return next_answer

    status = client(answer, clock).wait_for_state("c", "RUNNING", 30)
    assert status.reached("RUNNING") and clock.now == 5.0

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    with pytest.raises(ConnectError, match=r"^Kafka Connect unreachable at http://connect\.test"):
        client(down, clock).wait_for_state("c", "RUNNING", 5)


def test_wait_for_state_says_the_first_refusal_at_once() -> None:
    # Review 64 (low): a wrong --url (a refused port, a web server's 404) waited the whole
    # --timeout without a word; a worker restarting looks the same, so the wait goes on, and
    # the first such answer is said at once.
    clock = FakeClock()
    said: list[tuple[float, str]] = []

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    with pytest.raises(ConnectError):
        client(down, clock).wait_for_state(
            "c", "RUNNING", 5, unanswered=lambda error: said.append((clock.now, str(error))))
    assert said == [(0.0, "Kafka Connect unreachable at http://connect.test:8083: [Errno 111] "
                          "Connection refused")]


def test_connectors_wait_on_a_refused_port_says_so_before_its_timeout() -> None:
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ran = CliRunner().invoke(main, ["connectors", "--url", f"http://127.0.0.1:{port}", "wait",
                                    "x", "--timeout", "1.5"])
    assert ran.exit_code == 1, ran.output
    assert ran.stderr.startswith(f"waiting: Kafka Connect unreachable at http://127.0.0.1:"
                                 f"{port}: ") and "asked again until --timeout 1.5s (a worker " \
        "starting answers so for a while; check --url if it is not one)\n" in ran.stderr, \
        ran.stderr


def test_wait_for_state_polls_a_host_name_no_resolver_knows_for_its_grace_only() -> None:
    # Review 64: since F-8, a mistyped --url host waited the whole --timeout before failing.
    # Review 65: failing at once, it failed through a restart whose worker's name Docker's DNS
    # or a StatefulSet's headless service drops meanwhile: the first 30 s are polled, said.
    clock = FakeClock()
    said: list[tuple[float, str]] = []

    def unknown(request: httpx.Request) -> httpx.Response:
        try:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        except socket.gaierror as error:
            raise httpx.ConnectError(str(error), request=request) from error

    with pytest.raises(ConnectError, match=r"^Kafka Connect unreachable at .*not known"):
        client(unknown, clock).wait_for_state(
            "c", "RUNNING", 60, unanswered=lambda error: said.append((clock.now, str(error))))
    assert clock.now == 30.0 and [at for at, _ in said] == [0.0]
    with pytest.raises(ConnectError, match=r"not known"):  # a shorter --timeout bounds it
        client(unknown, clock).wait_for_state("c", "RUNNING", 4)
    assert clock.now == 34.0
    # Review 66: a Connect pod's start takes 40-90 s: `connectors wait --name-grace` sets it.
    with pytest.raises(ConnectError, match=r"not known"):
        client(unknown, clock).wait_for_state("c", "RUNNING", 300, name_grace_s=90)
    assert clock.now == 34.0 + 90
    calls = iter(range(100))

    def back(request: httpx.Request) -> httpx.Response:  # the name back after 10 s
        if next(calls) < 10:
            return unknown(request)
        return httpx.Response(200, json=status_json("c", "RUNNING", "RUNNING"))

    assert client(back, clock).wait_for_state("c", "RUNNING", 60).state == "RUNNING"

    def for_now(request: httpx.Request) -> httpx.Response:
        try:
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        except socket.gaierror as error:
            raise httpx.ConnectError(str(error), request=request) from error

    with pytest.raises(ConnectError, match="Temporary failure"):
        client(for_now, clock).wait_for_state("c", "RUNNING", 3)
    assert clock.now >= 3.0


def test_wait_for_running_fails_fast_on_a_failed_task() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=status_json(
            "c", "RUNNING", "FAILED", trace="org.apache.kafka.connect.errors.ConnectException: "
                                           "slot in use\n\tat io.debezium..."))

    with pytest.raises(ConnectError) as caught:
        client(answer).wait_for_state("c", "RUNNING", 30)

    assert str(caught.value) == ("connector 'c' task 0 FAILED: org.apache.kafka.connect.errors."
                                 "ConnectException: slot in use")


def test_wait_for_state_gives_up_at_the_timeout_saying_where_it_stands() -> None:
    clock = FakeClock()

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=status_json("c", "RUNNING", "RUNNING"))

    with pytest.raises(ConnectError) as caught:
        client(answer, clock).wait_for_state("c", "PAUSED", 5, poll_interval=1)

    assert str(caught.value) == ("connector 'c' not PAUSED after 5s "
                                 "(connector RUNNING, task 0 RUNNING)")
    assert clock.now == 5


@pytest.mark.parametrize(("state", "tasks", "expected"), [
    ("RUNNING", (), False), ("RUNNING", ("RUNNING",), True), ("PAUSED", ("PAUSED",), True),
    ("PAUSED", ("RUNNING",), False), ("STOPPED", (), True),
    ("PAUSED", (), True),  # QA 64-a F-5: paused from STOPPED, it has no task to pause
    # it65: STOPPED while the status topic still listed its task RUNNING.
    ("STOPPED", ("RUNNING",), False), ("STOPPED", ("PAUSED",), False),
    ("STOPPED", ("UNASSIGNED",), True),
])
def test_reached_needs_the_connector_and_all_tasks(state: str, tasks: tuple[str, ...],
                                                   expected: bool) -> None:
    status = ConnectorStatus.from_json(status_json("c", state, *tasks))

    assert status.reached(state) is expected


# -- connector files, diffs and plans -----------------------------------------------------


def test_the_outbox_connector_file_expands_with_local_defaults() -> None:
    spec = load_spec(CONNECTOR_FILE, {})
    config = spec.config

    assert spec.name == "outbox-connector"
    assert config["database.password"] == "${env:CDC_ROUTER_DB_PASSWORD}"
    assert plain_secrets(config) == []
    assert (config["database.hostname"], config["database.port"], config["database.user"],
            config["database.dbname"]) == ("127.0.0.1", "15432", "debezium", "postgres")
    assert config["plugin.name"] == "pgoutput"
    assert config["publication.autocreate.mode"] == "disabled"
    assert config["table.include.list"] == "public.outbox"
    assert config["topic.prefix"] == "outbox"
    assert config["tombstones.on.delete"] == "false"
    assert config["exactly.once.support"] == "required"
    assert config["value.converter.schemas.enable"] == "false"
    assert "public.debezium_heartbeat" in config["heartbeat.action.query"]
    assert all("${" not in value for key, value in config.items() if key != "database.password")


def test_the_outbox_connector_file_follows_the_environment() -> None:
    spec = load_spec(CONNECTOR_FILE, {"CONNECTOR_NAME": "orders", "SLOT_NAME": "orders_slot",
                                      "REPLICATION_FACTOR": "3", "RAW_TOPIC_PARTITIONS": "6"})

    assert spec.name == "orders"
    assert spec.config["slot.name"] == "orders_slot"
    assert spec.config["topic.creation.default.replication.factor"] == "3"
    assert spec.config["topic.creation.default.partitions"] == "6"


def test_the_snapshot_of_one_plain_table_reads_it_in_the_order_its_rows_were_written() -> None:
    # QA, session 29: the snapshot's heap order put one aggregate's backlog out of order.
    config = load_spec(CONNECTOR_FILE, {"OUTBOX_TABLE": "billing.outbox"}).config
    assert config["snapshot.select.statement.overrides"] == "billing.outbox"
    assert config["snapshot.select.statement.overrides.billing.outbox"] == (
        'SELECT * FROM "billing"."outbox" ORDER BY age(xmin) DESC, cmin::text::bigint, ctid')


@pytest.mark.parametrize("connector_class", ["PostgresConnector", "Postgres"])
@pytest.mark.parametrize("tables", ["public.outbox", "public\\.outbox"])
def test_an_alias_of_the_class_and_an_escaped_dot_get_the_ordered_snapshot_too(
        connector_class: str, tables: str) -> None:
    # Review 31: Connect takes both aliases and the regex's escaped dot; the order was skipped.
    text = json.dumps({"name": "c", "connector.class": connector_class,
                       "table.include.list": tables})
    config = parse_spec(text, {}, source="c.json").config
    assert config["snapshot.select.statement.overrides"] == "public.outbox"
    assert "ORDER BY age(xmin)" in config["snapshot.select.statement.overrides.public.outbox"]


def test_several_plain_tables_each_get_the_ordered_snapshot() -> None:
    # QA 54-a F-2: a second table in the include list dropped the outbox's ordered statement,
    # and `connectors apply` planned its removal without a word.
    config = load_spec(CONNECTOR_FILE, {"OUTBOX_TABLE": "public.outbox,billing.outbox"}).config
    assert config["snapshot.select.statement.overrides"] == "public.outbox,billing.outbox"
    assert config["snapshot.select.statement.overrides.billing.outbox"] == (
        'SELECT * FROM "billing"."outbox" ORDER BY age(xmin) DESC, cmin::text::bigint, ctid')
    assert "ORDER BY age(xmin)" in config["snapshot.select.statement.overrides.public.outbox"]
    assert not [problem for problem in reading_problems(config) if "snapshot" in problem]


@pytest.mark.parametrize("tables", ["public.out.*", "Sales.OutBox", "public.a,Sales.OutBox"])
def test_no_snapshot_statement_for_a_regex_or_a_mixed_case_name_and_apply_warns(
        tables: str) -> None:
    config = load_spec(CONNECTOR_FILE, {"OUTBOX_TABLE": tables}).config
    assert not any(key.startswith("snapshot.select") for key in config)
    [said] = [problem for problem in reading_problems(config) if "snapshot" in problem]
    # Review 54-k F-7: the entry at fault named, and that the plain ones get none either.
    odd = tables.split(",")[-1]
    assert f"table.include.list has '{odd}', not a plain lower-case" in said
    assert "none of the tables gets an ordered statement" in said


def test_a_snapshot_statement_of_the_users_own_is_kept() -> None:
    text = json.dumps({"name": "c", "connector.class": "io.debezium.connector.postgresql."
                       "PostgresConnector", "table.include.list": "public.outbox",
                       "snapshot.select.statement.overrides": "public.outbox",
                       "snapshot.select.statement.overrides.public.outbox": "SELECT 1"})
    config = parse_spec(text, {}, source="c.json").config
    assert config["snapshot.select.statement.overrides.public.outbox"] == "SELECT 1"


def test_a_flat_config_and_scalar_values_are_accepted_as_connect_strings() -> None:
    spec = parse_spec('{"name": "c", "connector.class": "C", "tasks.max": 1, "x": true}', {},
                      source="c.json")

    assert spec.config == {"name": "c", "connector.class": "C", "tasks.max": "1", "x": "true"}


@pytest.mark.parametrize(("text", "message"), [
    ("{", "not valid JSON"),
    ("[]", "expected a JSON object"),
    ('{"config": {"connector.class": "C"}}', "needs a non-empty name"),
    ('{"name": "c", "config": {}}', "connector.class"),
    ('{"name": "c", "config": {"connector.class": "C", "name": "d"}}', "differs"),
    ('{"name": "c", "config": {"connector.class": "C", "x": {"y": 1}}}', "must be a string"),
    ('{"name": "c", "config": {"connector.class": "C"}, "tasks": []}', "unexpected top-level"),
    ("[" * 100_000 + "]" * 100_000, "not valid JSON: nested too deeply"),  # QA 33-b: tracebacks
    ('{"name": 1' + "0" * 4300 + "}", "not valid JSON: a number has more than 4,300 digits"),
])
def test_bad_connector_files_name_the_file(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse_spec(text, {}, source="bad.json")

    assert str(caught.value).startswith("bad.json")


def test_diff_ignores_the_name_and_masked_secrets() -> None:
    desired = {"connector.class": "C", "database.password": "${env:P}", "a": "1", "new": "x"}
    deployed = {"name": "c", "connector.class": "C", "database.password": "********", "a": "2",
                "gone": "y"}

    assert diff_config(desired, deployed) == (
        ConfigChange("a", "2", "1"), ConfigChange("gone", "y", None),
        ConfigChange("new", None, "x"))


def test_a_changed_provider_reference_is_a_change() -> None:
    assert diff_config({"database.password": "${env:B}"}, {"database.password": "${env:A}"}) \
        == (ConfigChange("database.password", "${env:A}", "${env:B}"),)


def test_plan_creates_updates_or_leaves_alone() -> None:
    deployed: dict[str, dict[str, str]] = {"same": {"name": "same", "connector.class": "C"},
                                           "other": {"name": "other", "connector.class": "D"}}

    def answer(request: httpx.Request) -> httpx.Response:
        name = request.url.path.split("/")[2]
        if name not in deployed:
            return httpx.Response(404, json={"error_code": 404, "message": "not found"})
        return httpx.Response(200, json=deployed[name])

    connect = client(answer)
    plans = [plan(connect, parse_spec(json.dumps({"name": name, "connector.class": "C"}), {},
                                      source="f")) for name in ("same", "other", "new")]

    assert [item.action for item in plans] == [
        ConnectorAction.UNCHANGED, ConnectorAction.UPDATE, ConnectorAction.CREATE]
    assert plans[1].changes == (ConfigChange("connector.class", "D", "C"),)


def test_secrets_are_redacted_unless_they_are_provider_references() -> None:
    assert redact("database.password", "hunter2") == "*****"
    assert redact("database.password", "${file:/s.properties:pw}") == "${file:/s.properties:pw}"
    assert redact("sasl.jaas.config", "x required password=y;") == "*****"
    assert redact("slot.name", "s") == "s"
    assert plain_secrets({"database.password": "hunter2", "a.secret": "${env:S}"}) == [
        "database.password"]


# -- the CLI's error lines ----------------------------------------------------------------


def test_an_unset_placeholder_is_one_line_naming_variable_and_file(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"name": "c", "config": {"connector.class": "C", "slot.name": "${SLOT}"}}')

    result = CliRunner().invoke(main, ["connectors", "--url", "http://127.0.0.1:9",
                                       "diff", "-f", str(path)], env={"SLOT": None})

    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert "${SLOT} is not set and has no default" in result.stderr
    assert str(path) in result.stderr


def test_an_unreachable_connect_is_one_line_with_the_url() -> None:
    result = CliRunner().invoke(main, ["connectors", "--url", "http://127.0.0.1:9", "list"])

    assert result.exit_code == 1
    assert result.stderr.startswith("error: Kafka Connect unreachable at http://127.0.0.1:9")
    assert result.stderr.count("\n") == 1


# -- the CLI against a scripted Connect ---------------------------------------------------


class ScriptedConnect:
    """A tiny in-memory Connect: configs by name, statuses, and a validation verdict."""

    def __init__(self, configs: dict[str, dict[str, str]],
                 errors: dict[str, list[str]] | None = None, task_state: str = "RUNNING") -> None:
        self.configs = configs
        self.errors = errors or {}
        self.task_state = task_state  # of task 1; task 0 runs
        self.states_after_put: list[str] = []  # task 1's, one per status read after a PUT
        self.reads_after_put: list[str] = []
        self.puts: list[str] = []
        self.connector_state = "RUNNING"
        self.resets: list[str] = []
        self.restarts: list[str] = []
        self.trace = "io.debezium.DebeziumException: publication missing\n\tat x.y(Z.java:1)"

    def __call__(self, request: httpx.Request) -> httpx.Response:
        parts = request.url.path.strip("/").split("/")
        if parts[0] == "connector-plugins":
            return httpx.Response(200, json={"configs": [
                {"value": {"name": key, "errors": messages}}
                for key, messages in self.errors.items()]})
        if parts == ["connectors"] and "expand" not in request.url.params:
            return httpx.Response(200, json=sorted(self.configs))
        if parts == ["connectors"]:  # ?expand=info
            return httpx.Response(200, json={name: {"info": {"name": name, "config": config}}
                                             for name, config in self.configs.items()})
        name = parts[1]
        if request.method == "PUT" and parts[-1] == "config":
            self.puts.append(name)
            self.reads_after_put = list(self.states_after_put)
            created = name not in self.configs
            self.configs[name] = {**json.loads(request.content), "name": name}
            return httpx.Response(201 if created else 200, json={})
        if name not in self.configs:
            return httpx.Response(404, json={"error_code": 404,
                                                "message": f"Connector {name} not found"})
        if request.method == "DELETE" and parts[-1] == "offsets":
            if self.connector_state != "STOPPED":
                return httpx.Response(400, json={"message": "Connectors must be in the STOPPED "
                                                 "state ... issuing a 'PUT' request"})
            self.resets.append(name)
            return httpx.Response(200, json={"message": "offsets reset"})
        if request.method == "POST" and parts[-1] == "restart":
            self.restarts.append(name)
            return httpx.Response(202, json={})
        if parts[-1] == "status" and self.reads_after_put:
            self.task_state = self.reads_after_put.pop(0)
        if parts[-1] == "status":
            return httpx.Response(200, json=status_json(
                name, self.connector_state, "RUNNING", self.task_state, trace=self.trace))
        return httpx.Response(200, json=self.configs[name])


def run_cli(monkeypatch: pytest.MonkeyPatch, connect: ScriptedConnect,
            *args: str) -> Any:
    def build(url: str, **kwargs: Any) -> ConnectClient:
        return ConnectClient(url, transport=httpx.MockTransport(connect), **kwargs)

    monkeypatch.setattr("cdc_router.cli.connectors.ConnectClient", build)
    return CliRunner().invoke(main, ["connectors", *args])


def connector_file(tmp_path: Path, **config: str) -> str:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "c", "config": {"connector.class": "C", **config}}))
    return str(path)


def test_status_prints_the_failed_tasks_trace_and_exits_2(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Left open since stop 46: a FAILED task exited 0, so a probe could not alert on it.
    connect = ScriptedConnect({"c": {"name": "c"}}, task_state="FAILED")
    result = run_cli(monkeypatch, connect, "status", "c")
    as_json = run_cli(monkeypatch, connect, "status", "c", "-o", "json")
    connect.task_state = "RUNNING"
    running = run_cli(monkeypatch, connect, "status", "c")

    assert (result.exit_code, as_json.exit_code, running.exit_code) == (2, 2, 0), result.output
    assert json.loads(as_json.stdout)["tasks"][1]["state"] == "FAILED"
    assert "task 1 trace:\nio.debezium.DebeziumException: publication missing" in result.stdout
    assert result.stdout.endswith("\n\nconnector 'c' task 1 FAILED: io.debezium.Debezium"
                                  "Exception: publication missing; fix the cause, then "
                                  "`cdc-router connectors restart c --tasks failed`\n")
    assert "fix the cause" not in as_json.stdout


def test_apply_shows_the_plan_masks_secrets_and_puts(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    connect = ScriptedConnect({"c": {"name": "c", "connector.class": "C", "a": "1",
                                     "database.password": "old"}})
    path = connector_file(tmp_path, a="2", **{"database.password": "new"})

    result = run_cli(monkeypatch, connect, "apply", "-f", path, "--yes", "--wait", "0.3")

    assert result.exit_code == 0, result.output
    assert "c (" in result.stdout and "): update (2 keys)" in result.stdout
    assert "  ~ a: 1 -> 2" in result.stdout
    assert "  ~ database.password: ***** -> *****" in result.stdout
    assert "old" not in result.stdout and "new" not in result.stdout
    assert "database.password is plain text" in result.stderr
    assert result.stdout.rstrip().endswith("c: updated\nc: RUNNING (2 task(s))")
    assert connect.puts == ["c"]


def test_apply_fails_when_a_task_fails_right_after_the_put(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    # QA 46-a F2: a publication that does not exist passes Connect's validation; the task
    # failed seconds after `created`, and apply had exited 0.
    connect = ScriptedConnect({}, task_state="FAILED")
    result = run_cli(monkeypatch, connect, "apply", "-f", connector_file(tmp_path), "--yes")
    assert result.exit_code == 1
    assert "c: created" in result.stdout
    assert result.stderr.startswith("error: connector 'c' task 1 FAILED: io.debezium."
                                    "DebeziumException: publication missing; fix the cause, "
                                    "then `cdc-router connectors restart c --tasks failed`")
    assert "\tat x.y" not in result.stderr  # one line, not the Java trace
    skipped = run_cli(monkeypatch, connect, "apply", "-f", connector_file(tmp_path, a="2"),
                      "--yes", "--wait", "0")
    assert skipped.exit_code == 0, skipped.output



def test_apply_names_the_missing_publication_and_how_to_create_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Stop 58: Debezium's trace names no publication, and the line said "fix the cause".
    connect = ScriptedConnect({}, task_state="FAILED")
    connect.trace = ("org.apache.kafka.connect.errors.ConnectException: Publication autocreation "
                     "is disabled, please create one and restart the connector.\n\tat io."
                     "debezium.connector.postgresql.connection.PostgresReplicationConnection."
                     "initPublication(PostgresReplicationConnection.java:242)")
    path = connector_file(tmp_path, **{"publication.name": "orders_pub",
                                       "table.include.list": "app.outbox"})
    result = run_cli(monkeypatch, connect, "apply", "-f", path, "--yes")
    shown = run_cli(monkeypatch, connect, "status", "c")  # the same line below the trace
    assert shown.exit_code == 2 and "publication orders_pub does not exist" in shown.stdout
    assert result.exit_code == 1
    assert " ".join(result.stderr.split()) == (
        "error: connector 'c' task 1 FAILED: org.apache.kafka.connect.errors.ConnectException: "
        "Publication autocreation is disabled, please create one and restart the connector.; "
        "publication orders_pub does not exist and the connector does not create it "
        "(publication.autocreate.mode disabled): create it with `cdc-router outbox init "
        "--publication orders_pub --table app.outbox` (with this database's --dsn), then "
        "`cdc-router connectors restart c --tasks failed`; if its slot existed already (the "
        "publication was dropped), follow README runbook 'the slot was dropped or its WAL "
        "removed' from its step 2 instead (the whole trace: `cdc-router connectors status c`)")


def test_apply_of_a_fix_is_not_failed_by_the_trace_from_before_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Review 46-3: the status read right after the PUT still showed the old FAILED task.
    connect = ScriptedConnect({"c": {"name": "c", "connector.class": "C"}}, task_state="FAILED")
    still = run_cli(monkeypatch, connect, "apply", "-f", connector_file(tmp_path, a="1"),
                    "--yes", "--wait", "0.2")
    assert still.exit_code == 1 and "task 1 FAILED" in still.stderr  # not fixed: at the end
    connect.states_after_put = ["FAILED", "FAILED", "RUNNING"]  # the restart takes a while
    fixed = run_cli(monkeypatch, connect, "apply", "-f", connector_file(tmp_path, a="2"),
                    "--yes", "--wait", "0.6")
    assert fixed.exit_code == 0, fixed.output
    assert fixed.stdout.rstrip().endswith("c: RUNNING (2 task(s))")


def test_apply_of_an_unchanged_connector_warns_of_its_failed_task(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    connect = ScriptedConnect({"c": {"name": "c", "connector.class": "C"}}, task_state="FAILED")
    result = run_cli(monkeypatch, connect, "apply", "-f", connector_file(tmp_path), "--yes")
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip().endswith("nothing to apply")
    assert result.stderr.startswith("warning: c is unchanged but task 1 FAILED: io.debezium.")


def test_apply_of_a_running_connector_is_not_done_at_its_old_tasks_running(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # QA 46-c: right after the PUT the old task still runs; the new one failed 1.7 s later,
    # and apply had said RUNNING, exit 0.
    connect = ScriptedConnect({"c": {"name": "c", "connector.class": "C"}})
    connect.states_after_put = ["RUNNING", "FAILED"]
    result = run_cli(monkeypatch, connect, "apply", "-f", connector_file(tmp_path, a="1"),
                     "--yes", "--wait", "3")
    assert result.exit_code == 1, result.output
    assert "task 1 FAILED" in result.stderr


def test_without_a_terminal_apply_plans_and_asks_for_yes_instead_of_applying(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # QA, session 25: every prompt was skipped when stdin was no terminal (cron, CI, a pipe):
    # `echo n | cdc-router connectors delete x` deleted it.
    connect = ScriptedConnect({"c": {"name": "c", "connector.class": "C", "a": "1"}})
    result = run_cli(monkeypatch, connect, "apply", "-f", connector_file(tmp_path, a="2"))
    assert result.exit_code == 1
    assert "  ~ a: 1 -> 2" in result.stdout
    # QA 36-c: "field '--yes'" read as a config field.
    assert result.stderr == ("error: no terminal to confirm on; pass --yes to go on without "
                             "asking, or --dry-run to only plan\n")
    assert connect.puts == []


def test_without_a_terminal_a_command_without_dry_run_hints_only_yes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    connect = ScriptedConnect({"c": {"name": "c", "connector.class": "C"}})
    result = run_cli(monkeypatch, connect, "delete", "c")
    assert result.exit_code == 1
    assert result.stderr == ("error: no terminal to confirm on; pass --yes to go on without "
                             "asking\n")  # `delete` has no --dry-run to point to
    assert "c" in connect.configs


def test_apply_puts_nothing_when_connect_rejects_a_field(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    connect = ScriptedConnect({}, errors={"snapshot.mode": ["Value must be one of initial"]})

    result = run_cli(monkeypatch, connect, "apply", "-f", connector_file(tmp_path))

    assert result.exit_code == 1
    assert "c.json: c: snapshot.mode: Value must be one of initial" in result.stderr
    assert connect.puts == []


def test_apply_sends_debeziums_eventrouter_placeholder_verbatim(
        monkeypatch: pytest.MonkeyPatch) -> None:
    connect = ScriptedConnect({})

    result = run_cli(monkeypatch, connect, "apply", "--yes", "--wait", "0", "-f",
                     str(EVENTROUTER_FILE))

    assert result.exit_code == 0, result.output
    assert connect.puts == ["orders-outbox"]
    sent = connect.configs["orders-outbox"]
    assert sent["transforms.outbox.route.topic.replacement"] == "outbox.event.${routedByValue}"
    assert sent["database.password"] == "${env:CDC_ROUTER_DB_PASSWORD}"
    assert sent["database.hostname"] == "127.0.0.1"
    again = run_cli(monkeypatch, connect, "diff", "-f", str(EVENTROUTER_FILE))
    assert again.exit_code == 0, again.output  # what Connect stores is what the file says


def test_diff_warns_of_a_snapshot_it_cannot_order_as_apply_does(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Review 54-k F-7: spec.py said `diff` warned too; only `apply` did.
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "c", "config": {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "table.include.list": "public.outbox,Sales.OutBox"}}))
    result = run_cli(monkeypatch, ScriptedConnect({}), "diff", "-f", str(path))
    assert "table.include.list has 'Sales.OutBox'" in result.stderr, result.output
    assert "physical order" not in result.stdout


def test_diff_exit_codes_follow_terraform(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    connect = ScriptedConnect({"c": {"name": "c", "connector.class": "C"}})

    same = run_cli(monkeypatch, connect, "diff", "-f", connector_file(tmp_path))
    differs = run_cli(monkeypatch, connect, "diff", "-f", connector_file(tmp_path, x="1"))

    assert (same.exit_code, differs.exit_code) == (0, 2)
    assert "  + x = 1" in differs.stdout
    # Review 31: click's usage errors exit 2 too, and a typo read as "differs"; review 31-2:
    # the group's own too (an option of the group, an unknown command).
    for usage in (["diff"], ["diff", "-f", connector_file(tmp_path), "-o", "yaml"]):
        mistaken = run_cli(monkeypatch, connect, *usage)
        assert mistaken.exit_code == 1, mistaken.output
    for usage in (["connectors", "--bogus", "diff"], ["connectors", "dif", "-f", "x"]):
        mistaken = CliRunner().invoke(main, usage)
        assert mistaken.exit_code == 1, mistaken.output


@pytest.mark.parametrize("url", ["http://127.0.0.1:abc", "http://[::1"])
def test_a_url_httpx_cannot_parse_is_one_line_naming_the_setting(url: str) -> None:
    # httpx.InvalidURL came out of every `connectors` command and `status` as a traceback (QA,
    # session 25).
    with pytest.raises(ConnectError, match=r"not valid .*--connect-url, or CDC_ROUTER_"):
        ConnectClient(url).list()


@pytest.mark.parametrize(("url", "reason"), [
    ("127.0.0.1:8083", "no http:// or https:// before the host"), ("", "empty"),
    ("http://", "no host"), ("ftp://h:1", "scheme ftp: not http or https")])
def test_a_url_without_scheme_or_host_is_invalid_not_unreachable(url: str, reason: str) -> None:
    # Review 46-2 F13: "Kafka Connect unreachable at 127.0.0.1:8083: Request URL is missing an
    # 'http://' or 'https://' protocol", and for `--url http://` a failed name lookup.
    with pytest.raises(ConnectError, match=rf"URL '.*' is not valid \({reason}\): give its "
                       r"REST URL, e\.g\. http://127\.0\.0\.1:8083 .*--connect-url"):
        ConnectClient(url).list()


def test_a_connector_file_not_in_utf8_or_with_a_key_twice_is_one_line(tmp_path: Path) -> None:
    # QA, session 25: Latin-1 text was a UnicodeDecodeError traceback; a second "config" was
    # kept silently, the first one dropped.
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(b'{"name": "q", "config": {"connector.class": "x", "a": "caf\xe9"}}')
    with pytest.raises(ConfigError, match=r"not UTF-8: byte 0xe9 at position 58.*as UTF-8"):
        load_spec(latin1, {})
    twice = '{"name": "q", "config": {"connector.class": "x"}, "config": {"a": "b"}}'
    with pytest.raises(ConfigError, match=r"a key appears twice in one object \(got \['config'\]"):
        parse_spec(twice, {}, source="f.json")


_PG = {"connector.class": "io.debezium.connector.postgresql.PostgresConnector",
       "database.hostname": "db", "database.port": "5432", "database.dbname": "shop"}


def test_apply_refuses_a_connector_on_a_slot_another_one_streams_from(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # QA, session 28: a second connector on a used slot was "configuration valid" and RUNNING,
    # while its task failed on "replication slot is active" and the two stole changes.
    connect = ScriptedConnect({"orders": {"name": "orders", **_PG, "slot.name": "s"}})
    taken = run_cli(monkeypatch, connect, "apply", "--yes", "-f",
                    connector_file(tmp_path, **_PG, **{"slot.name": "s"}))
    assert taken.exit_code == 1
    assert "c: slot.name 's' on db:5432/shop is already used by connector orders" in \
        taken.stderr
    assert "give each connector its own slot.name (SLOT_NAME)" in taken.stderr
    assert connect.puts == []
    # QA 48-g F2: a slot's name is unique in its cluster, whatever database it streams (the
    # second connector's task FAILED on "replication slot ... already exists").
    elsewhere = run_cli(monkeypatch, connect, "apply", "--yes", "--wait", "0", "-f", connector_file(
        tmp_path, **{**_PG, "database.dbname": "billing"}, **{"slot.name": "s"}))
    assert elsewhere.exit_code == 1 and "already used by connector orders" in elsewhere.stderr
    assert connect.puts == []


def test_delete_hints_the_slot_drop_only_when_no_other_connector_streams_from_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shared = {"a": {"name": "a", **_PG, "slot.name": "s"},
              "b": {"name": "b", **_PG, "slot.name": "s"}}
    first = run_cli(monkeypatch, ScriptedConnect(dict(shared)), "delete", "a", "--yes")
    assert "replication slot 's' stays: connector b streams from it" in first.stderr
    assert "pg_drop_replication_slot" not in first.stderr
    alone = run_cli(monkeypatch, ScriptedConnect({"a": shared["a"]}), "delete", "a", "--yes")
    # QA 64-a F-6: deleted to be applied again, the connector resumes from its slot.
    assert "stays and retains WAL until dropped: keep it if you apply a again (it resumes " \
           "there, from the offsets Connect keeps for the name;" in alone.stderr
    # QA 46-a F3: a slot the connector never made (its task failed first) is not there to
    # drop: the hint's statement drops it only if it is.
    assert ("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE "
            "slot_name = 's' AND NOT active;") in alone.stderr



def test_reset_offsets_of_a_running_connector_says_how_to_stop_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 48-b F9: Connect's 400 was relayed, advising a 'PUT' to its /stop endpoint.
    connect = ScriptedConnect({"c": {"name": "c"}})
    result = run_cli(monkeypatch, connect, "reset-offsets", "c", "--yes")
    assert result.exit_code == 1
    assert result.stderr == ("error: connector 'c' is RUNNING; only a STOPPED connector's "
                             "offsets can be reset: `cdc-router connectors stop c`, `cdc-router "
                             "connectors wait c --state STOPPED`, then reset-offsets again\n")
    assert connect.resets == []
    connect.connector_state = "STOPPED"
    done = run_cli(monkeypatch, connect, "reset-offsets", "c", "--yes")
    assert done.exit_code == 0, done.output
    assert connect.resets == ["c"]


def test_apply_of_a_postgres_connector_points_to_status_for_its_table(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Review 48-b F10: a connector on a table that does not exist, or is outside its
    # publication, was RUNNING, exit 0, and nothing said to look further.
    result = run_cli(monkeypatch, ScriptedConnect({}), "apply", "--yes", "--wait", "0.3", "-f",
                     connector_file(tmp_path, **_PG))
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip().endswith("c: RUNNING (2 task(s))")
    assert result.stderr.rstrip().endswith(
        "hint: Connect checked c's config, not its table: `cdc-router status -c router.yaml "
        "--connector c` checks its slot, publication and table")
    other = run_cli(monkeypatch, ScriptedConnect({}), "apply", "--yes", "--wait", "0", "-f",
                    connector_file(tmp_path))
    assert other.exit_code == 0 and "hint:" not in other.stderr  # not a Postgres connector


def test_a_failure_names_debeziums_root_cause_not_only_its_wrapper() -> None:
    # QA 48-a F-low-10, review 48-b F12: apply's line gave "Creation of replication slot
    # failed"; the cause (the default plugin decoderbufs, a key misspelt) was in status only.
    trace = ("io.debezium.DebeziumException: Creation of replication slot failed\n\tat x.y(Z)\n"
             "Caused by: org.postgresql.util.PSQLException: ERROR: could not access file "
             "\"decoderbufs\": No such file or directory\n\tat a.b(C)")
    status = ConnectorStatus("c", "RUNNING", "w", (TaskStatus(0, "FAILED", "w", trace),))
    assert status.failure() == (
        "task 0 FAILED: io.debezium.DebeziumException: Creation of replication slot failed "
        "(root cause: org.postgresql.util.PSQLException: ERROR: could not access file "
        "\"decoderbufs\": No such file or directory)")


def test_apply_refuses_a_topic_prefix_another_debezium_connector_has(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # QA 63-b F-1: two teams' connectors, each on its own database and slot, both left on the
    # shipped topic.prefix: the second's events went into the first's raw topic, which the
    # first team's router routed (after 2 min of Debezium's metrics retries).
    deployed = {**_PG, "slot.name": "orders_slot", "topic.prefix": "outbox",
                "table.include.list": "public.outbox"}
    connect = ScriptedConnect({"orders": {"name": "orders", **deployed}})
    mine = {**_PG, "database.dbname": "billing", "slot.name": "billing_slot",
            "topic.prefix": "outbox", "table.include.list": "public.outbox"}
    taken = run_cli(monkeypatch, connect, "apply", "--yes", "--wait", "0", "-f",
                    connector_file(tmp_path, **mine))
    assert taken.exit_code == 1
    assert ("c: topic.prefix 'outbox' is already used by connector orders: both write the raw "
            "topic outbox.public.outbox, so each pipeline's router routes the other's "
            "events") in taken.stderr
    assert "give each connector its own slot.name (SLOT_NAME) and topic.prefix " \
        "(TOPIC_PREFIX)" in taken.stderr
    assert connect.puts == []
    other_table = run_cli(monkeypatch, connect, "apply", "--yes", "--wait", "0", "-f",
                          connector_file(tmp_path, **{**mine, "table.include.list": "b.outbox"}))
    assert other_table.exit_code == 1 and "metrics and heartbeat topic" in other_table.stderr
    assert connect.puts == []
    own = run_cli(monkeypatch, connect, "apply", "--yes", "--wait", "0", "-f",
                  connector_file(tmp_path, **{**mine, "topic.prefix": "billing"}))
    assert "topic.prefix" not in own.stderr, own.stderr


def test_restart_of_a_stopped_connector_says_that_only_resume_starts_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 64-a F-4: "restart requested", exit 0, and the connector stayed STOPPED (Connect
    # answers 202 RESTARTING); a PAUSED one restarts PAUSED.
    connect = ScriptedConnect({"c": {"name": "c"}})
    connect.connector_state = "STOPPED"
    stopped = run_cli(monkeypatch, connect, "restart", "c", "--tasks", "all")
    assert stopped.exit_code == 1
    assert stopped.stderr == ("error: connector 'c' is STOPPED: a restart leaves it STOPPED, "
                              "with no task; `cdc-router connectors resume c` starts it\n")
    assert connect.restarts == []
    connect.connector_state = "PAUSED"
    paused = run_cli(monkeypatch, connect, "restart", "c")
    assert paused.exit_code == 0, paused.output
    assert paused.stdout == "c: restart requested\n"
    assert paused.stderr == ("hint: c is PAUSED and restarts PAUSED: `cdc-router connectors "
                             "resume c` starts it\n")
    connect.connector_state = "RUNNING"
    running = run_cli(monkeypatch, connect, "restart", "c")
    assert (running.exit_code, running.stderr) == (0, "")
    assert connect.restarts == ["c", "c"]


def test_apply_to_a_stopped_or_paused_connector_says_it_captures_nothing_until_resumed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # QA 64-a F-7: "updated", then "STOPPED (0 task(s))", and "nothing to apply" said nothing:
    # Connect keeps a connector's STOPPED or PAUSED state through a config update.
    connect = ScriptedConnect({"c": {"name": "c", "connector.class": "C"}})
    connect.connector_state = "STOPPED"
    updated = run_cli(monkeypatch, connect, "apply", "--yes", "-f",
                      connector_file(tmp_path, **{"heartbeat.interval.ms": "7000"}))
    assert updated.exit_code == 0, updated.output
    assert "c: updated\nc: STOPPED (2 task(s))\n" in updated.stdout
    held = "hint: c is STOPPED and captures nothing until `cdc-router connectors resume c`\n"
    assert held in updated.stderr
    connect.connector_state = "PAUSED"
    unchanged = run_cli(monkeypatch, connect, "apply", "--yes", "-f",
                        connector_file(tmp_path, **{"heartbeat.interval.ms": "7000"}))
    assert "nothing to apply" in unchanged.stdout
    assert unchanged.stderr == held.replace("STOPPED", "PAUSED")
    connect.connector_state = "RUNNING"
    running = run_cli(monkeypatch, connect, "apply", "--yes", "-f",
                      connector_file(tmp_path, **{"heartbeat.interval.ms": "7000"}))
    assert running.stderr == ""


def test_reset_offsets_says_what_the_resume_will_do_by_snapshot_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 64-a F-10: "offsets reset; it stays STOPPED", and the resume re-snapshotted 40,000
    # rows (or, with no_data, nothing): the command said neither.
    config = {"name": "c", "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
              "table.include.list": "public.outbox", "snapshot.mode": "when_needed"}
    connect = ScriptedConnect({"c": config})
    connect.connector_state = "STOPPED"
    done = run_cli(monkeypatch, connect, "reset-offsets", "c", "--yes")
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith(
        "on resume, Debezium snapshots public.outbox again (snapshot.mode when_needed), then "
        "streams: the router drops the rows it delivered within dedup.window_ms")
    config["snapshot.mode"] = "no_data"
    quiet = run_cli(monkeypatch, connect, "reset-offsets", "c", "--yes")
    assert quiet.stdout.startswith("on resume, Debezium snapshots nothing (snapshot.mode "
                                   "no_data): it streams from its slot")
    assert connect.resets == ["c", "c"]
