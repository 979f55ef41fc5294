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


@pytest.mark.parametrize(("section", "expected"), [
    ("topics: [{name: t, partitions: 010}]",
     "field 'topics[0].partitions': YAML reads 010 as the octal number 8; write 8, or 10"),
    ("status: {lag_warning: 017}", "field 'status.lag_warning': YAML reads 017 as the octal"),
    ("delivery: {commit_max_records: 1:30}",
     "field 'delivery.commit_max_records': YAML reads 1:30 as 90 (base 60, as a time); write 90"),
    ("cleanup: {batch_size: '12:30:00'}", "field 'cleanup.batch_size'"),  # quoted: not a number
    ("cleanup: {batch_size: 12:30:00}", "YAML reads 12:30:00 as 45000"),
])
def test_a_number_yaml_reads_in_another_base_is_refused(tmp_path: Path, section: str,
                                                        expected: str) -> None:
    # Review 48-e F3: `partitions: 010` created 8 partitions, `1:30` was 90 records.
    assert expected in error_of(tmp_path, MINIMAL + "topics: [{name: t}]\n" * (
        "topics" not in section) + section + "\n")


@pytest.mark.parametrize(("section", "env", "field", "got"), [
    ("cleanup: {mode: retention, retention_ms: 7d}", {}, "cleanup.retention_ms", "'7d'"),
    ("cleanup: {interval_ms: 1e30}", {}, "cleanup.interval_ms", "'1e30'"),  # YAML 1.1: text
    ("dedup: {window_ms: '1.5'}", {}, "dedup.window_ms", "'1.5'"),
    ("", {"CDC_ROUTER__CLEANUP__RETENTION_MS": "7 days"}, "cleanup.retention_ms", "'7 days'"),
])
def test_a_duration_in_ms_written_with_a_unit_is_refused_saying_milliseconds(
        tmp_path: Path, section: str, env: dict[str, str], field: str, got: str) -> None:
    # QA 55-b F-4: "unable to parse string as an integer", while `outbox purge` takes 7d.
    message = error_of(tmp_path, MINIMAL + section + "\n", env)
    assert f"field '{field}': takes an integer number of milliseconds, e.g. 604800000 for 7 " \
           f"days (a duration with a unit, such as 7d, is not read here) (got {got})" in message


def test_a_number_of_milliseconds_as_text_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(MINIMAL + "cleanup: {interval_ms: '250'}\n")
    config = load_config(path, env={"CDC_ROUTER__DEDUP__WINDOW_MS": " 60_000 "}).config
    assert (config.cleanup.interval_ms, config.dedup.window_ms) == (250, 60_000)


def test_a_number_whose_text_keeps_its_meaning_loads(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(MINIMAL + "topics: [{name: t, partitions: 0x10}]\n"
                    "delivery: {commit_max_records: 1_000, commit_interval_ms: +5}\n")
    config = load_config(path).config
    assert (config.topics[0].partitions, config.delivery.commit_max_records,
            config.delivery.commit_interval_ms) == (16, 1000, 5)


@pytest.mark.parametrize(("match", "field"), [
    ('{type: ""}', "routes[0].match.type"), ('{type: "\\t"}', "routes[0].match.type"),
    ('{aggregate_type: [Order, " "]}', "routes[0].match.aggregate_type"),
    ('{header: {tenant: ""}}', "routes[0].match.header"),
])
def test_an_empty_or_blank_match_pattern_is_refused(tmp_path: Path, match: str,
                                                    field: str) -> None:
    # Review 48-e F16: the route never matched, and its events silently took the next route.
    message = error_of(tmp_path, "source: {topics: [a]}\nroutes:\n"
                       f"  - {{match: {match}, topic: paid}}\n  - {{topic: other}}\n")
    assert f"field '{field}" in message and "a pattern cannot be empty or blank" in message


@pytest.mark.parametrize(("section", "field", "value"), [
    ("topics: [{name: t, config: {retention.ms: nan}}]", "topics[0].config.retention.ms", "nan"),
    ("dead_letter: {config: {retention.ms: '1e3'}}", "dead_letter.config.retention.ms", "1e3"),
    ("topics: [{name: t, config: {segment.bytes: 0x10}}]", "topics[0].config.segment.bytes",
     "0x10"),
])
def test_a_topic_configs_time_or_size_must_be_a_whole_number(tmp_path: Path, section: str,
                                                             field: str, value: str) -> None:
    # Review 48-e F14: `rules check` said valid (a log line), and `topics apply` sent it.
    message = error_of(tmp_path, MINIMAL + section + "\n")
    assert f"field '{field}': must be a whole number (milliseconds or bytes; -1 for no limit) " \
        f"(got '{value}')" in message, message


def test_a_topic_configs_whole_numbers_load(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(MINIMAL + "topics: [{name: t, config: {retention.ms: -1, segment.bytes: "
                    "1_000, cleanup.policy: compact}}]\n")
    assert load_config(path).config.topics[0].config == {
        "retention.ms": "-1", "segment.bytes": "1000", "cleanup.policy": "compact"}

