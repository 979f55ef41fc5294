"""Plan and apply the topics a router config names: destinations, dead letters, changelog."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)

from cdc_router.config.fields import list_config_items
from cdc_router.config.model import RouterConfig, TopicSpec
from cdc_router.errors import CdcRouterError
from cdc_router.kafka.errors import kafka_error_of
from cdc_router.kafka.logs import serve_logs
from cdc_router.kafka.lookups import metadata

# Admin calls wait this long for the controller; topic creation on a busy cluster takes seconds.
_ADMIN_TIMEOUT_S = 30.0

TopicAction = Literal["create", "update", "unchanged"]


@dataclass(frozen=True)
class TopicPlan:
    """What `apply` would do to one topic, and why."""

    name: str
    action: TopicAction
    partitions: int | None
    replication_factor: int | None
    config_changes: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


class TopicAdmin:
    """Reads the cluster's topics and makes them match the specs; built lazily."""

    def __init__(self, client_config: dict[str, Any]) -> None:
        self._config = client_config
        self._admin: AdminClient | None = None

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self._config)
        return self._admin

    def plan(self, specs: list[TopicSpec],
             floors: Mapping[str, frozenset[str]] | None = None,
             ceilings: Mapping[str, frozenset[str]] | None = None,
             shared: Mapping[str, str] | None = None) -> list[TopicPlan]:
        """What apply would do; `floors`: per topic, the config keys (durations in ms) that
        are raised to the spec's value but never lowered; `ceilings`: those lowered to it but
        never raised; `shared`: the topics other pipelines may share (shared_topics)."""
        try:
            existing = metadata(self.admin, _ADMIN_TIMEOUT_S).topics
        except KafkaException as error:
            serve_logs(self.admin)  # librdkafka's authentication failure, if it logged one
            raise CdcRouterError(f"cannot reach Kafka at {self._config.get('bootstrap.servers')}"
                                 f": {error}; is the cluster up?") from error
        plans = []
        for spec in specs:
            found = existing.get(spec.name)
            if found is None:
                plans.append(TopicPlan(spec.name, "create", spec.partitions,
                                       spec.replication_factor,
                                       {k: (None, v) for k, v in spec.config.items()}))
                continue
            warnings: list[str] = []
            count = len(found.partitions)
            if spec.partitions is not None and spec.partitions != count:
                # Adding partitions moves aggregates to other partitions and breaks their order.
                warnings.append(f"has {count} partitions, the config says {spec.partitions}: "
                                "left as is (changing it breaks per-aggregate order)")
            # Review 50-d F8: a topic made with fewer replicas (a dev run, auto-create) passed
            # as unchanged, and whoever declared them believed it had them.
            replicas = min((len(p.replicas) for p in found.partitions.values()), default=0)
            if spec.replication_factor is not None and spec.replication_factor != replicas:
                warnings.append(f"has replication factor {replicas}, the config says "
                                f"{spec.replication_factor}: left as is (kafka-reassign-"
                                "partitions changes it)")
            changes = self._config_changes(spec, (floors or {}).get(spec.name, frozenset()),
                                           (ceilings or {}).get(spec.name, frozenset()),
                                           warnings, (shared or {}).get(spec.name))
            plans.append(TopicPlan(spec.name, "update" if changes else "unchanged", count, None,
                                   changes, tuple(warnings)))
        return plans

    def apply(self, plans: list[TopicPlan], *, validate_only: bool = False) -> list[TopicPlan]:
        """Create and update the topics `plans` name; with validate_only, only ask the
        controller whether it would (a config key it does not know, a value out of range),
        so that a plan never shows what its apply would then refuse. An account that may
        not change topics is not refused that question: a read-only dry run still plans, each
        create it may not do warned (QA 31-c: a topic it may not describe is not listed, and
        was planned as a create). Returns the plans, with those warnings."""
        creates = [NewTopic(p.name, num_partitions=p.partitions or -1,
                            replication_factor=p.replication_factor or -1,
                            config={k: v for k, (_, v) in p.config_changes.items()})
                   for p in plans if p.action == "create"]
        not_allowed: dict[str, str] = {}  # topic -> the plan's warning
        if creates:
            for name, future in self.admin.create_topics(
                    creates, request_timeout=_ADMIN_TIMEOUT_S,
                    validate_only=validate_only).items():
                if _wait(future, f"creating topic {name}", "Create",
                         validate_only) is _NOT_ALLOWED_NOW:
                    not_allowed[name] = (
                        "this principal may not create the topic, or may not describe it if it "
                        "exists (the cluster does not list such a topic): the apply would fail; "
                        "grant it Create and Describe on the topic")
        for plan in plans:
            if plan.action != "update":
                continue
            resource = ConfigResource(ConfigResource.Type.TOPIC, plan.name, incremental_configs=[
                ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                for k, (_, v) in plan.config_changes.items()])
            for future in self.admin.incremental_alter_configs(
                    [resource], validate_only=validate_only).values():
                if _wait(future, f"updating the config of topic {plan.name}", "AlterConfigs",
                         validate_only) is _NOT_ALLOWED_NOW:  # QA 35-e F8: it was dropped
                    not_allowed[plan.name] = ("this principal may not change the topic's "
                                              "config: the apply would fail; grant it "
                                              "AlterConfigs on the topic")
        return [replace(plan, warnings=(*plan.warnings, not_allowed[plan.name]))
                if plan.name in not_allowed else plan for plan in plans]

    def _config_changes(self, spec: TopicSpec, floors: frozenset[str],
                        ceilings: frozenset[str], warnings: list[str],
                        declared_in: str | None = None) -> dict[str, tuple[str | None, str]]:
        resource = ConfigResource(ConfigResource.Type.TOPIC, spec.name)
        future = self.admin.describe_configs([resource])[resource]
        try:
            current = _wait(future, f"reading the config of topic {spec.name}",
                            "DescribeConfigs")
        except CdcRouterError:
            if spec.config:
                raise
            return {}  # nothing declared to compare: only the warning below is skipped
        warnings.extend(_undeclared(spec, current, floors | ceilings, declared_in))
        changes = {}
        for key, wanted in spec.config.items():
            entry = current.get(key)
            have = entry.value if entry is not None else None
            if key in floors and have != wanted and _at_least(have, wanted):
                warnings.append(f"{key} {have} kept: the config needs at least {wanted}; "
                                "another pipeline sharing the topic may need more (to lower "
                                "it, set it in dedup.changelog_config)")
            elif key in ceilings and have != wanted and _at_most(have, wanted):
                warnings.append(f"{key} {have} kept: the config needs at most {wanted}; "
                                "another pipeline sharing the topic may need less (to raise "
                                "it, set it in dedup.changelog_config)")
            elif have != wanted and not _same_number(have, wanted) and \
                    not _same_list(key, have, wanted):
                changes[key] = (have, wanted)
        return changes


def shared_topics(config: RouterConfig) -> dict[str, str]:
    """The router's own topics, which other pipelines may share (the dead-letter topic's and
    the changelog's default names are every pipeline's), each with the field in which a
    pipeline declares its settings of it."""
    shared = {config.dead_letter.topic: "dead_letter.config",
              config.dedup.changelog_topic: "dedup.changelog_config"}
    if config.relay is not None:
        shared[config.relay_position_topic] = "relay.position_config"
    return shared


def _undeclared(spec: TopicSpec, current: Mapping[str, Any], shared: frozenset[str],
                declared_in: str | None = None) -> list[str]:
    """A warning for each setting made on the topic itself that the config does not declare:
    apply never removes one (QA 62-a: a retention.ms taken out of the config was planned
    "unchanged" and stayed, deleting records after a day where the broker's default is 7).
    A `shared` key (a floor or ceiling: each pipeline sharing the topic sets it from its own
    window) may be another pipeline's: no removal is advised (review 62 #8: a dedup changelog
    kept for ever has no segment.ms, and was told to delete that of one sharing it); on a
    topic others may share, any key may be one they declare in their `declared_in` (fixer
    63: min.insync.replicas in another pipeline's dead_letter.config got the delete line)."""
    # The whole command (review 62: `kafka-configs --alter --delete-config K` named no topic,
    # and kafka-configs refuses it); for a shared key, only where no pipeline shares the topic
    # (review 63: one whose own leftover it is, its marks now kept for ever, lost the command).
    def removal(key: str) -> str:
        return (f"`kafka-configs --bootstrap-server ... --alter --entity-type topics "
                f"--entity-name {spec.name} --delete-config {key}` restores the broker's "
                "default")

    def advice(key: str) -> str:
        if key in shared:
            return ("a pipeline sharing the topic may set it from its own dedup window; this "
                    f"config needs no value of it, and keeps the topic's; if none shares it, "
                    f"{removal(key)}")
        if declared_in is not None:
            return (f"a pipeline sharing the topic may declare it in its {declared_in}; if "
                    f"none shares it, {removal(key)}")
        return f"apply never removes a setting; {removal(key)}"

    return [f"{key} {entry.value} is set on the topic, not in the config: left as is "
            f"({advice(key)})"
            for key, entry in sorted(current.items()) if key not in spec.config
            and getattr(entry, "source", None) in _SET_ON_THE_TOPIC]


# ConfigEntry.source: confluent-kafka gives the enum's int value.
_SET_ON_THE_TOPIC = (ConfigSource.DYNAMIC_TOPIC_CONFIG, ConfigSource.DYNAMIC_TOPIC_CONFIG.value)


def _same_number(have: str | None, wanted: str) -> bool:
    """Whether the broker's value and the config's are one number written two ways (0.5 and
    0.50: the config keeps a number as the file writes it, review 46-3, and a broker gives
    its own text back; comparing text planned the same change at every `topics apply`)."""
    try:
        return have is not None and Decimal(have) == Decimal(wanted)
    except ArithmeticError:  # decimal.InvalidOperation: text that is no number
        return False


# Topic configs of Kafka's LIST type: a set of items, which the broker stores without blanks.
_LIST_CONFIGS = frozenset({"cleanup.policy", "leader.replication.throttled.replicas",
                           "follower.replication.throttled.replicas"})


def _same_list(key: str, have: str | None, wanted: str) -> bool:
    """Whether a list config holds the same items either way (`compact, delete` in the
    config, `compact,delete` from the broker: comparing text planned the same update at every
    `topics apply`, review 50-d F14)."""
    return key in _LIST_CONFIGS and have is not None and \
        list_config_items(have) == list_config_items(wanted)


def _at_least(have: str | None, wanted: str) -> bool:
    """Whether a duration in ms (-1: for ever) is at least `wanted`."""
    try:
        value, floor = int(have or ""), int(wanted)
    except ValueError:
        return False
    return value == -1 or value >= floor


def _at_most(have: str | None, wanted: str) -> bool:
    """Whether a duration in ms is set and at most `wanted` (-1, for ever, is not)."""
    try:
        return 0 <= int(have or "") <= int(wanted)
    except ValueError:
        return False


_NOT_ALLOWED = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED,
                          KafkaError.CLUSTER_AUTHORIZATION_FAILED})
_NOT_ALLOWED_NOW = object()


def _wait(future: Any, what: str, grant: str, validate_only: bool = False) -> Any:
    """The future's result; a one-line error naming `what`, and the `grant` (an ACL
    operation on the topic) when the broker refused it for want of one."""
    try:
        return future.result(timeout=_ADMIN_TIMEOUT_S)
    except KafkaException as error:
        found = kafka_error_of(error)
        refused = found is not None and found.code() in _NOT_ALLOWED
        if validate_only and refused:
            return _NOT_ALLOWED_NOW  # a warning of the plan; the real apply fails
        reason = found.str().rstrip(".") if found is not None else error
        fix = f": grant this principal {grant} on the topic" if refused else ""
        raise CdcRouterError(f"Kafka would refuse {what}: {reason}{fix}" if validate_only
                             else f"{what} failed: {reason}{fix}") from error


# Settings whose lower value deletes a topic's records sooner (-1: kept for ever).
_KEEPING = ("retention.ms", "retention.bytes")


def retention_cuts(plan: TopicPlan) -> list[str]:
    """The changes of `plan` that delete its topic's records sooner than now, each as
    'retention.ms A -> B'; empty when none does."""
    cuts = []
    for key in _KEEPING:
        old, new = plan.config_changes.get(key, (None, None))
        try:
            before, after = int(old or ""), int(new or "")
        except ValueError:  # unset before (the broker's default), or not a number
            continue
        if after >= 0 and (before < 0 or after < before):
            cuts.append(f"{key} {old} -> {new}")
    return cuts
