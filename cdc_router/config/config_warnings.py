"""What `rules check` and a process's start warn about a loaded router.yaml: settings that load
but would not do what they seem to (besides the topic templates', config/topic_names.py).

Worded for the process that runs (review 64: at `cdc-router relay`'s start the default-group
and DSN warnings spoke of the router's consumer group and of `cdc-router run`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from cdc_router.config.cleanup import retention_leak
from cdc_router.config.patterns import slow_pattern
from cdc_router.config.routes import literal_header_fields, misspelt_keys, shadowed_routes
from cdc_router.postgres import split_table

if TYPE_CHECKING:  # model.py's checks import nothing of this module
    from cdc_router.config.model import RouterConfig

ProcessName = Literal["run", "relay"]

_DEBEZIUM_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

_SLOW = ("repeats a group that repeats itself: one value can take exponential time to match "
         "and hold the router (catastrophic backtracking); write it without nested "
         "repetition, or as a list of plain patterns")


def config_warnings(config: RouterConfig, process: ProcessName = "run") -> list[str]:
    """What `rules check` and the start of `process` (`run`, `relay`) warn about."""
    missing = config.cleanup.missing_dsn()
    dsn = [f"cleanup.dsn: {missing}; `cdc-router {process}` refuses to start without it"] \
        if missing is not None else []
    windows = config.nats.stream_warnings() if config.nats is not None else []
    leak = retention_leak(config.cleanup, without_sweep=config.without_sweep(),
                          changelog_retention_ms=config.dedup.changelog_config.get(
                              "retention.ms"), keep_ms=config.changelog_keep_ms())
    return source_warnings(config, process) + pattern_warnings(config) + \
        route_warnings(config) + windows + dsn + cleanup_warnings(config) + \
        ([leak] if leak else []) + config.dead_letter.warnings() + \
        config.kafka.ignored_properties() + config.kafka.unused_login()


def checked_process(config: RouterConfig) -> ProcessName:
    """The process `rules check` words its warnings for: the relay's for a config that only
    relays (a relay: section and no source.topics), else the router's."""
    return "relay" if config.relay is not None and not config.source.topics else "run"


def cleanup_warnings(config: RouterConfig) -> list[str]:
    """A cleanup.table no source topic is named after (review 47-b F2: the cleanup deleted
    nothing from another table, said nothing, and the outbox grew): Debezium names a
    table's topic <topic.prefix>.<schema>.<table>, characters other than letters, digits,
    '.', '_' and '-' made '_'. Unless a connector's SMT renames its topics."""
    topics = config.source.topics
    if config.cleanup.mode == "none" or not topics or \
            any(topic.startswith("^") for topic in topics):
        return []
    schema, table = split_table(config.cleanup.table, "cleanup.table")
    suffix = _DEBEZIUM_UNSAFE.sub("_", f".{schema}.{table}")
    if any(topic.endswith(suffix) for topic in topics):
        return []
    return [f"cleanup.table {config.cleanup.table}: no source topic is named after it "
            f"(Debezium's topic for it ends with {suffix}; source.topics: "
            f"{', '.join(topics)}): the cleanup deletes delivered ids from that table "
            "alone, so the outbox the events come from would grow; name it in "
            "cleanup.table (unless the connector renames its topics)"]


def relay_warnings(config: RouterConfig) -> list[str]:
    """What `rules check` warns about a relay: section (review 46-2 F6): not the router's
    start, which a deployment runs without the relay's secret."""
    if config.relay is None or config.relay.dsn or config.cleanup.dsn:
        return []
    return ["relay: the relay needs the Postgres DSN (relay.dsn or cleanup.dsn, or the "
            "environment variable CDC_ROUTER__CLEANUP__DSN); `cdc-router relay` refuses "
            "to start without it"]


def route_warnings(config: RouterConfig) -> list[str]:
    """Routes that can never match (QA, session 30: `rules check` called them valid)."""
    found = (shadowed_routes(config.routes) + literal_header_fields(config.routes)
             + misspelt_keys(config.routes, config.source.outbox.named))
    for index, route in enumerate(config.routes):
        if route.match is None:
            continue
        if route.match.header and config.source.outbox.headers is None:
            found.append(f"routes[{index}].match.header can never match: "
                         "source.outbox.headers is null (the rows have no headers column)")
    return found


def pattern_warnings(config: RouterConfig) -> list[str]:
    """Patterns matched against row values (`re:` match patterns, the topic lists, `^`
    source topics) that repeat a repeating group: one row can stall the router."""
    found = []
    for index, route in enumerate(config.routes):
        match = route.match
        if match is None:
            continue
        fields = {"aggregate_type": match.aggregate_type, "type": match.type,
                  **{f"header.{name}": value for name, value in (match.header or {}).items()}}
        for name, patterns in fields.items():
            for pattern in [patterns] if isinstance(patterns, str) else patterns or []:
                if slow_pattern(pattern):
                    found.append(f"routes[{index}].match.{name} {pattern!r} {_SLOW}")
    # QA 33-b: these are matched against topic names built from row values too.
    named = [*(("allowed_topics", index, pattern) for index, pattern
               in enumerate(config.allowed_topics or [])),
             *(("protected_topics", index, pattern) for index, pattern
               in enumerate(config.protected_topics)),
             *(("source.topics", index, "re:" + topic) for index, topic
               in enumerate(config.source.topics) if topic.startswith("^"))]
    found += [f"{field}[{index}] {pattern.removeprefix('re:')!r} {_SLOW}"
              for field, index, pattern in named if slow_pattern(pattern)]
    return found


def source_warnings(config: RouterConfig, process: ProcessName = "run") -> list[str]:
    """What `rules check` and a start warn about the sources: a group left to its default,
    several outbox topics (tables) in one pipeline (one id space)."""
    topics, unnamed = config.source.topics, default_group_warnings(config, process)
    if len(topics) < 2 and not any(topic.startswith("^") for topic in topics):
        return unnamed
    return [*unnamed, f"source.topics {', '.join(topics)}: several outbox tables in one "
            "pipeline "
            "share one space of event ids: an id met on one table is dropped as a replay "
            "on another (the dedup filter), and the cleanup deletes delivered ids from "
            "cleanup.table alone; give every table ids unique across all of them (UUIDs, "
            "as write_event makes), or give each table a pipeline of its own (one table's "
            "old and new raw topic, while a topic.prefix change drains, share its ids: "
            "dropping the new snapshot's replays is then what is wanted)"]


def default_group_warnings(config: RouterConfig, process: ProcessName = "run") -> list[str]:
    """A group_id left to its default, which every such pipeline shares (QA 63-b F-3: two
    pipelines on one host fenced each other within a second of load). A relay joins no
    consumer group: what its group names is its position topic, its marks and its
    transactional id `<group>-relay-<schema.table>` (clients.transactional_id)."""
    source = config.source
    if "group_id" in source.model_fields_set:
        return []
    default = f"source.group_id is not set: its default {source.group_id!r} is the group of " \
        "every pipeline that leaves it so, and "
    if process == "relay":
        # Review 65 (low): this was one sentence of nested clauses; now a list of three.
        return [default + "two such relays share three things: the dedup marks; the position "
                f"topic {source.group_id}.relay-position (unless relay.position_topic is set), "
                "where two relays of one table name in two databases find each other's "
                "position, and the second stops on it; and, for two relays of one table "
                "name, the transactional id (unless delivery.transactional_id is set), so they "
                "fence each other. Give this "
                "pipeline a source.group_id of its own"]
    return [default + "two such pipelines share a consumer group and dedup marks, and on one "
            "host (one default --instance-id) their transactional id, fencing each other; "
            "give this pipeline a source.group_id of its own"]
