"""A produce quota on the router's client id is said, a line a minute, and counted."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from cdc_router.kafka.throttle import LOG_INTERVAL_S, ThrottleWatch
from tests.unit.router_fakes import FakeProducer
from tests.unit.test_router_loop import Harness, cluster_with, events


def throttled(ms: int) -> SimpleNamespace:
    return SimpleNamespace(broker_name="127.0.0.1:29092/1", broker_id=1, throttle_time=ms / 1000)


def test_a_quota_is_one_line_a_minute_naming_the_client_and_the_longest_delay(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 57-a F-4: producer_byte_rate=5000 on the router's client id: 4.5 minutes with only
    # "Message timed out" and a status that said "stuck or down".
    now = [0.0]
    seconds: list[float] = []
    watch = ThrottleWatch("qa57a-router", on_throttle=seconds.append, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="cdc_router.router"):
        watch(throttled(0))  # librdkafka's end of a throttle
        watch(throttled(1200))
        for ms in (800, 2500, 300):
            now[0] += 10
            watch(throttled(ms))
        now[0] = LOG_INTERVAL_S + 1
        watch(throttled(100))
    lines = [r.getMessage() for r in caplog.records if "event=throttled" in r.getMessage()]
    assert len(lines) == 2
    assert "client_id=qa57a-router" in lines[0] and "throttle_ms=1200 responses=1" in lines[0]
    assert "producer_byte_rate" in lines[0] and "--entity-name qa57a-router" in lines[0]
    assert "throttle_ms=2500 responses=4" in lines[1]
    assert seconds == [1.2, 0.8, 2.5, 0.3, 0.1]


def test_the_routers_producer_reports_throttling_to_its_metric() -> None:
    harness = Harness(cluster_with(*events(2)), kafka={"client_id": "qa57a-router"})
    producer = harness.router._producer.client
    assert isinstance(producer, FakeProducer)
    producer.config["throttle_cb"](throttled(1500))
    assert harness.metric("cdc_router_produce_throttled_seconds_total") == 1.5
