"""Planning the JetStream streams of a config: create, update in place, warn on fixed fields."""

from __future__ import annotations

import pytest

from cdc_router.config.nats import StreamSpec
from cdc_router.nats.streams import config_changes, plan_streams, wanted

ORDERS = StreamSpec(name="ORDERS", subjects=["orders.>"], duplicate_window_ms=3_600_000)


def test_a_missing_stream_is_created_with_the_configured_duplicate_window() -> None:
    [plan] = plan_streams([ORDERS], {})
    assert plan.action == "create"
    assert plan.changes["duplicate_window"] == (None, 3600.0)
    assert plan.changes["subjects"] == (None, ["orders.>"])


def test_a_matching_stream_is_unchanged_and_a_changed_limit_is_an_update() -> None:
    assert [p.action for p in plan_streams([ORDERS], {"ORDERS": wanted(ORDERS)})] == [
        "unchanged"]
    shorter = {**wanted(ORDERS), "duplicate_window": 120.0}
    [plan] = plan_streams([ORDERS], {"ORDERS": shorter})
    assert (plan.action, plan.changes) == ("update", {"duplicate_window": (120.0, 3600.0)})


def test_the_plan_is_shown_in_the_configs_names_and_milliseconds() -> None:
    # QA 62-b F-6: `duplicate_window: 120.0 -> 3600.0` (nats-py's name, in seconds) of a config
    # that says duplicate_window_ms: 3600000.
    live = {**wanted(ORDERS), "duplicate_window": 120.0, "max_age": 1.003, "max_msgs": 5,
            "no_ack": True}
    [plan] = plan_streams([ORDERS], {"ORDERS": live})
    assert config_changes(plan.changes) == {
        "duplicate_window_ms": (120_000, 3_600_000), "max_age_ms": (1003, 0),
        "max_msgs": (5, -1), "no_ack": (True, False)}
    assert config_changes(plan_streams([ORDERS], {})[0].changes)["replicas"] == (None, 1)


def test_storage_and_replicas_are_never_changed_only_warned_about() -> None:
    live = {**wanted(ORDERS), "storage": "memory", "num_replicas": 3}
    [plan] = plan_streams([ORDERS], {"ORDERS": live})
    assert plan.action == "unchanged"
    assert [w.split(" is ")[0] for w in plan.warnings] == ["storage", "replicas"]
    # Review 53-c F9: "JetStream cannot change it" was untrue of replicas (a cluster can).
    assert plan.warnings[0].endswith("left as is (JetStream cannot change it on a live stream)")
    assert plan.warnings[1] == (
        f"replicas is 3, the config says {ORDERS.replicas}: left as is: `streams apply` does "
        f"not change a live stream's replicas; `nats stream edit ORDERS --replicas "
        f"{ORDERS.replicas}` does (a clustered JetStream)")


def test_a_stream_switched_to_discard_new_is_put_back_and_a_message_size_limit_is_named() -> None:
    # QA, session 28: both were "unchanged", though discard new stalls the whole router.
    drifted = {**wanted(ORDERS), "discard": "new", "max_msg_size": 1024}
    [plan] = plan_streams([ORDERS], {"ORDERS": drifted})
    assert plan.action == "update" and plan.changes == {"discard": ("new", "old")}
    assert any("max_msg_size is 1024" in warning for warning in plan.warnings)
    unlimited = {**wanted(ORDERS), "max_msg_size": -1}
    assert plan_streams([ORDERS], {"ORDERS": unlimited})[0].action == "unchanged"


def test_durations_read_back_from_the_server_match_to_the_millisecond() -> None:
    # Review L3: nats-py sends int(seconds * 1e9), so 1.003 s is stored as 1002999999 ns and
    # read back as 1.002999999 s; compared as floats, every apply planned an update.
    from nats.js.api import StreamConfig

    odd = StreamSpec(name="ORDERS", subjects=["orders.>"], duplicate_window_ms=1003,
                     max_age_ms=86_400_007)
    sent = StreamConfig(name="ORDERS", duplicate_window=wanted(odd)["duplicate_window"],
                        max_age=wanted(odd)["max_age"]).as_dict()
    assert sent["duplicate_window"] == 1_002_999_999  # the truncation this guards against
    back = StreamConfig.from_response(dict(sent))
    live = {**wanted(odd), "duplicate_window": back.duplicate_window, "max_age": back.max_age}
    assert plan_streams([odd], {"ORDERS": live})[0].action == "unchanged"
    longer = {**live, "duplicate_window": 1.004}
    assert plan_streams([odd], {"ORDERS": longer})[0].changes == {
        "duplicate_window": (1.004, 1.003)}


def test_a_server_window_shorter_than_the_configs_stops_the_start_naming_the_field() -> None:
    # QA 49-a F5: the server's stream kept duplicates for 3 s, the config said 24 h; `run`
    # started without a word and a batch re-published after a crash was stored twice.
    from cdc_router.nats.streams import start_problem

    [plan] = plan_streams([ORDERS], {"ORDERS": {**wanted(ORDERS), "duplicate_window": 3.0}})
    problem = start_problem(2, plan)
    assert problem is not None
    assert str(problem) == (
        "field 'nats.streams[2].duplicate_window_ms': stream ORDERS detects duplicates for "
        "3000 ms on the server, shorter than the config's 3600000 ms: a batch re-published "
        "after a crash would be stored twice once the server's window has passed; set the "
        "server's window with `cdc-router streams apply -c <config>` (a longer one there is "
        "fine)")


def test_a_longer_server_window_or_another_limit_lets_the_router_start() -> None:
    from cdc_router.nats.streams import start_problem

    for drift in ({"duplicate_window": 7200.0}, {"max_msgs": 10}, {}):
        [plan] = plan_streams([ORDERS], {"ORDERS": {**wanted(ORDERS), **drift}})
        assert start_problem(0, plan) is None, drift


def test_server_subjects_that_no_longer_capture_the_configs_stop_the_start() -> None:
    # QA 49-a F7: ORDERS changed to orders2.> on the server; `run` started, and every batch
    # failed for ever (no stream captured orders.*), Kafka routes held with it.
    from cdc_router.nats.streams import start_problem

    [plan] = plan_streams([ORDERS], {"ORDERS": {**wanted(ORDERS), "subjects": ["orders2.>"]}})
    problem = start_problem(0, plan)
    assert problem is not None
    assert str(problem) == (
        "field 'nats.streams[0].subjects': stream ORDERS on the server captures orders2.>, not "
        "the config's orders.>: no stream would store those events; give it the config's "
        "subjects with `cdc-router streams apply -c <config>`")
    narrower = plan_streams([ORDERS], {"ORDERS": {**wanted(ORDERS), "subjects": ["orders.*"]}})
    assert start_problem(0, narrower[0]) is not None  # orders.a.b would be lost


def test_server_subjects_that_still_cover_the_configs_let_the_router_start() -> None:
    from cdc_router.nats.streams import start_problem

    for held in (["orders.>", "refunds.>"], [">"], ["orders.>"]):
        [plan] = plan_streams([ORDERS], {"ORDERS": {**wanted(ORDERS), "subjects": held}})
        assert start_problem(0, plan) is None, held


@pytest.mark.parametrize(("wide", "narrow", "covers"), [
    ("a.>", "a.b", True), ("a.>", "a.b.>", True), ("a.*", "a.b", True), ("a.*", "a.*", True),
    (">", "a.>", True), ("a.b", "a.b", True), ("a.*", "a.>", False), ("a.b", "a.*", False),
    ("a.*.>", "a.>", False), ("a.>", "a", False), ("a.*", "b.c", False)])
def test_subject_covers_when_the_wide_one_matches_all_the_narrow_one_does(
        wide: str, narrow: str, covers: bool) -> None:
    from cdc_router.config.nats_subjects import subject_covers

    assert subject_covers(wide, narrow) is covers


def test_lowering_a_limit_below_what_is_stored_says_what_it_deletes() -> None:
    # QA 49-a F9: `max_msgs: 50 -> 10` deleted 40 stored events, consumed or not, and the plan
    # said only "max_msgs: 50 -> 10".
    small = StreamSpec(name="ORDERS", subjects=["orders.>"], duplicate_window_ms=3_600_000,
                       max_msgs=10, max_bytes=4096 + 1_000_000, max_age_ms=7_200_000)
    live = {**wanted(small), "max_msgs": 50, "max_bytes": -1, "max_age": 0.0,
            "messages": 50, "bytes": 2_000_000}
    [plan] = plan_streams([small], {"ORDERS": live})
    assert plan.warnings == (
        "lowers max_msgs 50 -> 10: JetStream deletes the oldest messages beyond it at once, "
        "consumed or not (50 messages stored now)",
        "lowers max_bytes -1 -> 1004096: JetStream deletes the oldest messages beyond it at "
        "once, consumed or not (2000000 bytes stored now)",
        "lowers max_age_ms 0 -> 7200000: JetStream deletes the messages older than that at "
        "once, consumed or not (50 messages stored now)")


def test_lowering_max_msgs_names_the_consumers_that_lose_messages_not_yet_acked() -> None:
    # QA 65-b F-7: 500 messages a durable had not read went with only the stored count said.
    small = StreamSpec(name="ORDERS", subjects=["orders.>"], duplicate_window_ms=3_600_000,
                       max_msgs=100)
    live = {**wanted(small), "max_msgs": 1000, "messages": 900, "bytes": 100,
            "unacked": [("svc", 500), ("audit", 100), ("late", 101)]}
    [plan] = plan_streams([small], {"ORDERS": live})
    assert plan.warnings == (
        "lowers max_msgs 1000 -> 100: JetStream deletes the oldest messages beyond it at "
        "once, consumed or not (900 messages stored now); consumers that lose messages not "
        "yet acked: svc 400 of its 500, late 1 of its 101",)


def test_a_lower_limit_that_still_holds_what_is_stored_or_a_raised_one_warns_nothing() -> None:
    small = StreamSpec(name="ORDERS", subjects=["orders.>"], duplicate_window_ms=3_600_000,
                       max_msgs=100)
    for live in ({**wanted(small), "max_msgs": 500, "messages": 60, "bytes": 100},
                 {**wanted(small), "max_msgs": 50, "messages": 50, "bytes": 100},
                 {**wanted(small), "max_age": 10_000.0, "messages": 0, "bytes": 0}):
        [plan] = plan_streams([small], {"ORDERS": live})
        assert plan.warnings == (), live


def test_a_refusal_for_subjects_another_stream_holds_names_both_streams() -> None:
    # QA 49-a F4: `streams apply --yes` said only "subjects overlap with an existing stream".
    import asyncio
    from types import SimpleNamespace

    from nats.js.errors import BadRequestError

    from cdc_router.errors import ConfigError
    from cdc_router.nats.streams import StreamAdmin

    class Server:
        async def add_stream(self, config: object) -> None:
            raise BadRequestError(code=400, err_code=10065,
                                  description="subjects overlap with an existing stream")

        async def streams_info(self) -> list[SimpleNamespace]:
            return [SimpleNamespace(config=SimpleNamespace(name=name, subjects=subjects))
                    for name, subjects in (("OTHER", ["misc.>"]), ("ORDERS", ["orders.>"]))]

    misc = StreamSpec(name="MISC", subjects=["misc.a", "x.>"])
    [plan] = plan_streams([misc], {})
    with pytest.raises(ConfigError) as caught:
        asyncio.run(StreamAdmin._write(Server(), [(4, misc, plan)]))
    assert str(caught.value) == (
        "field 'nats.streams[4].subjects': JetStream refused stream MISC: 'misc.a' overlaps "
        "'misc.>' of stream OTHER, and a subject is stored in one stream only; take those "
        "subjects out of the other stream, or route to that stream's subjects and declare it "
        "in nats.streams instead")


@pytest.mark.parametrize("mode", ["--dry-run", "--yes"])
def test_a_dry_run_refuses_a_stream_that_overlaps_one_outside_the_config(
        tmp_path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    # Review 53-c F8: `streams apply --dry-run` planned "create RVOTHER2", exit 0, and `--yes`
    # then stopped on JetStream's refusal; the plan now finds the overlap first, either way.
    from types import SimpleNamespace

    from click.testing import CliRunner
    from nats.js.errors import NotFoundError

    from cdc_router.cli import main
    from cdc_router.nats.streams import StreamAdmin

    class Server:
        async def stream_info(self, name: str) -> object:
            raise NotFoundError

        async def streams_info(self) -> list[SimpleNamespace]:
            return [SimpleNamespace(config=SimpleNamespace(name=name, subjects=subjects))
                    for name, subjects in (("RVOTHER", ["rvother.>"]),
                                           ("RVORDERS", ["rvorders.>"]))]

    async def call(self: StreamAdmin, work: object, argument: object) -> object:
        return await work(Server(), argument)  # type: ignore[operator]

    monkeypatch.setattr(StreamAdmin, "_call", call)
    config = tmp_path / "nats.yaml"
    config.write_text("source: {topics: [raw]}\nroutes: [{topic: x}]\n"
                      "nats: {url: 'nats://127.0.0.1:1', streams: [\n"
                      "  {name: RVORDERS, subjects: ['rvorders.>']},\n"
                      "  {name: RVOTHER2, subjects: ['rvother.>']}]}\n", "utf-8")
    result = CliRunner().invoke(main, ["streams", "apply", "-c", str(config), mode])
    assert (result.exit_code, result.stdout) == (1, ""), result.output
    assert result.stderr == (
        "error: field 'nats.streams[1].subjects': JetStream refused stream RVOTHER2: "
        "'rvother.>' overlaps 'rvother.>' of stream RVOTHER, and a subject is stored in one "
        "stream only; take those subjects out of the other stream, or route to that "
        "stream's subjects and declare it in nats.streams instead\n")
