"""One-line errors at the CLI's edge: a Kafka error that no command turned into its own, and a
--metrics-port in use."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaError, KafkaException

from cdc_router.cli import dlq, main
from cdc_router.cli.run import property_refused, run_until_stopped
from cdc_router.config.config_warnings import config_warnings
from cdc_router.config.load import load_config
from cdc_router.config.model import RouterConfig
from cdc_router.errors import ConfigError, DeliveryError, FatalKafkaError, MemberFenced
from cdc_router.kafka.logs import librdkafka_logger
from cdc_router.router.metrics import RouterMetrics

CONFIG = ("kafka: {bootstrap_servers: '127.0.0.1:1'}\nsource: {topics: [raw]}\n"
          "routes: [{topic: x}]\n")


class _Unreachable:
    """A reader whose metadata request fails, as TopicReader's does with no broker."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    said = "Connection refused"  # the RepeatFilter passes a line once a minute

    def read_to_end(self, **kwargs: Any) -> Any:
        librdkafka_logger().error("FAIL [cdc-router#consumer-1] [thrd:127.0.0.1:1/bootstrap]: "
                                  f"Connect to ipv4#127.0.0.1:1 failed: {self.said}")
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: Local: "
                                        "Broker transport failure"))

    def close(self) -> None:
        pass

EXAMPLE = Path(__file__).resolve().parents[2] / "cdc_router" / "examples" / "router.yaml"


def test_a_kafka_error_no_command_caught_is_one_line_naming_what_to_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "router.yaml").write_text(CONFIG)
    monkeypatch.setattr(dlq, "TopicReader", _Unreachable)

    result = CliRunner().invoke(main, ["dlq", "list", "-c", str(tmp_path / "router.yaml")])

    assert result.exit_code == 1
    # Review 53-c F5: it named no address, and librdkafka's FAIL line came before it.
    assert result.stderr == (
        "error: a Kafka call to 127.0.0.1:1 failed: _TRANSPORT: Failed to get metadata: Local: "
        "Broker transport failure; check kafka.bootstrap_servers and the security settings, and "
        "that the cluster is up\n")
    assert "Traceback" not in result.output
    assert "FAIL [cdc-router#consumer-1]" not in caplog.text
    assert librdkafka_logger().propagate, "the next command (or `run`) shows them again"
    monkeypatch.setattr(_Unreachable, "said", "Connection reset")
    CliRunner().invoke(main, ["-v", "dlq", "list", "-c", str(tmp_path / "router.yaml")])
    assert "FAIL [cdc-router#consumer-1]" in caplog.text  # --verbose shows them


def test_dlq_list_limit_is_bounded_on_the_command_line(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 48-e F11: -n 99999999999999999999 was an OverflowError traceback from deque().
    (tmp_path / "router.yaml").write_text(CONFIG)
    monkeypatch.setattr(dlq, "TopicReader", _Unreachable)
    result = CliRunner().invoke(main, ["dlq", "list", "-c", str(tmp_path / "router.yaml"),
                                       "-n", "99999999999999999999"])
    assert result.exit_code == 2, result.output
    assert "is not in the range 1<=x<=1000000" in result.stderr


def test_a_kafka_error_of_another_kind_does_not_blame_the_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "router.yaml").write_text(CONFIG)

    class _Denied(_Unreachable):
        def read_to_end(self, **kwargs: Any) -> Any:
            raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"))

    monkeypatch.setattr(dlq, "TopicReader", _Denied)

    result = CliRunner().invoke(main, ["dlq", "list", "-c", str(tmp_path / "router.yaml")])

    assert result.exit_code == 1
    assert result.stderr == ("error: a Kafka call to 127.0.0.1:1 failed: "
                             "TOPIC_AUTHORIZATION_FAILED: denied\n")


def test_any_other_exception_is_not_swallowed(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # A bug is not a Kafka failure: it keeps its traceback (and its test fails loudly).
    (tmp_path / "router.yaml").write_text(CONFIG)

    class _Broken(_Unreachable):
        def read_to_end(self, **kwargs: Any) -> Any:
            raise ZeroDivisionError("a bug")

    monkeypatch.setattr(dlq, "TopicReader", _Broken)

    result = CliRunner().invoke(main, ["dlq", "list", "-c", str(tmp_path / "router.yaml")])

    assert isinstance(result.exception, ZeroDivisionError)


def test_a_metrics_port_in_use_is_a_config_error_before_anything_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A second instance on one host with the default --metrics-port: a traceback before.
    monkeypatch.setattr(signal, "signal", lambda signum, handler: None)  # keep pytest's
    started: list[str] = []
    process = SimpleNamespace(last_poll=0.0, run=lambda: started.append("run"), stop=lambda: None)
    cleaner = SimpleNamespace(start=lambda: started.append("cleaner"), stop=lambda: None)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as caught:
            run_until_stopped(process, cleaner, RouterMetrics(), port,  # type: ignore[arg-type]
                              "router", RouterConfig.model_validate(
                                  {"source": {"topics": ["raw"]}, "routes": [{"topic": "x"}]}))
    assert str(caught.value) == (
        f"command line: field '--metrics-port': cannot serve /metrics on port {port}: Address "
        "already in use; give each instance on a host its own port [env "
        "CDC_ROUTER_METRICS_PORT], or 0 for none")
    assert started == []


_CONFIG_WITH_GROUP = {"source": {"topics": ["raw"], "group_id": "orders-router"},
                      "routes": [{"topic": "x"}], "delivery": {"transactional_id": "orders"}}


@pytest.mark.parametrize(("code", "what", "expected"), [
    (KafkaError.GROUP_AUTHORIZATION_FAILED, "router",
     "may not use consumer group orders-router: grant it Read on Group orders-router ("),
    (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "router",
     "may not use the transactional ids orders-*: grant it Write on TransactionalId orders- "
     "(prefixed"),
    (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "relay",
     "grant it Write on TransactionalId orders- (prefixed"),
    (KafkaError.CLUSTER_AUTHORIZATION_FAILED, "router", "grant it IdempotentWrite on the Cluster"),
])
def test_a_refused_group_or_transactional_id_names_it_and_the_grant_to_add(
        code: int, what: str, expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 35-e F1, F3: GROUP_AUTHORIZATION_FAILED and TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    # stopped `run` with librdkafka's line, naming neither the group or id nor the grant.
    monkeypatch.setattr(signal, "signal", lambda signum, handler: None)  # keep pytest's

    def refused() -> None:
        raise FatalKafkaError("the consumer failed for good: Group authorization failed",
                              code=code)

    process = SimpleNamespace(last_poll=0.0, run=refused, stop=lambda: None)
    cleaner = SimpleNamespace(start=lambda: None, stop=lambda: None)
    with pytest.raises(FatalKafkaError) as caught:
        run_until_stopped(process, cleaner, RouterMetrics(), 0,  # type: ignore[arg-type]
                          what, RouterConfig.model_validate(_CONFIG_WITH_GROUP))
    assert expected in str(caught.value)
    assert str(caught.value).endswith("(the consumer failed for good: Group authorization "
                                      "failed)")
    assert caught.value.exit_code == 1 and caught.value.code == code


def test_a_fence_at_the_edge_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signal, "signal", lambda signum, handler: None)
    fence = MemberFenced("fenced")

    def fenced() -> None:
        raise fence

    process = SimpleNamespace(last_poll=0.0, run=fenced, stop=lambda: None)
    cleaner = SimpleNamespace(start=lambda: None, stop=lambda: None)
    with pytest.raises(MemberFenced) as caught:
        run_until_stopped(process, cleaner, RouterMetrics(), 0,  # type: ignore[arg-type]
                          "router", RouterConfig.model_validate(_CONFIG_WITH_GROUP))
    assert caught.value is fence


def test_dlq_replay_without_its_group_names_the_group_and_the_grant(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 35-e F4: without Read on Group <G>.dlq-replay the replay stopped naming neither.
    (tmp_path / "router.yaml").write_text(CONFIG)

    class _GroupRefused:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def plan(self, selection: Any) -> Any:
            raise FatalKafkaError("Kafka transaction step 'offsets' failed for good: "
                                  "GROUP_AUTHORIZATION_FAILED: Group authorization failed",
                                  code=KafkaError.GROUP_AUTHORIZATION_FAILED)

        def close(self) -> None:
            pass

    monkeypatch.setattr(dlq, "DeadLetterReplay", _GroupRefused)
    result = CliRunner().invoke(main, ["dlq", "replay", "-c", str(tmp_path / "router.yaml"),
                                       "--yes"])
    assert result.exit_code == 1
    assert result.stderr.startswith(
        "error: this process's Kafka principal may not use consumer group "
        "cdc-router.dlq-replay: grant it Read on Group cdc-router.dlq-replay")


@pytest.mark.parametrize("answer", [False, True])
def test_dlq_replay_asks_about_a_dry_runs_plan_and_plans_again_once_told_yes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: bool) -> None:
    # Review 48-d F8: the plan shown at the prompt registered the routes' schemas (with
    # auto_register), so a replay answered "no" had changed the registry.
    (tmp_path / "router.yaml").write_text(CONFIG)
    made: list[bool] = []
    applied: list[Any] = []

    class _Replay:
        def __init__(self, compiled: Any, *, dry_run: bool) -> None:
            made.append(dry_run)
            self.dry_run = dry_run

        def plan(self, selection: Any) -> Any:
            return SimpleNamespace(planned=[SimpleNamespace(action="deliver")], by=self)

        def apply(self, plan: Any) -> Any:
            applied.append(plan.by.dry_run)
            return SimpleNamespace(committed={"deliver": 1})

        def close(self) -> None:
            pass

    def confirm(question: str, yes: bool) -> None:
        if not answer:
            raise click.Abort

    monkeypatch.setattr(dlq, "DeadLetterReplay", _Replay)
    monkeypatch.setattr(dlq, "confirm", confirm)
    monkeypatch.setattr(dlq, "_plan_json", lambda plan, config, committed: {})
    CliRunner().invoke(main, ["dlq", "replay", "-c", str(tmp_path / "router.yaml"), "-o",
                              "json"])
    assert (made, applied) == (([True, False], [False]) if answer else ([True], []))


def test_an_argument_that_is_not_utf8_is_one_line_before_any_command_runs() -> None:
    result = CliRunner().invoke(main, ["outbox", "write", "--aggregate-type",
                                       b"\xff".decode("utf-8", "surrogateescape"),
                                       "--aggregate-id", "1", "--type", "T", "--payload", "{}"])
    assert result.exit_code == 2
    assert "argument 4 ('\\udcff') is not valid UTF-8" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("args", [
    ["-c", "/nonexistent/router.yaml"],
    ["-c", str(EXAMPLE), "--threshold", "nosuch=1"],
    ["-c", str(EXAMPLE), "--watch", "0"],
])
def test_status_that_cannot_check_exits_3_never_a_verdict(args: list[str]) -> None:
    # QA, session 26: a missing config exited 1 (warning) and a bad option 2 (critical): a
    # probe paging on 2 and logging 1 took "the check never ran" for a warning.
    result = CliRunner().invoke(main, ["status", *args])
    assert result.exit_code == 3, result.output


def test_a_dsn_that_is_no_connection_string_is_a_bad_argument_never_quoted() -> None:
    # `status --dsn notadsn` reported the part unreachable (critical, exit 2), quoting libpq's
    # reason, which quotes the string's words (a password among them).
    for command in (["status", "-c", str(EXAMPLE)], ["outbox", "init"]):
        result = CliRunner().invoke(main, [*command, "--dsn", "host=db password=s3cret oops"])
        assert result.exit_code in (1, 3), result.output
        assert "--dsn" in result.stderr and "s3cret" not in result.output + result.stderr
    assert CliRunner().invoke(main, ["status", "-c", str(EXAMPLE), "--dsn", "oops"]).exit_code == 3


@pytest.mark.parametrize(("kafka", "text", "field"), [
    ({"config": {"no.such.property": "x"}}, 'No such configuration property: "no.such.property"',
     "kafka.config.no.such.property"),
    ({"producer": {"partitioner": "bogus"}},
     'Invalid value for configuration property "partitioner": bogus',
     "kafka.producer.partitioner")])
def test_a_client_property_librdkafka_refuses_is_a_config_error_naming_it(
        kafka: dict[str, Any], text: str, field: str) -> None:
    # Review, session 27: `rules check` said valid, and `run` stopped with librdkafka's line,
    # naming neither the file's section nor what to do.
    config = RouterConfig.model_validate({"source": {"topics": ["raw"]},
                                          "routes": [{"topic": "x"}], "kafka": kafka})
    refused = KafkaException(KafkaError(KafkaError._INVALID_ARG, text))
    error = property_refused(DeliveryError("step 'init': ..."), config)
    assert error is None
    error = property_refused(refused, config)
    assert error is not None and f"field '{field}'" in str(error)
    assert "CONFIGURATION.md" in str(error)
    wrapped = DeliveryError("step 'init'")
    wrapped.__cause__ = refused
    assert property_refused(wrapped, config) is not None


@pytest.mark.parametrize("kafka, field", [
    ("producer: {lingerr.ms: 5}", "kafka.producer.lingerr.ms"),
    ("consumer: {fetch.max.bytess: 5}", "kafka.consumer.fetch.max.bytess"),
    ("producer: {partitioner: bogus}", "kafka.producer.partitioner")])
def test_rules_check_refuses_a_client_property_as_run_does_with_no_broker_and_no_files(
        tmp_path: Path, kafka: str, field: str, caplog: pytest.LogCaptureFixture) -> None:
    # QA 36-b F6: `rules check` (what CI runs) said valid; `run` refused it at start, after a
    # misleading `event=abort_failed` warning (there was no transaction to abort).
    config = tmp_path / "router.yaml"

    def write(kafka: str, ca: str = "/no/such.pem") -> None:
        config.write_text("kafka: {bootstrap_servers: '127.0.0.1:1', config: {ssl.ca.location: "
                          f"{ca}}}, {kafka}}}\nsource: {{topics: [raw]}}\n"
                          "routes: [{topic: x}]\n", "utf-8")

    write(kafka)
    checked = CliRunner().invoke(main, ["rules", "check", "-c", str(config)])
    assert checked.exit_code == 1 and f"error: {config}: field '{field}': librdkafka refused" \
        in checked.output, checked.output
    (tmp_path / "ca.pem").write_text("", "utf-8")  # `run` stops first on a missing file
    write(kafka, str(tmp_path / "ca.pem"))
    ran = CliRunner().invoke(main, ["run", "-c", str(config), "--metrics-port", "0"])
    assert ran.exit_code == 1 and f"field '{field}'" in ran.output, ran.output
    assert "abort_failed" not in caplog.text
    write("producer: {linger.ms: 5}")
    checked = CliRunner().invoke(main, ["rules", "check", "-c", str(config)])
    assert checked.exit_code == 0, checked.output  # a file of the router's host: not checked


@pytest.mark.parametrize("kafka, field", [
    ("consumer: {check.crcs: 'yes please'}", "kafka.consumer.check.crcs"),
    ("config: {enable.ssl.certificate.verification: maybe}",
     "kafka.config.enable.ssl.certificate.verification"),
    ("producer: {linger.ms: abc}", "kafka.producer.linger.ms"),
    ("producer: {compression.type: zstdd}", "kafka.producer.compression.type"),
    ("config: {acks: many}", "kafka.config.acks"),
    ("consumer: {fetch.wait.max.ms: -5}", "kafka.consumer.fetch.wait.max.ms")])
def test_rules_check_refuses_a_bad_boolean_or_an_alias_naming_the_key_as_written(
        tmp_path: Path, kafka: str, field: str) -> None:
    # Review 46-2 F3/F4: librdkafka 2.16's `Expected bool value for "check.crcs"` passed
    # `rules check`; an alias came back as its canonical name (linger.ms as
    # kafka.config.queue.buffering.max.ms), and a range error spanned two lines.
    config = tmp_path / "router.yaml"
    config.write_text(f"kafka: {{bootstrap_servers: '127.0.0.1:1', {kafka}}}\n"
                      "source: {topics: [raw]}\nroutes: [{topic: x}]\n", "utf-8")
    checked = CliRunner().invoke(main, ["rules", "check", "-c", str(config)])
    assert checked.exit_code == 1, checked.output
    assert checked.output.startswith(f"error: {config}: field '{field}': librdkafka refused"), \
        checked.output
    assert checked.output.count("\n") == 1, checked.output


@pytest.mark.parametrize("kafka", [
    "security_protocol: SASL_SSL, sasl_mechanism: SCRAM-SHA-256, sasl_username: app",
    "security_protocol: SASL_PLAINTEXT, sasl_mechanism: GSSAPI",
    "config: {plugin.library.paths: /no/such/plugin.so, some.plugin.property: x}",
    "security_protocol: SASL_SSL, sasl_mechanism: OAUTHBEARER, config: {"
    "sasl.oauthbearer.method: oidc, sasl.oauthbearer.client.id: c, "
    "sasl.oauthbearer.client.secret: s, sasl.oauthbearer.token.endpoint.url: "
    "'http://127.0.0.1:1/token'}"])
def test_rules_check_leaves_to_the_router_s_host_what_depends_on_it(
        tmp_path: Path, kafka: str) -> None:
    # Review 37: a password from the router's environment, a SASL provider of its build, a
    # plugin on its disk, an OIDC token fetched at construction: no fault of the file.
    config = tmp_path / "router.yaml"
    config.write_text(f"kafka: {{bootstrap_servers: '127.0.0.1:1', {kafka}}}\n"
                      "source: {topics: [raw]}\nroutes: [{topic: x}]\n", "utf-8")
    checked = CliRunner().invoke(main, ["rules", "check", "-c", str(config)])
    assert checked.exit_code == 0, checked.output


@pytest.mark.parametrize(("args", "code"), [
    (["run", "--metrics-port", "0"], 1), (["topics", "apply", "--dry-run"], 1),
    (["dlq", "list"], 1), (["status"], 3)])
def test_a_sasl_login_without_its_password_names_the_variable_to_set(
        tmp_path: Path, args: list[str], code: int) -> None:
    # Review 51-d F4: the secret not in the environment, each command said librdkafka's
    # "sasl.username and sasl.password must be set" with another hint: kafka.config, "the file
    # paths (ssl.*.location), the key password".
    config = tmp_path / "router.yaml"
    config.write_text("kafka: {bootstrap_servers: '127.0.0.1:1', security_protocol: "
                      "SASL_PLAINTEXT, sasl_mechanism: PLAIN, sasl_username: router}\n"
                      "source: {topics: [raw]}\nroutes: [{topic: x}]\n", "utf-8")
    ran = CliRunner().invoke(main, [*args, "-c", str(config)],
                             env={"CDC_ROUTER__KAFKA__SASL_PASSWORD": None})
    assert ran.exit_code == code, ran.output
    assert "field 'kafka.sasl_password': is not set, and SASL PLAIN logs in with a username " \
        "and a password; set CDC_ROUTER__KAFKA__SASL_PASSWORD in this process's environment " \
        "(secrets come from the environment, not the file)" in ran.output, ran.output
    assert "kafka.config" not in ran.output and ran.output.count("\n") == 1, ran.output
    checked = CliRunner().invoke(main, ["rules", "check", "-c", str(config)])
    assert checked.exit_code == 0, checked.output  # CI's environment may not hold it
    assert "kafka.sasl_password is not set here (CDC_ROUTER__KAFKA__SASL_PASSWORD)" in \
        checked.output


@pytest.mark.parametrize("text", [
    "Failed to create consumer: Unsupported SASL mechanism: FOO-BAR",
    "Failed to create consumer: No provider for SASL mechanism GSSAPI: recompile librdkafka "
    "with libsasl2 or openssl support. Current build options: PLAIN SASL_SCRAM OAUTHBEARER"])
def test_a_sasl_mechanism_librdkafka_refuses_names_kafka_sasl_mechanism_and_the_values(
        text: str) -> None:
    # QA 35-e F6: blamed on field kafka.config, with a hint about ssl.key.location.
    config = RouterConfig.model_validate({"source": {"topics": ["raw"]},
                                          "routes": [{"topic": "x"}],
                                          "kafka": {"security_protocol": "SASL_PLAINTEXT",
                                                    "sasl_mechanism": "FOO-BAR"}})
    error = property_refused(KafkaException(KafkaError(KafkaError._INVALID_ARG, text)), config)
    assert error is not None and str(error).startswith("field 'kafka.sasl_mechanism': ")
    assert "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER" in str(error)
    assert "ssl.key.location" not in str(error)


def test_the_cleanup_dsn_is_needed_by_run_only(tmp_path: Path) -> None:
    # QA, session 28: `rules check`, `topics apply` and `status` refused a config with
    # `cleanup: {mode: delete}` and no DSN, so that CI (and docker-compose's init) needed the
    # database secret to check rules or create topics.
    config = tmp_path / "router.yaml"
    config.write_text(CONFIG + "cleanup: {mode: delete}\n", "utf-8")
    checked = CliRunner().invoke(main, ["rules", "check", "-c", str(config)])
    assert checked.exit_code == 0, checked.output
    assert "cleanup.dsn: mode delete needs the Postgres DSN" in checked.output
    ran = CliRunner().invoke(main, ["run", "-c", str(config), "--metrics-port", "0"])
    assert ran.exit_code == 1
    assert "field 'cleanup.dsn': mode delete needs the Postgres DSN" in ran.output, ran.output
    assert "CDC_ROUTER__CLEANUP__DSN" in ran.output


def test_a_refusal_of_the_credentials_librdkafka_logged_is_named_in_kafka_lines_only(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
        ) -> None:
    # QA 31-c: a wrong SASL password ended as "is the cluster at ... reachable?" (run) or
    # "cannot reach Kafka ... is the cluster up?" (topics apply). Review 32-3: not on a line
    # about something else.
    from types import SimpleNamespace

    from cdc_router.cli import _fail
    from cdc_router.kafka import logs

    monkeypatch.setattr(logs, "_REFUSALS", [])
    monkeypatch.setattr(logs, "_CLUSTER", ["b:9092"])
    logs.librdkafka_logger().error(
        "SASL authentication error: Authentication failed: Invalid username or password "
        "(after 3ms in state AUTH_REQ)")
    result = CliRunner().invoke(main, ["rules", "check", "-c", str(tmp_path / "absent.yaml")])
    assert result.exit_code != 0 and "file not found" in result.output
    assert "Kafka refused" not in result.output
    with pytest.raises(SystemExit):
        _fail(SimpleNamespace(obj={}), "Kafka transaction step 'init' timed out: is the "  # type: ignore[arg-type]
              "cluster at b:9092 reachable?", 75)
    said = capsys.readouterr().err
    assert "Kafka at b:9092 refused this process's credentials: SASL authentication error: " \
        "Authentication failed: Invalid username or password" in said
    assert "check kafka.sasl_username and its password" in said and "reachable" not in said


def test_status_with_a_kafka_client_config_librdkafka_refuses_cannot_check(
        tmp_path: Path) -> None:
    # QA 32-d: a missing CA file made `status` exit 1, its "warning".
    config = tmp_path / "router.yaml"
    config.write_text(
        "kafka: {bootstrap_servers: '127.0.0.1:1', security_protocol: SSL,\n"
        "        config: {ssl.ca.location: /nonexistent/ca.pem}}\n"
        "source: {group_id: g, topics: [raw]}\nroutes: [{topic: orders}]\n")
    result = CliRunner().invoke(main, ["status", "-c", str(config)])
    assert result.exit_code == 3, result.output
    assert "field 'kafka.config': ssl.ca.location /nonexistent/ca.pem does not exist" in \
        result.output


@pytest.mark.parametrize("args", [["topics", "apply", "--dry-run"], ["dlq", "list"],
                                  ["dlq", "replay", "--dry-run"], ["run", "--metrics-port=0"],
                                  ["rules", "check", "--cluster"]])
def test_every_command_making_a_kafka_client_names_a_missing_certificate_file(
        tmp_path: Path, args: list[str]) -> None:
    # Review 50-b F3: topics apply, dlq list and dlq replay said only librdkafka's
    # "ssl.ca.location failed: ... BIO lib", naming no path; the check is in the one place
    # every client's config comes from (clients.logged_config).
    config = tmp_path / "router.yaml"
    config.write_text(
        "kafka: {bootstrap_servers: '127.0.0.1:1', security_protocol: SSL,\n"
        f"        config: {{ssl.ca.location: /nonexistent/ca.pem, ssl.key.location: {config}}}}}\n"
        "source: {group_id: g, topics: [raw]}\nroutes: [{topic: orders}]\n")
    words = [arg for arg in args if not arg.startswith("-")]
    result = CliRunner().invoke(main, [*words, "-c", str(config), *args[len(words):]])
    assert result.exit_code == 1, result.output
    assert result.output == ("error: field 'kafka.config': ssl.ca.location /nonexistent/ca.pem "
                             "does not exist; give the path of the file on the host this "
                             "command runs on\n")
    checked = CliRunner().invoke(main, ["rules", "check", "-c", str(config)])
    assert checked.exit_code == 0, checked.output  # offline: a warning, the file may be elsewhere
    assert "warning: kafka.config: ssl.ca.location /nonexistent/ca.pem does not exist on this " \
        "host" in checked.output


@pytest.mark.parametrize("args", [["rules", "check", "-c", ""], ["run", "-c", ""],
                                  ["dlq", "list", "-c", ""], ["demo", "-c", ""],
                                  ["connectors", "apply", "-f", ""]])
def test_an_empty_path_is_named_as_empty_not_as_the_working_directory(args: list[str]) -> None:
    # QA 33-b: pathlib reads '' as '.', and the error named '.' as "not a file".
    result = CliRunner().invoke(main, args)
    assert result.exit_code in (1, 2), result.output
    assert "is empty: give the path of a file" in result.stderr
    assert "'.'" not in result.stderr and ".:" not in result.stderr


# Review 50-b F11: `CDC_ROUTER_INSTANCE_ID="$POD_NAME"` with POD_NAME unset started as the host
# name (click takes an empty variable for unset): in a container a new id at each re-create, so
# the successor's transactional id never fenced its predecessor.
_FROM_ENV = "CDC_ROUTER_INSTANCE_ID is set but"


@pytest.mark.parametrize(("command", "instance_id", "problem"), [
    ("run", "", "is empty: give a name unique per instance"),
    ("run", "  ", "is empty"),
    ("run", "a b/c", "'a b/c' is not a Kafka group.instance.id"),
    ("run", "..", "'..' is not a Kafka group.instance.id"),
    ("run", "x" * 241, f"'{'x' * 241}' is not a Kafka group.instance.id"),
    ("relay", "", "is empty"),
    ("relay", "a b", "'a b' holds a blank"),
    ("run", "env:", f"{_FROM_ENV} empty: give a name unique per instance"),
    ("run", "env: ", f"{_FROM_ENV} blank"),
    ("relay", "env:", f"{_FROM_ENV} empty")])
def test_an_empty_or_illegal_instance_id_is_refused_before_anything_starts(
        tmp_path: Path, command: str, instance_id: str, problem: str) -> None:
    # Review 46-2 F9: `--instance-id "$POD_NAME"` with the variable unset started, and every
    # replica started so shared the transactional id `<prefix>-` and fenced the others.
    config = tmp_path / "router.yaml"
    config.write_text(CONFIG, "utf-8")
    variable = instance_id.removeprefix("env:") if instance_id.startswith("env:") else None
    given = [] if variable is not None else ["--instance-id", instance_id]
    result = CliRunner().invoke(main, [command, "-c", str(config), "--metrics-port", "0",
                                       *given], env={"CDC_ROUTER_INSTANCE_ID": variable})
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())  # click wraps a long line
    assert f"Invalid value for '--instance-id': {problem}" in said, result.output


def test_an_explained_record_or_a_connector_file_that_is_a_device_is_refused_unread(
        tmp_path: Path) -> None:
    # Review 48-e F17: `--explain /dev/zero` and `connectors diff -f /dev/zero` read until a
    # MemoryError traceback (or the OOM killer); -c was already refused so (QA 33-b).
    (tmp_path / "router.yaml").write_text(CONFIG)
    explain = CliRunner().invoke(main, ["rules", "check", "-c", str(tmp_path / "router.yaml"),
                                        "--explain", "/dev/zero"])
    diff = CliRunner().invoke(main, ["connectors", "diff", "-f", "/dev/zero"])
    assert (explain.exit_code, diff.exit_code) == (1, 1)
    assert explain.stderr == ("error: /dev/zero: field '--explain': not a file (a directory or "
                              "a device); pass --explain with a change record's file\n")
    assert diff.stderr == ("error: /dev/zero: not a file (a directory or a device); pass -f "
                           "with a connector's JSON file\n")


@pytest.mark.parametrize(("kafka", "name", "field"), [
    ({"config": {"linger.ms": "abc"}, "producer": {"linger.ms": "5"}}, "queue.buffering.max.ms",
     "kafka.config.linger.ms"),
    ({"config": {"session.timeout.ms": "abc"}, "consumer": {"session.timeout.ms": "6000"}},
     "session.timeout.ms", "kafka.config.session.timeout.ms"),
    ({"consumer": {"fetch.wait.max.ms": "abc"}, "producer": {"fetch.wait.max.ms": "5"}},
     "fetch.wait.max.ms", "kafka.consumer.fetch.wait.max.ms"),
])
def test_a_refused_value_names_the_section_that_holds_it(kafka: dict[str, Any], name: str,
                                                          field: str) -> None:
    # Review 48-e F9: the first section holding the key was blamed, with its valid value.
    config = RouterConfig.model_validate({"source": {"topics": ["raw"]},
                                          "routes": [{"topic": "x"}], "kafka": kafka})
    text = f'Invalid value for configuration property "{name}"'
    error = property_refused(KafkaException(KafkaError(KafkaError._INVALID_ARG, text)), config)
    assert error is not None and f"field '{field}'" in str(error), error
    assert "(got 'abc')" in str(error)


def _relay_without_dsn(tmp_path: Path, text: str) -> Path:
    """`relay` started on `text` plus a relay: section, without a DSN: it logs its start's
    warnings, then exits 1 on the DSN. Returns the config file."""
    config = tmp_path / "relay.yaml"
    config.write_text(text + "relay: {table: public.outbox}\n", "utf-8")
    ran = CliRunner().invoke(main, ["relay", "-c", str(config), "--metrics-port", "0"],
                             env={"CDC_ROUTER__CLEANUP__DSN": None})
    assert ran.exit_code == 1 and "the relay needs the Postgres DSN" in ran.output, ran.output
    return config


def test_the_relay_warns_of_sasl_settings_no_sasl_protocol_sends_as_run_does(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Review 51-j F2: `run` logged it (review 51-d F5), the relay went straight to lock_failed.
    _relay_without_dsn(tmp_path, "kafka: {bootstrap_servers: '127.0.0.1:1', sasl_mechanism: "
                       "PLAIN, sasl_username: router}\nsource: {topics: [raw]}\n"
                       "routes: [{topic: x}]\n")
    assert "event=config_warning" in caplog.text and "kafka.security_protocol is PLAINTEXT, " \
        "the default: no SASL login is sent" in caplog.text, caplog.text


def test_the_relay_logs_the_config_warnings_run_logs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # QA 63-b L-3: the relay's start logged only the Kafka settings' warnings; a group left
    # to its default (its position and transactional id shared) and a route that can never
    # match were said by `rules check` and `run` alone.
    config = _relay_without_dsn(tmp_path, "kafka: {bootstrap_servers: '127.0.0.1:1'}\n"
                                "source: {outbox: {headers: null}}\nroutes: [{topic: y, "
                                "match: {header: {tenant: a}}}, {topic: x}]\n")
    warned = [record.getMessage() for record in caplog.records
              if record.name == "cdc_router.relay" and "config_warning" in record.getMessage()]
    loaded = load_config(config, {}).config
    assert len(warned) == len(config_warnings(loaded)) >= 2, warned
    assert any("source.group_id is not set" in line for line in warned), warned
    assert any("routes[0].match.header can never match" in line for line in warned), warned


def test_the_relay_words_its_start_warnings_for_the_relay(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Review 64 (low): at the relay's start the default group's warning said pipelines
    # "share a consumer group" (a relay joins none) and the DSN's "`cdc-router run` refuses".
    _relay_without_dsn(tmp_path, "kafka: {bootstrap_servers: '127.0.0.1:1'}\n"
                       "source: {topics: [raw]}\ncleanup: {mode: delete}\nroutes: [{topic: x}]\n")
    warned = [record.getMessage() for record in caplog.records
              if record.name == "cdc_router.relay" and "config_warning" in record.getMessage()]
    [group] = [line for line in warned if "source.group_id is not set" in line]
    # Review 65 (low): one hard sentence; now the three things shared, each with its fix.
    assert "two such relays share three things: the dedup marks; the position topic " \
        "cdc-router.relay-position (unless relay.position_topic is set), where two relays of " \
        "one table name in two databases find each other's position, and the second stops " \
        "on it; and, for two relays of one table name, the transactional id (unless " \
        "delivery.transactional_id is set), so they fence each other. Give this pipeline a " \
        "source.group_id of its own" in group, group
    assert "consumer group" not in group, group
    [dsn] = [line for line in warned if "cleanup.dsn: mode delete" in line]
    assert "`cdc-router relay` refuses to start without it" in dsn, dsn


def test_an_unset_sasl_username_is_not_called_a_secret(tmp_path: Path) -> None:
    # Review 51-j F3: the hint said "secrets come from the environment, not the file" of the
    # username, which README's example writes in the file.
    config = tmp_path / "router.yaml"
    config.write_text("kafka: {bootstrap_servers: '127.0.0.1:1', security_protocol: "
                      "SASL_PLAINTEXT, sasl_mechanism: PLAIN}\n"
                      "source: {topics: [raw]}\nroutes: [{topic: x}]\n", "utf-8")
    ran = CliRunner().invoke(main, ["dlq", "list", "-c", str(config)],
                             env={"CDC_ROUTER__KAFKA__SASL_USERNAME": None,
                                  "CDC_ROUTER__KAFKA__SASL_PASSWORD": None})
    assert ran.exit_code == 1, ran.output
    assert "field 'kafka.sasl_username': is not set" in ran.output and "set it in the config " \
        "file, or CDC_ROUTER__KAFKA__SASL_USERNAME in this process's environment" in ran.output
    assert "secrets" not in ran.output, ran.output


def test_a_status_serve_port_in_use_exits_3_as_bad_arguments(tmp_path: Path) -> None:
    # Review 53-c: it exited 1, which `status` means as "warning"; bad arguments exit 3.
    config = tmp_path / "router.yaml"
    config.write_text(CONFIG, "utf-8")
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["status", "-c", str(config), "--serve", str(port)])
    assert result.exit_code == 3, result.output
    assert result.stderr == (f"error: command line: field '--serve': cannot serve /metrics on "
                             f"port {port}: Address already in use; pick a free port for the "
                             "exporter\n")


@pytest.mark.parametrize(("args", "variable", "value", "code"), [
    (["connectors", "list"], "CDC_ROUTER_CONNECT_URL", "", 1),
    (["outbox", "stats"], "CDC_ROUTER_PG_DSN", "", 2),
    (["outbox", "republish", "--since", "1h"], "CDC_ROUTER_PG_DSN", " ", 2),
    (["status"], "CDC_ROUTER_CONNECT_URL", "", 3),
    (["status"], "CDC_ROUTER_BOOTSTRAP_SERVERS", "", 3),
    (["status"], "CDC_ROUTER_PG_DSN", "", 3),
    (["local", "env"], "CDC_ROUTER_HOME", "", 2),
    (["rules", "check"], "CDC_ROUTER_CONFIG", "", 2)])
def test_an_address_variable_set_but_empty_is_refused_naming_it(
        tmp_path: Path, args: list[str], variable: str, value: str, code: int) -> None:
    # Review 53-c F18: click takes an empty variable for unset: `CDC_ROUTER_CONNECT_URL=""
    # connectors list` listed the default's connectors (the main stack's), exit 0.
    config = tmp_path / "router.yaml"
    config.write_text(CONFIG, "utf-8")
    given = args if variable == "CDC_ROUTER_CONFIG" else [*args, "-c", str(config)] \
        if args[0] in ("status", "rules") or args[1] == "republish" else args
    result = CliRunner().invoke(main, given, env={variable: value})
    assert result.exit_code == code, result.output
    said = " ".join(result.output.split())  # click wraps a long line
    fallback = "and give --config" if variable == "CDC_ROUTER_CONFIG" else "for the default"
    assert f"{variable} is set but {'blank' if value else 'empty'}: give a value, or unset " \
        f"it {fallback}" in said, result.output


def test_an_empty_variable_leaves_help_alone_and_names_the_option_without_default() -> None:
    # Reread 53-k F-3: `CDC_ROUTER_CONNECT_URL= connectors list --help` refused the variable
    # instead of showing the help; F-2: -c has no default to fall back to once unset.
    helped = CliRunner().invoke(main, ["connectors", "list", "--help"],
                                env={"CDC_ROUTER_CONNECT_URL": ""})
    assert helped.exit_code == 0 and "Usage:" in helped.output, helped.output
    ran = CliRunner().invoke(main, ["run"], env={"CDC_ROUTER_CONFIG": ""})
    assert ran.exit_code == 2
    assert "CDC_ROUTER_CONFIG is set but empty: give a value, or unset it and give --config" \
        in " ".join(ran.output.split()), ran.output


def test_a_dsn_from_the_environment_is_named_as_the_variable_in_its_errors() -> None:
    # Review 53-c F18: `CDC_ROUTER_PG_DSN=garbage outbox stats` said field '--dsn'.
    said = "not a Postgres connection string"
    result = CliRunner().invoke(main, ["outbox", "stats"], env={"CDC_ROUTER_PG_DSN": "garbage"})
    assert result.exit_code == 1 and f"error: field 'CDC_ROUTER_PG_DSN': {said}" in \
        result.stderr, result.output
    result = CliRunner().invoke(main, ["outbox", "stats", "--dsn", "garbage"],
                                env={"CDC_ROUTER_PG_DSN": None})
    assert result.exit_code == 1 and f"error: field '--dsn': {said}" in result.stderr


def test_json_output_of_a_bad_config_is_a_document_on_stdout_besides_the_error(
        tmp_path: Path) -> None:
    # Review 53-c F19: `status -o json` and `rules check -o json` printed nothing on stdout:
    # a script reading the document (README: stable keys) got none.
    config = tmp_path / "router.yaml"
    config.write_text("source: {topics: [raw]}\nroutes: [{topic: 'bad topic'}]\n", "utf-8")
    status = CliRunner().invoke(main, ["status", "-c", str(config), "-o", "json"])
    assert status.exit_code == 3, status.output
    [line] = status.stderr.splitlines()
    message = line.removeprefix("error: ")
    assert "field 'routes[0].topic'" in message
    assert json.loads(status.stdout) == {"status": "unknown", "exit_code": 3, "problems": [
        {"level": "critical", "component": "config", "message": message}]}
    rules = CliRunner().invoke(main, ["rules", "check", "-c", str(config), "-o", "json"])
    assert rules.exit_code == 1 and rules.stderr == f"error: {message}\n", rules.output
    assert json.loads(rules.stdout) == {"file": str(config), "valid": False, "error": message,
                                        "warnings": [], "config": None, "events": []}
    config.write_text(CONFIG, "utf-8")  # valid: a bad argument is the problem
    argued = CliRunner().invoke(main, ["status", "-c", str(config), "-o", "json", "--dsn",
                                       "host=x port=abc"], env={"CDC_ROUTER_PG_DSN": None})
    assert argued.exit_code == 3 and json.loads(argued.stdout)["problems"] == [
        {"level": "critical", "component": "arguments",
         "message": "--dsn: its port 'abc' is not an integer"}], argued.output


@pytest.mark.parametrize(("args", "said"), [
    (["--bogus", "-o", "json"], "No such option '--bogus'."),
    (["-o", "json", "--bogus"], "No such option '--bogus'."),
    (["--watch", "abc", "--output=json"], "Invalid value for '--watch': 'abc' is not a valid "
                                          "float."),
    (["--serve", "0", "-ojson"], "Invalid value for '--serve': 0 is not in the range "
                                 "1<=x<=65535."),
])
def test_json_output_of_status_with_a_bad_argument_anywhere_is_a_document(
        tmp_path: Path, args: list[str], said: str) -> None:
    # Review 54-k F-5: click fails before it has read `-o json` when the bad word comes first
    # (or is an unknown option): no document.
    config = tmp_path / "router.yaml"
    config.write_text(CONFIG, "utf-8")
    status = CliRunner().invoke(main, ["status", "-c", str(config), *args])
    assert status.exit_code == 3, status.output
    assert json.loads(status.stdout) == {"status": "unknown", "exit_code": 3, "problems": [
        {"level": "critical", "component": "arguments", "message": said}]}, status.output
    text = CliRunner().invoke(main, ["status", "-c", str(config), *args, "-o", "text"])
    assert text.exit_code == 3 and text.stdout == "", text.output  # the last -o counts


def test_json_output_of_status_with_an_empty_address_variable_is_a_document_too(
        tmp_path: Path) -> None:
    # Review 54: the variable's refusal came before status's own error path: no document.
    config = tmp_path / "router.yaml"
    config.write_text(CONFIG, "utf-8")
    said = "CDC_ROUTER_BOOTSTRAP_SERVERS is set but empty: give a value, or unset it for the " \
           "default"
    for args in (["-o", "json", "-c", str(config)], ["-c", str(config), "--output=json"]):
        status = CliRunner().invoke(main, ["status", *args],
                                    env={"CDC_ROUTER_BOOTSTRAP_SERVERS": ""})
        assert status.exit_code == 3 and said in status.stderr, status.output
        assert json.loads(status.stdout) == {"status": "unknown", "exit_code": 3, "problems": [
            {"level": "critical", "component": "arguments",
             "message": f"Invalid value for '--bootstrap-servers': {said}"}]}, status.output
    text = CliRunner().invoke(main, ["status", "-c", str(config)],
                              env={"CDC_ROUTER_CONNECT_URL": " "})
    assert text.exit_code == 3 and text.stdout == "" and \
        "CDC_ROUTER_CONNECT_URL is set but blank" in text.stderr
    helped = CliRunner().invoke(main, ["status", "-o", "json", "--help"],
                                env={"CDC_ROUTER_BOOTSTRAP_SERVERS": ""})
    assert helped.exit_code == 0 and helped.stdout.startswith("Usage:"), helped.output


def test_a_refused_client_property_names_the_variable_that_set_it(tmp_path: Path) -> None:
    # Review 53-c F4: `CDC_ROUTER__KAFKA__CONFIG__LINGER_MS=abc` gave "field
    # 'kafka.config.linger.ms': librdkafka refused ..." naming neither the file nor the variable.
    config = tmp_path / "router.yaml"
    config.write_text(CONFIG, "utf-8")
    checked = CliRunner().invoke(main, ["rules", "check", "-c", str(config)],
                                 env={"CDC_ROUTER__KAFKA__CONFIG__LINGER_MS": "abc"})
    assert checked.exit_code == 1
    assert f"error: {config} via environment variable CDC_ROUTER__KAFKA__CONFIG__LINGER_MS: " \
           "field 'kafka.config.linger.ms': librdkafka refused" in checked.output, checked.output
    config.write_text(CONFIG.replace("'127.0.0.1:1'", "'127.0.0.1:1', config: {linger.ms: abc}"),
                      "utf-8")
    checked = CliRunner().invoke(main, ["rules", "check", "-c", str(config)])
    assert f"error: {config}: field 'kafka.config.linger.ms': librdkafka refused" in \
        checked.output, checked.output


@pytest.mark.parametrize("password", [None, "wrong-passphrase"])
def test_an_encrypted_client_key_librdkafka_cannot_read_names_its_password_variable(
        tmp_path: Path, password: str | None) -> None:
    # QA 56-d F-5: without its passphrase, or with a wrong one, the line said "see librdkafka's
    # CONFIGURATION.md for the names and values, and check the key password of
    # ssl.key.location", naming neither ssl.key.password nor the variable that sets it.
    from confluent_kafka import Producer
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = tmp_path / "client-enc.key"
    key.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"the-passphrase")))
    settings = {"ssl.key.location": str(key)}
    if password is not None:
        settings["ssl.key.password"] = password
    config = RouterConfig.model_validate({"source": {"topics": ["raw"]},
                                          "routes": [{"topic": "x"}],
                                          "kafka": {"security_protocol": "SSL",
                                                    "config": settings}})
    with pytest.raises(KafkaException) as refused:
        Producer(config.kafka.librdkafka())
    error = property_refused(refused.value, config)
    assert error is not None
    line = str(error)
    assert line.startswith("field 'kafka.config.ssl.key.password': librdkafka could not read "
                           f"the private key ssl.key.location {key}"), line
    assert "set CDC_ROUTER__KAFKA__CONFIG__SSL_KEY_PASSWORD" in line, line
    assert ("ssl.key.password is not set" in line) == (password is None), line
    assert "CONFIGURATION.md" not in line and "wrong-passphrase" not in line, line


def test_an_unreadable_key_without_password_is_told_alike_by_run_and_the_other_commands(
        ) -> None:
    # Review 57: `run`'s line and the other commands' gave the same advice in two wordings
    # (one without the property's name, one without 'in this process's environment'): it is
    # built once, naming the variable config/overrides.py's variable_of gives.
    from cdc_router.cli import _kafka_failure
    from cdc_router.cli.run import _key_unread
    from cdc_router.config.overrides import variable_of

    config = RouterConfig.model_validate({
        "source": {"topics": ["raw"]}, "routes": [{"topic": "x"}],
        "kafka": {"security_protocol": "SSL", "config": {"ssl.key.location": "/k.pem"}}})
    advice = ("if the key is encrypted, set CDC_ROUTER__KAFKA__CONFIG__SSL_KEY_PASSWORD "
              "(ssl.key.password) to its passphrase; else check that the file is a PEM "
              "private key")
    assert variable_of(("kafka", "config", "ssl.key.password")) in advice
    run_line = str(_key_unread("PEM lib", config, None))
    other = _kafka_failure(KafkaException(KafkaError(
        KafkaError._INVALID_ARG, "Failed to create producer: ssl.key.location failed: PEM lib")))
    assert run_line.endswith(f"ssl.key.password is not set: {advice}"), run_line
    assert other is not None and other.endswith(
        f"could not read the private key of ssl.key.location: {advice}"), other


def test_a_client_key_librdkafka_cannot_read_in_another_command_names_the_variable() -> None:
    # QA 56-d F-5: the one-shot commands' line said "check ... the key password and the
    # property names", naming no variable.
    from cdc_router.cli import _kafka_failure

    line = _kafka_failure(KafkaException(KafkaError(
        KafkaError._INVALID_ARG, "Failed to create producer: ssl.key.location failed: "
        "error:0A080009:SSL routines::PEM lib")))
    assert line is not None and line.endswith(
        "set CDC_ROUTER__KAFKA__CONFIG__SSL_KEY_PASSWORD (ssl.key.password) to its passphrase; "
        "else check that the file is a PEM private key"), line


@pytest.mark.parametrize(("args", "said"), [
    (["outbox", "stats"], "error: field '--dsn': its sslmode 'bogus' is not one libpq takes: "
     "disable, allow, prefer, require, verify-ca, verify-full"),
    (["dedup", "init"], "error: libpq refuses the dedup store's DSN, before asking any server: "
     "its sslmode 'bogus' is not one libpq takes: disable, allow, prefer, require, verify-ca, "
     "verify-full; check --dsn (env CDC_ROUTER_PG_DSN)")])
def test_a_dsn_option_value_libpq_refuses_is_named_not_blamed_on_postgres(
        args: list[str], said: str) -> None:
    # Reread 59 F-2: "Postgres refuses the dedup store's connection" and "Postgres at
    # 127.0.0.1:1/: connection is bad: ...", though libpq refused it before asking any server.
    result = CliRunner().invoke(main, [*args, "--dsn", "host=127.0.0.1 port=1 password=s3cret "
                                       "sslmode=bogus"], env={"CDC_ROUTER_PG_DSN": None})
    assert result.exit_code == 1 and said in " ".join(result.stderr.split()), result.output
    assert "s3cret" not in result.output and "Postgres" not in result.stderr


def test_the_relay_says_a_cleanup_in_another_database_before_that_database_s_own_refusal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 61-w W-1: cleanup.dsn at another database without the table was told to run
    # `outbox init` there; the mismatch (QA 61-a F-3) was never said.
    from cdc_router.cli import relay as relay_cli

    def other_database(config: Any, source: str | None = None) -> None:
        raise ConfigError("cleanup.dsn names database 'b' and relay.dsn database 'a'",
                          source=source, field="cleanup.dsn/relay.dsn")

    def no_table(cleaner: Any, source: str) -> None:
        raise ConfigError("the outbox table does not exist", source=source,
                          field="cleanup.table")

    monkeypatch.setattr(relay_cli, "check_cleanup_database", other_database)
    monkeypatch.setattr(relay_cli, "check_cleanup", no_table)
    config = tmp_path / "relay.yaml"
    config.write_text("kafka: {bootstrap_servers: '127.0.0.1:1'}\nsource: {topics: [raw]}\n"
                      "routes: [{topic: x}]\nrelay: {table: public.outbox, dsn: "
                      "'postgresql://u@127.0.0.1:1/a'}\ncleanup: {mode: delete, dsn: "
                      "'postgresql://u@127.0.0.1:1/b', table: public.outbox}\n", "utf-8")
    ran = CliRunner().invoke(main, ["relay", "-c", str(config), "--metrics-port", "0"])
    assert ran.exit_code == 1 and "names database 'b'" in ran.output, ran.output
