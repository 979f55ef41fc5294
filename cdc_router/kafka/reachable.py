"""Whether a client reaches Kafka: librdkafka's statistics (stats_cb), read once an interval.

QA 58-b F-6: Kafka stopped 73 s and the router's /metrics said nothing of it: the consumer's
assignment was revoked at its session timeout, so cdc_router_consumer_lag lost its series, no
batch was open, so cdc_router_consecutive_aborts stayed 0, and no rule on the router's own
exposition could fire. librdkafka tells error_cb of an outage (_TRANSPORT for each failed
connection, _ALL_BROKERS_DOWN) but never of its end; its statistics give the state of each
broker connection every statistics.interval.ms, both ways. The callback runs at a poll of the
client, once an interval, never once a record.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

# How often librdkafka hands over its statistics: the gauge follows an outage within this
# (plus the poll that serves them).
STATS_INTERVAL_MS = 5000

# The document has an entry of some 40 fields a partition: json.loads of a 65 kB one took
# 4 ms, on the loop's thread; its top-level "brokers" object alone, 30 us. No string in the
# document holds this unescaped (its quotes would be \").
_BROKERS = re.compile(r'"brokers"\s*:\s*')
_DECODER = json.JSONDecoder()


class BrokerReach:
    """stats_cb of one client at a time: `on_change(reachable)` with whether any broker
    connection of the client is up (librdkafka's state UP), each time that changes."""

    def __init__(self, on_change: Callable[[bool], None]) -> None:
        self._on_change = on_change
        self.reachable: bool | None = None  # None: no statistics yet

    def client_config(self) -> dict[str, Any]:
        """The properties that have a client hand its statistics to this watch (they win over
        a statistics.interval.ms of the user's: the router gives them to no one else)."""
        return {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self}

    def __call__(self, stats: str) -> None:
        found = _BROKERS.search(stats)
        try:
            brokers = _DECODER.raw_decode(stats, found.end())[0] if found else None
        except ValueError:
            return  # not librdkafka's statistics: says nothing either way
        if not isinstance(brokers, dict):
            return
        # The bootstrap entries, the learned brokers, the logical GroupCoordinator; never
        # librdkafka's internal broker, which is no connection.
        reachable = any(isinstance(broker, dict) and broker.get("state") == "UP"
                        and broker.get("source") != "internal" for broker in brokers.values())
        if reachable != self.reachable:
            self.reachable = reachable
            self._on_change(reachable)
