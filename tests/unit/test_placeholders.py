"""${NAME} / ${NAME:-default} expansion, and Connect's ${provider:...} left alone."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_router.config.placeholders import expand, expand_tree, provider_references
from cdc_router.errors import ConfigError


def test_a_set_variable_is_substituted() -> None:
    assert expand("${DB_HOST}:${DB_PORT}", {"DB_HOST": "db", "DB_PORT": "5432"},
                  source="f.json") == "db:5432"


def test_the_default_applies_only_when_the_variable_is_unset() -> None:
    assert expand("${DB_PORT:-15432}", {}, source="f.json") == "15432"
    assert expand("${DB_PORT:-15432}", {"DB_PORT": "6543"}, source="f.json") == "6543"
    assert expand("${DB_PORT:-15432}", {"DB_PORT": ""}, source="f.json") == ""
    assert expand("x${SUFFIX:-}y", {}, source="f.json") == "xy"


def test_a_default_may_hold_colons_dots_and_spaces() -> None:
    assert expand("${URL:-http://127.0.0.1:8083/a b}", {}, source="f") == \
        "http://127.0.0.1:8083/a b"


@pytest.mark.parametrize("reference", [
    "${env:CDC_ROUTER_DB_PASSWORD}",
    "${file:/etc/kafka/secrets.properties:db.password}",
    "${dir:/run/secrets:db-password}",
    "${vault:secret/data/db:password}",
])
def test_config_provider_references_reach_connect_verbatim(reference: str) -> None:
    text = f"pre {reference} post"

    assert expand(text, {"env": "x", "CDC_ROUTER_DB_PASSWORD": "leak"}, source="f") == text
    assert provider_references(text) == [reference]


def test_an_unset_variable_without_default_names_the_variable_file_and_field() -> None:
    with pytest.raises(ConfigError) as caught:
        expand("${SLOT_NAME}", {}, source="connectors/outbox.json", field="config.slot.name")

    message = str(caught.value)
    assert "${SLOT_NAME} is not set and has no default" in message
    assert "connectors/outbox.json" in message
    assert "config.slot.name" in message
    assert "\n" not in message


@pytest.mark.parametrize("text", [
    "outbox.event.${routedByValue}",  # Debezium EventRouter's route.topic.replacement
    "${lower}", "${}", "${1ABC}", "${A-B}", "${routedByValue:-x}",
])
def test_anything_else_in_braces_is_left_verbatim_for_its_owner(text: str) -> None:
    assert expand(text, {"lower": "x", "routedByValue": "y", "A": "a"}, source="f") == text


def test_the_eventrouter_placeholder_is_not_taken_for_a_provider_reference() -> None:
    assert provider_references("outbox.event.${routedByValue}") == []


def test_ours_and_foreign_placeholders_mix_in_one_value() -> None:
    assert expand("${PREFIX:-outbox}.event.${routedByValue}", {}, source="f") == \
        "outbox.event.${routedByValue}"


def test_a_nested_placeholder_in_a_default_is_rejected_not_half_expanded() -> None:
    with pytest.raises(ConfigError, match="nested placeholder"):
        expand("${A:-${B}}", {"B": "b"}, source="f")


def test_expand_tree_expands_keys_and_values_and_keeps_other_types() -> None:
    tree = {"name": "${NAME:-c}", "config": {"${KEY:-k}": "${VALUE}", "n": 1, "b": True,
                                             "l": ["${VALUE}", None]}}

    assert expand_tree(tree, {"VALUE": "v"}, source="f") == {
        "name": "c", "config": {"k": "v", "n": 1, "b": True, "l": ["v", None]}}


def test_expand_tree_reports_the_path_of_the_failing_value() -> None:
    with pytest.raises(ConfigError, match=r"field 'config\.slot\.name'"):
        expand_tree({"config": {"slot.name": "${SLOT}"}}, {}, source="f")


def test_a_value_with_quotes_cannot_break_out_of_its_string() -> None:
    assert expand_tree({"q": "${Q}"}, {"Q": '", "x": "y'}, source="f") == {"q": '", "x": "y'}


@given(st.text().filter(lambda text: "${" not in text))
def test_text_without_placeholders_is_unchanged(text: str) -> None:
    assert expand(text, {}, source="f") == text
