"""librdkafka's own log lines, through Python's logging, without a flood.

During a broker outage librdkafka reports each failed connection attempt (about 20 lines a
second with a producer, a consumer and an admin client, measured in QA session 27-b: 7,116
lines in a 6-minute outage). The same line, numbers aside, is passed once per REPEAT_WINDOW_S;
the next one passed says how many like it were held back.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from cdc_router.kafka.tls import CERTIFICATES, certificate_failure, certificate_refusal

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
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.levelno >= logging.WARNING:
            lowered = text.lower()  # TLS first: "client SSL authentication might be required"
            if certificate := certificate_refusal(text):
                _REFUSALS[:] = [(time.monotonic(), certificate, text)]
            elif any(sign in lowered for sign in _TLS_FAILURE_SIGNS):
                _REFUSALS[:] = [(time.monotonic(), _TLS, text)]
            elif "unsupported sasl mechanism" in lowered:
                _REFUSALS[:] = [(time.monotonic(), _MECHANISM, text)]
            elif "authentication" in lowered:
                _REFUSALS[:] = [(time.monotonic(), _CREDENTIALS, text)]
        _note_closed_at_once(text)
        key = (record.levelno, _NUMBERS.sub("#", text)[:300])
        with self._lock:  # clients log on threads of their own too (a close, a lookup)
            now = self._clock()
            passed = self._seen.get(key)
            if passed is not None and now - passed[0] < self._window_s:
                self._seen[key] = (passed[0], passed[1] + 1)
                return False
            self._seen.pop(key, None)
            self._seen[key] = (now, 0)
            while len(self._seen) > _MAX_KEYS:
                del self._seen[next(iter(self._seen))]
        if passed is not None and passed[1]:
            record.msg = f"{text} ({passed[1]} like it in the last " \
                         f"{now - passed[0]:.0f}s not logged)"
            record.args = ()
        return True


# librdkafka's newest line saying the cluster refused this process's credentials, or that a
# TLS handshake failed: both otherwise end as a timeout, "is the cluster reachable?" (QA 31-c:
# a wrong SASL password; QA 32-d: a wrong CA file, a certificate for another host name; QA 35-e:
# a SASL mechanism the broker does not enable).
# (monotonic time, kind, line); used while REFUSAL_FRESH_S old.
_REFUSALS: list[tuple[float, str, str]] = []
_CREDENTIALS, _MECHANISM, _TLS = "credentials", "mechanism", "tls"
_TLS_FAILURE_SIGNS = ("ssl handshake failed", "ssl routines", "certificate verify failed")
REFUSAL_FRESH_S = 300.0


def with_kafka_refusal(line: str) -> str:
    """`line` about Kafka, when librdkafka said in the last REFUSAL_FRESH_S that Kafka refused
    this process's login or a certificate of the TLS handshake: refused_login's text instead
    (the line's own guess, "is the cluster up?", dropped); another TLS handshake that failed:
    the line naming it; a broker that closed each connection at once: the line naming
    kafka.security_protocol (QA 56-d F-2); other lines as they are (review 32-3: a Postgres
    error line was blamed on TLS)."""
    lowered = line.lower()
    refusal = _fresh_refusal()
    if "kafka" not in lowered or "authentic" in lowered or "handshake" in lowered:
        return line
    if refusal is None or refusal[1] in line:
        closed = _fresh(_CLOSED)
        if closed is None or closed[1] in line or "security_protocol" in lowered:
            return line
        return f"{line} ({_closed_hint(closed[1])})"
    kind, said = refusal
    if kind in (_CREDENTIALS, _MECHANISM):  # review 54-k F-4: the refusal leads, not a guess
        return _login_refused(kind, said)
    if kind in CERTIFICATES:  # added to the line: mid-stream it may have been brief (56-s F-1)
        return f"{line} ({certificate_failure(kind, said, 'kafka.config')})"
    return (f"{line} (the TLS handshake with Kafka failed: {said}; check kafka.config's ssl.* "
            "settings: the CA file, the client certificate and key, the broker's host name in "
            f"its certificate, and kafka.security_protocol (now {_protocol()}) against the "
            "listener)")


def refused_login() -> str | None:
    """What Kafka refused of this process's login (its credentials, its SASL mechanism, a
    certificate of the TLS handshake) and what to check, when librdkafka said so in the last
    REFUSAL_FRESH_S; else None (another TLS failure too): for a start whose init_transactions
    only timed out (kafka/start.py init_failure; review 54: a wrong password was "is the
    cluster reachable?"; QA 56-d F-3: a wrong CA file exited 75, restarted for ever)."""
    refusal = _fresh_refusal()
    if refusal is None or refusal[0] == _TLS:
        return None
    return _login_refused(*refusal)


def refused_since(since: float) -> bool:
    """Whether librdkafka said at or after `since` (time.monotonic()) that Kafka refused this
    process's login or a certificate (refused_login's refusals): no wait for an answer helps."""
    return bool(_REFUSALS) and _REFUSALS[0][0] >= since and _REFUSALS[0][1] != _TLS


def refused_certificate() -> bool:
    """Whether the refusal refused_login names is a certificate's (kafka/tls.py)."""
    refusal = _fresh_refusal()
    return refusal is not None and refusal[0] in CERTIFICATES


def _login_refused(kind: str, said: str) -> str:
    """The one text of a refused login, for every command (review 54-k F-4: the others led
    with their own guess, "is the cluster up?", and a shorter list of what to check), naming
    the bootstrap servers noted, which the line it replaces named (review 54-m F-8)."""
    kafka = f"Kafka at {_CLUSTER[0]}" if _CLUSTER else "Kafka"
    if kind == _MECHANISM:
        return (f"{kafka} does not enable this process's SASL mechanism: {said}; set "
                "kafka.sasl_mechanism to one the broker lists; a restart does not mend it")
    if kind in CERTIFICATES:
        return f"{certificate_failure(kind, said, 'kafka.config', kafka)}; a restart does not " \
            "mend it"
    return (f"{kafka} refused this process's credentials: {said}; check kafka.sasl_username and "
            "its password (kafka.sasl_password, or CDC_ROUTER__KAFKA__SASL_PASSWORD), "
            "kafka.sasl_mechanism and kafka.security_protocol against the broker's listener; "
            "a restart does not mend it")


# librdkafka's newest line saying a broker closed a connection within CLOSED_AT_ONCE_MS of its
# opening, before or just after the first request: what a listener does to a client speaking
# another security protocol (SSL against SASL_SSL, PLAINTEXT against SSL or SASL; QA 56-d F-2).
# Lines at any level: librdkafka logs some of these at INFO.
_CLOSED: list[tuple[float, str, str]] = []
CLOSED_AT_ONCE_MS = 1000
_CLOSED_LINE = re.compile(r"connection (?:closed|reset) by peer.*\(after (\d+)ms in state "
                          r"(?:CONNECT|SSL_HANDSHAKE|APIVERSION_QUERY|AUTH_\w+|UP)\b")


def _note_closed_at_once(text: str) -> None:
    closed = _CLOSED_LINE.search(text)
    if closed is not None and int(closed.group(1)) < CLOSED_AT_ONCE_MS:
        _CLOSED[:] = [(time.monotonic(), "closed", text)]


def _closed_hint(said: str) -> str:
    return (f"the broker accepted the connection and closed it at once: {said}; a listener "
            "does so to a client speaking another security protocol: check "
            f"kafka.security_protocol (now {_protocol()}) against the listener's (PLAINTEXT, "
            "SSL, SASL_PLAINTEXT or SASL_SSL), and for a SASL one kafka.sasl_mechanism, "
            "kafka.sasl_username and its password")


def forget_refusal() -> None:
    """Forget the refusal noted: a client of this process has logged in since (review 54-k
    F-3: one refused login, then an outage's timeout, exited 1, "a restart does not mend it")."""
    _REFUSALS.clear()
    _CLOSED.clear()


def _fresh_refusal() -> tuple[str, str] | None:
    return _fresh(_REFUSALS)


def _fresh(noted: list[tuple[float, str, str]]) -> tuple[str, str] | None:
    if not noted or time.monotonic() - noted[0][0] > REFUSAL_FRESH_S:
        return None
    return noted[0][1], noted[0][2]


# The cluster this process's clients were built for (clients.logged_config notes it): the CLI's
# line for a Kafka error no command turned into its own names it (review 53-c F5).
_CLUSTER: list[str] = []
_PROTOCOL: list[str] = []  # and the security protocol it speaks


def note_cluster(bootstrap_servers: str, security_protocol: str = "PLAINTEXT") -> None:
    """Note the bootstrap servers a client of this process is built for, and its protocol."""
    _CLUSTER[:] = [bootstrap_servers]
    _PROTOCOL[:] = [security_protocol]


def _protocol() -> str:
    return _PROTOCOL[0] if _PROTOCOL else "PLAINTEXT"


def noted_cluster() -> str | None:
    """The bootstrap servers last noted, or None before any client."""
    return _CLUSTER[0] if _CLUSTER else None


def quiet_librdkafka() -> Callable[[], None]:
    """Stop librdkafka's lines reaching stderr (a one-shot command's failure is its one error
    line, review 53-c F5: a raw `FAIL [cdc-router#consumer-1]` line came before it), still
    noting a refusal for with_kafka_refusal, as unshown_logger does; returns what undoes it."""
    logger = librdkafka_logger()
    handler = logging.NullHandler()  # not Python's last resort, to stderr
    logger.addHandler(handler)
    logger.propagate = False

    def undo() -> None:
        logger.removeHandler(handler)
        logger.propagate = True

    return undo


def serve_logs(admin: Any) -> None:
    """Hand an admin client's queued librdkafka lines to its logger: an AdminClient serves
    them only in poll(), which nothing else calls (QA 31-d: `topics apply` and `status` after
    a wrong SASL password never saw the authentication failure)."""
    with suppress(Exception):  # a client already closed has nothing to serve
        admin.poll(0)


def librdkafka_logger() -> logging.Logger:
    """The logger our Kafka clients hand librdkafka's lines to, with its RepeatFilter."""
    return _filtered(logging.getLogger("cdc_router.librdkafka"))


def unshown_logger() -> logging.Logger:
    """A logger that shows none of librdkafka's lines but still notes a refusal for
    with_kafka_refusal: for `status`, which reports each failure itself (review 51-d F1:
    librdkafka silenced by log_level 0 said no refusal, and a wrong SASL password was shown
    as "Broker transport failure")."""
    logger = logging.getLogger("cdc_router.librdkafka.unshown")
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())  # not Python's last resort, to stderr
    return _filtered(logger)


def _filtered(logger: logging.Logger) -> logging.Logger:
    if not any(isinstance(existing, RepeatFilter) for existing in logger.filters):
        logger.addFilter(RepeatFilter())
    return logger
