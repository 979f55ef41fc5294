"""Settings of the idempotent consumer and the librdkafka configs they render."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from confluent_kafka import KafkaException

from cdc_router.config.connections import bootstrap_problem
from cdc_router.config.redact import masked_repr, redact_tree
from cdc_router.config.topic_names import TopicGuard, topic_name_problem
from cdc_router.consumer.checks import Check, check_all
from cdc_router.consumer.retry import RetryPolicy, finite_number, whole_number
from cdc_router.errors import ConfigError
from cdc_router.kafka.errors import refused_config
from cdc_router.kafka.logs import librdkafka_logger

T = TypeVar("T")

# auto: the `event_id_header` header when the record has one (the router always writes it),
# else the key. key / header: only that one, for producers other than the router.
EventIdSource = Literal["auto", "key", "header"]

# What makes the loop at-least-once with dedup; an override would silently break it.
_PINNED_CONSUMER = {
    "enable.auto.commit": "false",  # commit only after the effect is safe
    "enable.auto.offset.store": "false",  # store each offset after its record is done
    "isolation.level": "read_committed",  # never act on events of aborted transactions
}
_PINNED_PRODUCER = {"enable.idempotence": "true", "acks": "all"}
# The consumer_config keys the dead-letter producer takes too unless producer_config sets
# them: how to reach and authenticate to the cluster is one thing for both clients (QA 32-d:
# with TLS settings in consumer_config only, the producer spoke PLAINTEXT to the TLS port and
# the first poison record stalled the consumer for ever).
_SHARED_PREFIXES = ("security.protocol", "ssl.", "ssl_", "sasl.", "enable.ssl.",
                    "client.dns.lookup", "broker.address.family", "socket.", "oauth_cb")

# bootstrap.servers and its librdkafka alias: bootstrap_servers' alone (QA 61-b F1).
_CLUSTER_KEYS = ("bootstrap.servers", "metadata.broker.list")

# librdkafka's lines through logging, with kafka/logs.py's RepeatFilter, not straight to
# stderr (review 51-d F2: a refused login, 5 lines a second); consumer_config may set its own.
_LOGGED: dict[str, Any] = {"logger": librdkafka_logger()}

# librdkafka's bound on the messages of one consume() call (it raises ValueError above it).
MAX_BATCH_SIZE = 1_000_000


def filled(value: object) -> bool:
    """A string that is neither empty nor blank (review 48-e F7: librdkafka takes a blank
    group.id as none, and confluent-kafka's C code then aborts the process)."""
    return isinstance(value, str) and bool(value.strip())


def as_names(value: object, source: str, name: str) -> tuple[str, ...]:
    """A tuple of names from a tuple, a list, or one name alone (review 33: a string was
    taken as its characters, and the consumer subscribed to 'p', 'a', 'y', ...)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise ConfigError("must be a tuple of names, e.g. ('payments.confirmed',)", source=source,
                      field=name, value=value)


def _consumer_of(topics: tuple[str, ...], name: str, source: str) -> str | None:
    """The `topics` entry (a name, or a `^regex` librdkafka subscribes by) that consumes topic
    `name`, the router's own rule (config/topic_names.py TopicGuard.source_of); a ConfigError
    for a `^regex` Python and librdkafka would read otherwise, or not at all."""
    try:
        return TopicGuard(sources=topics, own={}).source_of(name)
    except ValueError as error:
        raise ConfigError(str(error), source=source, field="topics", value=topics) from None


@dataclass(frozen=True)
class ConsumerSettings:
    """Where to read, how to find the event id, where poison goes, how patiently to retry.

    consumer_config/producer_config add librdkafka properties (security, timeouts); the
    properties that make the loop safe are pinned and cannot be overridden.
    """

    bootstrap_servers: str
    group_id: str
    topics: tuple[str, ...]
    dead_letter_topic: str
    # Not "key": a route may key records by aggregate id, and then every event of an aggregate
    # after the first would be taken for a duplicate of it.
    event_id_source: EventIdSource = "auto"
    event_id_header: str = "id"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # Records per consume() call; the loop stores each offset as soon as its record is done.
    batch_size: int = 500
    # Upper bound of one consume() wait, so a stop request is seen within this time.
    poll_timeout_s: float = 1.0
    # Offsets are committed at most this often (and on revoke and stop); a crash redelivers
    # at most this much work, which the dedup store then absorbs as duplicates.
    commit_interval_s: float = 1.0
    # How long a dead-letter record may take to be acknowledged; below max.poll.interval.ms
    # (300 s by default) so a slow broker cannot get the consumer evicted from its group.
    dead_letter_timeout_s: float = 30.0
    # QA 66-a F-6: when this many records of a topic fail to decode alike before any decodes,
    # run() stops with a ConfigError naming the decoder, none acknowledged (consumer/
    # decode_guard.py); 0: dead-letter each one, as any malformed record.
    decode_mismatch_limit: int = 100
    consumer_config: Mapping[str, str] = field(default_factory=dict)
    producer_config: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        """The dataclass's repr, with the credentials among consumer_config and producer_config
        masked (QA 64-b: a service that logged its settings logged sasl.password in clear)."""
        return masked_repr(self, consumer_config=_masked_properties,
                           producer_config=_masked_properties)

    def __post_init__(self) -> None:
        source = "ConsumerSettings"
        object.__setattr__(self, "topics", as_names(self.topics, source, "topics"))
        check_all(source, [(isinstance(extra, Mapping), name,
                            "must be a mapping of librdkafka properties", extra)
                           for name, extra in (("consumer_config", self.consumer_config),
                                               ("producer_config", self.producer_config))])
        checks: list[Check] = [
            (filled(self.bootstrap_servers), "bootstrap_servers",
             "must be a string that is not empty or blank", self.bootstrap_servers),
            # Review 48-e F1: a blank group.id aborted the process in confluent-kafka's C code.
            (filled(self.group_id), "group_id",
             "must be a string that is not empty or blank", self.group_id),
            (bool(self.topics) and all(filled(topic) for topic in self.topics), "topics",
             "must name at least one topic, none empty or blank", self.topics),
            (filled(self.dead_letter_topic), "dead_letter_topic",
             "must name a topic: poison records are never dropped", self.dead_letter_topic),
            (self.event_id_source in ("auto", "key", "header"), "event_id_source",
             "must be 'auto', 'key' or 'header'", self.event_id_source),
            (filled(self.event_id_header), "event_id_header", "must not be empty or blank",
             self.event_id_header),
            (isinstance(self.retry, RetryPolicy), "retry", "must be a RetryPolicy", self.retry),
            # Review 48-e F8: above librdkafka's bound every poll raised ValueError.
            (whole_number(self.batch_size) and self.batch_size <= MAX_BATCH_SIZE, "batch_size",
             f"must be a whole number from 1 to {MAX_BATCH_SIZE:,} (librdkafka's bound)",
             self.batch_size),
            (finite_number(self.poll_timeout_s) and self.poll_timeout_s > 0, "poll_timeout_s",
             "must be a finite positive number", self.poll_timeout_s),
            (finite_number(self.commit_interval_s) and self.commit_interval_s >= 0,
             "commit_interval_s", "must be a finite number, not negative",
             self.commit_interval_s),
            (finite_number(self.dead_letter_timeout_s) and self.dead_letter_timeout_s > 0,
             "dead_letter_timeout_s", "must be a finite positive number",
             self.dead_letter_timeout_s),
            (isinstance(self.decode_mismatch_limit, int)
             and not isinstance(self.decode_mismatch_limit, bool)
             and self.decode_mismatch_limit >= 0, "decode_mismatch_limit",
             "must be a whole number, 0 to dead-letter each undecodable record",
             self.decode_mismatch_limit),
            # Review 47-e F12: the Kafka group moved away from the dedup group, unsaid.
            ("group.id" not in self.consumer_config, "consumer_config.group.id",
             "is group_id's: the Kafka group and the dedup group are one; set group_id",
             self.consumer_config.get("group.id")),
            # QA 61-b F1: the consumer read one cluster, the dead-letter check passed there,
            # and the letters (and the group checks) went to bootstrap_servers' cluster.
            *[(extra.get(key, self.bootstrap_servers) == self.bootstrap_servers,
               f"{name}.{key}", "is set by bootstrap_servers: the consumer, the dead-letter "
               "producer and the group checks use one cluster; set bootstrap_servers (the "
               "same value here is taken)", extra.get(key))
              for name, extra in (("consumer_config", self.consumer_config),
                                  ("producer_config", self.producer_config))
              for key in _CLUSTER_KEYS],
        ]
        check_all(source, checks)
        _check_names(self, source)
        consumer = _consumer_of(self.topics, self.dead_letter_topic, source)
        if consumer is not None:
            # Review 52-c F-HIGH-15: with a `^regex` matching it, the consumer read its own
            # dead letters and dead-lettered them again, without end.
            how = "" if consumer == self.dead_letter_topic else \
                f": topics entry {consumer!r} matches it"
            raise ConfigError(f"must not be one of the consumed topics{how}, so the consumer "
                              "would read its own dead letters and dead-letter them again "
                              "without end", source=source, field="dead_letter_topic",
                              value=self.dead_letter_topic)
        for name, pinned, extra in (("consumer_config", _PINNED_CONSUMER, self.consumer_config),
                                    ("producer_config", _PINNED_PRODUCER, self.producer_config)):
            for key, value in extra.items():
                if key in pinned and str(value).lower() != pinned[key] and \
                        not (key == "acks" and str(value) == "-1"):  # -1 is all
                    raise ConfigError(f"{key} is pinned to {pinned[key]}", source=source,
                                      field=f"{name}.{key}", value=value,
                                      hint="the idempotent consumer depends on it")
        object.__setattr__(self, "consumer_config", MappingProxyType(dict(self.consumer_config)))
        object.__setattr__(self, "producer_config", MappingProxyType(dict(self.producer_config)))

    @property
    def incremental(self) -> bool:
        """Whether the group rebalances incrementally, each assignment naming only what its
        round adds (often nothing): consumer_config's partition.assignment.strategy
        cooperative-sticky, or group.protocol consumer (KIP-848). Else eager (the default,
        range,roundrobin): each names all the member holds."""
        strategy = str(self.consumer_config.get("partition.assignment.strategy", ""))
        protocol = str(self.consumer_config.get("group.protocol", ""))
        return "cooperative" in strategy.lower() or protocol.strip().lower() == "consumer"

    def librdkafka_consumer(self) -> dict[str, Any]:
        """The confluent-kafka Consumer config: defaults, the user's additions, the pins."""
        return {
            **_LOGGED,
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group_id,
            "auto.offset.reset": "earliest",  # a new group must not skip existing events
            **self.consumer_config,
            **_PINNED_CONSUMER,
        }

    def librdkafka_admin(self) -> dict[str, Any]:
        """An admin client's config (the group's lookups): consumer_config's connection and
        security settings."""
        return {**_LOGGED, "bootstrap.servers": self.bootstrap_servers,
                **{key: value for key, value in self.consumer_config.items()
                   if key.startswith(_SHARED_PREFIXES)}}

    def librdkafka_producer(self) -> dict[str, Any]:
        """The dead-letter Producer config; delivery gives up before dead_letter_timeout_s;
        consumer_config's connection and security settings unless producer_config has its
        own."""
        return {
            **_LOGGED,
            "bootstrap.servers": self.bootstrap_servers,
            "linger.ms": "0",  # each dead-letter record is flushed alone; nothing to batch
            "delivery.timeout.ms": str(int(self.dead_letter_timeout_s * 1000)),
            **{key: value for key, value in self.consumer_config.items()
               if key.startswith(_SHARED_PREFIXES)},
            **self.producer_config,
            **_PINNED_PRODUCER,
        }


def _check_names(settings: ConsumerSettings, source: str) -> None:
    """The router's own rules for bootstrap.servers and topic names (QA 57-c F-1: an http://
    server or a topic named 'payments confirmed' was taken, and run() waited for ever)."""
    protocol = settings.consumer_config.get("security.protocol")
    problem = bootstrap_problem(settings.bootstrap_servers,
                                None if protocol is None else str(protocol),
                                "consumer_config['security.protocol']",
                                "consumer_config's sasl.username and sasl.password")
    if problem:
        raise ConfigError(problem[0], source=source, field="bootstrap_servers",
                          value=problem[1])
    named = [("topics", topic) for topic in settings.topics if not topic.startswith("^")]
    for name, topic in [*named, ("dead_letter_topic", settings.dead_letter_topic)]:
        problem_of_topic = topic_name_problem(topic, internal_ok=name == "topics")
        if problem_of_topic:
            raise ConfigError(problem_of_topic, source=source, field=name, value=topic)


def built(factory: Callable[[dict[str, Any]], T], config: dict[str, Any], field: str) -> T:
    """factory(config); a ConfigError naming `field` when librdkafka refuses the config (QA
    32-d: a missing CA file was a traceback)."""
    try:
        return factory(config)
    except KafkaException as error:
        raise ConfigError(refused_config(error, config), source="ConsumerSettings",
                          field=field) from None


def _masked_properties(properties: Mapping[str, str]) -> Any:
    return redact_tree(dict(properties))
