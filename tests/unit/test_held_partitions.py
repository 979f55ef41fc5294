"""router/held.py: a raw partition read no further while records wait behind its high
watermark is logged once per stall, from the consumer lag's periodic update."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from cdc_router.config.load import load_config
from cdc_router.config.source import SourceSettings
from cdc_router.router.metrics import RouterMetrics
from cdc_router.router.values import Committed
from tests.unit.router_fakes import RAW
from tests.unit.test_router_loop import Harness, cluster_with, events
from tests.unit.test_settings import error_of, write

HELD_WARNING_S = SourceSettings().held_partition_warning_s  # 60 s


def idle() -> set[tuple[str, int]]:
    """No partition has records read and not committed."""
    return set()


def busy() -> set[tuple[str, int]]:
    """raw[0] has records read and not committed (the open batch's, the poll's)."""
    return {("raw", 0)}


class _Consumer:
    """One assigned raw partition at `position`, its last fetch's high watermark `high`."""

    def __init__(self, position: int, high: int) -> None:
        self.position_at, self.high = position, high

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("raw", 0)]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition("raw", 0, self.position_at)]

    def get_watermark_offsets(self, partition: Any, cached: bool = False) -> tuple[int, int]:
        assert cached  # no network call on the loop
        return 0, self.high


def _held(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "event=raw_partition_" in r.getMessage()]


def test_a_partition_held_behind_its_high_watermark_is_logged_once_per_stall(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 54-b F-1: a transaction open on the raw topic held partition 0 for 3 minutes
    # (19,250 records waiting): the router logged nothing.
    caplog.set_level(logging.INFO, "cdc_router.router")
    metrics, consumer = RouterMetrics(), _Consumer(56020, 56030)
    for second in range(0, int(HELD_WARNING_S) + 30, 5):
        consumer.high += 500  # the writer goes on; nothing past 56020 is readable
        metrics.observe_lag(consumer, float(second), HELD_WARNING_S, idle)
    said = _held(caplog)
    assert len(said) == 1, said
    assert said[0].startswith("event=raw_partition_held topic=raw partition=0 position=56020 ")
    assert "README runbook 'a raw partition held by an open transaction'" in said[0]
    assert metrics.registry.get_sample_value(
        "cdc_router_consumer_lag", {"topic": "raw", "partition": "0"}) == consumer.high - 56020
    consumer.position_at = 70_000  # the transaction ended: the router reads again
    metrics.observe_lag(consumer, 200.0, HELD_WARNING_S, idle)
    assert _held(caplog)[1].startswith("event=raw_partition_released topic=raw partition=0 ")


def test_a_partition_that_moves_or_waits_for_nothing_is_not_held(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "cdc_router.router")
    metrics, moving, still = RouterMetrics(), _Consumer(100, 110), _Consumer(100, 100)
    for second in range(0, 300, 5):
        moving.position_at += 10  # a busy partition: records always in flight, read on
        moving.high += 10
        metrics.observe_lag(moving, float(second), HELD_WARNING_S, idle)
    quiet = RouterMetrics()
    for second in range(0, 300, 5):
        quiet.observe_lag(still, float(second), HELD_WARNING_S, idle)  # all read: an idle pipeline
    assert _held(caplog) == []


def test_the_bound_is_source_held_partition_warning_s(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    # QA 54-b: the 60 s before event=raw_partition_held was a constant, and the stack's test
    # waited on it; an operator whose transactions last longer (or who wants to know sooner)
    # could not move it.
    caplog.set_level(logging.INFO, "cdc_router.router")
    config = load_config(write(tmp_path, "source: {topics: [raw], held_partition_warning_s: 5}"
                                         "\nroutes: [{topic: out}]\n")).config
    assert config.source.held_partition_warning_s == 5
    assert HELD_WARNING_S == 60  # the default: today's bound
    metrics, consumer = RouterMetrics(), _Consumer(56020, 56030)
    for second in range(0, 5):
        metrics.observe_lag(consumer, float(second), config.source.held_partition_warning_s,
                            idle)
    assert _held(caplog) == []
    metrics.observe_lag(consumer, 5.0, config.source.held_partition_warning_s, idle)
    assert _held(caplog)[0].startswith("event=raw_partition_held topic=raw partition=0 ")


def test_the_router_watches_its_partitions_with_the_configured_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    harness = Harness(cluster_with(*events(3)), source={
        "topics": [RAW], "group_id": "g", "held_partition_warning_s": 7})
    bounds: list[float] = []
    in_flight: set[tuple[str, int]] = set()
    monkeypatch.setattr(harness.metrics, "observe_lag",
                        lambda consumer, now, bound_s, busy: (bounds.append(bound_s),
                                                              in_flight.update(busy())))
    harness.run()
    assert bounds and set(bounds) == {7}
    assert in_flight == {(RAW, 0)}  # the poll's records count from the committed offset


@pytest.mark.parametrize(("value", "expected"), [
    ("0.5", "(got 0.5)"), ("0", "(got 0)"), ("-60", "(got -60)"), (".nan", "(got nan)"),
    (".inf", "(got inf)"),
])
def test_a_bound_below_a_second_or_not_finite_is_refused_naming_field_and_value(
        tmp_path: Path, value: str, expected: str) -> None:
    error = error_of(tmp_path, f"source: {{topics: [raw], held_partition_warning_s: {value}}}"
                               "\nroutes: [{topic: out}]\n")
    assert "field 'source.held_partition_warning_s': must be a number of seconds, at least 1 " \
        "(the router looks at its partitions once a second), e.g. 60 (the default)" in error
    assert expected in error


def test_consumer_lag_counts_records_fetched_but_not_committed() -> None:
    # QA 55-c F-3: a batch stuck in routing (a slow registry) read 0 while the group was
    # 4,317 records behind: the lag was the high watermark minus the position after the fetch.
    metrics = RouterMetrics()
    value = metrics.registry.get_sample_value
    labels = {"topic": "raw", "partition": "0"}
    metrics.assigned([TopicPartition("raw", 0)], [TopicPartition("raw", 0, 100)])
    metrics.observe_lag(_Consumer(5000, high=5000), 10.0, 60, busy)
    assert value("cdc_router_consumer_lag", labels) == 4900  # from the group's offset
    metrics.committed(Committed([], [], [], {("raw", 0): 4000}), now_ms=0)
    metrics.observe_lag(_Consumer(5000, high=5200), 11.0, 60, busy)
    assert value("cdc_router_consumer_lag", labels) == 1200  # from this router's commit
    metrics.committed(Committed([], [], [], {("raw", 0): 5200}), now_ms=0)
    metrics.observe_lag(_Consumer(5200, high=5200), 12.0, 60, idle)
    assert value("cdc_router_consumer_lag", labels) == 0
    # Reassigned with no committed offset (a new group): from the position, as before.
    metrics.assigned([TopicPartition("raw", 0)], None)
    metrics.observe_lag(_Consumer(5100, high=5200), 13.0, 60, busy)
    assert value("cdc_router_consumer_lag", labels) == 100


def test_an_idle_partition_past_a_commit_marker_has_no_lag() -> None:
    # Reread 55-r F-1: a transactional raw topic ends each transaction with a commit marker,
    # an offset no record holds: the router commits up to its last record, one short of the
    # high watermark, and counted from that offset an idle partition read 1 for ever (the
    # alert CdcRouterConsumerStuck fired on every quiet period). Nothing in flight: from the
    # position, which librdkafka moves past the marker.
    metrics = RouterMetrics()
    labels = {"topic": "raw", "partition": "0"}
    metrics.assigned([TopicPartition("raw", 0)], [TopicPartition("raw", 0, 100)])
    metrics.committed(Committed([], [], [], {("raw", 0): 4199}), now_ms=0)  # marker at 4199
    metrics.observe_lag(_Consumer(4200, high=4200), 10.0, 60, idle)
    assert metrics.registry.get_sample_value("cdc_router_consumer_lag", labels) == 0
    metrics.observe_lag(_Consumer(4300, high=4300), 11.0, 60, busy)  # 100 read, in flight
    assert metrics.registry.get_sample_value("cdc_router_consumer_lag", labels) == 101
