"""Secrets never printed: the key rule, and every command that shows a config."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.config.load import load_config
from cdc_router.config.redact import MASK, is_secret_key, redact, redact_tree, shown_url
from cdc_router.connect.client import url_problem
from cdc_router.errors import ConfigError
from cdc_router.router import clients
from tests.unit.test_connect_client import ScriptedConnect, run_cli

PEM = ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n"
       "-----END PRIVATE KEY-----")
# Every plain secret below; none of them may appear in any output.
SECRETS = ("sr-user:sr-Pa55", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7",
           "k3y-pa55", "jaas-Pa55", "db-Pa55", "tok-3n", "cl13nt-s3cret", "n4ts-Pa55",
           "PEM-K3Y-BODY")
# A Connect connector as users write them: secrets inline, and one through a config provider.
CONNECTOR = {
    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
    "database.password": "db-Pa55",
    "database.user": "debezium",
    "value.converter": "io.confluent.connect.avro.AvroConverter",
    "value.converter.basic.auth.credentials.source": "USER_INFO",
    "value.converter.basic.auth.user.info": "sr-user:sr-Pa55",
    "value.converter.schema.registry.url": "https://registry:8081",
    "producer.override.ssl.keystore.key": PEM,
    "producer.override.ssl.key.password": "k3y-pa55",
    "producer.override.sasl.jaas.config":
        'org.apache.kafka.common.security.plain.PlainLoginModule required username="app" '
        'password="${file:/etc/kafka/secrets.properties:jaas}";',
    "database.sslpassword": "${env:DB_SSL_PASSWORD}",
}
CONNECTOR_OLD = {**CONNECTOR, "database.password": "old-Pa55",
                 "value.converter.basic.auth.user.info": "sr-user:old-Pa55"}


def assert_no_secret(text: str) -> None:
    leaked = [secret for secret in (*SECRETS, "old-Pa55") if secret in text]
    assert not leaked, f"printed in clear: {leaked}"


# -- the rule -----------------------------------------------------------------------------


@pytest.mark.parametrize("key", [
    "database.password", "SSL.KEY.PASSWORD", "ssl.keystore.key", "ssl.truststore.password",
    "basic.auth.user.info", "value.converter.basic.auth.user.info", "sasl.jaas.config",
    "sasl.oauthbearer.client.secret", "client_secret", "access.token", "aws.credentials",
    "private.key", "private.key.passphrase", "api.key", "sasl_password", "dsn", "cleanup.dsn",
    "basic_auth_user_info", "ssl.key.pem",
    # QA 64-b: librdkafka redacts it in its own config dump (`debug: conf`); a client secret
    # may be written there ('clientSecret=...'), and `rules check -o json` showed it
    "sasl.oauthbearer.config", "kafka.config.sasl.oauthbearer.config",
])
def test_credential_keys_are_secret(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", [
    "database.user", "sasl.username", "slot.name", "ssl.keystore.location", "ssl.keystore.type",
    "basic.auth.credentials.source", "sasl.oauthbearer.token.endpoint.url",
    "ssl.truststore.certificates", "topic.prefix", "transactional_id",
])
def test_other_keys_are_not(key: str) -> None:
    assert not is_secret_key(key)


def test_a_secret_is_masked_but_provider_references_in_it_stay_visible() -> None:
    assert redact("database.password", "hunter2") == MASK
    assert redact("database.password", "${env:DB_PASSWORD}") == "${env:DB_PASSWORD}"
    assert redact("basic.auth.user.info", "user:${file:/s.properties:pw}") == \
        f"{MASK}${{file:/s.properties:pw}}"
    assert redact("sasl.jaas.config", 'M required password="${dir:/run/s:pw}";') == \
        f'{MASK}${{dir:/run/s:pw}}{MASK}'
    assert redact("database.password", "") == ""
    assert redact("database.password", None) is None


def test_a_password_in_a_url_is_masked_under_any_key() -> None:
    assert redact("schema.registry.url", "https://u:p4ss@registry:8081/x") == \
        f"https://u:{MASK}@registry:8081/x"
    assert redact("url", "https://u:${env:P}@registry") == "https://u:${env:P}@registry"
    assert redact("url", "http://registry:8081") == "http://registry:8081"
    # QA 64-b: the password ended at its first '@', and the rest of it was shown
    assert redact("connection.url", "mongodb://u:P@ss@h1,h2/db") == f"mongodb://u:{MASK}@h1,h2/db"
    assert redact("", "at postgresql://u:P@s@s@h/db, see a@b") == \
        f"at postgresql://u:{MASK}@h/db, see a@b"


def test_a_url_after_a_long_run_of_scheme_letters_is_still_masked() -> None:
    # The scheme is read 32 characters at most (QA 33-b: 28 s for a 100,000-letter value); the
    # leftmost match then starts inside the run, and the password is masked all the same.
    for before in ("x" * 100, "1" + "a" * 31, "9.+-" * 20, "", "a" + "1" * 40):
        assert redact("url", f"{before}https://user:pw@host/x") == f"{before}https://user:{MASK}@host/x"
    assert redact("url", "a" * 10_000) == "a" * 10_000


def test_a_password_among_a_urls_parameters_is_masked() -> None:
    # Review 31: a JDBC sink's connection.url was shown in clear by connectors get/diff/apply.
    assert redact("connection.url", "jdbc:postgresql://db/app?user=app&password=s3cret&ssl=1") \
        == f"jdbc:postgresql://db/app?user=app&password={MASK}&ssl=1"
    assert redact("connection.url", "jdbc:sqlserver://h;databaseName=x;PWD=s3cret;user=u") == \
        f"jdbc:sqlserver://h;databaseName=x;PWD={MASK};user=u"
    assert redact("connection.url", "jdbc:mysql://h/db?password=${file:/s.properties:pw}") == \
        "jdbc:mysql://h/db?password=${file:/s.properties:pw}"
    # Review 31-2: every parameter whose name is a secret's, by is_secret_key's rule.
    assert redact("connection.url", "jdbc:postgresql://db/app?sslpassword=K&user=u&x=1") == \
        f"jdbc:postgresql://db/app?sslpassword={MASK}&user=u&x=1"
    assert redact("connection.url", "jdbc:sqlserver://h;trustStorePassword=T;password={a;b};x=1"
                  ) == f"jdbc:sqlserver://h;trustStorePassword={MASK};password={MASK};x=1"
    assert redact("url", "https://h/api?access_token=TOK&page=2") == \
        f"https://h/api?access_token={MASK}&page=2"
    assert redact("connection.url", "jdbc:mysql://h/db?password=my pass&y=2") == \
        f"jdbc:mysql://h/db?password={MASK}&y=2"


@pytest.mark.parametrize(("url", "shown"), [
    ("http://u:Url@S3c@127.0.0.1:8083", f"http://u:{MASK}@127.0.0.1:8083"),
    ("http://u:Url/S3c@127.0.0.1:8083", f"http://u:{MASK}@127.0.0.1:8083"),
    ("nats://t0k@S3c@h:4222,nats://u:p/S3c@h2", f"nats://{MASK}@h:4222,nats://u:{MASK}@h2"),
    ("http://127.0.0.1:8083?token=S3c&x=1", f"http://127.0.0.1:8083?token={MASK}&x=1"),
    ("http://h:8081/apis/ccompat/v7", "http://h:8081/apis/ccompat/v7")])
def test_a_server_url_is_shown_without_any_piece_of_its_password(url: str, shown: str) -> None:
    # QA 64-b: the user info ended at its first '@' or '/': `connectors --url
    # http://u:Url@S3c@h:1 list` said "unreachable at http://u:*****@S3c@h:1", a '/' in the
    # password showed it whole ("Kafka Connect URL 'http://u:Url/S3c@...' is not valid", and
    # nats.url's load error), a token parameter was shown as written.
    assert shown_url(url) == shown
    assert "S3c" not in shown_url(url)


@pytest.mark.parametrize("url", ["http://u:Url/S3c@127.0.0.1:8083",
                                 "http://u:12/S3c@127.0.0.1:8083", "http://u:Url?S3c@h:8083"])
def test_a_url_whose_password_ends_its_authority_is_refused_without_showing_it(
        url: str, tmp_path: Path) -> None:
    # QA 64-b: `connectors --url http://u:Url/S3c@h:1` said "(Invalid port: 'Url')", and with
    # `u:12/S3c@...` httpx dialled the host "u" while the line named 127.0.0.1; a registry URL
    # passed load the same way. An '@' in the password is no problem: httpx and urllib (the
    # registry client's) end the user info at the last '@'.
    said = url_problem(url)
    assert said is not None and "not percent-encoded" in said and "S3c" not in said, said
    assert "Url" not in said
    config = tmp_path / "router.yaml"
    config.write_text("source: {topics: [raw]}\nroutes: [{topic: a}]\n"
                      "schema_registry: {url: 'http://h:8081'}\n", "utf-8")
    with pytest.raises(ConfigError, match=r"schema_registry\.url.*not percent-encoded") as refused:
        load_config(config, {"CDC_ROUTER__SCHEMA_REGISTRY__URL": url})
    assert "S3c" not in str(refused.value)
    assert url_problem("http://u:Url@S3c@127.0.0.1:8083") is None
    load_config(config, {"CDC_ROUTER__SCHEMA_REGISTRY__URL": "http://u:Url@S3c@127.0.0.1:8081"})


def test_redact_tree_masks_at_any_depth_and_keeps_the_rest() -> None:
    tree = {"kafka": {"sasl_password": "x", "config": {"ssl.key.password": "y", "acks": "all"},
                      "n": 3},
            "list": [{"token": "z"}], "password_length": None, "flag": True}

    assert redact_tree(tree) == {
        "kafka": {"sasl_password": MASK, "config": {"ssl.key.password": MASK, "acks": "all"},
                  "n": 3},
        "list": [{"token": MASK}], "password_length": None, "flag": True}


# -- connectors get / diff / apply ---------------------------------------------------------


def connector_file(tmp_path: Path) -> str:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "c", "config": CONNECTOR}))
    return str(path)


class ConnectWithInfo(ScriptedConnect):
    """Also answers GET /connectors/{name} with Connect's info document."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        parts = request.url.path.strip("/").split("/")
        if request.method == "GET" and len(parts) == 2 and parts[1] in self.configs:
            return httpx.Response(200, json={"name": parts[1], "type": "source", "tasks": [],
                                             "config": self.configs[parts[1]]})
        return super().__call__(request)


@pytest.mark.parametrize("output", ["text", "json"])
def test_connectors_get_masks_secrets(monkeypatch: pytest.MonkeyPatch, output: str) -> None:
    connect = ConnectWithInfo({"c": {"name": "c", **CONNECTOR}})

    result = run_cli(monkeypatch, connect, "get", "c", "-o", output)

    assert result.exit_code == 0, result.output
    assert_no_secret(result.stdout)
    assert "${env:DB_SSL_PASSWORD}" in result.stdout
    assert "${file:/etc/kafka/secrets.properties:jaas}" in result.stdout
    assert "debezium" in result.stdout and "USER_INFO" in result.stdout


@pytest.mark.parametrize("output", ["text", "json"])
def test_connectors_diff_masks_both_sides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                          output: str) -> None:
    connect = ScriptedConnect({"c": {"name": "c", **CONNECTOR_OLD}})

    result = run_cli(monkeypatch, connect, "diff", "-f", connector_file(tmp_path), "-o", output)

    assert result.exit_code == 2, result.output
    assert_no_secret(result.stdout)
    assert "value.converter.basic.auth.user.info" in result.stdout


def test_connectors_apply_dry_run_plan_masks_secrets(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    connect = ScriptedConnect({})  # a new connector: the plan lists every key

    result = run_cli(monkeypatch, connect, "apply", "--dry-run", "-f",
                     connector_file(tmp_path))

    assert result.exit_code == 0, result.output
    assert_no_secret(result.output)
    assert "): create (" in result.stdout
    assert "dry run: 1 to change" in result.stdout
    assert connect.puts == []


def test_connectors_apply_update_plan_masks_secrets(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    connect = ScriptedConnect({"c": {"name": "c", **CONNECTOR_OLD}})

    result = run_cli(monkeypatch, connect, "apply", "--dry-run", "-f",
                     connector_file(tmp_path))

    assert result.exit_code == 0, result.output
    assert_no_secret(result.output)
    assert f"  ~ value.converter.basic.auth.user.info: {MASK} -> {MASK}" in result.stdout


# -- rules check ---------------------------------------------------------------------------

ROUTER_YAML = """\
source: {topics: [outbox.public.outbox]}
routes:
  - topic: 'outbox.event.{type}'
kafka:
  security_protocol: SASL_SSL
  sasl_mechanism: PLAIN
  sasl_username: app
  config:
    ssl.key.password: k3y-pa55
    sasl.oauthbearer.client.secret: cl13nt-s3cret
    ssl.keystore.location: /etc/kafka/app.p12
    ssl.key.pem: PEM-K3Y-BODY
  producer:
    sasl.jaas.config: 'PlainLoginModule required password="jaas-Pa55";'
  consumer:
    sasl.oauthbearer.token: tok-3n
schema_registry:
  url: https://registry:8081
  basic_auth_user_info: 'sr-user:sr-Pa55'
  config:  # properties SchemaRegistryClient takes (it refuses others at load)
    ssl.certificate.location: /etc/registry/app.pem
    ssl.key.location: /etc/registry/app.key
    ssl.key.password: k3y-pa55
cleanup: {mode: delete, dsn: 'postgresql://u:db-Pa55@h/db'}
nats: {url: 'nats://nuser:n4ts-Pa55@127.0.0.1:4222'}
"""


@pytest.mark.parametrize("output", ["text", "json"])
def test_rules_check_masks_every_secret(tmp_path: Path, output: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(ROUTER_YAML)
    refused = CliRunner().invoke(main, ["rules", "check", "-c", str(path), "-o", output])
    assert refused.exit_code == 1 and "Java JAAS configuration is not supported" in \
        refused.output, refused.output  # librdkafka's refusal, as `run` would meet it
    assert_no_secret(refused.output)
    monkeypatch.setattr(clients, "refused_property", lambda config: None)

    result = CliRunner().invoke(main, ["rules", "check", "-c", str(path), "-o", output])

    assert result.exit_code == 0, result.output
    assert_no_secret(result.output)
    if output == "json":
        config = json.loads(result.stdout)["config"]
        assert config["kafka"]["config"] == {"ssl.key.password": MASK,
                                             "sasl.oauthbearer.client.secret": MASK,
                                             "ssl.keystore.location": "/etc/kafka/app.p12",
                                             "ssl.key.pem": MASK}
        assert config["kafka"]["producer"]["sasl.jaas.config"] == MASK
        assert config["kafka"]["sasl_username"] == "app"
        assert config["schema_registry"]["config"]["ssl.key.password"] == MASK
        assert config["schema_registry"]["url"] == "https://registry:8081"


def test_a_secret_of_the_wrong_type_is_not_echoed_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("source: {topics: [t]}\nroutes: [{topic: x}]\n"
                    "kafka: {sasl_password: 905512345}\n")

    result = CliRunner().invoke(main, ["rules", "check", "-c", str(path)])

    assert result.exit_code == 1
    assert "kafka.sasl_password" in result.stderr and "905512345" not in result.stderr


def test_rules_check_json_masks_a_token_in_a_server_url(tmp_path: Path) -> None:
    # Review 46-2 F11: `nats://TOKEN@host` (NATS's token form) was printed in clear by -o json.
    path = tmp_path / "router.yaml"
    path.write_text("source: {topics: [t]}\nroutes: [{nats: {subject: orders.x}}]\n"
                    "nats: {url: 'nats://u:pw1@h:4221, nats://s3cr3tTOKEN@h:4222', "
                    "streams: [{name: S, subjects: ['orders.>']}]}\n"
                    "schema_registry: {url: 'http://regTOKEN@h:8081'}\n")

    result = CliRunner().invoke(main, ["rules", "check", "-c", str(path), "-o", "json"])

    assert result.exit_code == 0, result.output
    assert "s3cr3tTOKEN" not in result.output and "regTOKEN" not in result.output
    assert "pw1" not in result.output
    config = json.loads(result.stdout)["config"]
    assert config["nats"]["url"] == f"nats://u:{MASK}@h:4221,nats://{MASK}@h:4222"
    assert config["schema_registry"]["url"] == f"http://{MASK}@h:8081"
