"""Settings of the JetStream idempotent consumer: where to read, where poison goes, how to retry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cdc_router.config.nats import subject_problem
from cdc_router.config.nats_servers import server_problem
from cdc_router.config.nats_subjects import subject_matches
from cdc_router.config.redact import masked_repr, shown_url
from cdc_router.consumer.checks import Check, check_all
from cdc_router.consumer.retry import RetryPolicy, finite_number, whole_number
from cdc_router.consumer.settings import as_names, filled
from cdc_router.errors import ConfigError, printable

# auto: the `event_id_header` header when the message has one (the router always writes it,
# equal to Nats-Msg-Id), else Nats-Msg-Id. A copy re-published under a fresh Nats-Msg-Id (to
# pass the stream's duplicate window) keeps its `id` header, so auto still sees the same event.
# msg_id / header: only that one, for publishers other than the router.
JetStreamEventIdSource = Literal["auto", "msg_id", "header"]


@dataclass(frozen=True)
class JetStreamSettings:
    """A durable pull consumer on `stream`, its dead-letter subject, and the retry policy.

    `retry.max_attempts` is the consumer's MaxDeliver: a message whose handler fails on its
    max_attempts-th delivery goes to `dead_letter_subject`. The server-side consumer is created
    with MaxDeliver unlimited on purpose (see cdc_router/consumer/README.md).
    """

    url: str = field(repr=False)  # may hold user:password@ or a token: __repr__ masks it
    stream: str
    durable: str
    dead_letter_subject: str
    # Empty: the whole stream. Several need nats-server 2.10 or later (filter_subjects):
    # refused at start on an older server, which would ignore them.
    filter_subjects: tuple[str, ...] = ()
    # The dedup store's consumer group; the durable name when None. Give the Kafka consumer's
    # group id to carry its done marks over when a service moves from Kafka to JetStream.
    group_id: str | None = None
    event_id_source: JetStreamEventIdSource = "auto"
    event_id_header: str = "id"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # How long JetStream waits for an ack before it redelivers (to this or another worker):
    # the redelivery delay after a crash. Long handlers are kept alive with in-progress acks.
    ack_wait_s: float = 30.0
    # Messages per fetch; all of them are kept alive (in-progress) while the batch is handled.
    batch_size: int = 50
    # Upper bound of one fetch wait, so a stop request is seen within this time.
    poll_timeout_s: float = 1.0
    connect_timeout_s: float = 5.0
    # How long a dead-letter publish may wait for its JetStream ack before it is retried.
    dead_letter_timeout_s: float = 10.0
    # JetStream's own bound on unacked messages (None: the server's default, 1000).
    max_ack_pending: int | None = None
    # nats.connect() keywords for credentials and TLS, e.g. the router's own `nats:` section:
    # cdc_router.nats.connection.connect_options(NatsSettings(user=..., password=..., tls=...)).
    connect_options: Mapping[str, Any] = field(default_factory=dict, repr=False)  # secrets

    def __repr__(self) -> str:
        """The dataclass's repr, the url's password or token masked (QA 64-b) and without
        connect_options (credentials and TLS)."""
        return masked_repr(self, url=shown_url)

    def __post_init__(self) -> None:
        source = "JetStreamSettings"
        object.__setattr__(self, "filter_subjects",
                           as_names(self.filter_subjects, source, "filter_subjects"))
        checks: list[Check] = [
            (filled(self.url), "url", "must not be empty or blank", self.url),
            (filled(self.stream) and not any(ch in self.stream for ch in ".*> \t"), "stream",
             "must name a stream: no '.', '*', '>' or whitespace", self.stream),
            (self.group_id is None or filled(self.group_id), "group_id",
             "must be None (the durable name) or a string that is not empty or blank",
             self.group_id),
            (bool(self.durable) and not any(ch in self.durable for ch in ".*> \t"), "durable",
             "must be a name without '.', '*', '>' or whitespace", self.durable),
            (subject_problem(self.dead_letter_subject) is None, "dead_letter_subject",
             "must be a valid subject without wildcards: poison messages are never dropped",
             self.dead_letter_subject),
            (all(subject_problem(s, wildcards=True) is None for s in self.filter_subjects),
             "filter_subjects", "must be valid subjects (wildcards allowed)",
             self.filter_subjects),
            (not self.consumes(self.dead_letter_subject), "dead_letter_subject",
             "must not be one of the consumed subjects", self.dead_letter_subject),
            (self.event_id_source in ("auto", "msg_id", "header"), "event_id_source",
             "must be 'auto', 'msg_id' or 'header'", self.event_id_source),
            (filled(self.event_id_header), "event_id_header", "must not be empty or blank",
             self.event_id_header),
            # Of the right type and finite (review 47-e F12: tracebacks, an idle loop that
            # spun on an infinite timeout).
            (isinstance(self.retry, RetryPolicy), "retry", "must be a RetryPolicy", self.retry),
            (finite_number(self.ack_wait_s) and self.ack_wait_s >= 1, "ack_wait_s",
             "must be a finite number, at least 1 s", self.ack_wait_s),
            (whole_number(self.batch_size), "batch_size", "must be a whole number, at least 1",
             self.batch_size),
            *((finite_number(value) and value > 0, name, "must be a finite positive number",
               value) for name, value in (("poll_timeout_s", self.poll_timeout_s),
                                          ("connect_timeout_s", self.connect_timeout_s),
                                          ("dead_letter_timeout_s",
                                           self.dead_letter_timeout_s))),
            (self.max_ack_pending is None or whole_number(self.max_ack_pending), "max_ack_pending",
             "must be a whole number, at least 1", self.max_ack_pending),
        ]
        check_all(source, checks)
        connect_option_problem(self.connect_options)
        # QA 61-b F3: http:// or nat:// was taken, and run() failed on a DNS error.
        problem = server_problem(self.url, "tls" in self.connect_options)
        if problem is not None:
            raise ConfigError(problem[0], source=source, field="url", value=problem[1])

    @property
    def dedup_group(self) -> str:
        """The consumer group of the dedup keys."""
        return self.group_id or self.durable

    def consumes(self, subject: str) -> bool:
        """Whether `subject` is one this consumer reads (if it is in the stream)."""
        if not self.filter_subjects:
            return False  # the whole stream: the stream check at start decides
        return any(subject_matches(filter_, subject) for filter_ in self.filter_subjects)


# The nats.connect() keywords the consumer sets itself (jetstream.py _connect): given again in
# connect_options they were a TypeError, "got multiple values for keyword argument".
_OWN_CONNECT_OPTIONS = {
    "servers": "url", "connect_timeout": "connect_timeout_s", "name": None,
    "allow_reconnect": None, "max_reconnect_attempts": None, "reconnect_time_wait": None,
    "error_cb": None, "disconnected_cb": None, "reconnected_cb": None}


def connect_option_problem(options: object) -> None:
    """Raise a ConfigError naming the first connect_options key nats.connect() does not take
    (review 52-c F-low-7: `usr` for `user` was nats-py's TypeError traceback at run()), or
    one the consumer sets itself."""
    import difflib
    import inspect

    from nats.aio.client import Client

    source = "JetStreamSettings"
    try:
        keys = list(dict(options))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ConfigError("must be a mapping of nats.connect() keywords", source=source,
                          field="connect_options", value=type(options).__name__) from None
    taken = set(inspect.signature(Client.connect).parameters) - {"self"}
    for key in keys:
        if key in _OWN_CONNECT_OPTIONS:
            setting = _OWN_CONNECT_OPTIONS[key]
            raise ConfigError("is set by the consumer itself", source=source,
                              field=f"connect_options.{key}",
                              hint=f"set JetStreamSettings.{setting}" if setting else None)
        if key not in taken:
            close = difflib.get_close_matches(str(key), sorted(taken), n=1)
            raise ConfigError(
                "is not a nats.connect() keyword", source=source,
                field=f"connect_options.{printable(str(key))}",
                hint=(f"did you mean {close[0]!r}? " if close else "") +
                "see the keywords of nats.aio.client.Client.connect")


def consumer_problem(existing: Any, settings: JetStreamSettings) -> str | None:
    """Why an existing durable consumer (its nats-py ConsumerConfig) cannot serve `settings`."""
    if existing.deliver_subject:
        return "is a push consumer; this consumer pulls"
    ack_policy = str(getattr(existing.ack_policy, "value", existing.ack_policy))
    if ack_policy != "explicit":
        return f"acknowledges {ack_policy!r}, not 'explicit'"
    if existing.max_deliver not in (None, 0, -1):
        return (f"has MaxDeliver {existing.max_deliver}: JetStream would stop redelivering a "
                "message after that many deliveries, even those naked for a store outage "
                "(the consumer enforces retry.max_attempts itself); set it to -1")
    filters = set(existing.filter_subjects or ()) | (
        {existing.filter_subject} if existing.filter_subject else set())
    if filters != set(settings.filter_subjects):
        return (f"filters {sorted(filters) or 'the whole stream'}, the settings say "
                f"{sorted(settings.filter_subjects) or 'the whole stream'}")
    return None
