"""RouterConfig, the whole router.yaml, and the checks across its sections.

Reading the file, applying `CDC_ROUTER__...` overrides and turning validation errors into one-line
ConfigErrors is config/load.py's job (`load_config`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from cdc_router.config.cleanup import CleanupSettings, sweep_keep_ms
from cdc_router.config.connections import KafkaSettings, SchemaRegistrySettings
from cdc_router.config.delivery import DeadLetterSettings, DedupSettings, DeliverySettings

# Moved from settings.py with their bodies unchanged, hence the short local names.
from cdc_router.config.fields import ConfigModel as _Model
from cdc_router.config.fields import TopicConfig, TopicCount, TopicPattern
from cdc_router.config.fields import field_problem as _fail
from cdc_router.config.nats import NatsSettings, SubjectGuard, parse_subject_template
from cdc_router.config.relay import POSITION_TOPIC_CONFIG, RelaySettings
from cdc_router.config.routes import RouteRule
from cdc_router.config.source import SourceSettings
from cdc_router.config.status import StatusSettings
from cdc_router.config.topic_names import (
    DEFAULT_PROTECTED_TOPICS,
    TopicGuard,
    parse_topic_template,
    render_topic,
    topic_name_problem,
)
from cdc_router.errors import ConfigError
from cdc_router.postgres import split_table


class TopicSpec(_Model):
    """A topic `topics apply` creates; None leaves partitions or replication to the broker."""

    name: str
    partitions: TopicCount | None = None
    replication_factor: TopicCount | None = None
    config: TopicConfig = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _legal_name(cls, name: str) -> str:
        problem = topic_name_problem(name)
        if problem:
            raise ValueError(problem)
        return name


class RouterConfig(_Model):
    """The whole router.yaml."""

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    source: SourceSettings
    routes: list[RouteRule] = Field(min_length=1)
    unmatched: Literal["dead_letter", "skip"] = "dead_letter"
    schema_registry: SchemaRegistrySettings | None = None  # None: Avro single-object encoding
    delivery: DeliverySettings = Field(default_factory=DeliverySettings)
    dead_letter: DeadLetterSettings = Field(default_factory=DeadLetterSettings)
    dedup: DedupSettings = Field(default_factory=DedupSettings)
    cleanup: CleanupSettings = Field(default_factory=CleanupSettings)
    relay: RelaySettings | None = None  # `cdc-router relay` only
    nats: NatsSettings | None = None  # needed by routes with a `nats:` destination
    topics: list[TopicSpec] = Field(default_factory=list)
    status: StatusSettings = Field(default_factory=StatusSettings)  # `cdc-router status`
    # Topics no route may write to, besides `__*`, the sources and the router's own topics
    # (topic_names.py): Kafka Connect's and the schema registry's by default. Setting the list
    # replaces the defaults: name your Connect cluster's *.storage.topic settings here.
    protected_topics: list[TopicPattern] = Field(
        default_factory=lambda: list(DEFAULT_PROTECTED_TOPICS))
    # When set, a templated route may write only to names matching one of these, and a static
    # route topic must match one at load. None: any name TopicGuard does not refuse.
    allowed_topics: list[TopicPattern] | None = Field(default=None, min_length=1)

    def relay_settings(self) -> RelaySettings:
        """The relay: section, which `cdc-router relay` needs; a ConfigError without it."""
        if self.relay is None:
            raise ConfigError("no relay: section", field="relay", hint="add `relay: {table: "
                              "public.outbox}` (see README, The relay)")
        return self.relay

    def without_sweep(self) -> str | None:
        """The setting that leaves the cleanup without its sweep, or None when it has one."""
        if not self.dedup.enabled:
            return "dedup.enabled false"
        if self.delivery.guarantee != "exactly_once":
            return f"delivery.guarantee {self.delivery.guarantee}"
        return None

    def cleanup_sweeps(self) -> bool:
        """Whether the cleanup reads delivered ids back from the dedup changelog (its sweep):
        only where a mark proves a delivery, written in the delivery's transaction."""
        return self.cleanup.mode != "none" and self.without_sweep() is None

    def changelog_keep_ms(self) -> int:
        """How long the dedup changelog must keep its marks (config/cleanup.py)."""
        return sweep_keep_ms(self.cleanup, self.dedup.window_ms, sweeps=self.cleanup_sweeps())

    def topic_specs(self) -> list[TopicSpec]:
        """Every topic the config names for creation: declared ones, dead-letter, changelog."""
        specs = list(self.topics)
        dlq = self.dead_letter
        specs.append(TopicSpec(name=dlq.topic, partitions=dlq.partitions,
                               replication_factor=dlq.replication_factor, config=dlq.config))
        if self.dedup.enabled:
            dedup = self.dedup  # kept the window, or the retention's sweep's time
            specs.append(TopicSpec(name=dedup.changelog_topic,
                                   partitions=dedup.changelog_partitions,
                                   replication_factor=dedup.changelog_replication_factor,
                                   config=dedup.topic_config(self.changelog_keep_ms())))
        if self.relay is not None:
            specs.append(TopicSpec(name=self.relay_position_topic, partitions=1,
                                   replication_factor=self.relay.position_replication_factor,
                                   config={**POSITION_TOPIC_CONFIG,
                                           **self.relay.position_config}))
        return specs

    def config_floors(self) -> dict[str, frozenset[str]]:
        """Per topic, the config keys whose value in topic_specs() is a minimum, not a target:
        the changelog's retention.ms from dedup.window_ms (or cleanup.retention_ms).
        Pipelines with other windows may share the changelog (QA 35-c: `topics apply` of one
        lowered it under another's window); a retention.ms set in dedup.changelog_config is
        a target."""
        if not self.dedup.enabled or "retention.ms" in self.dedup.changelog_config:
            return {}
        return {self.dedup.changelog_topic: frozenset({"retention.ms"})}

    def config_ceilings(self) -> dict[str, frozenset[str]]:
        """Per topic, the config keys whose value in topic_specs() is a maximum: the
        changelog's segment.ms, from the time its marks are kept; a pipeline sharing it with
        a shorter window needs less, and each `topics apply` undid the other's (reread 58-r
        F-1). A segment.ms set in dedup.changelog_config is a target."""
        if not self.dedup.enabled or "segment.ms" in self.dedup.changelog_config:
            return {}
        return {self.dedup.changelog_topic: frozenset({"segment.ms"})}

    @property
    def relay_position_topic(self) -> str:
        """Where the relay keeps its position: relay.position_topic, or
        `<source.group_id>.relay-position`."""
        if self.relay is not None and self.relay.position_topic:
            return self.relay.position_topic
        return f"{self.source.group_id}.relay-position"

    def _own_topics(self) -> dict[str, str]:
        """The router's (and relay's) own topics, by the field that names them."""
        own = {self.dead_letter.topic: "dead_letter.topic",
               self.dedup.changelog_topic: "dedup.changelog_topic"}
        if self.relay is not None:
            own[self.relay_position_topic] = "relay.position_topic"
        return own

    def jetstream(self) -> NatsSettings | None:
        """The `nats` section when a route publishes to JetStream (the validation makes it
        declare streams then), else None: the router, its start and `status` ask NATS only
        then."""
        return self.nats if any(route.nats for route in self.routes) else None

    def subject_guard(self) -> SubjectGuard:
        """The subjects this config's JetStream routes may publish to (config/nats.py)."""
        return SubjectGuard(self.nats.streams if self.nats is not None else [])

    def _check_nats_routes(self) -> None:
        routes = [(index, route) for index, route in enumerate(self.routes) if route.nats]
        if routes and (self.nats is None or not self.nats.streams):
            raise _fail(f"routes[{routes[0][0]}].nats", "a JetStream route needs `nats:` with "
                        "the streams that capture its subjects (nats.streams)",
                        routes[0][1].destination)
        guard = self.subject_guard()
        for index, route in routes:
            pieces = parse_subject_template(route.destination)
            subject = render_topic(pieces, {})
            problem = guard.problem(subject) if subject is not None else \
                guard.template_problem(pieces)
            if problem:
                raise _fail(f"routes[{index}].nats.subject", problem, subject or
                            route.destination)
        nats = self.nats
        longest_wait_ms = nats.connect_timeout_ms + nats.ack_timeout_ms if nats else 0
        if routes and nats is not None and \
                longest_wait_ms >= self.delivery.transaction_timeout_ms:
            # The Kafka transaction stays open while the batch waits for its acks: a wait
            # that outlasts it would have the coordinator abort the batch under us.
            raise _fail("nats.ack_timeout_ms", "nats.connect_timeout_ms + nats.ack_timeout_ms "
                        "must stay below delivery.transaction_timeout_ms "
                        f"({self.delivery.transaction_timeout_ms})", nats.ack_timeout_ms)
        names = [stream.name for stream in (self.nats.streams if self.nats else [])]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise _fail(f"nats.streams[{index}].name", "declared twice", name)
        declared = [spec.name.replace(".", "_") for spec in self.topics]
        for index, name in enumerate(declared):
            if name in declared[:index]:  # Kafka's metric names: '.' and '_' collide
                other = self.topics[declared.index(name)].name
                raise _fail(f"topics[{index}].name", "declared twice" if other ==
                            self.topics[index].name else f"collides with {other!r}: Kafka "
                            "refuses topics whose names differ only in '.' and '_'",
                            self.topics[index].name)
        # ... also across the source, own and declared topics (review 46-2 F14).
        named = [(f"source.topics[{index}]", name) for index, name in
                 enumerate(self.source.topics)]
        named += [(field, name) for name, field in self._own_topics().items()
                  if field != "dedup.changelog_topic" or self.dedup.enabled]
        named += [(f"topics[{index}].name", spec.name) for index, spec in enumerate(self.topics)]
        seen: dict[str, tuple[str, str]] = {}
        for field, name in named:
            other_field, other = seen.setdefault(name.replace(".", "_"), (field, name))
            if other != name:
                raise _fail(field, f"collides with {other!r} ({other_field}): Kafka refuses "
                            "topics whose names differ only in '.' and '_'", name)

    def topic_guard(self) -> TopicGuard:
        """The names this config's routes may not produce to (topic_names.py's TopicGuard)."""
        what = {"dead_letter.topic": "dead-letter topic", "dedup.changelog_topic":
                "dedup changelog", "relay.position_topic": "relay position topic"}
        own = {name: f"{what[field]}, {field}" for name, field in self._own_topics().items()}
        return TopicGuard(sources=self.source.topics, own=own,
                          protected=self.protected_topics, allowed=self.allowed_topics)

    @model_validator(mode="after")
    def _coherent(self) -> RouterConfig:
        for index, route in enumerate(self.routes[:-1]):
            if route.is_default:
                raise _fail(f"routes[{index + 1}]", f"unreachable: routes[{index}] has no match "
                            "and takes every event; put the default route last")
        if self.dedup.changelog_topic == self.dead_letter.topic:
            raise _fail("dedup.changelog_topic", "must differ from dead_letter.topic",
                        self.dedup.changelog_topic)
        if self.relay is not None and self.relay_position_topic in (
                self.dead_letter.topic, self.dedup.changelog_topic):
            raise _fail("relay.position_topic", "must differ from dead_letter.topic and "
                        "dedup.changelog_topic", self.relay_position_topic)
        own = self._own_topics()
        if not self.source.topics and self.relay is None:
            raise _fail("source.topics", "needs at least one raw topic (only `cdc-router "
                        "relay`, with a relay: section, reads no topic)")
        relay = self.relay
        if relay is not None and self.cleanup.mode != "none" and \
                split_table(self.cleanup.table) != split_table(relay.table):
            raise _fail("cleanup.table", f"must name the relay's table {relay.table!r}: the "
                        "relay deletes the rows it delivered", self.cleanup.table)
        guard = self.topic_guard()
        for name, field in own.items():
            source = guard.source_of(name)
            if source is not None:
                raise _fail(field, f"must differ from the source topics ({source!r} consumes "
                            "it, so the router would read its own output)", name)
            # QA 33-b, reread 55-r F-8: relay.position_topic's default is made of
            # source.group_id, the field an error names (with the value the file has).
            derived = field == "relay.position_topic" and self.relay is not None and \
                not self.relay.position_topic
            problem = topic_name_problem(name)
            if problem and derived:
                raise _fail("source.group_id", f"{problem}, in relay.position_topic's default "
                            f"{name!r}", self.source.group_id)
            if problem:
                raise _fail(field, problem, name)
            protector = guard.protected_by(name)
            if protector is not None and (field != "dedup.changelog_topic" or
                                          self.dedup.enabled):
                # QA 55-a F-1: the router writes here, and `topics apply` creates or alters it.
                what, fix = (f"relay.position_topic's default {name!r}", "set relay.position_"
                             "topic to another topic (or change source.group_id)") if derived \
                    else (repr(name), "name another topic")
                raise _fail("source.group_id" if derived else field, f"{what} is protected by "
                            f"protected_topics entry {protector!r}: the router must not write "
                            f"to it nor topics apply create or alter it; {fix}",
                            self.source.group_id if derived else name)
        self._check_nats_routes()
        for index, route in enumerate(self.routes):
            if route.topic is None:
                continue
            pieces = parse_topic_template(route.topic)
            topic = render_topic(pieces, {})
            problem = guard.problem(topic) if topic is not None else \
                guard.template_problem(pieces)
            if problem:
                raise _fail(f"routes[{index}].topic", problem, route.topic)
        configured = {*own, *guard.source_names}
        for index, spec in enumerate(self.topics):
            if spec.name in configured:
                raise _fail(f"topics[{index}].name", "this topic is configured elsewhere "
                            "(source, dead_letter or dedup); declare it there", spec.name)
            protector = guard.protected_by(spec.name)
            if protector is not None:
                raise _fail(f"topics[{index}].name", f"protected by protected_topics entry "
                            f"{protector!r}: topics apply must not create or alter it",
                            spec.name)
        return self
