"""`cdc-router rules`: validate a router config and explain what it does with a change event."""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from cdc_router.cli._options import config_option
from cdc_router.cli._output import json_text, output_option
from cdc_router.cli._rules_text import describe, public_config, route_match, summary
from cdc_router.cli.run import property_refused
from cdc_router.config.config_warnings import checked_process, config_warnings, relay_warnings
from cdc_router.config.load import load_config, require_file
from cdc_router.config.model import RouterConfig
from cdc_router.config.topic_names import template_warnings
from cdc_router.errors import CdcRouterError
from cdc_router.kafka.errors import missing_files
from cdc_router.kafka.producer import LatchingProducer
from cdc_router.router import clients
from cdc_router.router.debezium import OutboxEvent
from cdc_router.router.destinations import (
    ClusterListing,
    DestinationMetadata,
    missing_destinations,
    missing_topic,
)
from cdc_router.router.partitioner import java_default_partition
from cdc_router.router.routing import OutboundRecord, rfc3339
from cdc_router.router.step import DeadLettered, RecordStep, Routed, Skipped
from cdc_router.serde.avro import AvroSerializer
from cdc_router.serde.json import parse_json


@click.group(name="rules")
def cli() -> None:
    """Check routing rules, and see which route a change event takes."""


@cli.command()
@config_option()
@click.option("--explain", "events", multiple=True, type=click.Path(exists=True, dir_okay=False,
              path_type=Path), metavar="EVENT.json",
              help="A raw Debezium change record value (as on the raw topic), or a captured "
                   "record {topic, key, value}; repeatable.")
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True,
              help="Partition count assumed for declared destination topics without one.")
@click.option("--topic", "source_topic", help="Raw topic the event came from "
              "[default: the captured record's, else the first source topic].")
@click.option("--cluster", is_flag=True,
              help="Ask Kafka (kafka.bootstrap_servers) for the destination topics and their "
                   "partition counts, as the router does, instead of reading `topics:`.")
@output_option
def check(config_path: Path, events: tuple[Path, ...], partitions: int,
          source_topic: str | None, cluster: bool, output: str) -> None:
    """Validate router.yaml (with CDC_ROUTER__ overrides) and summarise it.

    Warns about templated routes that can name a topic the router consumes, or any topic,
    and Avro schema fields no JSON payload can fill.

    With --explain, also show for each event how it decodes, which route takes it and the
    record it would produce, through the router's own per-record step. Offline, a destination
    topic not declared under `topics:` counts as missing (a topic created by other means
    exists for the router: check it with --cluster, which asks Kafka as the router does).
    A created_at the destination would refuse, or delete by retention.ms, is a dead letter as
    in the router: offline by Kafka 4's timestamp defaults and a declared retention.ms, with
    --cluster by the topic's configuration.
    Exits 1 when the config is invalid or an event would go to the dead-letter topic.
    """
    try:
        compiled = load_config(config_path, env=os.environ)
        refusal = clients.refused_property(compiled.config)
        refused = property_refused(refusal, compiled.config, str(config_path), os.environ) \
            if refusal is not None else None
        if refused is not None:  # a name or value librdkafka refuses, as `run` would at start
            raise refused
        avro = compiled.serializers.get("avro")
        if isinstance(avro, AvroSerializer):  # schemas sharing a subject, as `run` would
            avro.check_subjects(str(config_path))
    except CdcRouterError as error:
        if output == "json":  # review 53-c F19: a script read no document at all
            click.echo(json_text({"file": str(config_path), "valid": False,
                                  "error": str(error), "warnings": [], "config": None,
                                  "events": []}))
        raise
    config = compiled.config
    warnings = template_warnings([route.topic for route in config.routes if route.topic],
                                 config.source.topics, config.allowed_topics)
    warnings += config_warnings(config, checked_process(config)) + relay_warnings(config)
    # Every other command stops on these (review 50-b F3); this one may run in CI, elsewhere.
    warnings += [f"kafka.config: {missing} on this host: every command that makes a Kafka "
                 "client stops on it; fine only where the router's host has the file"
                 for missing in missing_files(config.kafka.config)]
    if unset := config.kafka.unset_login():
        warnings.append(f"{unset[0]} is not set here ({unset[1]}): every command that makes "
                        "a Kafka client stops on it; fine only where the router's environment "
                        "sets it")
    for serializer in compiled.serializers.values():
        warnings += getattr(serializer, "warnings", list)()  # Avro's unfillable fields
    # The destinations' timestamp and retention limits too, as the router checks them (QA,
    # session 30: an explained record the router then dead-lettered at stage produce).
    limits = clients.timestamp_limits(clients.topic_describe(config) if cluster
                                      else declared_configs(config), config)
    partitions_for = _on_cluster(config) if cluster else declared_partitions(config, partitions)
    step = RecordStep(compiled, partitions_for, missing=missing_topic if cluster else
                      _not_declared, timestamp_limits=limits)
    warnings += missing_destinations(config, partitions_for, cluster=cluster)
    explained = [explain_event(path, config, step, source_topic, partitions_for)
                 for path in events]
    if output == "json":
        click.echo(json_text({"file": str(config_path), "valid": True, "warnings": warnings,
                              "config": public_config(config), "events": explained}))
    else:
        click.echo(summary(config_path, config))
        for warning in warnings:
            click.echo(f"warning: {warning}")
        for result in explained:
            click.echo("")
            click.echo(describe(result))
    if any(result["outcome"] == "dead_letter" for result in explained):
        sys.exit(1)


def explain_event(path: Path, config: RouterConfig, step: RecordStep, source_topic: str | None,
                  partitions_for: Callable[[str], int | None]) -> dict[str, Any]:
    """What the router would do with the record in `path`, as a JSON-ready dict.

    `step` is the router's own per-record step (router/step.py), so the outcome is the
    router's: routed, skipped, or dead letter at the stage it would fail.
    """
    # A relay-only config has no source topic: the relay hands its rows to the same step,
    # and its dead letters name the table as their source.
    default_topic = config.source.topics[0] if config.source.topics else \
        config.relay.qualified_table if config.relay else "(none)"
    topic, key, value = _read_record(path, source_topic or None, default_topic)
    result: dict[str, Any] = {"file": str(path), "source_topic": topic}
    outcome = step(topic, key, value)
    event = outcome.event if isinstance(outcome, Routed | Skipped | DeadLettered) else None
    if event is not None:
        result["event"] = _event(event)
        found = step.explain(event)
        if found is not None:
            result["route"] = {"index": found[0], "match": route_match(found[1].match),
                               "topic": found[1].destination}
    if isinstance(outcome, DeadLettered):
        return {**result, "outcome": "dead_letter", "stage": outcome.stage,
                "reason": str(outcome.error) or type(outcome.error).__name__,
                "error_class": type(outcome.error).__name__,
                "dead_letter_topic": config.dead_letter.topic}
    if isinstance(outcome, Skipped):
        return {**result, "outcome": "skipped", "reason": outcome.reason}
    assert isinstance(outcome, Routed)  # no replay filter here: never a Duplicate
    record = _record(outcome.record)
    if outcome.record.partition is None and not outcome.record.nats:  # partition: kafka_default
        record.update(_producer_partition(config, outcome.record, partitions_for))
    return {**result, "outcome": "routed", "record": record}


def _producer_partition(config: RouterConfig, record: OutboundRecord,
                        partitions_for: Callable[[str], int | None]) -> dict[str, Any]:
    """The partition the router's producer picks for a record the route leaves to it: its
    partitioner's (murmur2 of the key unless kafka.producer.partitioner names another), or
    None with the partitioner named (review 50-b F8: explain printed 'partition None')."""
    name = str(config.kafka.producer.get("partitioner", "murmur2_random"))
    count = partitions_for(record.topic)
    if name in ("murmur2", "murmur2_random") and record.key is not None and count:
        return {"partition": java_default_partition(record.key, count),
                "partitioner": f"the producer's {name}: murmur2 of the key"}
    return {"partition": None, "partitioner": f"the producer's {name}, when it sends"}


def declared_partitions(config: RouterConfig, assumed: int) -> Callable[[str], int | None]:
    """Offline destinations: the topics the config declares (`topics apply` creates them),
    with their partition count or `assumed`; any other topic does not exist."""
    declared = {spec.name: spec.partitions or assumed for spec in config.topic_specs()}
    return declared.get


# Kafka 4's defaults of the timestamp limits of a topic created without them. Not its
# retention: a broker's log.retention.* may set another, so offline only a declared
# retention.ms is checked.
KAFKA_TOPIC_DEFAULTS = {"message.timestamp.type": "CreateTime",
                        "message.timestamp.before.max.ms": str(2**63 - 1),
                        "message.timestamp.after.max.ms": "3600000"}


def declared_configs(config: RouterConfig) -> Callable[[str, float], dict[str, str]]:
    """Offline describe(topic, timeout_s): a declared topic's `config:` over Kafka 4's
    timestamp defaults; nothing for another topic (offline, it does not exist)."""
    declared = {spec.name: {**KAFKA_TOPIC_DEFAULTS, **spec.config}
                for spec in config.topic_specs()}
    return lambda topic, timeout_s: declared.get(topic, {})


def _on_cluster(config: RouterConfig) -> Callable[[str], int | None]:
    """Destinations as the router finds them: in one listing of the cluster's topics (review
    30-2: asked one name at a time, a topic the router may not describe, left out of its
    listing, existed here and was missing for the router)."""
    producer = LatchingProducer(clients.common_config(config))
    return DestinationMetadata(ClusterListing(producer.topics)).partitions


def _not_declared(topic: str) -> str:
    return (f"destination topic {topic} is not declared under `topics:` (checked offline: "
            "if it was created otherwise, `rules check --cluster` asks Kafka); the router "
            "never creates topics and dead-letters events whose destination does not exist "
            "(declare it, then run `cdc-router topics apply`)")


def _read_record(path: Path, topic: str | None,
                 default_topic: str) -> tuple[str, bytes | None, bytes | None]:
    """(topic, key, value) from a captured {topic, key, value} file (kcat -J's {topic, key,
    payload} too) or a raw value file."""
    require_file(path, field="--explain", hint="pass --explain with a change record's file")
    data = path.read_bytes()
    try:
        parsed = parse_json(data, max_depth=sys.getrecursionlimit() // 2)
    except (ValueError, UnicodeDecodeError):
        return topic or default_topic, None, data  # not JSON (or too deep): decode says why
    if isinstance(parsed, dict) and "topic" in parsed and "op" not in parsed and (
            "value" in parsed or ("payload" in parsed and "schema" not in parsed)):
        # kcat -J names the value `payload` (review 50-d F16); a Debezium envelope with
        # schemas has `schema` and `payload`, and no `topic`.
        value = parsed["value"] if "value" in parsed else parsed["payload"]
        return topic or str(parsed["topic"]), _encoded(parsed.get("key")), _encoded(value)
    return topic or default_topic, None, (None if parsed is None else data)


def _encoded(part: Any) -> bytes | None:
    """A captured key or value as the record's bytes: a string is the record's text (kcat -J
    and console consumers write it so; review 50-d F16: it was taken for a JSON string, the
    change event "a string, not an object"), anything else the JSON it is."""
    if part is None:
        return None
    return part.encode(errors="surrogatepass") if isinstance(part, str) else \
        json.dumps(part).encode()


def _event(event: OutboxEvent) -> dict[str, Any]:
    return {"id": event.event_id, "op": event.op, "aggregate_type": event.aggregate_type,
            "aggregate_id": event.aggregate_id, "type": event.type,
            "created_at": _moment(event.created_at_ms),
            "headers": dict(event.headers), "payload_bytes": len(event.payload),
            "payload_is_json": event.payload_is_json, "lsn": event.lsn, "tx_id": event.tx_id}


def _moment(epoch_ms: int | None) -> str | None:
    """created_at as RFC 3339, or as milliseconds where RFC 3339 has no year for it."""
    if epoch_ms is None:
        return None
    try:
        return rfc3339(epoch_ms)
    except ValueError:
        return f"{epoch_ms} ms since 1970"


def _record(record: OutboundRecord) -> dict[str, Any]:
    return {"topic": record.topic, "partition": record.partition, "nats": record.nats,
            "event_id": record.event_id,
            "key": _text(record.key), "timestamp_ms": record.timestamp_ms,
            "headers": [[name, _text(value)] for name, value in record.headers],
            "value": _text(record.value), "value_bytes": len(record.value),
            "format": record.format, "route_index": record.route_index}


def _text(data: bytes | None) -> str | None:
    """Bytes as text when they are UTF-8, else as 'base64:...'."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()
