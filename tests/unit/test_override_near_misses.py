"""CDC_ROUTER__ overrides that cannot be what was meant are refused, naming the variable:
a broken list given for a pattern (QA 57-d F-3), the prefix in lower case or alone (F-5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_router.config.load import load_config
from cdc_router.errors import ConfigError

BASE = ("source: {topics: [outbox.public.outbox], group_id: g}\nroutes:\n"
        "  - {match: {aggregate_type: 'Order*'}, topic: orders}\n  - topic: other\n")
PATTERN = "CDC_ROUTER__ROUTES__0__MATCH__AGGREGATE_TYPE"


def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "router.yaml"
    path.write_text(BASE, encoding="utf-8")
    return path


@pytest.mark.parametrize("value", ['["Order*",', '["Order*", "Pay*"', "[Order*, Payment*]",
                                   "['Order*']"])
def test_a_pattern_override_that_is_a_broken_list_is_refused(tmp_path: Path,
                                                             value: str) -> None:
    path = config_path(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_config(path, {PATTERN: value})
    message = str(caught.value)
    assert message.startswith(
        f"{path} via environment variable {PATTERN}: field 'routes[0].match.aggregate_type': "
        "it reads as a list that is not valid JSON ("), message
    assert f"not as one pattern (got {value!r}); write the list as JSON" in message, message


@pytest.mark.parametrize(("value", "expected"), [
    ("[Oo]rder*", "[Oo]rder*"), ("[OP]rder*", "[OP]rder*"), ('["Order*", "Pay*"]',
                                                            ["Order*", "Pay*"]),
    ('["[,;]x"]', ["[,;]x"]), ("re:^[A-Z],", "re:^[A-Z],")])
def test_globs_and_valid_lists_are_kept(tmp_path: Path, value: str, expected: object) -> None:
    match = load_config(config_path(tmp_path), {PATTERN: value}).config.routes[0].match
    assert match is not None
    assert match.aggregate_type == expected


@pytest.mark.parametrize(("name", "expected"), [
    ("cdc_router__delivery__guarantee",
     "environment variable cdc_router__delivery__guarantee: looks like an override, but "
     "variable names are case-sensitive and overrides start with CDC_ROUTER__ in capitals, so "
     "it would be ignored; rename it CDC_ROUTER__DELIVERY__GUARANTEE"),
    ("Cdc_Router_delivery__guarantee", "rename it CDC_ROUTER__DELIVERY__GUARANTEE"),
    ("CDC_ROUTER__", "environment variable CDC_ROUTER__: names no field, so it would be "
     "ignored; an override names the field's path after it, e.g. "
     "CDC_ROUTER__DELIVERY__GUARANTEE; else unset it"),
])
def test_an_override_that_would_be_ignored_is_refused(tmp_path: Path, name: str,
                                                      expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(config_path(tmp_path), {name: "at_least_once"})
    assert str(caught.value) == expected or str(caught.value).endswith(expected)


def test_lower_case_variables_that_are_no_override_are_left_alone(tmp_path: Path) -> None:
    env = {"cdc_router_config": "x", "CDC_ROUTER_CONFIG": "y", "other__x": "z"}
    assert load_config(config_path(tmp_path), env).config.delivery.guarantee == "exactly_once"


def test_a_broken_mapping_for_a_misspelt_key_gets_its_unknown_key_line(tmp_path: Path) -> None:
    # review 57-b F-2: the broken-list rule fired on an unknown path and printed the password.
    name = "CDC_ROUTER__KAFKA__CONFIGG"
    with pytest.raises(ConfigError) as caught:
        load_config(config_path(tmp_path), {name: '{"sasl.password": "s3cret",'})
    message = str(caught.value)
    assert message.endswith(f"via environment variable {name}: field 'kafka.configg': unknown "
                            "key 'configg'; did you mean 'config'?"), message
    assert "s3cret" not in message


def test_the_broken_list_rule_is_only_for_a_pattern_starting_with_a_bracket(
        tmp_path: Path) -> None:
    # review 57-b F-2: `{Order,Paid}*` (a pattern, not a list) and a schema's text got the
    # "reads as a list ... not as one pattern" wording.
    path = config_path(tmp_path)
    match = load_config(path, {"CDC_ROUTER__ROUTES__0__MATCH__TYPE": "{Order,Paid}*"}
                        ).config.routes[0].match
    assert match is not None
    assert match.type == "{Order,Paid}*"
    with pytest.raises(ConfigError) as caught:
        load_config(path, {"CDC_ROUTER__ROUTES__0__SCHEMA": '["subject", "x",'})
    assert "reads as a list" not in str(caught.value)
