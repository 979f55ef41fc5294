"""Route topic templates no row could fill into a name the router may produce to are config
errors at load (QA 36-b F5: `__{type}` passed `rules check`, then dead-lettered every event)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.config.load import load_config
from tests.unit.test_settings import error_of, write

ROUTE = "source: {{topics: [outbox.public.outbox]}}\nroutes:\n  - topic: '{topic}'\n"
ALLOWED = "allowed_topics: ['orders.*', 're:fz\\.agg\\..+', exact.name]\n"


@pytest.mark.parametrize(("topic", "expected"), [
    ("__{type}", "every topic it renders starts with '__', which marks Kafka's internal topics; "
                 "give the template another fixed start (got '__{type}')"),
    ("__x.{aggregate_type}.{type}", "starts with '__'"),
    # Each literal fits; with a character per field the shortest name does not.
    ("a" * 200 + "{type}" + "b" * 49, "every topic it renders has over 249 characters (its fixed "
                                      "text and at least one per field: 250); a topic name has "
                                      "at most 249"),
    ("{type}.{id}" + "y" * 248, "at least one per field: 251)"),
    # Already refused before (a literal's own characters or length), still one line.
    ("a b.{type}", "illegal characters ' ' in topic 'a b.'"),
    ("a/{type}", "illegal characters '/'"),
    ("a:{type}", "illegal characters ':'"),
])
def test_a_template_kafka_can_never_take_is_a_config_error(tmp_path: Path, topic: str,
                                                            expected: str) -> None:
    message = error_of(tmp_path, ROUTE.format(topic=topic))
    assert "field 'routes[0].topic': " in message and expected in message


@pytest.mark.parametrize("topic", ["_{type}", "{type}__", "x.__{type}", "." + "{type}",
                                   "a" * 248 + "{type}", "{type}" + "z" * 248])
def test_templates_some_row_can_fill_legally_still_load(tmp_path: Path, topic: str) -> None:
    assert load_config(write(tmp_path, ROUTE.format(topic=topic))).config.routes[0].topic == topic


def test_rules_check_refuses_an_internal_template_in_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, ROUTE.format(topic="__{type}"))
    result = CliRunner().invoke(main, ["rules", "check", "-c", str(path)])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "field 'routes[0].topic'" in result.output


@pytest.mark.parametrize("topic", ["payments.{type}", "fz.aggx{type}", "exact.name{type}",
                                   "x{aggregate_type}.orders"])
def test_a_template_whose_fixed_start_no_allowed_topic_takes_is_a_config_error(
        tmp_path: Path, topic: str) -> None:
    fixed = topic.partition("{")[0]
    message = error_of(tmp_path, ROUTE.format(topic=topic) + ALLOWED)
    assert (f"field 'routes[0].topic': every topic it renders starts with '{fixed}', which "
            "matches none of allowed_topics ('orders.*', 're:fz\\\\.agg\\\\..+', 'exact.name'); "
            f"add a pattern for it there, or change the route's topic (got '{topic}')"
            in message)


@pytest.mark.parametrize("topic", ["orders.{type}", "ord{type}", "fz.agg.{type}", "fz.{type}",
                                   "exact.{type}", "{type}", "{aggregate_type}.payments"])
def test_a_template_whose_fixed_start_may_match_an_allowed_topic_loads(
        tmp_path: Path, topic: str) -> None:
    # Conservative: only a fixed start that disagrees with every pattern's literal start is
    # refused; whether row data then matches is checked per event, as before.
    config = load_config(write(tmp_path, ROUTE.format(topic=topic) + ALLOWED)).config
    assert config.routes[0].topic == topic


def test_a_regex_allowed_topic_without_a_literal_start_takes_any_template(
        tmp_path: Path) -> None:
    text = ROUTE.format(topic="payments.{type}") + "allowed_topics: ['re:orders|payments\\..*']\n"
    assert load_config(write(tmp_path, text)).config.allowed_topics == ["re:orders|payments\\..*"]
