"""The text `rules check` prints: the config's summary, each explained event, the config as
JSON with its secrets masked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cdc_router.cli._output import table
from cdc_router.config.model import RouterConfig
from cdc_router.config.redact import redact_tree, shown_url
from cdc_router.config.routes import RouteMatch, RouteRule

_PREVIEW_CHARS = 400  # text output cuts long values; -o json shows them whole


def route_match(match: RouteMatch | None) -> str:
    if match is None:
        return "(default)"
    parts = [f"{name} ~ {_patterns(value)}" for name, value in
             (("aggregate_type", match.aggregate_type), ("type", match.type)) if value is not None]
    parts += [f"header {name} ~ {_patterns(value)}" for name, value in
              (match.header or {}).items()]
    return ", ".join(parts)


def _patterns(value: str | list[str]) -> str:
    return value if isinstance(value, str) else " | ".join(value)


def _rule_options(rule: RouteRule) -> str:
    # JetStream has no keys or partitions: a nats route's record is its subject, data, headers.
    options: list[str] = [rule.format] if rule.nats else [f"key {' | '.join(rule.key_names)}",
                                               f"partition {rule.partition}", rule.format]
    if rule.cloudevents:
        options.append(f"cloudevents ({rule.ce_source})")
    if rule.headers:
        options.append("headers " + ", ".join(rule.headers))
    return ", ".join(options)


def summary(path: Path, config: RouterConfig) -> str:
    source, delivery, dedup = config.source, config.delivery, config.dedup
    lines = [f"{path}: valid",
             f"source     {', '.join(source.topics)} (group {source.group_id}; snapshot rows "
             f"{'routed' if source.snapshot_rows else 'skipped'}; updates {source.on_update}"
             + "".join(f"; {field} the first of {' | '.join(names)}"  # a rename's names
                       for field, names in source.outbox.renamed) + ")",
             f"routes     {len(config.routes)}, first match wins:"]
    rows = [[f"[{index}]", route_match(rule.match), "->",
             f"nats {rule.destination}" if rule.nats else rule.destination, _rule_options(rule)]
            for index, rule in enumerate(config.routes)]
    lines += ["  " + line for line in table(["#", "match", "", "topic", "options"],
                                            rows).splitlines()]
    unmatched = (f"dead letter to {config.dead_letter.topic}" if config.unmatched ==
                 "dead_letter" else "skipped and counted")
    dedup_text = (f"on: {dedup.window_ms // 3_600_000} h / {dedup.max_ids} ids, changelog "
                  f"{dedup.changelog_topic}" if dedup.enabled else "off")
    lines += [f"unmatched  {unmatched}",
              f"delivery   {delivery.guarantee} (commit every {delivery.commit_interval_ms} ms "
              f"or {delivery.commit_max_records} records; max payload "
              f"{delivery.max_payload_bytes} bytes)",
              f"dead letter {config.dead_letter.topic}",
              f"dedup      {dedup_text}",
              f"cleanup    {config.cleanup.mode}",
              f"topics     {', '.join(spec.name for spec in config.topic_specs())} "
              "(created by `cdc-router topics apply`)",
              f"protected  {', '.join(config.protected_topics)}, __*, the source and the "
              "router's own topics",
              f"allowed    {', '.join(config.allowed_topics or ['any name not protected'])}"]
    # Not a nats section without streams (a JetStream route needs them): `eval "$(cdc-router
    # local env)"` gives every config one, by CDC_ROUTER__NATS__URL (QA 36-c F2).
    if config.nats is not None and config.nats.streams:
        streams = ", ".join(f"{stream.name} ({' '.join(stream.subjects)})"
                            for stream in config.nats.streams)
        lines.append(f"nats       {shown_url(config.nats.url)}; streams {streams} "
                     "(created by `cdc-router streams apply`)")
    return "\n".join(lines)


def describe(result: dict[str, Any]) -> str:
    lines = [f"{result['file']} (from {result['source_topic']})"]
    event = result.get("event")
    if event:
        lines.append(f"  event     op {event['op']}, id {event['id']}, aggregate "
                     f"{event['aggregate_type']!r}/{event['aggregate_id']!r}, type "
                     f"{event['type']!r}, created_at {event['created_at']}")
    route = result.get("route")
    if route:
        lines.append(f"  route     [{route['index']}] {route['match']} -> {route['topic']}")
    if result["outcome"] == "skipped":
        lines.append(f"  skipped   {result['reason']}")
    elif result["outcome"] == "dead_letter":
        lines.append(f"  dead letter to {result['dead_letter_topic']} (stage "
                     f"{result['stage']}): {result['reason']}")
    else:
        record = result["record"]
        value = record["value"] or ""
        if len(value) > _PREVIEW_CHARS:
            value = value[:_PREVIEW_CHARS] + "…"
        where = (f"NATS subject {record['topic']}, Nats-Msg-Id {record['event_id']}"
                 if record["nats"] else f"topic {record['topic']}, partition "
                 + (f"{record['partition']}" if record["partition"] is not None else "chosen")
                 + (f" ({record['partitioner']})" if "partitioner" in record else "")
                 + f", key {record['key']}, timestamp {record['timestamp_ms']}")
        lines += [f"  record    {where}",
                  "  headers   " + ", ".join(f"{name}={value!r}" for name, value in
                                            record["headers"]),
                  f"  value     {value} ({record['value_bytes']} bytes, {record['format']})"]
    return "\n".join(lines)


def public_config(config: RouterConfig) -> dict[str, Any]:
    """The config as JSON, secrets masked: SecretStr fields, the DSN, every secret-named
    property passed through (kafka.config, kafka.producer, schema_registry.config, ...), and
    the user info of every server URL."""
    data: dict[str, Any] = _urls_shown(redact_tree(config.model_dump(mode="json",
                                                                     by_alias=True)))
    return data


def _urls_shown(value: Any, key: str = "") -> Any:
    """`value` with each URL (nats.url, schema_registry.url, a `*.url` property) as shown_url
    masks it: redact() knows `user:password@`, not a token alone, `nats://TOKEN@host`, NATS's
    own form, which -o json printed in clear (review 46-2 F11)."""
    if isinstance(value, dict):
        return {name: _urls_shown(item, str(name)) for name, item in value.items()}
    if isinstance(value, list):
        return [_urls_shown(item, key) for item in value]
    if isinstance(value, str) and value and (key == "url" or key.endswith((".url", "_url"))):
        return shown_url(value)
    return value
