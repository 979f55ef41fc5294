"""What a connector's settings mean for the router: where its raw topic is, and the settings
that make the router's input unreadable or, worse, readable and wrong.

Pure functions of a connector config (every value a string, as Connect stores it), for
`connectors apply` (connect/plan.py, cli/connectors.py) and `status` (ops/connector.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from psycopg import sql

from cdc_router.config.converter import CONVERTER_FIX, JSON_CONVERTER
from cdc_router.connect.spec import (
    ConnectorSpec,
    included_tables,
    plain_table,
    unordered_snapshot,
    unordered_snapshot_warning,
)
from cdc_router.errors import ConfigError
from cdc_router.postgres import regclass_text

# Kafka's EnvVarConfigProvider placeholder, ${env:NAME} (or ${env:path:NAME}), resolved by
# the Connect worker when it reads the connector's config.
_ENV_PLACEHOLDER = re.compile(r"\$\{env:(?:[^:}]*:)?([^:}]+)\}")
_UNWRAP = "io.debezium.transforms.ExtractNewRecordState"
_EVENT_ROUTER = "io.debezium.transforms.outbox.EventRouter"
# What each transform does to the raw change events the router decodes (QA 35-a F3: every
# record was dead-lettered, and `connectors apply` had said nothing).
_RESHAPERS = {
    _UNWRAP: "strips the change event's envelope (op, after, source) the router decodes",
    _EVENT_ROUTER: "turns each row into the event it routes (the router's own job), a value "
                   "that is no change event",
}
# Transforms that rename a record's topic; a transform of any other package may too.
_ROUTERS = frozenset({
    "org.apache.kafka.connect.transforms.RegexRouter",
    "org.apache.kafka.connect.transforms.TimestampRouter",
    "io.debezium.transforms.ByLogicalTableRouter",
    "io.debezium.transforms.ContentBasedRouter",
    _EVENT_ROUTER,
})
_KNOWN_PACKAGES = ("org.apache.kafka.connect.transforms.", "io.debezium.transforms.")
# Converters that write for a schema registry: framed with the schema's id (Confluent's: byte
# 0, then 4 bytes), then Avro, JSON Schema or Protobuf; Apicurio's Avro may carry the id in
# headers instead (review 49-f F2: nothing warned, and each record was a decode letter).
_REGISTRY_CONVERTERS = {
    "io.confluent.connect.avro.AvroConverter": "Avro",
    "io.confluent.connect.json.JsonSchemaConverter": "JSON Schema",
    "io.confluent.connect.protobuf.ProtobufConverter": "Protobuf",
}
_REGISTRY_PACKAGES = ("io.confluent.", "io.apicurio.registry.")
# The connector's default topic naming, <topic.prefix>.<schema>.<table> on PostgreSQL (review
# 35-2: DefaultTopicNamingStrategy names it <topic.prefix>.<table> there).
_DEFAULT_NAMING = "io.debezium.schema.SchemaTopicNamingStrategy"


def transform_types(config: Mapping[str, str]) -> dict[str, str]:
    """The connector's transforms in order: alias -> its `transforms.<alias>.type`."""
    aliases = [alias.strip() for alias in config.get("transforms", "").split(",")
               if alias.strip()]
    return {alias: config.get(f"transforms.{alias}.type", "").strip() for alias in aliases}


def raw_topic(config: Mapping[str, str]) -> str | None:
    """The topic the connector writes its one outbox table's change events to:
    `<topic.prefix>.<schema>.<table>`; None when that cannot be told from the config (several
    tables or a regex, no topic.prefix, a transform that may rename topics, a naming
    strategy of its own)."""
    topics = raw_topics(config)
    return topics[0] if len(topics) == 1 else None


def raw_topics(config: Mapping[str, str]) -> tuple[str, ...]:
    """The topic of each table of the include list, in its order; empty when one of them
    cannot be told from the config (a regex, no topic.prefix, a transform that may rename
    topics, a naming strategy of its own)."""
    tables = included_tables(config, unescaped=True)
    prefix = config.get("topic.prefix", "").strip()
    # A name with a character Kafka refuses ($) is renamed by Debezium (review 35-2).
    if not tables or not prefix or any(not plain_table(table) or "$" in table
                                       for table in tables):
        return ()
    if config.get("topic.naming.strategy", _DEFAULT_NAMING).strip() != _DEFAULT_NAMING:
        return ()
    if any(kind in _ROUTERS or not kind.startswith(_KNOWN_PACKAGES)
           for kind in transform_types(config).values()):
        return ()
    delimiter = config.get("topic.delimiter", ".")
    return tuple(delimiter.join([prefix, *table.split(".")]) for table in tables)


def prefix_conflicts(specs: list[ConnectorSpec],
                     deployed: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Specs whose topic.prefix another Debezium connector (deployed, or in the same files)
    has too, one line each. QA 63-b F-1: two teams' connectors, each on its own database and
    slot, both left on the shipped prefix: the second's task waited two minutes on Debezium's
    metrics of that name, then wrote its events into the first one's raw topic, which the
    first team's router routed. Debezium wants the prefix unique across connectors."""
    after = {**deployed, **{spec.name: spec.config for spec in specs}}
    found = []
    for spec in specs:
        prefix = _debezium_prefix(spec.config)
        if prefix is None:
            continue
        others = sorted(name for name, config in after.items()
                        if name != spec.name and _debezium_prefix(config) == prefix)
        if not others:
            continue
        topic = raw_topic(spec.config)
        shared = [name for name in others if topic is not None and raw_topic(after[name]) == topic]
        what = (f"both write the raw topic {topic}, so each pipeline's router routes the "
                "other's events" if shared else "Debezium's metrics and heartbeat topic of "
                "that name collide, and the second task waits minutes before it streams")
        found.append(f"{spec.source}: {spec.name}: topic.prefix {prefix!r} is already used by "
                     f"connector {', '.join(others)}: {what}")
    return found


def _debezium_prefix(config: Mapping[str, str]) -> str | None:
    """A Debezium connector's topic.prefix; None for another connector or without one."""
    if not config.get("connector.class", "").strip().startswith("io.debezium."):
        return None
    return config.get("topic.prefix", "").strip() or None


def reading_problems(config: Mapping[str, str]) -> list[str]:
    """Settings under which the router cannot read the connector's records right, one line
    each: what is set, what it does to the records, what to set. Empty for a connector
    other than Debezium's PostgreSQL one."""
    if "postgres" not in config.get("connector.class", "").lower():
        return []
    problems = [f"transforms.{alias}.type is {kind}: it {_RESHAPERS[kind]}; if cdc-router "
                "reads this connector's topic, it dead-letters every record: remove the "
                "transform (the router reads Debezium's raw change events); a connector run "
                "for the transform's own output (the SMT path) may ignore this"
                for alias, kind in transform_types(config).items() if kind in _RESHAPERS]
    converter = _converter_problem(config.get("value.converter", "").strip())
    if converter is not None:
        problems.append(converter)
    decimals = config.get("decimal.handling.mode")
    if _schemas_off(config) and (decimals is None or decimals.strip().lower() == "precise"):
        # QA 35-a F1: 20 of 20 rows delivered with a base64 aggregate id (and partition)
        # and a base64 key, no warning anywhere.
        said = "is precise" if decimals is not None else "is not set (Debezium's default: precise)"
        problems.append(f"decimal.handling.mode {said} while value.converter.schemas.enable "
                        "is false: a numeric column arrives as base64 of its unscaled bytes, "
                        "which the router cannot tell from text (a numeric aggregate id or "
                        "key column goes out as that base64); if cdc-router reads this "
                        "connector's topic, set decimal.handling.mode=string")
    if unordered_snapshot(config):  # QA 54-a F-2
        problems.append(unordered_snapshot_warning(config))
    return problems


def _converter_problem(converter: str) -> str | None:
    """What a value.converter other than JsonConverter does to the router's input; None for
    JsonConverter, or none set (the worker's own, which this config does not show)."""
    if not converter or converter == JSON_CONVERTER:
        return None
    kind = _REGISTRY_CONVERTERS.get(converter)
    if kind is not None:
        writes = (f"a schema-registry converter: each value is {kind} framed for the registry "
                  "(byte 0 and a 4-byte schema id), not the JSON the router decodes")
    elif converter.startswith(_REGISTRY_PACKAGES):
        writes = ("a schema-registry converter: each value is framed for the registry or "
                  "binary, not the JSON the router decodes")
    else:
        writes = "not JsonConverter, whose JSON is what the router decodes"
    # A warning, not a refusal: apply does not know which topics cdc-router reads, and the
    # same file may deploy a connector for the registry's own consumers.
    return (f"value.converter is {converter}, {writes}; if cdc-router reads this connector's "
            f"topic, it dead-letters every record: {CONVERTER_FIX}; a connector run for "
            "other consumers of its topic may ignore this")


def _schemas_off(config: Mapping[str, str]) -> bool:
    """The connector's own JsonConverter, its values sent without their schema (a converter
    left to the worker is the worker's business: its settings are not in this config)."""
    return config.get("value.converter", "").strip() == JSON_CONVERTER and \
        config.get("value.converter.schemas.enable", "true").strip().lower() == "false"


def prefix_move(deployed: Mapping[str, str], desired: Mapping[str, str]) -> str | None:
    """What a change of topic.prefix does to the router's input, or None when it is kept."""
    old, new = deployed.get("topic.prefix"), desired.get("topic.prefix")
    if old is None or new is None or old == new:
        return None
    before, after = raw_topic(deployed), raw_topic(desired)
    moved = f"the raw topic {before} to {after}" if before and after else \
        f"every raw topic from {old}.* to {new}.*"
    # QA 35-a F5: the router kept reading the old topic, and Debezium re-snapshotted the
    # table into the new one, which nothing read.
    return (f"topic.prefix {old} -> {new} moves {moved}: source.topics in the router's "
            "config must follow, or the router reads nothing new; Debezium keeps no offsets "
            "under the new prefix, so per snapshot.mode it snapshots the table again (the "
            "router's dedup drops the events it delivered, within dedup.window_ms)")


# Snapshot modes under which a new connector reads none of the rows already in its tables.
_NO_DATA_MODES = frozenset({"no_data", "never"})


def skipped_rows(config: Mapping[str, str]) -> str | None:
    """What a new connector's snapshot.mode leaves undelivered, or None when it snapshots.
    QA 64-a F-3: 100 rows already in the outbox never reached the raw topic, no word."""
    mode = config.get("snapshot.mode", "").strip().lower()
    if "postgres" not in config.get("connector.class", "").lower() or mode not in _NO_DATA_MODES:
        return None
    tables = ", ".join(included_tables(config, unescaped=True)) or "its tables"
    # Review 64: a connector deleted and created again skips nothing: its slot, left behind
    # (Connect keeps its offsets too, and shows them for no connector it lacks), holds every
    # change since that one's position, and the new one streams from there.
    return (f"snapshot.mode {mode}: a new connector delivers none of the rows already in "
            f"{tables}, only those committed once its slot exists (one created again, whose "
            "slot.name a deleted connector left behind, skips nothing: it streams from that "
            "one's position); snapshot.mode when_needed "
            "(the shipped file's) delivers them too, or re-emit them afterwards with "
            "`cdc-router outbox republish`")


def after_reset(config: Mapping[str, str]) -> str:
    """What Debezium does on the resume after `connectors reset-offsets`, by its snapshot.mode
    (QA 64-a F-10: the command said only that the connector stays STOPPED)."""
    mode = config.get("snapshot.mode", "initial").strip().lower()  # Debezium's default
    tables = ", ".join(included_tables(config, unescaped=True)) or "its tables"
    if mode in _NO_DATA_MODES:
        return (f"on resume, Debezium snapshots nothing (snapshot.mode {mode}): it streams from "
                "its slot, and a slot created anew starts at that moment: rows committed while "
                "it was missing need `cdc-router outbox republish` (README runbook 'the slot "
                "was dropped or its WAL removed')")
    if mode in ("initial", "when_needed", "always"):
        return (f"on resume, Debezium snapshots {tables} again (snapshot.mode {mode}), then "
                "streams: the router drops the rows it delivered within dedup.window_ms and "
                "delivers again the older ones still in the table (`cdc-router outbox purge "
                "--older-than ...` first, if that is not wanted)")
    return f"on resume, Debezium starts as a new connector would, per snapshot.mode {mode}"


def include_move(deployed: Mapping[str, str], desired: Mapping[str, str]) -> str | None:
    """What adding tables to table.include.list leaves behind, or None when it adds none.
    QA 64-a F-2: Debezium streams a table added to a connector that has snapshotted, but
    does not snapshot it: 113 of 1,092 rows (those written before the apply) never reached
    the raw topic, and the plan said nothing."""
    if "postgres" not in desired.get("connector.class", "").lower():
        return None
    before = set(included_tables(deployed, unescaped=True))
    added = [table for table in included_tables(desired, unescaped=True) if table not in before]
    if not added:
        return None
    return (f"table.include.list adds {', '.join(added)}: {_streamed(added, desired)}, so "
            "its rows committed before this update are not delivered; afterwards "
            f"{_snapshot_of(added, desired)}, or re-emit them with `cdc-router outbox "
            "republish` (the way for a router with source.snapshot_rows false, which skips a "
            "snapshot's rows, op r); its raw topic must be in the router's source.topics")


# The publication modes under which Debezium leaves the publication's tables to the user:
# a table added to the include list streams only once the publication publishes it.
_USERS_PUBLICATION = frozenset({"disabled", "no_tables"})
DEFAULT_PUBLICATION = "dbz_publication"  # Debezium's publication.name by default


def _streamed(added: list[str], desired: Mapping[str, str]) -> str:
    """Whether Debezium streams the `added` tables once updated: by default (all_tables,
    filtered) it does; with the publication left to the user (the shipped file's disabled),
    only once the publication publishes them (review 65: the note said it streams them, and
    0 of 5 rows reached Kafka; the connector's role, made by `outbox init` for the outbox
    alone, then failed the snapshot the note advised: permission denied)."""
    mode = desired.get("publication.autocreate.mode", "all_tables").strip().lower()
    if mode not in _USERS_PUBLICATION:
        return "Debezium streams its inserts from now on but does not snapshot it"
    publication = desired.get("publication.name", "").strip() or DEFAULT_PUBLICATION
    tables = []
    for table in added:
        try:
            tables.append(regclass_text(table, "table.include.list"))
        except ConfigError:  # a regular expression: as written
            tables.append(table)
    role = desired.get("database.user", "").strip()
    # A ${file:...} reference is resolved by the worker: the role is not known here.
    grantee = sql.Identifier(role).as_string(None) if role and "${" not in role else \
        "<its database.user>"
    grant = (f", and `GRANT SELECT ON {', '.join(tables)} TO {grantee}` unless its role may "
             "read it (a snapshot reads it)")
    return (f"Debezium streams none of its rows until publication {publication} publishes it "
            f"(publication.autocreate.mode {mode}): before this update, `ALTER PUBLICATION "
            f"{sql.Identifier(publication).as_string(None)} ADD TABLE {', '.join(tables)}`"
            f"{grant}; nor does it snapshot it")


# Review 64: the note advised the full re-snapshot alone, which delivers again every row of
# every table older than dedup.window_ms; Debezium's incremental snapshot reads just the
# added tables, by primary key, as op r rows (routed like inserts, deduplicated by id).
_FULL = ("`cdc-router connectors stop`, `reset-offsets`, `resume` snapshots every table "
         "again (snapshot.mode when_needed or initial; the router drops the rows it delivered "
         "within dedup.window_ms)")


def _snapshot_of(added: list[str], desired: Mapping[str, str]) -> str:
    """How to snapshot the `added` tables: an execute-snapshot signal where the connector
    has a signal table (signal.data.collection), else the full re-snapshot, naming what a
    signal needs."""
    signals = desired.get("signal.data.collection", "").strip()
    if not signals:
        return ("snapshot just the added table with Debezium's incremental snapshot, which "
                "needs its signalling: a signal table (id varchar(42) PRIMARY KEY, type "
                "varchar(32) NOT NULL, data varchar(2048)) named in signal.data.collection, "
                "in the connector's publication, that its role may INSERT into (connectors/"
                f"README.md, signals); without it, {_FULL}")
    data = json.dumps({"data-collections": added, "type": "incremental"}).replace("'", "''")
    try:
        table = regclass_text(signals, "signal.data.collection")
    except ConfigError:
        table = signals
    return (f"snapshot just the added table with an incremental snapshot, once the "
            f"connector runs with the new list: `INSERT INTO "
            f"{table} (id, type, data) VALUES (gen_random_uuid()::text, 'execute-snapshot', "
            f"'{data}')` (its rows come as op r, routed like inserts; the signal table must be "
            "in the connector's publication, as `cdc-router status` checks, and its raw topic "
            "must exist where topics are not created automatically), or " + _FULL)


def login_hint(config: Mapping[str, str]) -> str | None:
    """Where the connector tried Postgres and as whom, for Connect's error of a database.*
    field, and where its password comes from when it is a ${env:...} placeholder (review
    53-c F15: the hint named DB_HOST, DB_PORT, DB_USER only); None without a host or user."""
    host, user = config.get("database.hostname"), config.get("database.user")
    if not host or not user:
        return None
    said = (f"the connector tried Postgres at {host}:{config.get('database.port')} as {user} "
            "(DB_HOST, DB_PORT, DB_USER in the shipped file; `eval \"$(cdc-router local env)\"` "
            "sets the host and port of the local stack)")
    password = config.get("database.password", "")
    if (found := _ENV_PLACEHOLDER.fullmatch(password)) is not None:
        said += (f"; its password is {password}, which the Connect worker resolves from its "
                 f"own environment, read when the worker started: {found[1]} set in this "
                 "shell does not reach it; set it where the worker runs, then restart it (the "
                 "local stack's: `cdc-router local down`, then `local up`; its data stays)")
    return said
