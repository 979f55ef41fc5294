"""Planning the JetStream streams of a config: create, update in place, warn on fixed fields."""

from __future__ import annotations

from cdc_router.config.nats import StreamSpec
from cdc_router.nats.streams import plan_streams, wanted

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


def test_storage_and_replicas_are_never_changed_only_warned_about() -> None:
    live = {**wanted(ORDERS), "storage": "memory", "num_replicas": 3}
    [plan] = plan_streams([ORDERS], {"ORDERS": live})
    assert plan.action == "unchanged"
    assert [w.split(" is ")[0] for w in plan.warnings] == ["storage", "num_replicas"]
