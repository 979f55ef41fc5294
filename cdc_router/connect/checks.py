"""What a connector's settings mean for the router: the settings that make the router's
input unreadable or, worse, readable and wrong.

Pure functions of a connector config (every value a string, as Connect stores it), for
`connectors apply` (cli/connectors.py).
"""

from __future__ import annotations

from collections.abc import Mapping

JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
_UNWRAP = "io.debezium.transforms.ExtractNewRecordState"
_EVENT_ROUTER = "io.debezium.transforms.outbox.EventRouter"
# What each transform does to the raw change events the router decodes (QA 35-a F3: every
# record was dead-lettered, and `connectors apply` had said nothing).
_RESHAPERS = {
    _UNWRAP: "strips the change event's envelope (op, after, source) the router decodes",
    _EVENT_ROUTER: "turns each row into the event it routes (the router's own job), a value "
                   "that is no change event",
}


def transform_types(config: Mapping[str, str]) -> dict[str, str]:
    """The connector's transforms in order: alias -> its `transforms.<alias>.type`."""
    aliases = [alias.strip() for alias in config.get("transforms", "").split(",")
               if alias.strip()]
    return {alias: config.get(f"transforms.{alias}.type", "").strip() for alias in aliases}


def reading_problems(config: Mapping[str, str]) -> list[str]:
    """Settings under which the router cannot read the connector's records right, one line
    each: what is set, what it does to the records, what to set. Empty for a connector
    other than Debezium's PostgreSQL one."""
    if "postgres" not in config.get("connector.class", "").lower():
        return []
    problems = [f"transforms.{alias}.type is {kind}: it {_RESHAPERS[kind]}, so the router "
                "would dead-letter every record of this connector; remove it from transforms "
                "(the router reads Debezium's raw change events)"
                for alias, kind in transform_types(config).items() if kind in _RESHAPERS]
    decimals = config.get("decimal.handling.mode")
    if _schemas_off(config) and (decimals is None or decimals.strip().lower() == "precise"):
        # QA 35-a F1: 20 of 20 rows delivered with a base64 aggregate id (and partition)
        # and a base64 key, no warning anywhere.
        said = "is precise" if decimals is not None else "is not set (Debezium's default: precise)"
        problems.append(f"decimal.handling.mode {said} while value.converter.schemas.enable "
                        "is false: a numeric column arrives as base64 of its unscaled bytes, "
                        "which the router cannot tell from text (a numeric aggregate id or "
                        "key column goes out as that base64); set decimal.handling.mode=string")
    return problems


def _schemas_off(config: Mapping[str, str]) -> bool:
    """The connector's own JsonConverter, its values sent without their schema (a converter
    left to the worker is the worker's business: its settings are not in this config)."""
    return config.get("value.converter", "").strip() == JSON_CONVERTER and \
        config.get("value.converter.schemas.enable", "true").strip().lower() == "false"
