"""The value converter the router reads Debezium's change events with: a fact of the
connector's config, which the connector-file checks (connect/) and the router's decoder
(router/debezium.py) both name. A pure leaf (reread 50-i F5: the checks imported the
router's decoder for it)."""

from __future__ import annotations

JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
# What the shipped connector file sets, for the router to read its values (review 49-f F2).
CONVERTER_FIX = (f"set value.converter={JSON_CONVERTER} and value.converter.schemas.enable="
                 "false (as connectors/outbox-connector.json has it)")
