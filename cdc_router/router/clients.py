"""The router's Kafka client policy: every client it builds, configured in one place.

The user's client properties come first; those the guarantees depend on come after, and win.
Every client sets allow.auto.create.topics=false: librdkafka's producer defaults to true, and on
a broker with auto.create.topics.enable=true (Apache Kafka's default) a mere metadata lookup of
a name rendered from row data would create that topic.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from pydantic import SecretStr

from cdc_router.config.model import RouterConfig
from cdc_router.config.nats import SubjectGuard
from cdc_router.dead_letter import dead_letter_max_bytes
from cdc_router.errors import ConfigError
from cdc_router.kafka.errors import missing_files
from cdc_router.kafka.logs import librdkafka_logger, note_cluster
from cdc_router.kafka.membership import ListedFactory, MembershipWatch
from cdc_router.kafka.producer import LatchingProducer
from cdc_router.kafka.throttle import ThrottleWatch
from cdc_router.nats.connection import connect_options
from cdc_router.nats.publisher import JetStreamPublisher
from cdc_router.router.destinations import (
    ClusterListing,
    Describe,
    DestinationMetadata,
    config_unreadable,
)
from cdc_router.router.grants import OperationsFactory, admin_operations
from cdc_router.router.timestamps import (
    DESCRIBE_TIMEOUT_S,
    DescribeFactory,
    SmallTopics,
    TopicLimitsCache,
    admin_describe,
)

log = logging.getLogger("cdc_router.router")

_NO_AUTO_CREATE = {"allow.auto.create.topics": False}


@dataclass(frozen=True)
class Timeouts:
    """Waits on the broker, each derived from delivery.transaction_timeout_ms."""

    transaction_ms: int

    @property
    def call_s(self) -> float:
        """A transactional call (flush, offsets, commit, abort): a call that outlasts the
        transaction is useless, the coordinator aborts the transaction at that point anyway."""
        return self.transaction_ms / 1000

    @property
    def init_s(self) -> float:
        """init_transactions has the coordinator end a previous incarnation's open transaction
        first; it takes at most one transaction timeout."""
        return self.transaction_ms / 1000

    @property
    def stable_offsets_s(self) -> float:
        """Committed offsets of newly assigned partitions wait (require_stable) for a previous
        owner's open transaction; a dead owner's lasts one transaction timeout, plus margin."""
        return 2 * self.transaction_ms / 1000


def logged_config(config: RouterConfig) -> dict[str, Any]:
    """Connection and security settings, with librdkafka's own log lines through logging (and
    its RepeatFilter: an unreachable broker is a line a minute, not twenty a second), not
    straight to stderr. Every client of every command starts from it, so a certificate file
    that is not there stops every command before its first client, naming the property and
    the path (review 50-b F3: topics apply, dlq list and replay said only librdkafka's
    'ssl.ca.location failed: ... BIO lib'), and so does a SASL login without its password."""
    if missing := missing_files(config.kafka.config):
        raise ConfigError("; ".join(missing), field="kafka.config",
                          hint="give the path of the file on the host this command runs on")
    if unset := config.kafka.unset_login():
        field, variable = unset
        hint = (f"set {variable} in this process's environment (secrets come from the "
                "environment, not the file)") if field == "kafka.sasl_password" else \
            f"set it in the config file, or {variable} in this process's environment"
        raise ConfigError(f"is not set, and SASL {config.kafka.sasl_mechanism} logs in with "
                          "a username and a password", field=field, hint=hint)
    note_cluster(config.kafka.bootstrap_servers, config.kafka.security_protocol or "PLAINTEXT")
    return {**config.kafka.librdkafka(), "logger": librdkafka_logger()}


def common_config(config: RouterConfig) -> dict[str, Any]:
    """What every client of the router shares: connection, security, no topic creation."""
    return {**logged_config(config), **_NO_AUTO_CREATE}


def transactional_prefix(config: RouterConfig) -> str:
    """The prefix of every transactional id of this pipeline (`<prefix>-<instance id>`,
    `<prefix>-dlq-replay`, ...): delivery.transactional_id, by default source.group_id."""
    return config.delivery.transactional_id or config.source.group_id


def transactional_id(config: RouterConfig, instance_id: str) -> str | None:
    """The producer's transactional id, `<prefix>-<instance_id>`, under exactly_once; None
    under at_least_once (no transactions)."""
    if config.delivery.guarantee != "exactly_once":
        return None
    return f"{transactional_prefix(config)}-{instance_id}"


def producer_config(config: RouterConfig, instance_id: str) -> dict[str, Any]:
    """The producer: idempotent, acks=all; transactional under exactly_once. Its partitioner
    is the Java client's (murmur2 of the key), which `partition: kafka_default` routes leave
    the partition to, unless kafka.producer.partitioner names another."""
    produced: dict[str, Any] = {"linger.ms": 5, "partitioner": "murmur2_random",
                                **common_config(config), **config.kafka.producer,
                                "enable.idempotence": True, "acks": "all", **_NO_AUTO_CREATE}
    if (transactional := transactional_id(config, instance_id)) is not None:
        produced["transactional.id"] = transactional
        produced["transaction.timeout.ms"] = config.delivery.transaction_timeout_ms
    return produced


def watched(produced: dict[str, Any],
            on_throttle: Callable[[float], None] | None = None) -> dict[str, Any]:
    """`produced` with a throttle_cb (kafka/throttle.py): a quota on its client id is said in
    the log, and counted by `on_throttle` if given (reread 57-a F-10: the relay's and `dlq
    replay`'s producers slowed without a word)."""
    return {**produced, "throttle_cb": ThrottleWatch(str(produced.get("client.id", "")),
                                                     on_throttle=on_throttle)}


def consumer_config(config: RouterConfig, instance_id: str) -> dict[str, Any]:
    """The raw-topic consumer: read_committed, manual commits, static membership."""
    return {
        # A raw topic Debezium creates after we subscribed is noticed within this time.
        "topic.metadata.refresh.interval.ms": 5000,
        # A static member that stops (or dies and stays away) keeps its partitions until
        # this passes: 10 s bounds that stall, well above the 3 s heartbeat interval.
        "session.timeout.ms": 10_000,
        **common_config(config),
        **config.kafka.consumer,
        "group.id": config.source.group_id,
        # Static membership: a restarted instance takes its partitions back at once
        # instead of waiting session.timeout.ms for the group to notice it died.
        "group.instance.id": static_member_id(instance_id, config.source.topics),
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # Debezium's exactly-once source tasks write in transactions: never read aborted ones.
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        # An eager assignor: every member commits or aborts before any partition moves.
        # roundrobin first (QA 55-a F-7): range deals each topic out on its own, so with
        # several one-partition raw topics the first member got them all and the others
        # idled. Members of an older version still offer range,roundrobin: the coordinator
        # picks a protocol every member offers, and both are eager.
        "partition.assignment.strategy": "roundrobin,range",
        **_NO_AUTO_CREATE,
    }


def static_member_id(instance_id: str, topics: Sequence[str]) -> str:
    """The raw-topic consumer's group.instance.id: the instance id and a digest of what it
    subscribes to. A static member that rejoins within the session timeout gets its old
    assignment back without a rebalance, whatever it subscribes to now (QA 44-a: a source
    topic added, the router restarted at once, and the topic was never assigned). A changed
    subscription joins as a new member, so the group rebalances; the old id's partitions
    wait for its session timeout (session.timeout.ms, 10 s unless kafka.consumer sets it)."""
    digest = hashlib.sha256("\n".join(sorted(set(topics))).encode()).hexdigest()[:8]
    return f"{instance_id}.{digest}"


def membership_watch(config: RouterConfig, instance_id: str, factory: ListedFactory,
                     clock: Callable[[], float]) -> MembershipWatch:
    """The watch of the raw-topic consumer's group membership (kafka/membership.py)."""
    return MembershipWatch.for_consumer(consumer_config(config, instance_id),
                                        common_config(config), config.source.topics, factory,
                                        clock)


def refused_property(config: RouterConfig) -> KafkaException | None:
    """librdkafka's refusal of a property name or value of the router's producer or consumer,
    built offline (no bootstrap servers, no files to read): what `run` would refuse at start,
    found by `rules check` (QA 36-b F6: `kafka.producer.lingerr.ms` passed it); else None."""
    if "plugin.library.paths" in config.kafka.config:  # the plugin, and its properties, are
        return None  # the router's host's (review 37)
    # Files belong to the host the router runs on, which `rules check` (in CI) may not be.
    files = {key: value for key, value in config.kafka.config.items()
             if not key.endswith((".location", ".keytab"))}
    # A login left to the router's environment too (`rules check` warns of it).
    login = {"sasl_username": config.kafka.sasl_username or "check",
             "sasl_password": config.kafka.sasl_password or SecretStr("check")} \
        if config.kafka.unset_login() else {}
    config = config.model_copy(update={"kafka": config.kafka.model_copy(
        update={"config": files, **login})})
    for conf, client in ((producer_config(config, "check"), Producer),
                         (consumer_config(config, "check"), Consumer)):
        # An OIDC client would fetch a token at once.
        offline = {key: value for key, value in conf.items()
                   if key != "bootstrap.servers" and not key.endswith((".location", ".keytab"))
                   and not (key == "sasl.oauthbearer.method" and value == "oidc")}
        try:
            built = client(offline)
        except KafkaException as failure:
            # Only a name or a value is the config's own fault anywhere; the rest (credentials
            # from the router's environment, a SASL provider of this build) is the host's.
            return failure if _PROPERTY_REFUSAL.search(str(failure)) else None
        if isinstance(built, Consumer):
            built.close()
    return None


# librdkafka's words for an unknown property, a value it does not take (on any build).
_PROPERTY_REFUSAL = re.compile(r"No such configuration property|for configuration property|"
                               r"Configuration property \"|Expected bool value for|JAAS "
                               r"configuration is not supported|Unsupported SASL mechanism")


def dead_letter_limit(config: RouterConfig, describe: Describe | None = None) -> int:
    """The largest dead letter the router sends whole: within its producer's
    message.max.bytes and, with `describe` (one DescribeConfigs, at start; the router's loop
    reads it again at a letter refused as too large), within the dead-letter topic's
    max.message.bytes: a producer allowed bigger records than the topic
    would have its letters refused, and a refused letter stops the router."""
    return letters_limit(config, None if describe is None else
                         dead_letter_topic_max(config, describe))


def letters_limit(config: RouterConfig, topic_max: int | None) -> int:
    """The largest dead letter sent whole, within the producer's message.max.bytes and the
    dead-letter topic's max.message.bytes `topic_max` (None: not known)."""
    limit = dead_letter_max_bytes(config.kafka.producer.get(
        "message.max.bytes", config.kafka.config.get("message.max.bytes")))
    return limit if topic_max is None else min(limit, dead_letter_max_bytes(topic_max))


def dead_letter_topic_max(config: RouterConfig, describe: Describe) -> int | None:
    """The dead-letter topic's max.message.bytes, or None when it could not be read (said in
    a warning)."""
    topic = config.dead_letter.topic
    try:
        topic_max = describe(topic, DESCRIBE_TIMEOUT_S).get("max.message.bytes")
        return int(topic_max) if topic_max else None
    except (KafkaException, TimeoutError, ValueError) as error:
        config_unreadable(topic, error, "its max.message.bytes against the dead letters' "
                          "size")
        return None


def jetstream_publisher(config: RouterConfig, instance_id: str) -> JetStreamPublisher | None:
    """The publisher of the config's JetStream routes (lazy: no connection yet), or None."""
    nats = config.jetstream()
    if nats is None:
        return None
    return JetStreamPublisher(nats.url, ack_timeout_s=nats.ack_timeout_ms / 1000,
                              connect_timeout_s=nats.connect_timeout_ms / 1000,
                              name=f"cdc-router-{instance_id}",
                              options=connect_options(nats),
                              max_payload_bytes=nats.max_payload_bytes,
                              stream_of=SubjectGuard(nats.streams).stream_of)


def topic_describe(config: RouterConfig,
                   describe_factory: DescribeFactory = admin_describe) -> Describe:
    """describe(topic, timeout_s): a topic's configuration, by one admin client of the
    router's connection settings, made on first use (tests hand a fake `describe_factory`)."""
    return describe_factory(logged_config(config))


def timestamp_limits(describe: Describe, config: RouterConfig) -> TopicLimitsCache:
    """The destination topics' timestamp, retention and size limits (router/timestamps.py),
    warning once of a topic whose size limit is below the producer's batch.size."""
    return TopicLimitsCache(describe, on_read=SmallTopics(config.kafka.config,
                                                          config.kafka.producer))


def destinations(config: RouterConfig, producer: LatchingProducer,
                 operations_factory: OperationsFactory = admin_operations,
                 clock: Callable[[], float] = time.monotonic) -> DestinationMetadata:
    """The destination topics as the producer's cluster lists them, each checked once for
    the principal's Write grant (router/grants.py) when `operations_factory` gives a lookup."""
    return DestinationMetadata(ClusterListing(producer.topics), clock=clock,
                               operations=operations_factory(logged_config(config)))
