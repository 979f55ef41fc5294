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


def test_the_routers_consumer_reports_a_fetch_quota_to_its_own_metric_and_line(
        caplog: pytest.LogCaptureFixture) -> None:
    # Fixer 58-a: consumer_byte_rate=256 on the router's client id: 0 of 60 events in 150 s,
    # said by nothing but librdkafka's "Timed out 63 in-flight requests"; the consumer had no
    # throttle_cb. A renewed consumer gets it too.
    harness = Harness(cluster_with(*events(2)), kafka={"client_id": "qa58a-router"})
    with caplog.at_level(logging.WARNING, logger="cdc_router.router"):
        harness.router.run()
        assert harness.consumers, "the router built no consumer"
        for consumer in harness.consumers:
            consumer.config["throttle_cb"](throttled(700))
    assert harness.metric("cdc_router_fetch_throttled_seconds_total") == 0.7 * len(
        harness.consumers)
    assert harness.metric("cdc_router_produce_throttled_seconds_total") == 0.0
    [line] = [r.getMessage() for r in caplog.records if "event=throttled" in r.getMessage()]
    assert "client_id=qa58a-router requests=fetch " in line, line
    assert "consumer_byte_rate" in line and "delays its fetch requests: the raw topic (and " \
        "the dedup changelog at a start) is read slower" in line, line


def test_the_changelogs_reader_reports_a_fetch_quota_too() -> None:
    # Reread 58-r F-6: the restore read of the dedup changelog shares the client id and was
    # slowed by a consumer_byte_rate quota without a word.
    from cdc_router.config.compiled import compile_config
    from cdc_router.config.model import RouterConfig
    from cdc_router.router.loop import OutboxRouter
    from tests.unit.router_fakes import CHANGELOG, ORDERS, RAW, FakeChangelog

    cluster = cluster_with(*events(2))
    given: list[dict[str, object]] = []

    def changelog(conf: dict[str, object], topic: str) -> FakeChangelog:
        given.append(conf)
        return FakeChangelog(cluster, topic)

    settings = RouterConfig.model_validate({
        "source": {"topics": [RAW], "group_id": "g"}, "routes": [{"topic": ORDERS}],
        "dedup": {"changelog_topic": CHANGELOG}, "kafka": {"client_id": "qa58a-router"}})
    router = OutboxRouter(compile_config(settings), instance_id="i-1",
                          producer_factory=lambda conf: FakeProducer(cluster, conf),
                          changelog_factory=changelog,
                          describe_factory=cluster.describe_factory,
                          operations_factory=cluster.operations_factory,
                          members_factory=cluster.members_factory)
    [conf] = given
    conf["throttle_cb"](throttled(400))  # type: ignore[operator]
    assert router._metrics.registry.get_sample_value(
        "cdc_router_fetch_throttled_seconds_total") == 0.4


def test_the_relays_and_dlq_replays_producers_say_a_quota_too(
        caplog: pytest.LogCaptureFixture) -> None:
    # Reread 57-a F-10: only `run`'s producer had a throttle_cb; the relay's and `dlq
    # replay`'s slowed under a quota without a word.
    from tests.unit.test_dlq_replay import replayer
    from tests.unit.test_relay_loop import FakeTable, _cluster, _relay

    relay, _ = _relay(_cluster(), FakeTable())
    replay = replayer(cluster_with())
    with caplog.at_level(logging.WARNING, logger="cdc_router.router"):
        for producer in (relay._producer.client, replay._producer.client):
            assert isinstance(producer, FakeProducer)
            producer.config["throttle_cb"](throttled(900))
    assert relay._metrics.registry.get_sample_value(
        "cdc_router_produce_throttled_seconds_total") == 0.9
    lines = [r.getMessage() for r in caplog.records if "event=throttled" in r.getMessage()]
    assert len(lines) == 2 and all("requests=produce " in line for line in lines), lines
