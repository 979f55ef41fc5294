"""topics apply's plan check: what the controller would refuse, and whom it may not answer."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigSource

from cdc_router.config.model import TopicSpec
from cdc_router.errors import CdcRouterError
from cdc_router.router.topics import TopicAdmin, TopicPlan


class _Refusing:
    """An admin client whose create_topics and describe_configs answer with `error`."""

    def __init__(self, error: KafkaError) -> None:
        self.error = error

    def _refused(self) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_exception(KafkaException(self.error))
        return future

    def create_topics(self, topics: list[Any], **_: Any) -> dict[str, Future[Any]]:
        return {topic.topic: self._refused() for topic in topics}

    def describe_configs(self, resources: list[Any], **_: Any) -> dict[Any, Future[Any]]:
        return {resource: self._refused() for resource in resources}

    def incremental_alter_configs(self, resources: list[Any],
                                  **_: Any) -> dict[Any, Future[Any]]:
        return {resource: self._refused() for resource in resources}


def _admin(error: KafkaError) -> TopicAdmin:
    admin = TopicAdmin({})
    admin._admin = _Refusing(error)  # type: ignore[assignment]
    return admin


PLAN = [TopicPlan("t", "create", 1, None, {"bogus.key": (None, "1")})]


def test_the_check_says_what_the_controller_would_refuse() -> None:
    admin = _admin(KafkaError(KafkaError.INVALID_CONFIG, "Unknown topic config name: bogus.key"))
    with pytest.raises(CdcRouterError, match="Kafka would refuse creating topic t: Unknown"):
        admin.apply(PLAN, validate_only=True)


def test_an_account_that_may_not_change_topics_still_gets_its_plan() -> None:
    # A read-only account (a CI drift check) runs --dry-run: the check is not its to make,
    # and the real apply would say so anyway (review, session 25).
    admin = _admin(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not authorised"))
    [planned] = admin.apply(PLAN, validate_only=True)
    # QA 31-c: a topic the account may not describe is not listed, and was planned as a
    # create without a word.
    assert planned.action == "create" and planned.warnings == (
        "this principal may not create the topic, or may not describe it if it exists (the "
        "cluster does not list such a topic): the apply would fail; grant it Create and "
        "Describe on the topic",)
    with pytest.raises(CdcRouterError, match="creating topic t failed: not authorised: grant "
                                             "this principal Create on the topic"):
        admin.apply(PLAN)


def test_a_config_the_account_may_not_read_names_the_grant() -> None:
    # QA 31-d: without DescribeConfigs, `topics apply` stopped on the changelog's config
    # naming no grant.
    admin = _admin(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not authorised"))
    with pytest.raises(CdcRouterError, match="reading the config of topic t failed: not "
                                             "authorised: grant this principal "
                                             "DescribeConfigs on the topic"):
        admin._config_changes(TopicSpec(name="t", config={"retention.ms": "1"}), frozenset(),
                              frozenset(), [])


def test_a_dry_run_warns_of_a_config_update_the_account_may_not_make() -> None:
    # QA 35-e F8: the dry run planned the update without a word, and the apply then failed.
    admin = _admin(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED,
                              "Topic authorization failed."))
    update = [TopicPlan("t", "update", 1, None, {"retention.ms": ("604800000", "86400000")})]
    [planned] = admin.apply(update, validate_only=True)
    assert planned.action == "update" and planned.warnings == (
        "this principal may not change the topic's config: the apply would fail; grant it "
        "AlterConfigs on the topic",)
    with pytest.raises(CdcRouterError) as raised:
        admin.apply(update)
    assert str(raised.value) == ("updating the config of topic t failed: Topic authorization "
                                 "failed: grant this principal AlterConfigs on the topic")


class _Describing:
    """An admin client whose describe_configs answers with the broker's `values`."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def describe_configs(self, resources: list[Any], **_: Any) -> dict[Any, Future[Any]]:
        future: Future[Any] = Future()
        future.set_result({key: type("Entry", (), {"value": value})()
                           for key, value in self.values.items()})
        return {resource: future for resource in resources}


def test_a_number_the_broker_writes_otherwise_is_no_config_change() -> None:
    # Review 46-3: the config keeps `0.50` as the file writes it, the broker answers 0.5:
    # comparing text planned the same update at every `topics apply`.
    admin = TopicAdmin({})
    admin._admin = _Describing({"min.cleanable.dirty.ratio": "0.5",  # type: ignore[assignment]
                                "retention.ms": "123", "cleanup.policy": "delete"})
    spec = TopicSpec(name="t", config={"min.cleanable.dirty.ratio": "0.50",
                                       "retention.ms": "0123", "cleanup.policy": "compact"})
    assert admin._config_changes(spec, frozenset(), frozenset(), []) == {
        "cleanup.policy": ("delete", "compact")}


def test_a_list_config_written_with_blanks_is_no_config_change() -> None:
    # Review 50-d F14: Kafka stores `compact, delete` as `compact,delete`; comparing text
    # planned the same update at every `topics apply`, for ever.
    admin = TopicAdmin({})
    admin._admin = _Describing({"cleanup.policy": "compact,delete",  # type: ignore[assignment]
                                "leader.replication.throttled.replicas": "0:1,1:1",
                                "compression.type": "a,b"})
    spec = TopicSpec(name="t", config={"cleanup.policy": "delete, compact",
                                       "leader.replication.throttled.replicas": "0:1, 1:2",
                                       "compression.type": "a, b"})
    assert admin._config_changes(spec, frozenset(), frozenset(), []) == {
        "leader.replication.throttled.replicas": ("0:1,1:1", "0:1, 1:2"),
        "compression.type": ("a,b", "a, b")}


class _Listing(_Describing):
    """An admin client listing one topic `t` with `replicas` per partition."""

    def __init__(self, replicas: list[int]) -> None:
        super().__init__({})
        partitions = {i: type("Partition", (), {"replicas": list(range(n))})()
                      for i, n in enumerate(replicas)}
        self.topic = type("Topic", (), {"partitions": partitions})()

    def list_topics(self, **_: Any) -> Any:
        return type("Metadata", (), {"topics": {"t": self.topic}})()


@pytest.mark.parametrize(("replicas", "declared", "warned"), [
    ([1, 1], 3, "has replication factor 1, the config says 3: left as is "
                "(kafka-reassign-partitions changes it)"),
    ([3, 2], 3, "has replication factor 2, the config says 3: left as is "
                "(kafka-reassign-partitions changes it)"),
    ([3, 3], 3, None),
    ([1], None, None),
])
def test_a_replication_factor_other_than_the_configs_is_warned(
        replicas: list[int], declared: int | None, warned: str | None) -> None:
    # Review 50-d F8: a topic with 1 replica declared with 3 was "unchanged", without a word.
    admin = TopicAdmin({})
    admin._admin = _Listing(replicas)  # type: ignore[assignment]
    [plan] = admin.plan([TopicSpec(name="t", partitions=len(replicas),
                                   replication_factor=declared)])
    assert plan.action == "unchanged"
    assert plan.warnings == ((warned,) if warned else ())


@pytest.mark.parametrize(("have", "changed", "warned"), [
    (None, {"segment.ms": (None, "60000")}, ()),  # a changelog made before: set
    ("604800000", {"segment.ms": ("604800000", "60000")}, ()),  # Kafka's default: lowered
    ("30000", {}, ("segment.ms 30000 kept: the config needs at most 60000; another pipeline "
                   "sharing the topic may need less (to raise it, set it in "
                   "dedup.changelog_config)",)),
    ("60000", {}, ())])
def test_the_changelogs_segment_ms_is_lowered_never_raised(
        have: str | None, changed: dict[str, Any], warned: tuple[str, ...]) -> None:
    # Reread 58-r F-1: two pipelines sharing a changelog with a 7-day and a 10-minute window
    # set segment.ms each to its own, and every `topics apply` undid the other's.
    from cdc_router.config.model import RouterConfig

    config = RouterConfig.model_validate({"source": {"topics": ["raw"], "group_id": "g"},
                                          "routes": [{"topic": "o"}],
                                          "dedup": {"window_ms": 600_000}})
    [spec] = [s for s in config.topic_specs() if s.name == config.dedup.changelog_topic]
    assert config.config_ceilings() == {spec.name: frozenset({"segment.ms"})}
    admin = TopicAdmin({})
    admin._admin = _Describing({"cleanup.policy": "compact,delete",  # type: ignore[assignment]
                                "retention.ms": "600000",
                                **({"segment.ms": have} if have else {})})
    warnings: list[str] = []
    assert admin._config_changes(spec, frozenset({"retention.ms"}),
                                 config.config_ceilings()[spec.name], warnings) == changed
    assert tuple(warnings) == warned


@pytest.mark.parametrize(("changelog_config", "segment_ms"), [
    ({"retention.ms": "2592000000"}, "259200000"),  # 30 days kept: 3-day segments
    ({"retention.ms": "-1"}, None),  # kept for ever: Kafka's default
    ({"segment.ms": "5000"}, "5000")])
def test_the_changelogs_segment_ms_follows_the_retention_it_keeps(
        changelog_config: dict[str, str], segment_ms: str | None) -> None:
    # Reread 58-r F-1: a retention.ms set in dedup.changelog_config got the window's segments.
    from cdc_router.config.model import RouterConfig

    config = RouterConfig.model_validate({"source": {"topics": ["raw"], "group_id": "g"},
                                          "routes": [{"topic": "o"}],
                                          "dedup": {"window_ms": 600_000,
                                                    "changelog_config": changelog_config}})
    [spec] = [s for s in config.topic_specs() if s.name == config.dedup.changelog_topic]
    assert spec.config.get("segment.ms") == segment_ms
    assert config.config_ceilings() == ({} if "segment.ms" in changelog_config else
                                        {spec.name: frozenset({"segment.ms"})})


class _Configured(_Describing):
    """An admin client whose topic `t` has settings of its own and broker defaults."""

    def describe_configs(self, resources: list[Any], **_: Any) -> dict[Any, Future[Any]]:
        future: Future[Any] = Future()
        future.set_result({key: type("Entry", (), {"value": value, "source": source})()
                           for key, (value, source) in self.values.items()})
        return {resource: future for resource in resources}


@pytest.mark.parametrize("declared", [{}, {"segment.ms": "60000"}])
def test_a_setting_of_the_topic_the_config_no_longer_declares_is_warned(
        declared: dict[str, str]) -> None:
    # QA 62-a: retention.ms taken out of the config was planned "unchanged" and stayed on
    # the topic (records deleted after a day where the broker's default keeps 7).
    admin = TopicAdmin({})
    admin._admin = _Configured({  # type: ignore[assignment]
        "retention.ms": ("86400000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
        "segment.ms": ("60000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
        "cleanup.policy": ("delete", ConfigSource.DEFAULT_CONFIG.value),
        "max.message.bytes": ("1048588", ConfigSource.STATIC_BROKER_CONFIG.value)})
    warnings: list[str] = []

    changes = admin._config_changes(TopicSpec(name="t", config=declared), frozenset(),
                                    frozenset(), warnings)

    assert changes == {}
    assert warnings == [
        "retention.ms 86400000 is set on the topic, not in the config: left as is (apply never "
        "removes a setting; `kafka-configs --bootstrap-server ... --alter --entity-type "
        "topics --entity-name t --delete-config retention.ms` restores the "
        "broker's default)"] + ([] if declared else [
            "segment.ms 60000 is set on the topic, not in the config: left as is (apply never "
            "removes a setting; `kafka-configs --bootstrap-server ... --alter --entity-type "
            "topics --entity-name t --delete-config segment.ms` restores the "
            "broker's default)"])


def test_a_topic_without_declared_settings_whose_config_may_not_be_read_still_plans() -> None:
    admin = _admin(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not authorised"))
    assert admin._config_changes(TopicSpec(name="t"), frozenset(), frozenset(), []) == {}


def test_a_changelog_kept_for_ever_is_not_told_to_remove_the_segment_ms_of_one_sharing_it(
        ) -> None:
    # Review 62 #8: two pipelines share one dedup changelog; one keeps its marks for ever
    # (retention.ms -1: no segment.ms of its own), and its `topics apply` told it to delete
    # the segment.ms the other sets from its window.
    from cdc_router.config.model import RouterConfig

    config = RouterConfig.model_validate({
        "source": {"topics": ["raw"], "group_id": "b"}, "routes": [{"topic": "o"}],
        "dedup": {"changelog_topic": "shared.changelog",
                  "changelog_config": {"retention.ms": "-1"}}})
    [spec] = [s for s in config.topic_specs() if s.name == "shared.changelog"]
    admin = TopicAdmin({})
    admin._admin = _Configured({  # type: ignore[assignment]
        "retention.ms": ("-1", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
        "segment.ms": ("60000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
        "cleanup.policy": ("compact,delete", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)})
    warnings: list[str] = []

    changes = admin._config_changes(spec, config.config_floors().get(spec.name, frozenset()),
                                    config.config_ceilings().get(spec.name, frozenset()),
                                    warnings)

    assert changes == {}
    assert warnings == [
        "segment.ms 60000 is set on the topic, not in the config: left as is (a pipeline "
        "sharing the topic may set it from its own dedup window; this config needs no value "
        "of it, and keeps the topic's; if none shares it, `kafka-configs --bootstrap-server "
        "... --alter --entity-type topics --entity-name shared.changelog --delete-config "
        "segment.ms` restores the broker's default)"]


@pytest.mark.parametrize(("topic", "declared_in"), [
    ("shared.dlq", "dead_letter.config"), ("shared.changelog", "dedup.changelog_config"),
    ("g.relay-position", "relay.position_config"), ("orders", None)])
def test_a_setting_another_pipeline_may_declare_on_a_shared_topic_is_not_to_be_deleted(
        topic: str, declared_in: str | None) -> None:
    # Fixer 63: min.insync.replicas, declared in the dead_letter.config of another pipeline
    # sharing the dead-letter topic, got "apply never removes a setting; kafka-configs ...
    # --delete-config" from this one's `topics apply`; likewise on a shared changelog.
    from cdc_router.config.model import RouterConfig
    from cdc_router.router.topics import shared_topics

    config = RouterConfig.model_validate({
        "source": {"topics": ["raw"], "group_id": "g"}, "routes": [{"topic": "orders"}],
        "dead_letter": {"topic": "shared.dlq"}, "dedup": {"changelog_topic": "shared.changelog"},
        "relay": {"table": "public.outbox"}, "topics": [{"name": "orders"}]})
    [spec] = [s for s in config.topic_specs() if s.name == topic]
    admin = TopicAdmin({})
    admin._admin = _Configured({  # type: ignore[assignment]
        **{key: (value, ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
           for key, value in spec.config.items()},
        "min.insync.replicas": ("2", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)})
    warnings: list[str] = []

    admin._config_changes(spec, frozenset(), frozenset(), warnings,
                          shared_topics(config).get(topic))

    removal = (f"`kafka-configs --bootstrap-server ... --alter --entity-type topics "
               f"--entity-name {topic} --delete-config min.insync.replicas` restores the "
               "broker's default)")
    assert warnings == ["min.insync.replicas 2 is set on the topic, not in the config: left as "
                        "is (" + (f"a pipeline sharing the topic may declare it in its "
                                  f"{declared_in}; if none shares it, " if declared_in else
                                  "apply never removes a setting; ") + removal]
