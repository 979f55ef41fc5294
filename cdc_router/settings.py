"""The router's configuration: pydantic models for router.yaml, frozen after load.

Reading the file, applying `CDC_ROUTER__...` overrides and turning validation errors into one-line
ConfigErrors is cdc_router.config_file's job (`load_config`). Model validators that check several
fields raise `_fail(field, ...)` so that the error it turns into still names the sub-field.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveInt,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from cdc_router.outbox.table import OutboxColumns
from cdc_router.patterns import compile_pattern
from cdc_router.routing import CLOUDEVENTS_HEADERS, CONTRACT_HEADERS
from cdc_router.topic_names import (
    DEFAULT_PROTECTED_TOPICS,
    TopicGuard,
    parse_topic_template,
    source_regex,
    static_topic,
    topic_name_problem,
)


def _fail(field: str, message: str, value: object = None) -> PydanticCustomError:
    """An error for a model validator that still names the exact sub-field at fault."""
    return PydanticCustomError("field_problem", "{message}",
                               {"message": message, "field": field, "value": value})


def _stringify(value: Any) -> Any:
    """YAML gives ints and bools; librdkafka and topic configs want strings ('true', '100')."""
    if not isinstance(value, dict):
        return value
    out: dict[Any, Any] = {}
    for key, item in value.items():
        if isinstance(item, bool):
            out[key] = "true" if item else "false"
        elif isinstance(item, int | float):
            out[key] = str(item)
        else:
            out[key] = item
    return out


def _topic_pattern(pattern: str) -> str:
    if not pattern:
        raise ValueError("a topic pattern cannot be empty")
    compile_pattern(pattern)
    return pattern


StringMap = Annotated[dict[str, str], BeforeValidator(_stringify)]
Patterns = str | list[str]
TopicPattern = Annotated[str, AfterValidator(_topic_pattern)]  # exact, glob or re:regex


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class KafkaSettings(_Model):
    """How to reach the cluster; `config` passes any other librdkafka property through."""

    bootstrap_servers: str = Field(default="127.0.0.1:19092", min_length=1)
    client_id: str = "cdc-router"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    config: StringMap = Field(default_factory=dict)
    # Properties for one kind of client only (librdkafka warns about the others' properties).
    producer: StringMap = Field(default_factory=dict)
    consumer: StringMap = Field(default_factory=dict)

    @field_validator("config", "producer", "consumer")
    @classmethod
    def _no_shadowed_fields(cls, value: dict[str, str]) -> dict[str, str]:
        owned = {"bootstrap.servers": "bootstrap_servers", "client.id": "client_id",
                 "security.protocol": "security_protocol", "sasl.mechanism": "sasl_mechanism",
                 "sasl.username": "sasl_username", "sasl.password": "sasl_password"}
        for key in value:
            if key in owned:
                raise ValueError(f"set kafka.{owned[key]} instead of kafka.config[{key!r}]")
        return value

    def librdkafka(self) -> dict[str, str]:
        """The client properties every consumer, producer and admin client of ours shares."""
        conf = {"bootstrap.servers": self.bootstrap_servers, "client.id": self.client_id}
        if self.security_protocol:
            conf["security.protocol"] = self.security_protocol
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        conf.update(self.config)
        return conf


class SourceSettings(_Model):
    """The raw Debezium topics to consume and how to read their rows."""

    topics: list[str] = Field(min_length=1)
    group_id: str = Field(default="cdc-router", min_length=1)
    outbox: OutboxColumns = Field(default_factory=OutboxColumns)
    snapshot_rows: bool = True  # route op 'r' (rows read by Debezium's initial snapshot)
    on_update: Literal["skip", "fail"] = "skip"  # an outbox is insert-only; 'fail' dead-letters
    binary_handling: Literal["base64", "hex"] = "base64"  # the connector's binary.handling.mode
    # How to read the payload column: 'auto' trusts the schema when the converter sends one
    # and otherwise takes the value as JSON text (jsonb, json, text); 'bytes' is for bytea.
    payload_type: Literal["auto", "json", "bytes"] = "auto"
    # The connector's topic.heartbeat.prefix; records on topics starting with it are skipped.
    heartbeat_topic_prefix: str = Field(default="__debezium-heartbeat", min_length=1)

    @field_validator("topics")
    @classmethod
    def _legal_topics(cls, topics: list[str]) -> list[str]:
        for topic in topics:
            # librdkafka subscribes to every topic matching a name that starts with '^'.
            if topic.startswith("^"):
                source_regex(topic)
                continue
            problem = topic_name_problem(topic, internal_ok=True)
            if problem:
                raise ValueError(problem)
        if len(set(topics)) != len(topics):
            raise ValueError("a topic is listed twice")
        return topics


class RouteMatch(_Model):
    """Conditions an event must meet, all of them; each pattern is exact, glob or `re:` regex."""

    aggregate_type: Patterns | None = None
    type: Patterns | None = None
    header: dict[str, Patterns] | None = None  # the row's own headers (headers column)

    @field_validator("aggregate_type", "type")
    @classmethod
    def _compile(cls, value: Patterns | None) -> Patterns | None:
        for pattern in [value] if isinstance(value, str) else value or []:
            compile_pattern(pattern)
        return value

    @field_validator("header")
    @classmethod
    def _compile_headers(cls, value: dict[str, Patterns] | None) -> dict[str, Patterns] | None:
        for patterns in (value or {}).values():
            cls._compile(patterns)
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> RouteMatch:
        if self.aggregate_type is None and self.type is None and not self.header:
            raise ValueError("a match needs aggregate_type, type or header; "
                             "leave out 'match' for a default route")
        return self


class RouteRule(_Model):
    """One route: which events (match), where to (topic template) and how (key, partition...)."""

    match: RouteMatch | None = None  # None: the default route, takes every event
    topic: str
    # "id" (the event id), "aggregate_id", or the name of any column of the outbox table
    key: Literal["id", "aggregate_id"] | str = Field(default="id", min_length=1)
    partition: Literal["aggregate_id", "key", "kafka_default"] = "aggregate_id"
    format: Literal["json", "avro"] = "json"
    # With format avro: one .avsc file, or a mapping of event type -> .avsc ("*": any other
    # type). A relative path is relative to the folder of the config file.
    schema_path: str | dict[str, str] | None = Field(None, alias="schema")
    # Avro: payload keys the schema has no field for. 'reject' dead-letters the event (the
    # schema is the contract; dropping data silently is worse); 'ignore' leaves them out.
    extra_fields: Literal["reject", "ignore"] = "reject"
    cloudevents: bool = False  # add the CloudEvents Kafka binding (binary mode) headers
    ce_source: str | None = None  # CloudEvents 'source', a URI-reference; needed with cloudevents
    headers: StringMap = Field(default_factory=dict)  # static extra headers

    @field_validator("topic")
    @classmethod
    def _valid_template(cls, topic: str) -> str:
        if static_topic(parse_topic_template(topic)) is not None:
            problem = topic_name_problem(topic)
            if problem:
                raise ValueError(problem)
        return topic

    @field_validator("schema_path")
    @classmethod
    def _schema_files(cls, value: str | dict[str, str] | None,
                      info: ValidationInfo) -> str | dict[str, str] | None:
        folder = (info.context or {}).get("config_dir")

        def resolved(path: str) -> str:
            if not path.strip():
                raise ValueError("a schema file path cannot be empty")
            return str(Path(folder, path)) if folder is not None else path

        if isinstance(value, dict):
            if any(not event_type for event_type in value):
                raise ValueError("an event type in a schema mapping cannot be empty")
            return {event_type: resolved(path) for event_type, path in value.items()}
        return None if value is None else resolved(value)

    @model_validator(mode="after")
    def _consistent(self) -> RouteRule:
        if self.format == "avro" and not self.schema_path:
            raise _fail("schema", "format avro needs a schema file (or a mapping of event "
                        "type to schema file)")
        if self.schema_path and self.format != "avro":
            raise _fail("schema", "a schema only applies with format: avro", self.schema_path)
        if self.cloudevents and not self.ce_source:
            raise _fail("ce_source", "cloudevents: true needs ce_source, a URI-reference that "
                        "names the producer (e.g. /orders-service)")
        if self.ce_source and not self.cloudevents:
            raise _fail("ce_source", "ce_source only applies with cloudevents: true",
                        self.ce_source)
        reserved = CONTRACT_HEADERS | (CLOUDEVENTS_HEADERS if self.cloudevents else frozenset())
        for name in self.headers:
            if name in reserved or name.startswith("ce_"):
                raise _fail("headers", f"header {name!r} is written by the router itself", name)
        return self

    @property
    def is_default(self) -> bool:
        """True for a route without conditions: it takes every event that reaches it."""
        return self.match is None


# SchemaRegistryClient properties it wants as numbers; YAML and the environment give strings.
_REGISTRY_NUMBERS = frozenset({"timeout", "max.retries", "retries.wait.ms",
                               "retries.max.wait.ms", "cache.capacity", "cache.latest.ttl.sec"})


class SchemaRegistrySettings(_Model):
    """A Confluent-compatible schema registry; with it, Avro routes use its wire format."""

    url: str = Field(min_length=1)  # several: comma-separated; mock://<name>: in-memory, tests
    basic_auth_user_info: SecretStr | None = None  # "user:password"
    # Off: the router only looks schemas up, and a schema missing from its subject stops it
    # (registering is a deployment step, e.g. `cdc-router schemas register`).
    auto_register: bool = False
    subject_name_strategy: Literal["topic", "record", "topic_record"] = "topic"
    config: StringMap = Field(default_factory=dict)  # other client properties (ssl.*, timeout)

    @field_validator("url")
    @classmethod
    def _urls(cls, value: str) -> str:
        for url in value.split(","):
            parts = urlsplit(url.strip())
            if parts.scheme not in ("http", "https", "mock") or not parts.netloc:
                raise ValueError("each url must be http://host:port, https://host:port or "
                                 "mock://name (in-memory, for tests)")
        return value

    @field_validator("config")
    @classmethod
    def _not_shadowed(cls, value: dict[str, str]) -> dict[str, str]:
        owned = {"url": "url", "basic.auth.user.info": "basic_auth_user_info",
                 "auto.register.schemas": "auto_register"}
        for key in value:
            if key in owned:
                raise ValueError(f"set schema_registry.{owned[key]} instead of "
                                 f"schema_registry.config[{key!r}]")
            if key in _REGISTRY_NUMBERS and not re.fullmatch(r"\d+(\.\d+)?", value[key]):
                raise ValueError(f"{key} must be a number, not {value[key]!r}")
        return value

    def client_config(self) -> dict[str, str | float]:
        """The configuration of confluent-kafka's SchemaRegistryClient."""
        conf: dict[str, str | float] = {**self.config, "url": self.url}
        for key in _REGISTRY_NUMBERS.intersection(self.config):
            text = self.config[key]
            conf[key] = float(text) if "." in text else int(text)
        if self.basic_auth_user_info is not None:
            conf["basic.auth.credentials.source"] = "USER_INFO"
            conf["basic.auth.user.info"] = self.basic_auth_user_info.get_secret_value()
        return conf


class DeliverySettings(_Model):
    """Delivery guarantee and the size of each transaction."""

    guarantee: Literal["exactly_once", "at_least_once"] = "exactly_once"
    commit_interval_ms: PositiveInt = 100
    commit_max_records: PositiveInt = 1000
    transactional_id: str = Field(default="cdc-router", min_length=1)
    max_payload_bytes: PositiveInt = 1_000_000  # broker's default message.max.bytes is ~1 MiB
    # The producer's transaction.timeout.ms: how long a crashed instance's open transaction
    # blocks read_committed readers. Kafka's own default; the broker caps it at its
    # transaction.max.timeout.ms (15 minutes by default).
    transaction_timeout_ms: PositiveInt = 60_000
    # A record's Kafka timestamp: the row's created_at, or the router's clock. A broker refuses
    # a timestamp outside message.timestamp.{before,after}.max.ms (after: 1 hour by default);
    # with created_at such a row is dead-lettered with that reason, with now it is delivered.
    record_timestamp: Literal["created_at", "now"] = "created_at"

    @model_validator(mode="after")
    def _commit_well_inside_transaction(self) -> DeliverySettings:
        # A batch must commit long before the broker aborts its transaction: a tenth leaves
        # room for the flush, the offsets and a slow broker.
        if self.commit_interval_ms * 10 > self.transaction_timeout_ms:
            raise _fail("commit_interval_ms", f"must be at most a tenth of "
                        f"transaction_timeout_ms ({self.transaction_timeout_ms})",
                        self.commit_interval_ms)
        return self


class DeadLetterSettings(_Model):
    """Where poison input goes, and how `topics apply` creates that topic."""

    topic: str = "cdc-router.dlq"
    partitions: PositiveInt = 1
    replication_factor: PositiveInt | None = None  # None: the broker's default
    config: StringMap = Field(default_factory=dict)


class DedupSettings(_Model):
    """The replay filter: ids delivered recently, bounded by time and count.

    window_ms defaults to 7 days, the raw topic's default retention: Debezium cannot replay an
    event older than what its topic still holds. max_ids bounds memory (about 250 bytes per id).
    """

    enabled: bool = True
    window_ms: PositiveInt = 7 * 24 * 3600 * 1000
    max_ids: PositiveInt = 1_000_000
    changelog_topic: str = "cdc-router.dedup"
    changelog_partitions: PositiveInt = 1
    changelog_replication_factor: PositiveInt | None = None
    changelog_config: StringMap = Field(default_factory=dict)

    @field_validator("changelog_config")
    @classmethod
    def _compacted(cls, value: dict[str, str]) -> dict[str, str]:
        if value.get("cleanup.policy", "compact,delete") not in ("compact", "compact,delete"):
            raise ValueError("the dedup changelog needs cleanup.policy compact,delete "
                             "(or compact): one record per id, gone after the window")
        return value


class CleanupSettings(_Model):
    """Removing outbox rows once their events are committed downstream."""

    mode: Literal["none", "delete", "retention"] = "none"
    retention_ms: PositiveInt | None = None  # mode retention: delete rows older than this
    batch_size: PositiveInt = 1000
    interval_ms: PositiveInt = 1000
    table: str = "public.outbox"
    dsn: str | None = None  # Postgres DSN; set it through CDC_ROUTER__CLEANUP__DSN, not the file

    @model_validator(mode="after")
    def _complete(self) -> CleanupSettings:
        if self.mode == "retention" and self.retention_ms is None:
            raise _fail("retention_ms", "mode retention needs retention_ms")
        if self.mode != "none" and not self.dsn:
            raise _fail("dsn", f"mode {self.mode} needs the Postgres DSN (cleanup.dsn, "
                        "or the environment variable CDC_ROUTER__CLEANUP__DSN)")
        return self


class TopicSpec(_Model):
    """A topic `topics apply` creates; None leaves partitions or replication to the broker."""

    name: str
    partitions: PositiveInt | None = None
    replication_factor: PositiveInt | None = None
    config: StringMap = Field(default_factory=dict)

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
    topics: list[TopicSpec] = Field(default_factory=list)
    # Topics no route may write to, besides `__*`, the sources and the router's own topics
    # (topic_names.py): Kafka Connect's and the schema registry's by default. Setting the list
    # replaces the defaults: name your Connect cluster's *.storage.topic settings here.
    protected_topics: list[TopicPattern] = Field(
        default_factory=lambda: list(DEFAULT_PROTECTED_TOPICS))
    # When set, a templated route may write only to names matching one of these, and a static
    # route topic must match one at load. None: any name TopicGuard does not refuse.
    allowed_topics: list[TopicPattern] | None = Field(default=None, min_length=1)

    def topic_specs(self) -> list[TopicSpec]:
        """Every topic the config names for creation: declared ones, dead-letter, changelog."""
        specs = list(self.topics)
        dlq = self.dead_letter
        specs.append(TopicSpec(name=dlq.topic, partitions=dlq.partitions,
                               replication_factor=dlq.replication_factor, config=dlq.config))
        if self.dedup.enabled:
            dedup = self.dedup
            specs.append(TopicSpec(name=dedup.changelog_topic,
                                   partitions=dedup.changelog_partitions,
                                   replication_factor=dedup.changelog_replication_factor,
                                   config={"cleanup.policy": "compact,delete",
                                           # ids older than the window are of no use
                                           "retention.ms": str(dedup.window_ms),
                                           **dedup.changelog_config}))
        return specs

    @model_validator(mode="after")
    def _coherent(self) -> RouterConfig:
        for index, route in enumerate(self.routes[:-1]):
            if route.is_default:
                raise _fail(f"routes[{index + 1}]", f"unreachable: routes[{index}] has no match "
                            "and takes every event; put the default route last")
        own = {self.dead_letter.topic: "dead_letter.topic",
               self.dedup.changelog_topic: "dedup.changelog_topic"}
        if len(own) < 2:
            raise _fail("dedup.changelog_topic", "must differ from dead_letter.topic",
                        self.dedup.changelog_topic)
        guard = TopicGuard.for_config(self)
        for name, field in own.items():
            source = guard.source_of(name)
            if source is not None:
                raise _fail(field, f"must differ from the source topics ({source!r} consumes "
                            "it, so the router would read its own output)", name)
            problem = topic_name_problem(name)
            if problem:
                raise _fail(field, problem, name)
        for index, route in enumerate(self.routes):
            topic = static_topic(parse_topic_template(route.topic))
            problem = guard.problem(topic) if topic is not None else None
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
