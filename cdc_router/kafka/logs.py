"""librdkafka's own log lines, through Python's logging, without a flood.

During a broker outage librdkafka reports each failed connection attempt (about 20 lines a
second with a producer, a consumer and an admin client, measured in QA session 27-b: 7,116
lines in a 6-minute outage). The same line, numbers aside, is passed once per REPEAT_WINDOW_S;
the next one passed says how many like it were held back.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

REPEAT_WINDOW_S = 60.0
_NUMBERS = re.compile(r"\d+")
_MAX_KEYS = 1000  # distinct lines remembered (the oldest forgotten first)


class RepeatFilter(logging.Filter):
    """Passes a record unless one like it (same level, same text once numbers are masked)
    passed less than `window_s` ago; counts what it holds back."""

    def __init__(self, window_s: float = REPEAT_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._window_s = window_s
        self._clock = clock
        self._seen: dict[tuple[int, str], tuple[float, int]] = {}  # -> (passed at, held)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.levelno >= logging.WARNING:
            lowered = text.lower()
            if "authentication" in lowered:
                _REFUSED_CREDENTIALS[:] = [text]
            elif any(sign in lowered for sign in _TLS_FAILURE_SIGNS):
                _FAILED_TLS[:] = [text]
        key = (record.levelno, _NUMBERS.sub("#", text)[:300])
        now = self._clock()
        passed = self._seen.get(key)
        if passed is not None and now - passed[0] < self._window_s:
            self._seen[key] = (passed[0], passed[1] + 1)
            return False
        if passed is not None and passed[1]:
            record.msg = f"{record.getMessage()} ({passed[1]} like it in the last " \
                         f"{now - passed[0]:.0f}s not logged)"
            record.args = ()
        self._seen.pop(key, None)
        self._seen[key] = (now, 0)
        while len(self._seen) > _MAX_KEYS:
            del self._seen[next(iter(self._seen))]
        return True


# The last line of librdkafka's saying the cluster refused this process's credentials: a
# wrong SASL password otherwise ends as a timeout, "is the cluster reachable?" (QA 31-c).
_REFUSED_CREDENTIALS: list[str] = []


def refused_credentials() -> str | None:
    """librdkafka's last authentication failure in this process, or None."""
    return _REFUSED_CREDENTIALS[0] if _REFUSED_CREDENTIALS else None


# The last line of librdkafka's saying a TLS handshake with the cluster failed, or that the
# listener speaks another protocol: those ended as "is the cluster reachable?" too (QA 32-d).
_FAILED_TLS: list[str] = []
_TLS_FAILURE_SIGNS = ("ssl handshake failed", "state ssl_handshake", "ssl routines",
                      "incorrect security.protocol")


def with_refused_credentials(line: str) -> str:
    """`line`, naming the credentials Kafka refused or the TLS handshake that failed, when
    librdkafka said so (QA 31-c: a wrong SASL password ended as "is the cluster reachable?";
    QA 32-d: a wrong CA file, a certificate for another host name, likewise)."""
    refused = refused_credentials()
    if refused is not None and "authentic" not in line.lower():
        return (f"{line} (Kafka refused this process's credentials: {refused}; check "
                "kafka.sasl_username, its password and kafka.sasl_mechanism)")
    if _FAILED_TLS and "handshake" not in line.lower():
        return (f"{line} (the connection to Kafka failed: {_FAILED_TLS[0]}; check "
                "kafka.security_protocol against the listener, and kafka.config's ssl.* "
                "settings: the CA file, the client certificate and key, the broker's host "
                "name in its certificate)")
    return line


def serve_logs(admin: Any) -> None:
    """Hand an admin client's queued librdkafka lines to its logger: an AdminClient serves
    them only in poll(), which nothing else calls (QA 31-d: `topics apply` and `status` after
    a wrong SASL password never saw the authentication failure)."""
    with suppress(Exception):  # a client already closed has nothing to serve
        admin.poll(0)


def librdkafka_logger() -> logging.Logger:
    """The logger our Kafka clients hand librdkafka's lines to, with its RepeatFilter."""
    logger = logging.getLogger("cdc_router.librdkafka")
    if not any(isinstance(existing, RepeatFilter) for existing in logger.filters):
        logger.addFilter(RepeatFilter())
    return logger
