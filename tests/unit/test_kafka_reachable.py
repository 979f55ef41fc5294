"""The router's cdc_router_kafka_reachable from librdkafka's statistics (kafka/reachable.py;
QA 58-b F-6: Kafka stopped 73 s and the router's own /metrics said nothing of it). The real
stack's test: tests/integration/test_router_kafka_reachable.py."""

from __future__ import annotations

import json

from cdc_router.kafka.reachable import STATS_INTERVAL_MS, BrokerReach
from cdc_router.router.metrics import RouterMetrics
from tests.unit.test_router_loop import Harness, cluster_with, events


def stats(**states: str) -> str:
    """librdkafka's statistics of a consumer, trimmed to what the watch reads: each broker by
    its name (as librdkafka 2.x names them) with its connection's state."""
    source = {"127.0.0.1:26092/bootstrap": "configured", "GroupCoordinator": "logical",
              ":0/internal": "internal"}
    brokers = {name: {"name": name, "nodeid": -1 if name in source else 1,
                      "source": source.get(name, "learned"), "state": state}
               for name, state in states.items()}
    return json.dumps({"name": "rdkafka#consumer-1", "type": "consumer", "ts": 1,
                       "brokers": brokers, "topics": {}})


UP = stats(**{"127.0.0.1:26092/1": "UP", "GroupCoordinator": "UP"})
# Kafka stopped: the learned broker's connection refused, librdkafka retrying it (its states
# seen in an outage: DOWN, INIT, TRY_CONNECT, CONNECT); the internal broker's state is no
# connection's.
DOWN = stats(**{"127.0.0.1:26092/1": "TRY_CONNECT", "GroupCoordinator": "DOWN",
                ":0/internal": "UP"})
STARTING = stats(**{"127.0.0.1:26092/bootstrap": "CONNECT", "GroupCoordinator": "INIT"})


def test_the_watch_says_each_change_of_whether_a_broker_connection_is_up() -> None:
    said: list[bool] = []
    watch = BrokerReach(said.append)
    for document in (STARTING, UP, UP, DOWN, stats(**{"127.0.0.1:26092/1": "CONNECT"}),
                     "not json", json.dumps({"brokers": None}), "[]", UP):
        watch(document)
    assert said == [False, True, False, True]
    assert watch.client_config() == {"statistics.interval.ms": STATS_INTERVAL_MS,
                                     "stats_cb": watch}


def test_the_router_s_gauge_follows_its_consumer_s_statistics_and_comes_back() -> None:
    harness = Harness(cluster_with(*events(2)),
                      kafka={"consumer": {"statistics.interval.ms": "60000"}})
    harness.router.run()
    assert harness.consumers, "the router built no consumer"
    assert harness.metric("cdc_router_kafka_reachable") == 1.0  # before any statistics
    for consumer in harness.consumers:  # a renewed consumer's too
        assert consumer.config["statistics.interval.ms"] == STATS_INTERVAL_MS
        consumer.config["stats_cb"](UP)
        assert harness.metric("cdc_router_kafka_reachable") == 1.0
        # Its partitions revoked at the session timeout: no lag series is left to say it.
        consumer.config["stats_cb"](DOWN)
        assert harness.metric("cdc_router_kafka_reachable") == 0.0
        consumer.config["stats_cb"](UP)
        assert harness.metric("cdc_router_kafka_reachable") == 1.0


def test_the_gauge_is_exposed_from_the_start() -> None:
    samples = {sample.name: sample.value for family in RouterMetrics().registry.collect()
               for sample in family.samples}
    assert samples["cdc_router_kafka_reachable"] == 1.0
