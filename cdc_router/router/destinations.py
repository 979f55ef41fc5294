"""Destination topics' partition counts from cluster metadata, in a bounded cache.

A template over aggregate_id renders one topic name per aggregate, so the cache is an LRU of
at most `max_topics` names. A topic found missing is asked for again after a while: someone may
have created it since (the router never creates topics). A topic found is asked for again after
FOUND_RECHECK_S, as the Java producer refreshes its metadata (metadata.max.age.ms, 5 min): after
partitions are added, events go where Kafka's default partitioner would send them from then on.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from cdc_router.config.delivery import forgets_before
from cdc_router.config.model import RouterConfig
from cdc_router.config.relay import POSITION_TOPIC_CONFIG
from cdc_router.config.topic_names import static_topic
from cdc_router.errors import BatchFailed, CdcRouterError, ConfigError, RecordRefused, RouteError
from cdc_router.kafka.errors import RECORD_REFUSED, UNKNOWN_TOPIC, describe, kafka_error_of
from cdc_router.router.grants import Operations, refused

log = logging.getLogger("cdc_router.router")

# describe(topic, timeout_s): a topic's configuration (DescribeConfigs; router/timestamps.py).
Describe = Callable[[str, float], Mapping[str, str]]
MAX_TOPICS = 4096
# A topic missing from metadata is asked for again after this long (it may have been created).
MISSING_RECHECK_S = 10.0
# A topic found is asked for again after this long: the Java producer's metadata.max.age.ms.
FOUND_RECHECK_S = 300.0
# A topic the principal may not write to is asked for again after this long: the grant may
# have been given since (QA 31-d saw it only at the next rebalance or restart).
REFUSED_GRANT_RECHECK_S = 30.0
# One metadata request: well above a healthy broker's answer time, and a timeout is a cluster
# problem (the batch aborts and backs off), never a reason to dead-letter.
LOOKUP_TIMEOUT_S = 10.0


def missing_topic(topic: str) -> str:
    return (f"destination topic {topic} does not exist, or this router may not describe it "
            "(the router never creates topics): declare it under `topics:` and run "
            "`cdc-router topics apply`, or grant the router's principal Describe and Write")


def require_own_topics(config: RouterConfig, partitions: Callable[[str], int | None],
                       describe: Describe | None = None, *,
                       read_refused: Callable[[str], str | None] | None = None,
                       relay: bool = False) -> None:
    """ConfigError, at start, for a missing dead-letter or dedup changelog topic: the router
    would otherwise fail only at its first poison event, or its first commit. With `describe`
    (one DescribeConfigs), also for a changelog that forgets ids before dedup.window_ms: the
    router restored from it would deliver those replays again (QA, session 29). With
    `read_refused` (DestinationMetadata.read_refused), also for such a topic the process reads
    but may not (review 51-d F8: the cleanup's sweep, refused the dead-letter topic, stalled
    without a line). The `relay`'s position topic likewise (review 51-d F10: refused, it was
    met in the first batch's transaction, and said as "another relay may have taken over")."""
    own = {"dead_letter.topic": config.dead_letter.topic}
    reads = {"dead_letter.topic": "the cleanup's sweep reads it"} if config.cleanup_sweeps() \
        else {}
    if config.dedup.enabled:
        own["dedup.changelog_topic"] = config.dedup.changelog_topic
        reads["dedup.changelog_topic"] = "each start restores the replay filter from it"
    if relay:
        own["relay.position_topic"] = config.relay_position_topic
        reads["relay.position_topic"] = "the relay reads its position back at each start"
    for field, topic in own.items():
        try:
            found = partitions(topic)
        except RouteError as refusal:  # QA 31-c: the principal may not write to it
            raise ConfigError(str(refusal), field=field) from None
        why = reads.get(field)
        unread = None if found is None or why is None or read_refused is None \
            else read_refused(topic)
        if unread is not None:
            raise ConfigError(f"{unread} ({why})", field=field)
        if found is None:
            # Kafka hides a topic the principal may not describe, and Write or Read bring
            # Describe: a revoked Write looks like a missing topic (QA 35-e F2).
            raise ConfigError(f"topic {topic} does not exist, or this process's principal may "
                              "not describe it (the router never creates topics)", field=field,
                              hint="create it with `cdc-router topics apply -c <config>`, or "
                                   "grant the principal Write on the topic (which brings "
                                   "Describe)" + (" and Read" if field in reads else ""))
    if describe is not None and config.dedup.enabled:
        _require_changelog_retention(config, describe)
    if describe is not None and relay:
        _warn_position_config(config, describe)
    if describe is not None:  # at start, not at each recheck: a route's fixed topic missing
        for warning in missing_destinations(config, partitions, cluster=True):  # QA 47-d F9
            log.warning("event=destination_missing detail=%r", warning)


def recheck_grants(config: RouterConfig, destinations: DestinationMetadata, *,
                   relay: bool = False) -> None:
    """Forget what the destinations' metadata and grants said, and raise ConfigError when the
    dead-letter or changelog topic (or the `relay`'s position topic) is refused now: after a
    producer renewal, or a topic of a batch refused (QA 35-e F5: Write on the dead-letter topic
    revoked while the router ran had it abort batches for ever)."""
    destinations.clear()
    try:
        require_own_topics(config, destinations.partitions, relay=relay)
    except KafkaException as failure:
        # A cluster that does not answer now is no verdict (review 35-2: a renewal during a
        # broker outage stopped a healthy router): the loop backs off, the next start checks.
        log.info("event=grants_unchecked error=%r", str(failure))


def config_unreadable(topic: str, error: BaseException, unchecked: str) -> None:
    """Warn that `topic`'s configuration could not be read, so `unchecked` is not checked;
    naming the grant when the broker refused it (review 51-d F3: a bare
    TOPIC_AUTHORIZATION_FAILED, though README's ACL table calls the grant optional)."""
    found = kafka_error_of(error)
    grant = found is not None and found.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    log.warning("event=topic_config_unreadable topic=%s error=%r%s", topic, str(error),
                f" reason='grant this principal DescribeConfigs on the topic {topic} (optional: "
                f"without it the router does not check {unchecked})'" if grant else "")


# The position topic's settings that bound its read at each start (config/relay.py): a topic
# created before `topics apply` gave them reads up to a gigabyte of old commits (session 61).
_POSITION_BOUNDS = ("segment.ms", "delete.retention.ms")
# One DescribeConfigs at start, of a setting that only makes the start's read slower: a broker
# slower than this is left unchecked rather than holding the start up (review 62, P-2).
_POSITION_DESCRIBE_S = 2.0


def _looser(have: str | None, wanted: str) -> bool:
    """Whether a bound on the topic is unset or looser than `wanted`: a smaller one, set by
    hand, only trims sooner (review 62-b: it was warned about as well)."""
    try:
        return have is None or int(have) > int(wanted)
    except ValueError:
        return have != wanted


def _warn_position_config(config: RouterConfig, describe: Describe) -> None:
    """Warn once, at the relay's start, when the position topic lacks the settings that
    `topics apply` gives it (P-2: one created before them said nothing until then). A describe
    refused (no DescribeConfigs grant) or unanswered is only a debug line: they are optional."""
    topic = config.relay_position_topic
    wanted = {**POSITION_TOPIC_CONFIG, **config.relay_settings().position_config}
    try:
        settings = describe(topic, _POSITION_DESCRIBE_S)
    except (KafkaException, TimeoutError, ValueError) as error:
        log.debug("event=position_config_unchecked topic=%s error=%r", topic, str(error))
        return
    differ = [f"{name}={settings.get(name, 'unset')} (wanted {wanted[name]})"
              for name in _POSITION_BOUNDS if name in wanted
              and _looser(settings.get(name), wanted[name])]
    if differ:
        log.warning("event=position_topic_config topic=%s settings=%r reason=%r", topic,
                    ", ".join(differ), "the relay reads this topic whole at each start, and "
                    "without these settings compaction never trims it; set them with "
                    "`cdc-router topics apply -c <config>`")


def _require_changelog_retention(config: RouterConfig, describe: Describe) -> None:
    topic, window_ms = config.dedup.changelog_topic, config.dedup.window_ms
    try:
        settings = describe(topic, LOOKUP_TIMEOUT_S)
        forgets = forgets_before(settings, window_ms, default_policy="delete")
    except (KafkaException, TimeoutError, ValueError) as error:
        config_unreadable(topic, error, "its retention against dedup.window_ms")
        return
    if settings.get("message.timestamp.type") == "LogAppendTime":  # QA 66-c F-2
        log.warning("event=changelog_log_append_time topic=%s reason=%r", topic,
                    "the topic stamps records by the broker's clock (message.timestamp.type "
                    "LogAppendTime): each start restores the replay filter from the first "
                    "record stamped dedup.window_ms + 1 h ago, so a broker clock more than an "
                    "hour behind this process's leaves recent marks unread and their replays "
                    "are delivered again; set it to CreateTime (`kafka-configs --alter "
                    "--add-config message.timestamp.type=CreateTime`) or keep the clocks in sync")
    keep_ms = config.changelog_keep_ms()
    if not forgets and keep_ms > window_ms and forgets_before(settings, keep_ms,
                                                              default_policy="delete"):
        # Review 49-b F2: routing is sound; the rows delivered before a restart would leak.
        log.warning("event=cleanup_sweep_short topic=%s retention_ms=%s reason=%r", topic,
                    settings["retention.ms"], "the topic keeps its marks less than "
                    f"cleanup.retention_ms ({config.cleanup.retention_ms}) + 1 h: after a "
                    "restart the retention cleanup finds the rows delivered before it by "
                    "these marks, and rows whose marks are gone stay in the table for good; "
                    f"raise its retention.ms to {keep_ms} with `cdc-router topics apply -c "
                    "<config>`")
    if forgets:
        retention_ms = settings["retention.ms"]
        raise ConfigError(
            f"topic {topic} keeps its records {retention_ms} ms (retention.ms), less than "
            f"dedup.window_ms ({window_ms}): the ids it forgets sooner are delivered again "
            "when Debezium replays them", field="dedup.changelog_topic",
            hint="set the topic's retention.ms to the window with `cdc-router topics apply -c "
                 "<config>`, or lower dedup.window_ms")


class ClusterListing:
    """A lookup(topic, timeout_s) for DestinationMetadata that asks for the whole cluster's
    topics, not for one name: librdkafka keeps every name a client asks metadata for, for the
    client's life, and each lookup grows slower (QA, session 30: a template over row data
    naming 6,000 missing topics slowed the router to 3 events a second, holding up good ones,
    and its RSS grew 6.7 KB a name). A name missing from a listing younger than
    MISSING_RECHECK_S is missing without another request; a listing is used FOUND_RECHECK_S
    at most. `listing(timeout_s)`: topic name -> its metadata (confluent-kafka's
    TopicMetadata: .partitions, .error)."""

    def __init__(self, listing: Callable[[float], Mapping[str, Any]], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._listing = listing
        self._clock = clock
        self._topics: Mapping[str, Any] | None = None
        self._at = 0.0

    def __call__(self, topic: str, timeout_s: float) -> int | None:
        now = self._clock()
        age = now - self._at
        if self._topics is None or age >= FOUND_RECHECK_S or \
                (topic not in self._topics and age >= MISSING_RECHECK_S):
            self._topics, self._at = self._listing(timeout_s), now
        found = self._topics.get(topic)
        if found is not None and found.error is not None and \
                found.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise KafkaException(found.error)  # e.g. no leader yet: the cluster's, retried
        if found is None or found.error is not None or not found.partitions:
            return None
        return len(found.partitions)

    def refresh(self) -> None:
        """The next lookup lists the cluster again."""
        self._topics = None


class DestinationMetadata:
    """partitions(topic): the partition count, None for a missing topic; cached, bounded."""

    def __init__(self, lookup: Callable[[str, float], int | None], *,
                 max_topics: int = MAX_TOPICS,
                 clock: Callable[[], float] = time.monotonic,
                 operations: Operations | None = None) -> None:
        """`operations` (router/grants.py): a topic found that the principal may not write to
        is refused like one not authorised (RouteError); a grant is asked once until clear(),
        a refusal again after REFUSED_GRANT_RECHECK_S."""
        self._lookup = lookup
        self._max_topics = max_topics
        self._clock = clock
        self._topics: OrderedDict[str, tuple[int | None, float]] = OrderedDict()
        self._operations = operations
        # topic -> (why not, None: may write; when asked)
        self._write_refused: dict[str, tuple[str | None, float]] = {}

    def __len__(self) -> int:
        return len(self._topics)

    def partitions(self, topic: str) -> int | None:
        """Raises RouteError when the cluster refuses this one topic (e.g. not authorised);
        a KafkaException for anything else (the cluster is the problem, not the record)."""
        count = self._count(topic)
        if count is not None and self._operations is not None:
            self._require_write(topic, self._operations)
        return count

    def _count(self, topic: str) -> int | None:
        now = self._clock()
        # A ClusterListing is a cache dated by its listing: a second one here would add its
        # age to the listing's (review 30-2: a count 600 s old, a new topic missing 20 s).
        cached = None if isinstance(self._lookup, ClusterListing) else self._topics.get(topic)
        if cached is not None and now - cached[1] < (
                MISSING_RECHECK_S if cached[0] is None else FOUND_RECHECK_S):
            self._topics.move_to_end(topic)
            return cached[0]
        try:
            count = self._lookup(topic, LOOKUP_TIMEOUT_S)
        except KafkaException as failure:
            error = kafka_error_of(failure)
            if error is not None and error.code() in RECORD_REFUSED:
                raise RouteError(f"destination topic {topic}: {describe(error)}") from None
            raise
        if not isinstance(self._lookup, ClusterListing):
            self._topics[topic] = (count, now)
            self._topics.move_to_end(topic)
            while len(self._topics) > self._max_topics:
                self._topics.popitem(last=False)
        return count

    def read_refused(self, topic: str) -> str | None:
        """Why the principal may not read `topic` (router/grants.py), or None (also when the
        broker does not say); asked each time."""
        if self._operations is None:
            return None
        return refused(topic, self._operations(topic, LOOKUP_TIMEOUT_S), "READ")

    def _require_write(self, topic: str, operations: Operations) -> None:
        known = self._write_refused.get(topic)  # per event: one lookup
        if known is not None:
            if known[0] is None:
                return
            if self._clock() - known[1] < REFUSED_GRANT_RECHECK_S:
                raise RouteError(known[0])
        if len(self._write_refused) >= self._max_topics:
            self._write_refused.clear()
        reason = refused(topic, operations(topic, LOOKUP_TIMEOUT_S), "WRITE")
        self._write_refused[topic] = (reason, self._clock())
        if reason is not None:
            raise RouteError(reason)

    def clear(self) -> None:
        """Forget every topic and grant: the next record for each asks the cluster again."""
        self._write_refused.clear()
        self.refresh()

    def refresh(self) -> None:
        """Forget the partition counts (grants stay known): after an aborted batch, whose
        cause may be metadata gone stale. QA 50-a F2: a destination deleted under traffic held
        every route 139 s; its records, re-read, were produced again to the topic librdkafka
        still had metadata for, and stayed undelivered batch after batch, where a listing
        asked afresh routes them to dead letters."""
        self._topics.clear()
        self._refresh()

    def _refresh(self) -> None:
        if isinstance(self._lookup, ClusterListing):
            self._lookup.refresh()

    def check_refusal(self, topic: str, refusal: RecordRefused) -> None:
        """After produce() refused a record for `topic` on the spot: raise BatchFailed when it
        was refused as unknown but the cluster, asked again, lists the topic. librdkafka's own
        metadata lags then (a broker restarting, the topic recreated with fewer partitions):
        no record's fault, so the batch is retried, never dead-lettered. Returns otherwise (the
        record is at fault: the topic is gone, or the refusal is of the record itself)."""
        if refusal.kafka_error.code() not in UNKNOWN_TOPIC:
            return
        self._topics.pop(topic, None)
        self._refresh()
        try:
            listed = self.partitions(topic) is not None
        except RouteError:  # refused now (not authorised): the record's dead letter
            return
        if listed:
            raise BatchFailed(f"librdkafka refused a record for {topic} ({refusal}), but the "
                              "cluster lists the topic: its metadata lags; retrying the batch")


def missing_destinations(config: RouterConfig, partitions_for: Callable[[str], int | None],
                         *, cluster: bool) -> list[str]:
    """A warning per route to a fixed Kafka topic that is not declared under `topics:` (or,
    with `cluster`, not in the cluster): every event it takes would be a dead letter (QA 43-a
    F1: `rules check` said valid). A warning, not an error: other means may create it."""
    warnings = []
    for index, rule in enumerate(config.routes):
        if rule.topic is None or not static_topic(rule.topic):
            continue  # a JetStream subject, or a template: known only per event
        try:
            missing = partitions_for(rule.topic) is None
            where = "does not exist in the cluster" if cluster else (
                "is not declared under `topics:` (if it is created otherwise, `rules check "
                "--cluster` asks Kafka)")
        except CdcRouterError as error:  # the cluster refused to say (not authorised)
            missing, where = True, f"cannot be looked up: {error}"
        if missing:
            warnings.append(f"routes[{index}] sends to topic {rule.topic}, which {where}: the "
                            "router never creates topics, so every event this route takes "
                            "would be a dead letter; declare it and run `cdc-router topics "
                            "apply`")
    return warnings
