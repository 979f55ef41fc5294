"""router.yaml is read as it is: a `${NAME}` a forgotten envsubst left is refused (QA 57-d F-1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_router.config.load import load_config
from cdc_router.errors import ConfigError

BASE = "source: {topics: [outbox.public.outbox], group_id: g}\nroutes:\n  - topic: orders\n"


def error_of(tmp_path: Path, extra: str, env: dict[str, str] | None = None) -> str:
    path = tmp_path / "router.yaml"
    path.write_text(BASE + extra, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env)
    message = str(caught.value)
    assert "\n" not in message
    return message.removeprefix(f"{path}: ")


@pytest.mark.parametrize(("extra", "expected"), [
    ("  - {match: {aggregate_type: '${AGG}'}, topic: x}\n",
     "field 'routes[1].match.aggregate_type': ${AGG} is not expanded: router.yaml is read as it "
     "is (got '${AGG}'); run the file through envsubst (-c <(envsubst < {path})), or set "
     "CDC_ROUTER__ROUTES__1__MATCH__AGGREGATE_TYPE instead"),
    ("  - {match: {type: ['Order*', '${MORE:-Paid}']}, topic: x}\n",
     "field 'routes[1].match.type[1]': ${MORE:-Paid} is not expanded"),
    ("kafka: {security_protocol: SASL_SSL, sasl_mechanism: PLAIN, sasl_username: u, "
     "sasl_password: '${KAFKA_PASSWORD}'}\n",
     "field 'kafka.sasl_password': ${KAFKA_PASSWORD} is not expanded: router.yaml is read as it "
     "is (got '*****')"),
    ("cleanup: {mode: delete, dsn: 'postgresql://u:${PGPASS}@h:5432/db'}\n",
     "field 'cleanup.dsn': a ${...} in it is not expanded: router.yaml is read as it is (got "
     "'*****'); run the file through envsubst"),
    ("kafka: {config: {ssl.key.password: '${KEYPASS}'}}\n",
     "field \"kafka.config['ssl.key.password']\": ${KEYPASS} is not expanded"),
    ("status: {connector: '${CONNECTOR_NAME:-outbox-connector}'}\n",
     "field 'status.connector': ${CONNECTOR_NAME:-outbox-connector} is not expanded"),
    ("cleanup: {mode: none, table: 'public.${table}'}\n",
     "field 'cleanup.table': ${table} is not expanded"),
    ("  - {topic: x, schema_path: '${SCHEMA}'}\n",  # the field's name, not its alias `schema`
     "field 'routes[1].schema_path': ${SCHEMA} is not expanded"),
])
def test_a_placeholder_left_in_any_value_is_refused(tmp_path: Path, extra: str,
                                                    expected: str) -> None:
    message = error_of(tmp_path, extra)
    assert message.startswith(expected.replace("{path}", str(tmp_path / "router.yaml")))


@pytest.mark.parametrize("placeholder", ["${CONNECTOR:-outbox}", "${CONNECTOR-outbox}",
                                         "${CONNECTOR:?set it}"])
def test_a_placeholder_envsubst_would_not_expand_is_not_sent_to_envsubst(
        tmp_path: Path, placeholder: str) -> None:
    # QA 57-d: GNU envsubst leaves ${NAME:-default} as it is, so "run the file through
    # envsubst" sent the operator round in a circle.
    message = error_of(tmp_path, f"status: {{connector: '{placeholder}'}}\n")
    assert message.endswith("; envsubst expands ${NAME} only, not ${NAME:-default}: set "
                            "CDC_ROUTER__STATUS__CONNECTOR instead"), message
    assert "run the file through" not in message


def test_the_group_id_placeholder_names_its_override(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(BASE.replace("group_id: g", "group_id: '${GROUP}'"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"field 'source.group_id': \$\{GROUP\} is not "
                       r"expanded.*or set CDC_ROUTER__SOURCE__GROUP_ID instead$"):
        load_config(path, {})


def test_other_dollar_text_and_values_a_variable_sets_are_taken_as_they_are(
        tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(BASE + "kafka: {security_protocol: SASL_SSL, sasl_mechanism: PLAIN, "
                    "sasl_username: 'pa$$word', sasl_password: '${KAFKA_PASSWORD}'}\n",
                    encoding="utf-8")
    config = load_config(path, {"CDC_ROUTER__KAFKA__SASL_PASSWORD": "x${Y}z"}).config
    assert config.kafka.sasl_username == "pa$$word"
    assert config.kafka.sasl_password is not None
    assert config.kafka.sasl_password.get_secret_value() == "x${Y}z"
    path.write_text(BASE.replace("topic: orders", "{match: {type: 're:^a\\$\\{2}'}, "
                                 "topic: orders}") + "  - topic: other\n", encoding="utf-8")
    load_config(path, {})


@pytest.mark.parametrize(("extra", "expected"), [
    ("dead_letter: {topik: '${DLQ}'}\n",
     "field 'dead_letter.topik': unknown key 'topik'; did you mean 'topic'?"),
    ("kafka: {sasl_pasword: 'hunter2${X}'}\n",
     "field 'kafka.sasl_pasword': unknown key 'sasl_pasword'; did you mean 'sasl_password'?"),
])
def test_a_misspelt_key_holding_a_placeholder_gets_its_unknown_key_line(
        tmp_path: Path, extra: str, expected: str) -> None:
    # review 57-b F-1: the placeholder check ran first, named a variable for a field that does
    # not exist, lost the "did you mean", and showed a misspelt password key's value.
    message = error_of(tmp_path, extra)
    assert message == expected
    assert "hunter2" not in message


@pytest.mark.parametrize(("extra", "field"), [
    ("kafka: {security_protocol: SASL_SSL, sasl_mechanism: PLAIN, sasl_username: u, "
     "sasl_password: 'Tr0ub${a}dor'}\n", "'kafka.sasl_password'"),
    ("kafka: {config: {sasl.jaas.config: 'org.apache.kafka.common.security.plain."
     "PlainLoginModule required username=\"u\" password=\"s3${cr}et\";'}}\n",
     "\"kafka.config['sasl.jaas.config']\""),
    ("schema_registry: {url: 'http://u:p${w}d@registry:8081'}\n", "'schema_registry.url'"),
])
def test_a_placeholder_inside_a_secret_is_not_quoted(tmp_path: Path, extra: str,
                                                     field: str) -> None:
    # review 57-b F-4: the masked value was followed by the placeholder, a piece of the secret.
    message = error_of(tmp_path, extra)
    assert message.startswith(f"field {field}: a ${{...}} in it is not expanded: router.yaml "
                              "is read as it is (got '"), message
    for piece in ("${a}", "${cr}", "${w}", "Tr0ub", "s3", "p${w}d"):
        assert piece not in message, message
