"""Stream settings made by hand outside the config (QA 54-d F-2, F-3, F-9): `streams apply`
sets back what it can, says what only a new stream mends, and the start refuses what would
lose events or stall every batch."""

from __future__ import annotations

import pytest

from cdc_router.config.nats import StreamSpec
from cdc_router.nats.streams import plan_streams, start_problem, wanted

ORDERS = StreamSpec(name="ORDERS", subjects=["orders.>"], duplicate_window_ms=3_600_000)
RECREATE = ("JetStream cannot change it on a live stream: delete the stream (`nats stream rm "
            "ORDERS`, its stored messages go with it; copy them first if they matter) and "
            "create it with `cdc-router streams apply -c <config>`")


@pytest.mark.parametrize(("setting", "line"), [
    ({"retention": "interest"}, "retention interest: JetStream drops each message once the "
                                "consumers it has (interest) or one of them (workqueue) took "
                                "it, right after storing it when none exists: events acked "
                                "and lost"),
    ({"retention": "workqueue"}, "retention workqueue: JetStream drops"),
    ({"sealed": True}, "sealed True: a sealed stream refuses every publish for ever"),
    ({"mirror": "OTHER"}, "mirror OTHER: a mirror takes no publish of its own"),
])
def test_a_setting_only_a_new_stream_mends_stops_the_start_and_apply_changes_nothing(
        setting: dict[str, object], line: str) -> None:
    # QA 54-d F-2: `unchanged`, and the router started: 30 events acked and lost (interest),
    # every batch stalled (sealed); F-9: apply printed `applied` on a sealed stream.
    live = {**wanted(ORDERS), **setting, "discard": "new", "duplicate_window": 120.0}
    [plan] = plan_streams([ORDERS], {"ORDERS": live})
    assert (plan.action, plan.changes) == ("unchanged", {})
    [warning] = plan.warnings
    assert "(set outside the config)" in warning and warning.endswith(RECREATE)
    problem = start_problem(1, plan)
    assert problem is not None
    assert str(problem).startswith(
        f"field 'nats.streams[1]': stream ORDERS on the server has {line}")
    assert str(problem).endswith(RECREATE)


def test_no_ack_stops_the_start_and_apply_sets_it_back() -> None:
    # QA 54-d F-2: every batch timed out for ever, no hint, `unchanged`.
    [plan] = plan_streams([ORDERS], {"ORDERS": {**wanted(ORDERS), "no_ack": True}})
    assert (plan.action, plan.changes) == ("update", {"no_ack": (True, False)})
    problem = start_problem(0, plan)
    assert problem is not None and str(problem) == (
        "field 'nats.streams[0]': stream ORDERS on the server has no_ack true: JetStream "
        "acknowledges no publish to it, so every batch would time out; set it "
        "back with `cdc-router streams apply -c <config>`")


def test_discard_new_per_subject_goes_back_with_discard_new() -> None:
    # QA 54-d F-3: the plan said `discard: new -> old` alone, and the server refused it:
    # 'discard new per subject requires discard new policy to be set'.
    live = {**wanted(ORDERS), "discard": "new", "max_msgs_per_subject": 6,
            "discard_new_per_subject": True}
    [plan] = plan_streams([ORDERS], {"ORDERS": live})
    assert plan.changes == {"discard": ("new", "old"), "discard_new_per_subject": (True, False)}
    assert any(warning.startswith("max_msgs_per_subject is 6 (set outside the config): "
                                  "JetStream keeps that many messages per subject")
               for warning in plan.warnings)


def test_per_subject_limits_and_sources_are_warned_about_and_let_the_router_start() -> None:
    live = {**wanted(ORDERS), "max_msgs_per_subject": 5, "sources": ["A", "B"],
            "retention": "limits", "no_ack": False, "sealed": False, "mirror": None,
            "discard_new_per_subject": False}
    [plan] = plan_streams([ORDERS], {"ORDERS": live})
    assert plan.action == "unchanged"
    assert [w.split(" (")[0] for w in plan.warnings] == ["max_msgs_per_subject is 5",
                                                         "sources A, B"]
    assert start_problem(0, plan) is None


def test_memory_storage_is_warned_about_with_the_window() -> None:
    # QA 54-d F-5: `storage: memory` passed rules check and the start without a word; a
    # nats-server restart lost the stream and its 40 acked events.
    from cdc_router.config.nats import NatsSettings

    nats = NatsSettings(ack_timeout_ms=3000, streams=[
        ORDERS, StreamSpec(name="MEM", subjects=["mem.>"], storage="memory",
                           duplicate_window_ms=2000)])
    assert list(nats.warnings_of(0)) == []
    assert list(nats.warnings_of(1)) == ["duplicate_window", "storage"]
    assert nats.stream_warnings()[1].startswith(
        "nats.streams[1].storage memory: nats-server keeps the stream in memory only, so a "
        "restart of the server loses the stream and every event stored in it")


def test_a_stream_set_to_discard_new_is_warned_about_at_start() -> None:
    # QA 54-d F-6: the router started on it without a word; the stall came when it filled.
    from cdc_router.nats.streams import start_warning

    [plan] = plan_streams([ORDERS], {"ORDERS": {**wanted(ORDERS), "discard": "new"}})
    assert start_problem(0, plan) is None
    assert start_warning(0, plan) == (
        "nats.streams[0]: stream ORDERS on the server discards new messages when full (set "
        "outside the config): once it is full, every batch waits, Kafka routes included; "
        "`cdc-router streams apply -c <config>` sets it back to discard old ones")
    [fine] = plan_streams([ORDERS], {"ORDERS": wanted(ORDERS)})
    assert start_warning(0, fine) is None


def test_a_subject_transform_or_async_persistence_is_warned_about_by_apply_start_and_status(
        ) -> None:
    # Reread 54-m F-3: nats-server 2.10+ acks the router's publish and stores it under the
    # transformed subject (a consumer filtering on the config's subjects never sees it); with
    # persist_mode async (2.12) a server crash may lose what it acked. Neither was read, so
    # apply, the start and status said nothing. Left as they are: a transform may shard on
    # purpose (nats-server 2.9.10 drops both from a stream's config, so no live test here).
    from cdc_router.config.nats import NatsSettings
    from cdc_router.nats.streams import start_warning
    from cdc_router.ops.jetstream import streams_state

    live = {**wanted(ORDERS), "subject_transform": "orders.> -> moved.>",
            "persist_mode": "async"}
    [plan] = plan_streams([ORDERS], {"ORDERS": live})
    assert (plan.action, plan.changes, start_problem(0, plan)) == ("unchanged", {}, None)
    transform = ("subject_transform orders.> -> moved.> (set outside the config): JetStream "
                 "stores the router's events under the transformed subjects, so a consumer "
                 "filtering on the config's subjects (filter_subjects) never sees them; "
                 "filter on the transformed subjects, or remove the transform (`nats stream "
                 "edit`)")
    persist = ("persist_mode async (set outside the config): JetStream acks a publish before "
               "writing it, so a nats-server crash may lose events the router has committed "
               "as delivered; use the default persist mode")
    assert plan.warnings == (transform, persist)
    assert start_warning(2, plan) == (f"nats.streams[2]: stream ORDERS on the server has "
                                      f"{transform}; stream ORDERS on the server has {persist}")
    [plan] = plan_streams([ORDERS], {"ORDERS": {**live, "persist_mode": "default",
                                                "discard": "new"}})
    warning = start_warning(0, plan) or ""
    assert warning.startswith("nats.streams[0]: stream ORDERS on the server discards new ")
    assert warning.endswith(f"; stream ORDERS on the server has {transform}")
    nats = NatsSettings(streams=[ORDERS])
    [stream] = streams_state(nats, {"ORDERS": {**live, "messages": 0, "bytes": 0}}, []).streams
    assert stream.start_warning == start_warning(0, plan_streams([ORDERS], {"ORDERS": live})[0])


def test_the_server_s_transform_and_persist_mode_are_read() -> None:
    import asyncio
    from types import SimpleNamespace

    from nats.js.api import PersistMode, StreamConfig, SubjectTransform

    from cdc_router.nats.streams import StreamAdmin

    config = StreamConfig(name="ORDERS", subjects=["orders.>"], persist_mode=PersistMode.ASYNC,
                          subject_transform=SubjectTransform(src=None, dest="moved.>"))

    class FakeJetStream:
        async def stream_info(self, name: str) -> SimpleNamespace:
            return SimpleNamespace(config=config, state=SimpleNamespace(messages=0, bytes=0))

        async def streams_info(self) -> list[SimpleNamespace]:
            return []

        async def consumers_info(self, stream: str) -> list[SimpleNamespace]:
            return []

    found, _ = asyncio.run(StreamAdmin._read(FakeJetStream(), ["ORDERS"]))
    assert (found["ORDERS"]["subject_transform"], found["ORDERS"]["persist_mode"]) == (
        "> -> moved.>", "async")
    config.subject_transform, config.persist_mode = None, None
    found, _ = asyncio.run(StreamAdmin._read(FakeJetStream(), ["ORDERS"]))
    assert (found["ORDERS"]["subject_transform"], found["ORDERS"]["persist_mode"]) == (
        None, "default")
