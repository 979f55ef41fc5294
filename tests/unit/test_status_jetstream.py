"""`status`'s JetStream section (QA 54-d F-8): NATS down, a declared stream missing or one the
router's start refuses were said only as the router's stall, a minute later."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from cdc_router.cli._status_text import as_json, as_text
from cdc_router.config.model import RouterConfig
from cdc_router.config.nats import NatsSettings, StreamSpec
from cdc_router.config.status import StatusSettings
from cdc_router.nats.streams import wanted
from cdc_router.ops.exporter import StatusCollector
from cdc_router.ops.jetstream import jetstream_state, streams_state
from cdc_router.ops.report import JetStreamState, StreamState
from cdc_router.ops.verdict import judge, verdict
from tests.unit.test_status_verdict import SETTINGS, healthy

ORDERS = StreamSpec(name="ORDERS", subjects=["orders.>"], max_msgs=1000)
NATS = NatsSettings(url="nats://user:secret@127.0.0.1:4222", streams=[ORDERS])
URL = "nats://user:*****@127.0.0.1:4222"
APPLY = "`cdc-router streams apply -c <config>`"


def _live(**settings: object) -> dict[str, object]:
    """ORDERS as StreamAdmin.read finds it on the server, with `settings` changed."""
    return {**wanted(ORDERS), "messages": 10, "bytes": 2048, **settings}


def _lines(state: JetStreamState | None, settings: StatusSettings = SETTINGS) -> list[str]:
    return [str(problem) for problem in judge(replace(healthy(), jetstream=state), settings)]


def _config(routes: list[dict[str, object]], url: str = "nats://127.0.0.1:4222") -> RouterConfig:
    return RouterConfig.model_validate(yaml.safe_load(f"""
        source: {{topics: [outbox.public.outbox]}}
        nats: {{url: "{url}", streams: [{{name: ORDERS, subjects: ["orders.>"]}}]}}
        """) | {"routes": routes})


def test_a_healthy_stream_is_shown_and_no_problem() -> None:
    state = streams_state(NATS, {"ORDERS": _live()}, [])
    assert state == JetStreamState(answered=True, url=URL, streams=(StreamState(
        "ORDERS", ("orders.>",), True, messages=10, bytes=2048, max_msgs=1000, max_bytes=-1,
        discard="old"),))
    assert _lines(state) == []
    text = as_text(replace(healthy(), jetstream=state), [])
    assert f"jetstream {URL}:" in text
    assert "ORDERS  orders.>  10 of 1000 (1%)  2.0 KiB  old      -" in text


def test_a_missing_stream_is_critical_and_says_to_apply() -> None:
    state = streams_state(NATS, {}, [])
    assert state.streams == (StreamState("ORDERS", ("orders.>",), exists=False),)
    assert _lines(state) == [
        f"critical: jetstream: stream ORDERS (orders.>) does not exist on NATS at {URL}: "
        "nothing stores those subjects' events, so every batch with an event for it fails and "
        "is retried, holding back every route (Kafka routes too), and the router's start "
        f"refuses the config; run {APPLY}"]
    assert "ORDERS  orders.>  MISSING" in as_text(replace(healthy(), jetstream=state), [])


def test_a_missing_stream_whose_subjects_another_holds_says_apply_would_be_refused() -> None:
    state = streams_state(NATS, {}, [("LEGACY", "orders.*")])
    [line] = _lines(state)
    assert line.endswith(f"run {APPLY}; as things are it would be refused: field "
                         "'nats.streams[0].subjects': JetStream refused stream ORDERS: "
                         "'orders.>' overlaps 'orders.*' of stream LEGACY, and a subject is "
                         "stored in one stream only; take those subjects out of the other "
                         "stream, or route to that stream's subjects and declare it in "
                         "nats.streams instead")


def test_drift_the_start_refuses_is_critical_in_its_words() -> None:
    state = streams_state(NATS, {"ORDERS": _live(no_ack=True)}, [])
    assert state.streams[0].changes == {"no_ack": (True, False)}
    assert _lines(state) == [
        "critical: jetstream: the router's start refuses stream ORDERS as the server has it: "
        "field 'nats.streams[0]': stream ORDERS on the server has no_ack true: JetStream "
        f"acknowledges no publish to it, so every batch would time out; set it back with "
        f"{APPLY}"]
    assert "no_ack" in as_text(replace(healthy(), jetstream=state), [])


def test_a_stream_only_a_new_one_mends_is_critical() -> None:
    [line] = _lines(streams_state(NATS, {"ORDERS": _live(retention="interest")}, []))
    assert line.startswith("critical: jetstream: the router's start refuses stream ORDERS as "
                           "the server has it: field 'nats.streams[0]': stream ORDERS on the "
                           "server has retention interest")


def test_drift_the_start_lets_pass_is_shown_not_judged() -> None:
    # A longer duplicate window on the server is fine (start_problem): the table says it.
    state = streams_state(NATS, {"ORDERS": _live(duplicate_window=200_000.0)}, [])
    assert _lines(state) == []
    assert "duplicate_window" in as_text(replace(healthy(), jetstream=state), [])


@pytest.mark.parametrize(("messages", "stored", "level"), [
    (899, 2048, None), (900, 2048, "warning"), (10, 95 * 1024, "warning")])
def test_a_stream_near_its_limit_warns(messages: int, stored: int, level: str | None) -> None:
    state = streams_state(NATS, {"ORDERS": _live(messages=messages, bytes=stored,
                                                 max_bytes=100 * 1024)}, [])
    found = _lines(state)
    assert [line.split(":")[0] for line in found] == ([level] if level else [])
    if level and messages == 900:
        assert found[0].startswith("warning: jetstream: stream ORDERS holds 900 of its "
                                   "max_msgs 1000 (90%), warning at 90%: at the limit "
                                   "JetStream deletes its oldest message")
    if level and stored > 2048:
        assert "holds 97280 of its max_bytes 102400 (95%)" in found[0]
    assert _lines(state, StatusSettings(stream_usage_warning_percent=None)) == []


def test_a_full_stream_that_discards_new_messages_is_critical() -> None:
    state = streams_state(NATS, {"ORDERS": _live(messages=1000, discard="new")}, [])
    found = _lines(state, StatusSettings(stream_usage_warning_percent=None))
    assert found[0].startswith("critical: jetstream: stream ORDERS holds 1000 of its max_msgs "
                               "1000 (100%) and discards new messages (set outside the "
                               "config): JetStream refuses every publish to it")
    assert found[1].startswith("warning: jetstream: nats.streams[0]: stream ORDERS on the "
                               "server discards new messages")


def test_nats_down_is_critical_and_no_route_to_jetstream_no_section() -> None:
    down = JetStreamState(error="cannot connect to NATS at nats://127.0.0.1:4222 "
                                "(TimeoutError); is nats-server running?", url=URL)
    assert _lines(down) == [
        "critical: jetstream: cannot check it: cannot connect to NATS at "
        "nats://127.0.0.1:4222 (TimeoutError); is nats-server running?"]
    report = replace(healthy(), jetstream=down)
    document = json.loads(json.dumps(as_json(report, judge(report, SETTINGS))))
    assert document["status"] == "critical"
    assert document["jetstream"] == {"error": down.error, "answered": False, "url": URL,
                                     "streams": []}
    assert f"jetstream {URL}: NOT CHECKED: cannot connect" in as_text(report, [])
    # No JetStream route: no section in either output, and nothing to judge.
    assert "jetstream" not in as_json(healthy(), [])
    assert "jetstream" not in as_text(healthy(), [])
    assert verdict(judge(healthy(), SETTINGS)) == "ok"


def test_the_probe_asks_nats_only_for_jetstream_routes_and_says_it_is_down() -> None:
    assert jetstream_state(_config([{"topic": "orders"}])) is None
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    state = jetstream_state(_config([{"nats": {"subject": "orders.{type}"}}],
                                    f"nats://127.0.0.1:{port}"), timeout_s=1.0)
    assert state is not None and state.error is not None
    assert state.error.startswith(f"cannot connect to NATS at nats://127.0.0.1:{port}")
    assert (state.answered, state.url, state.streams) == (False, f"nats://127.0.0.1:{port}",
                                                          ())


def test_the_exporter_says_whether_nats_answered() -> None:
    collector = StatusCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    down = replace(healthy(), jetstream=JetStreamState(error="down", url=URL))
    collector.update(down, judge(down, SETTINGS))
    assert registry.get_sample_value("cdc_router_status_up", {"part": "jetstream"}) == 0
    collector.failed()  # a check without a report: the last report's parts are down
    assert registry.get_sample_value("cdc_router_status_up", {"part": "jetstream"}) == 0
    missing = replace(healthy(), jetstream=streams_state(NATS, {}, []))
    collector.update(missing, judge(missing, SETTINGS))
    assert registry.get_sample_value("cdc_router_status_up", {"part": "jetstream"}) == 1
    assert registry.get_sample_value("cdc_router_jetstream_stream_exists",
                                     {"stream": "ORDERS"}) == 0
    found = replace(healthy(), jetstream=streams_state(NATS, {"ORDERS": _live()}, []))
    collector.update(found, judge(found, SETTINGS))
    assert [registry.get_sample_value(f"cdc_router_jetstream_stream_{name}",
                                      {"stream": "ORDERS"}) for name in (
        "exists", "messages", "bytes")] == [1, 10, 2048]
    collector.update(healthy(), judge(healthy(), SETTINGS))
    collector.failed()
    assert registry.get_sample_value("cdc_router_status_up", {"part": "jetstream"}) is None
    assert registry.get_sample_value("cdc_router_status_up", {"part": "wal"}) == 0


def test_a_credentials_file_that_is_gone_cannot_be_checked(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    from click.testing import CliRunner

    from cdc_router.cli import main
    from cdc_router.cli import status as status_command

    def no_probe(check: object) -> None:
        raise AssertionError("probed")

    monkeypatch.setattr(status_command, "IsolatedChecks", no_probe)
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({
        "source": {"topics": ["outbox.public.outbox"]},
        "routes": [{"nats": {"subject": "orders.{type}"}}],
        "nats": {"credentials_file": str(tmp_path / "gone.creds"),
                 "streams": [{"name": "ORDERS", "subjects": ["orders.>"]}]}}))
    result = CliRunner().invoke(main, ["status", "-c", str(config)])
    assert result.exit_code == 3, result.output
    assert "nats.credentials_file" in result.output and "file not found" in result.output
