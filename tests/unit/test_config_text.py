"""router.yaml's text and its overrides: what the loader refuses before any model sees it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_router.config.load import load_config
from cdc_router.errors import ConfigError

MINIMAL = "source: {topics: [outbox.public.outbox]}\nroutes: [{topic: t}]\n"


def error_of(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    path = tmp_path / "router.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env)
    message = str(caught.value)
    assert "\n" not in message and message.encode("utf-8"), "one line a terminal can print"
    return message


@pytest.mark.parametrize(("text", "line"), [
    ('source: {topics: ["^out\\ud800"]}\nroutes: [{topic: t}]\n', 1),  # segfaulted subscribe
    (MINIMAL + 'kafka: {client_id: "a\\ud800"}\n', 3),
    (MINIMAL + 'kafka: {config: {client.rack: "\\udcff"}}\n', 3),
    (MINIMAL + 'kafka: {config: {"\\udcff": "1"}}\n', 3),
    (MINIMAL + 'protected_topics: ["\\ud800"]\n', 3),
    ('source: {topics: [a]}\nroutes: [{topic: t, cloudevents: true, ce_source: "/\\ud800"}]\n',
     2),
    ('source: {topics: [a]}\nroutes: [{topic: t, headers: {mood: "\\ude00\\ud83d"}}]\n', 2),
    ('source: {topics: [a]}\nroutes: [{topic: t, match: {type: "\\U0000d800"}}]\n', 2),
])
def test_a_lone_surrogate_in_the_file_is_refused_with_its_line(tmp_path: Path, text: str,
                                                               line: int) -> None:
    # Review 48-e F4-F6: a segfault, tracebacks, or every event of a route dead-lettered.
    message = error_of(tmp_path, text)
    assert f"line {line}, column" in message and "lone UTF-16 surrogate" in message, message
    assert message.endswith("write the character itself, or escape it as \\U and 8 hex digits "
                            "(\\U0001F600)")


def test_a_surrogate_pair_is_the_character_json_means(tmp_path: Path) -> None:
    # json.dumps writes 😀 as "\ud83d\ude00", and JSON is YAML.
    path = tmp_path / "router.yaml"
    path.write_text('{"source": {"topics": ["a"]}, "routes": [{"topic": "t", '
                    '"headers": {"mood": "\\ud83d\\ude00"}}]}\n', encoding="utf-8")
    assert load_config(path).config.routes[0].headers == {"mood": "\U0001f600"}


@pytest.mark.parametrize(("env", "expected"), [
    ({"CDC_ROUTER__SOURCE__TOPICS__0": "^a\udcff"},
     "via environment variable CDC_ROUTER__SOURCE__TOPICS__0: its value is not valid UTF-8"),
    ({"CDC_ROUTER__KAFKA__CLIENT_ID": "a\udcff"},
     "via environment variable CDC_ROUTER__KAFKA__CLIENT_ID: its value is not valid UTF-8"),
    ({"CDC_ROUTER__SOURCE__TOPICS": '["a\\ud800"]'},
     "CDC_ROUTER__SOURCE__TOPICS: its JSON holds a lone UTF-16 surrogate"),
    ({"CDC_ROUTER__KAFKA__CONFIG__A\udcff": "1"},
     "environment variable 'CDC_ROUTER__KAFKA__CONFIG__A\\udcff': its name is not valid UTF-8"),
])
def test_an_override_that_is_not_utf8_is_refused_naming_the_variable(
        tmp_path: Path, env: dict[str, str], expected: str) -> None:
    assert expected in error_of(tmp_path, MINIMAL, env)


@pytest.mark.parametrize("status", ["{wal_warning_bytes: off}", "{wal_critical_bytes: on}"])
def test_a_byte_count_yaml_reads_as_a_boolean_is_refused(tmp_path: Path, status: str) -> None:
    # Review 48-e F2: `off` was 0 bytes (the check always fired), `on` 1 byte.
    message = error_of(tmp_path, MINIMAL + f"status: {status}\n")
    assert "field 'status.wal_" in message and "must be a number, not a boolean" in message
