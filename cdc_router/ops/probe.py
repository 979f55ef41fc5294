"""One `status` check: ask Connect, Postgres, Kafka, NATS (for JetStream routes) and the schema
registry (with schema_registry), and put their answers in a Report.

Connect first, because the connector's config says which slot, publication and table to look
at. A part that does not answer becomes its sections' `error`; the others are still checked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from cdc_router.config.model import RouterConfig
from cdc_router.config.redact import shown_url
from cdc_router.errors import CdcRouterError
from cdc_router.kafka.errors import describe, kafka_error_of
from cdc_router.kafka.logs import serve_logs, unshown_logger, with_kafka_refusal
from cdc_router.kafka.lookups import metadata
from cdc_router.ops.connector import Capture, plain, probe_connector
from cdc_router.ops.database import probe_database
from cdc_router.ops.group import router_state
from cdc_router.ops.jetstream import jetstream_state
from cdc_router.ops.offsets import LOOKUP_TIMEOUT_S, admin_client
from cdc_router.ops.registry import registry_state
from cdc_router.ops.report import (
    ChangelogState,
    ConnectorState,
    DeadLetterState,
    OutboxState,
    PublicationState,
    Report,
    RouterState,
    WalState,
)
from cdc_router.ops.topics import changelog_state, dead_letter_state
from cdc_router.postgres import unquoted
from cdc_router.router.dlq_letters import sources_of
from cdc_router.router.dlq_replay import replay_group

T = TypeVar("T")


@dataclass(frozen=True)
class Endpoints:
    """Where the pipeline's parts answer (the CLI fills these from options and environment)."""

    dsn: str
    connect_url: str
    kafka: Mapping[str, str]  # librdkafka properties
    dsn_source: str = "--dsn or CDC_ROUTER_PG_DSN"  # where dsn came from, for its errors


def check(config: RouterConfig, endpoints: Endpoints, *, connector: str | None = None,
          clock: Callable[[], float] = time.time) -> Report:
    """A Report of the pipeline `config` describes; never raises for a part that is down."""
    now_ms = int(clock() * 1000)
    settings = config.status
    name = connector or settings.connector
    relay_alone = relay_only(config)
    if relay_alone:
        # QA 34-c: the connector's sections and the raw topic's group read as critical for a
        # healthy relay. No connector, publication or raw topic is this pipeline's.
        connector_state, capture = ConnectorState(), None
    else:
        connector_state, capture = probe_connector(endpoints.connect_url, name)
        connector_state = reading(connector_state, config)
    wal, publication, outbox = _database(config, endpoints, capture)
    jetstream, registry = jetstream_state(config), registry_state(config)
    if relay_alone or connector_state.exists is False:
        # A connector that does not exist names no publication: it is not checked (review
        # 49-b F6: shown as UNREACHABLE, a second critical line for the one cause).
        publication = PublicationState()
    elif capture is None and publication.error is None:
        # Without the connector's config, its slot and publication are unknown: Debezium's
        # default names would be reported missing, and point at the lost-slot runbook. Every
        # logical slot of the database is shown instead, and the publication is left
        # unchecked: not critical itself (QA 57-b F-6: "critical: publication, connector"
        # while Postgres, where it lives, answered); the connector's line says Connect is down.
        publication = PublicationState()
    # librdkafka logs each refused connection; `status` reports the failure itself, naming
    # the refusal (credentials, mechanism, TLS) that its lines, unshown, still note.
    kafka: dict[str, Any] = {**endpoints.kafka, "logger": unshown_logger(), "log_level": "3"}
    admin = admin_client(kafka)
    # One lookup first: an unreachable cluster costs one timeout, not one per section.
    down = _kafka_down(admin)
    if down is not None:  # where it was asked, as the Postgres and Connect lines say (QA 47-d)
        asked = str(kafka.get("bootstrap.servers", config.kafka.bootstrap_servers))
        down = f"{down} (bootstrap servers {shown_url(asked)})"  # QA 47-g F3: those asked
        # QA 61-a F-4: not the parts the config does not have (no raw topic, dedup off).
        return Report(_iso(now_ms), wal, publication, outbox, connector_state,
                      RouterState(group=config.source.group_id,
                                  error=None if relay_alone else down),
                      DeadLetterState(topic=config.dead_letter.topic, error=down),
                      ChangelogState(topic=config.dedup.changelog_topic,
                                     enabled=config.dedup.enabled,
                                     error=down if config.dedup.enabled else None),
                      jetstream, registry)
    group, dlq, changelog_topic = (config.source.group_id, config.dead_letter.topic,
                                   config.dedup.changelog_topic)
    router = RouterState(group=group) if relay_alone else _kafka(
        lambda: router_state(admin, kafka, group, list(config.source.topics), now_ms),
        lambda e: RouterState(group=group, error=e),
        _grants(f"Describe on the raw topics ({', '.join(config.source.topics)})",
                f"Describe on Group {group}"))
    letters = _kafka(lambda: dead_letter_state(admin, kafka, dlq, now_ms, sources_of(config),
                                               replay_group(config)),
                     lambda e: DeadLetterState(topic=dlq, error=e),
                     _grants(f"Read on the topic {dlq}", "Describe on Group cdc-router-status- "
                             "(prefixed)"))
    changelog = _kafka(lambda: changelog_state(admin, kafka, changelog_topic,
                                               config.dedup.enabled, group),
                       lambda e: ChangelogState(topic=changelog_topic, error=e),
                       _grants(f"Describe on the topic {changelog_topic}", ""))
    return Report(_iso(now_ms), wal, publication, outbox, connector_state, router, letters,
                  changelog, jetstream, registry)


def _iso(now_ms: int) -> str:
    return datetime.fromtimestamp(now_ms / 1000, UTC).isoformat(timespec="seconds")


def reading(connector: ConnectorState, config: RouterConfig) -> ConnectorState:
    """`connector` with whether the router reads its raw topic: source.topics names it, or
    a `^regex` entry matches it (QA 35-a F5: a changed topic.prefix moved the raw topic, and
    the router read nothing without a word)."""
    guard, elsewhere = config.topic_guard(), set(config.status.read_elsewhere)
    if connector.raw_topic is None:  # QA 64-a F-1: a table added to the include list
        return replace(connector, unread_topics=tuple(
            topic for topic in connector.raw_topics
            if guard.source_of(topic) is None and topic not in elsewhere))
    return replace(connector, raw_topic_read=guard.source_of(connector.raw_topic) is not None)


def relay_only(config: RouterConfig) -> bool:
    """A config for `cdc-router relay` alone: a relay section, and no raw topic to route."""
    return config.relay is not None and not config.source.topics


def outbox_table(config: RouterConfig, capture: Capture | None) -> tuple[str, str]:
    """status.outbox_table, else the relay's table (relay only), else the one table the
    connector captures, else cleanup.table; and what names it, for status's hint on a table
    the database lacks (review 54-k F-8: a relay-only config's relay.table went unnamed).

    With cleanup off, a cleanup.table that is none of the connector's several tables (the
    default public.outbox, another pipeline's) is not this pipeline's outbox: the first table of
    the include list is (QA 57-d F-2: status advised adding it to the publication, critical).
    """
    relayed = config.relay.table if config.relay is not None and relay_only(config) else None
    captured = capture and capture.table
    if capture is not None and not captured and config.cleanup.mode == "none" and \
            unquoted(config.cleanup.table) not in {unquoted(entry) for entry in capture.tables}:
        captured = next(iter(other_tables(capture, config.cleanup.table)[0]), None)
    named = [(config.status.outbox_table, "status.outbox_table"), (relayed, "relay.table"), (
        captured, "the connector's table.include.list")]
    return next(((table, by) for table, by in named if table),
                (config.cleanup.table, "cleanup.table"))


def _database(config: RouterConfig, endpoints: Endpoints,
              capture: Capture | None) -> tuple[WalState, PublicationState, OutboxState]:
    table, named_by = outbox_table(config, capture)
    try:
        schema = config.source.outbox.outbox_schema(table)
    except CdcRouterError as error:
        return (WalState(error=str(error)), PublicationState(error=str(error)),
                OutboxState(error=str(error), table=table))
    if capture is None:
        return probe_database(endpoints.dsn, None, None, schema, source=endpoints.dsn_source,
                              named_by=named_by)
    others, unread = other_tables(capture, table)
    schemas = []
    for other in others:
        try:
            schemas.append(config.source.outbox.outbox_schema(other))
        except CdcRouterError:  # not a table name after all: named, not checked
            unread.append(other)
    wal, publication, outbox = probe_database(
        endpoints.dsn, [capture.slot], capture.publication, schema, reader=capture.user,
        signal_table=capture.signal_table, source=endpoints.dsn_source, named_by=named_by,
        others=schemas, database=capture.database)
    cleaned = unquoted(config.cleanup.table)
    return wal, publication, replace(outbox, not_checked=tuple(unread), others=tuple(
        replace(other, is_cleanup_table=unquoted(other.table or "") == cleaned)
        for other in outbox.others))


def other_tables(capture: Capture, table: str) -> tuple[list[str], list[str]]:
    """The tables the connector captures besides `table` (and its signal table), and its
    include-list entries naming no one table (a regex; quoted ones the connector's section
    names): the outbox's `others` and `not_checked` (QA 55-a F-4)."""
    skip = {unquoted(name) for name in (table, capture.signal_table) if name}
    entries = [entry for entry in dict.fromkeys(capture.tables)
               if '"' not in entry and unquoted(entry) not in skip]
    return ([entry for entry in entries if plain(entry)],
            [entry for entry in entries if not plain(entry)])


def _kafka_down(admin: AdminClient) -> str | None:
    """Why the cluster does not answer a metadata request; None when it does."""
    try:
        metadata(admin, LOOKUP_TIMEOUT_S)
    except KafkaException as error:
        serve_logs(admin)  # librdkafka's authentication failure, if it logged one
        return _kafka_message(error)
    return None


def _grants(topic: str, group: str) -> dict[int, str]:
    """What to grant `status`'s principal when the broker refuses a topic or a group."""
    return {code: f"grant this principal {grant}" for code, grant in (
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, topic),
        (KafkaError.GROUP_AUTHORIZATION_FAILED, group)) if grant}


def _kafka(read: Callable[[], T], failed: Callable[[str], T],
           grants: Mapping[int, str] | None = None) -> T:
    """read(), or failed(the line saying why Kafka refused; QA 35-e F9: with the grant a
    refusal needs)."""
    try:
        return read()
    except KafkaException as error:
        return failed(_kafka_message(error, grants))
    except CdcRouterError as error:
        return failed(str(error))


def _kafka_message(error: KafkaException, grants: Mapping[int, str] | None = None) -> str:
    kafka_error = kafka_error_of(error)
    line = with_kafka_refusal(f"Kafka: {describe(kafka_error) if kafka_error else error}")
    grant = grants.get(kafka_error.code()) if grants and kafka_error is not None else None
    return f"{line}; {grant}" if grant else line
