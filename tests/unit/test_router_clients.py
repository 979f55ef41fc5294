"""Client policy and the destination metadata cache."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from cdc_router.config.config_warnings import config_warnings
from cdc_router.config.connections import _PINNED, _SHADOWED
from cdc_router.config.model import RouterConfig
from cdc_router.errors import BatchFailed, RecordRefused, RouteError
from cdc_router.kafka.changelog_reader import ChangelogReader
from cdc_router.router import clients
from cdc_router.router.destinations import (
    FOUND_RECHECK_S,
    MISSING_RECHECK_S,
    REFUSED_GRANT_RECHECK_S,
    ClusterListing,
    DestinationMetadata,
)
from cdc_router.router.partitioner import java_default_partition


def config(**kafka: Any) -> RouterConfig:
    return RouterConfig.model_validate({"source": {"topics": ["raw"], "group_id": "g"},
                                        "routes": [{"topic": "{aggregate_id}"}],
                                        "kafka": kafka})


def test_every_property_the_router_overrides_is_refused_or_warned_about() -> None:
    # Review 46-2 F12: the user's value of a pinned property was taken and silently ignored.
    # This holds router/clients.py to the tables of config/connections.py.
    base = config()
    for section, build in (("producer", clients.producer_config),
                            ("consumer", clients.consumer_config)):
        for key in build(base, "i"):
            user = {key: "user-value"}
            kafka = base.kafka.model_copy(update={section: user, "config": user})
            if build(base.model_copy(update={"kafka": kafka}), "i").get(key) == "user-value":
                continue  # the user's value is taken
            assert key in _SHADOWED or key in _PINNED or key == "logger", key
            if key in _PINNED:
                assert len(kafka.ignored_properties()) == 2, key  # under config and section
    warned = config_warnings(config(
        consumer={"auto.offset.reset": "latest", "isolation.level": "READ_COMMITTED"},
        producer={"acks": "-1", "linger.ms": "9"}, config={"acks": "1"}))
    assert warned == [
        "kafka.config['acks'] '1' is ignored: the router's producer uses all (a record counts "
        "as written once every in-sync replica has it)",
        "kafka.consumer['auto.offset.reset'] 'latest' is ignored: the router's consumer uses "
        "earliest (a group with no committed offset starts at the raw topic's beginning, so "
        "that no event is lost; to skip its history, commit the group's offsets before the "
        "first start (kafka-consumer-groups --group <source.group_id> --topic <raw topic> "
        "--reset-offsets --to-latest --execute))"]


@pytest.mark.parametrize(("section", "key", "field"), [
    ("consumer", "group.id", "source.group_id"), ("config", "group.id", "source.group_id"),
    ("producer", "transactional.id", "delivery.transactional_id"),
    ("producer", "transaction.timeout.ms", "delivery.transaction_timeout_ms"),
    ("producer", "client.id", "kafka.client_id")])
def test_a_property_a_field_of_ours_sets_is_refused(section: str, key: str, field: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=rf"set {re.escape(field)}\b.* instead "
                       rf"of kafka.{section}\['{re.escape(key)}'\]"):
        config(**{section: {key: "x"}})


def test_no_client_of_the_router_creates_topics_even_when_the_user_asks() -> None:
    asked = config(config={"allow.auto.create.topics": "true"},
                   producer={"allow.auto.create.topics": "true"},
                   consumer={"allow.auto.create.topics": "true"})
    built = [clients.producer_config(asked, "i"), clients.consumer_config(asked, "i"),
             clients.common_config(asked),
             ChangelogReader(clients.common_config(asked), "dedup")._config]
    assert all(client["allow.auto.create.topics"] is False for client in built)


def test_transactional_settings_come_from_delivery() -> None:
    settings = RouterConfig.model_validate({
        "source": {"topics": ["raw"]}, "routes": [{"topic": "t"}],
        "delivery": {"transaction_timeout_ms": 90_000}})
    produced = clients.producer_config(settings, "i-1")
    assert produced["transaction.timeout.ms"] == 90_000
    assert produced["transactional.id"] == "cdc-router-i-1"
    # QA, session 26: two pipelines on one host (--instance-id the host name by default)
    # shared `cdc-router-<host>` and fenced each other; the prefix is the group's by default.
    groups = [RouterConfig.model_validate({"source": {"topics": ["raw"], "group_id": group},
                                           "routes": [{"topic": "t"}]}) for group in "ab"]
    assert [clients.producer_config(c, "host")["transactional.id"] for c in groups] == [
        "a-host", "b-host"]
    timeouts = clients.Timeouts(90_000)
    assert (timeouts.call_s, timeouts.init_s, timeouts.stable_offsets_s) == (90, 90, 180)


def test_the_producer_partitions_keys_as_javas_default_partitioner_does() -> None:
    # QA, session 26: `partition: kafka_default` left it to librdkafka's own default, CRC32
    # (consistent_random), so a key landed elsewhere than from a Java producer. Real
    # librdkafka, on its mock cluster (4 partitions a topic).
    settings = RouterConfig.model_validate({"source": {"topics": ["raw"]},
                                            "routes": [{"topic": "t"}],
                                            "delivery": {"guarantee": "at_least_once"}})
    producer = Producer({**clients.producer_config(settings, "i"), "bootstrap.servers": "",
                         "test.mock.num.brokers": 1, "allow.auto.create.topics": True})
    placed: dict[bytes, int] = {}
    for key in [f"tenant{i}".encode() for i in range(20)]:
        producer.produce("t", key=key, value=b"v", on_delivery=lambda error, message, key=key:
                         placed.__setitem__(key, -1 if error else message.partition()))
    assert producer.flush(30) == 0
    partitions = len(producer.list_topics("t", timeout=10).topics["t"].partitions)
    assert placed == {key: java_default_partition(key, partitions) for key in placed}
    assert len(set(placed.values())) > 1
    assert clients.producer_config(config(producer={"partitioner": "consistent_random"}),
                                   "i")["partitioner"] == "consistent_random"


class Lookup:
    def __init__(self, answers: dict[str, int | KafkaError | None]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def __call__(self, topic: str, timeout_s: float) -> int | None:
        self.calls.append(topic)
        answer = self.answers.get(topic)
        if isinstance(answer, KafkaError):
            raise KafkaException(answer)
        return answer


def test_the_metadata_cache_is_a_bounded_lru() -> None:
    lookup = Lookup({f"t{i}": 1 for i in range(10)})
    cache = DestinationMetadata(lookup, max_topics=3)
    for topic in ("t0", "t1", "t2", "t0", "t3"):  # t1 is the least recently used
        cache.partitions(topic)
    assert len(cache) == 3
    cache.partitions("t0")
    cache.partitions("t1")
    assert lookup.calls == ["t0", "t1", "t2", "t3", "t1"]


def test_a_missing_topic_is_asked_again_after_a_while() -> None:
    now = [0.0]
    lookup = Lookup({})
    cache = DestinationMetadata(lookup, clock=lambda: now[0])
    assert cache.partitions("x") is None and cache.partitions("x") is None
    now[0] += MISSING_RECHECK_S
    lookup.answers["x"] = 4
    assert cache.partitions("x") == 4 and lookup.calls == ["x", "x"]


def test_a_topic_found_is_asked_again_after_the_producers_metadata_age() -> None:
    # Cached for the process's life, partitions added to a destination moved its aggregates
    # only at some later restart (review, session 25).
    now = [0.0]
    lookup = Lookup({"x": 3})
    cache = DestinationMetadata(lookup, clock=lambda: now[0])
    assert cache.partitions("x") == 3
    lookup.answers["x"] = 6
    now[0] += FOUND_RECHECK_S - 1
    assert cache.partitions("x") == 3
    now[0] += 1
    assert cache.partitions("x") == 6 and lookup.calls == ["x", "x"]


def test_a_topic_level_refusal_is_the_records_a_cluster_failure_is_not() -> None:
    cache = DestinationMetadata(Lookup({
        "denied": KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED),
        "slow": KafkaError(KafkaError._TIMED_OUT)}))
    with pytest.raises(RouteError, match="TOPIC_AUTHORIZATION_FAILED"):
        cache.partitions("denied")
    with pytest.raises(KafkaException):
        cache.partitions("slow")


def test_a_refusal_as_unknown_of_a_topic_now_not_authorised_is_the_records() -> None:
    # Second review, session 27: the re-check's RouteError escaped the loop (exit 1).
    def lookup(topic: str, timeout_s: float) -> int | None:
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

    refusal = RecordRefused(KafkaError(KafkaError._UNKNOWN_TOPIC, "Local: Unknown topic"))
    DestinationMetadata(lookup).check_refusal("orders", refusal)  # returns: a dead letter
    with pytest.raises(BatchFailed, match="metadata lags"):
        DestinationMetadata(lambda topic, timeout_s: 3).check_refusal("orders", refusal)


def _topic(partitions: int, error: int | None = None) -> Any:
    return SimpleNamespace(partitions=dict.fromkeys(range(partitions)),
                           error=None if error is None else KafkaError(error))


def test_lookups_of_many_missing_names_cost_one_cluster_listing_a_while() -> None:
    # QA, session 30: librdkafka keeps every name a client asks metadata for; 6,000 missing
    # names a template rendered slowed the router to 3 events a second and grew its RSS.
    now, listed = [0.0], []

    def listing(timeout_s: float) -> dict[str, Any]:
        listed.append(now[0])
        return {"orders": _topic(3), "young": _topic(0, KafkaError.LEADER_NOT_AVAILABLE)}

    lookup = ClusterListing(listing, clock=lambda: now[0])
    cache = DestinationMetadata(lookup, clock=lambda: now[0])
    assert [cache.partitions(f"t.{n}") for n in range(1000)] == [None] * 1000
    assert cache.partitions("orders") == 3 and listed == [0.0]
    with pytest.raises(KafkaException):  # no leader yet: the cluster's, never a dead letter
        cache.partitions("young")
    now[0] = MISSING_RECHECK_S
    assert cache.partitions("t.1000") is None and listed == [0.0, MISSING_RECHECK_S]
    cache.clear()  # an assignment: the listing is read again too
    assert cache.partitions("orders") == 3 and len(listed) == 3


def test_every_command_builds_its_kafka_clients_with_the_logged_config() -> None:
    # QA, session 28: `dlq list` against an unreachable broker printed about 600 raw
    # librdkafka lines to stderr in 30 s; its client lacked the logger (and RepeatFilter).
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "cdc_router"
    raw = [str(path.relative_to(package)) for path in package.rglob("*.py")
           if ".kafka.librdkafka()" in path.read_text("utf-8")
           and path.name != "clients.py"]
    assert raw == [], "build Kafka clients from clients.logged_config(config)"
    config = RouterConfig.model_validate({"source": {"topics": ["raw"]},
                                          "routes": [{"topic": "t"}]})
    assert clients.logged_config(config)["logger"].name == "cdc_router.librdkafka"


def test_dead_letters_fit_the_dead_letter_topic_when_the_producer_allows_bigger_records(
        caplog: pytest.LogCaptureFixture) -> None:
    # Found measuring the relay (session 28): kafka.producer message.max.bytes raised to 8 MB
    # for big events, the dead-letter topic at its 1 MB default: a big poison record's letter
    # was sized for 8 MB, refused by the topic, and the refusal stopped the relay.
    from cdc_router.dead_letter import HEADROOM_BYTES

    config = RouterConfig.model_validate({
        "source": {"topics": ["raw"]}, "routes": [{"topic": "t"}],
        "kafka": {"producer": {"message.max.bytes": 8_000_000}}})
    assert clients.dead_letter_limit(config) == 8_000_000 - HEADROOM_BYTES
    topic = {"max.message.bytes": "1048588"}
    assert clients.dead_letter_limit(config, lambda name, timeout_s: topic) == \
        1_048_588 - HEADROOM_BYTES

    def unreadable(name: str, timeout_s: float) -> dict[str, str]:
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

    assert clients.dead_letter_limit(config, unreadable) == 8_000_000 - HEADROOM_BYTES
    assert "reason='grant this principal DescribeConfigs on the topic cdc-router.dlq " \
        "(optional: without it the router does not check its max.message.bytes against the " \
        "dead letters' size)'" in caplog.text  # review 51-d F3


def test_grants_refuse_only_what_the_broker_says_is_not_granted() -> None:
    from cdc_router.router.grants import refused

    assert refused("t", None, "WRITE") is None  # not said: left to the other checks
    assert refused("t", frozenset({"ALL"}), "WRITE") is None
    assert refused("t", frozenset({"READ", "WRITE", "DESCRIBE"}), "READ", "WRITE") is None
    reason = refused("t", frozenset({"DESCRIBE"}), "READ", "WRITE")
    assert reason == ("this process's Kafka principal may not read or write topic t (the "
                      "broker grants it describe there): grant it Read and Write on the topic")


def test_a_destination_not_writable_is_asked_once_until_cleared() -> None:
    asked: list[str] = []

    def operations(topic: str, timeout_s: float) -> frozenset[str]:
        asked.append(topic)
        return frozenset({"DESCRIBE"})

    cache = DestinationMetadata(lambda topic, timeout_s: 3, operations=operations)
    for _ in range(3):
        with pytest.raises(RouteError, match="may not write topic orders"):
            cache.partitions("orders")
    cache.clear()
    with pytest.raises(RouteError):
        cache.partitions("orders")
    assert asked == ["orders", "orders"]


def test_a_refused_write_is_asked_again_after_a_while_and_a_grant_given_back_is_seen() -> None:
    # QA 31-d: a Write grant given back was seen only at the next rebalance or restart.
    granted = {"orders": frozenset({"DESCRIBE"}), "pay": frozenset({"DESCRIBE", "WRITE"})}
    asked: list[str] = []
    now = [0.0]

    def operations(topic: str, timeout_s: float) -> frozenset[str]:
        asked.append(topic)
        return granted[topic]

    cache = DestinationMetadata(lambda topic, timeout_s: 3, operations=operations,
                                clock=lambda: now[0])
    with pytest.raises(RouteError):
        cache.partitions("orders")
    assert cache.partitions("pay") == 3
    granted["orders"] = frozenset({"DESCRIBE", "WRITE"})
    now[0] = REFUSED_GRANT_RECHECK_S - 1
    with pytest.raises(RouteError):
        cache.partitions("orders")
    assert cache.partitions("pay") == 3
    now[0] = REFUSED_GRANT_RECHECK_S + 1
    assert cache.partitions("orders") == 3
    now[0] = 10 * REFUSED_GRANT_RECHECK_S
    assert cache.partitions("orders") == 3 and cache.partitions("pay") == 3
    assert asked == ["orders", "pay", "orders"]


def test_the_raw_topic_consumer_prefers_roundrobin_and_offers_only_eager_assignors() -> None:
    """QA 55-a F-7: range deals each raw topic out on its own, so one-partition raw topics
    all went to the first instance; roundrobin spreads them. Both are eager (the router
    commits or aborts before a partition moves), and range stays offered so that a group
    with members of an older version (range,roundrobin) still finds a common protocol."""
    strategy = clients.consumer_config(config(), "i")["partition.assignment.strategy"]
    assert strategy.split(",") == ["roundrobin", "range"]
    assert _PINNED["partition.assignment.strategy"][1] == (strategy,)
