"""What Kafka Connect would refuse with a raw REST error, said locally in one line (review 53-c
F2): a name its URL paths cannot carry, an unclosed placeholder, an unknown connector class."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from cdc_router.connect import ConnectClient, parse_spec
from cdc_router.errors import ConfigError, ConnectError

_CLASS = "io.debezium.connector.postgresql.PostgresConnector"


def _spec(name: str, **config: str) -> str:
    return json.dumps({"name": name, "config": {"connector.class": _CLASS, **config}})


@pytest.mark.parametrize("name, shown", [
    ("rv/slash", "'/'"), ("back\\slash", "'\\\\'"), ("fifty%", "'%'"), ("tab\there", "'\\t'")])
def test_a_name_connects_url_paths_cannot_carry_is_refused_before_any_call(
        name: str, shown: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_spec(_spec(name), {}, source="c.json")
    text = str(refused.value)
    assert text.startswith(f"c.json: field 'name': Kafka Connect's URL paths cannot carry {shown}")
    assert "(got " in text
    for dots in (".", ".."):
        refusal = re.escape("field 'name': a connector named '.' or '..'")
        with pytest.raises(ConfigError, match=refusal):
            parse_spec(_spec(dots), {}, source="c.json")
    assert parse_spec(_spec("outbox-connector_1.v2"), {}, source="c.json").name \
        == "outbox-connector_1.v2"


def test_an_unclosed_placeholder_is_refused_naming_the_key_and_value() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_spec(_spec("c", **{"database.hostname": "${DB_HOST"}), {"DB_HOST": "h"},
                   source="c.json")
    assert str(refused.value) == ("c.json: field 'config.database.hostname': a placeholder '${' "
                                  "is not closed with '}' (got '${DB_HOST'); write ${NAME} or "
                                  "${NAME:-default}")
    with pytest.raises(ConfigError) as secret:
        parse_spec(_spec("c", **{"database.password": "${DB_PASSWORD"}), {}, source="c.json")
    assert "DB_PASSWORD" not in str(secret.value) and "*****" in str(secret.value)
    # Closed ones, ours and Connect's, and a '}' alone, are fine.
    spec = parse_spec(_spec("c", **{"database.hostname": "${DB_HOST}", "a": "${env:X}",
                                    "b": "x}"}), {"DB_HOST": "h"}, source="c.json")
    assert spec.config["database.hostname"] == "h" and spec.config["a"] == "${env:X}"


def test_an_unknown_connector_class_is_one_line_naming_the_field() -> None:
    plugins = ", ".join(f"PluginDesc{{klass=class org.x.C{n}, location='file:/x/{n}.jar'}}"
                        for n in range(50))

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error_code": 500, "message": (
            "org.apache.kafka.connect.runtime.rest.errors.BadRequestException: Failed to find "
            "any class that implements Connector and which name matches no.such.Class, "
            f"available connectors are: {plugins}")})

    client = ConnectClient("http://connect.test:8083", transport=httpx.MockTransport(answer))
    with pytest.raises(ConnectError) as failed:
        client.validate("no.such.Class", {"name": "c"})
    assert str(failed.value) == ("field 'config.connector.class': Kafka Connect has no "
                                 "connector 'no.such.Class': is its plugin installed on the "
                                 "Connect worker?")
