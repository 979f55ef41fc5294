"""A broker's quota slowing a client: librdkafka's throttle_cb, told in one line a minute.

Kafka delays the responses of a client over its quota (producer_byte_rate, request_percentage
of `kafka-configs --entity-type clients`) and says by how long in each response
(throttle_time_ms); librdkafka hands that to throttle_cb, served by the client's poll(). The
router slowed under a quota, and said only "Message timed out", then `status` said "stuck or
down" (QA 57-a F-4). The callback runs once a throttled response, never once a record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Literal

log = logging.getLogger("cdc_router.router")

# The line is written at most this often (the first throttled response at once); it counts
# the responses throttled and the longest delay since the last line.
LOG_INTERVAL_S = 60.0


# The quotas that delay each kind of request (Kafka's docs, "Quotas"), and what waits on it.
_REQUESTS = {"produce": ("producer_byte_rate", "records wait to be written"),
             "fetch": ("consumer_byte_rate", "the raw topic (and the dedup changelog at a "
                       "start) is read slower")}


class ThrottleWatch:
    """throttle_cb for a client of `client_id` whose `requests` ("produce" for a producer,
    "fetch" for a consumer) a quota may delay: a rate-limited WARNING line, and
    `on_throttle(seconds)` for each throttled response (a metric)."""

    def __init__(self, client_id: str, *, on_throttle: Callable[[float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 requests: Literal["produce", "fetch"] = "produce") -> None:
        self._client_id = client_id
        self._requests = requests
        self._on_throttle = on_throttle
        self._clock = clock
        self._last_line: float | None = None
        self._responses = 0
        self._longest_s = 0.0

    def __call__(self, event: Any) -> None:
        """`event`: confluent_kafka.ThrottleEvent (broker_name, broker_id, throttle_time s)."""
        seconds = float(event.throttle_time)
        if seconds <= 0:  # librdkafka also reports the end of a throttle, as 0
            return
        if self._on_throttle is not None:
            self._on_throttle(seconds)
        self._responses += 1
        self._longest_s = max(self._longest_s, seconds)
        now = self._clock()
        if self._last_line is not None and now - self._last_line < LOG_INTERVAL_S:
            return
        quota, waiting = _REQUESTS[self._requests]
        log.warning("event=throttled client_id=%s requests=%s broker=%s throttle_ms=%d "
                    "responses=%d hint='a Kafka quota on this client id (%s or "
                    "request_percentage) delays its %s requests: %s and the lag grows; "
                    "`kafka-configs --describe --entity-type clients --entity-name %s` shows it: "
                    "raise or delete it, or give this process another kafka.client_id'",
                    self._client_id, self._requests, event.broker_name,
                    round(self._longest_s * 1000), self._responses, quota, self._requests,
                    waiting, self._client_id)
        self._last_line, self._responses, self._longest_s = now, 0, 0.0
