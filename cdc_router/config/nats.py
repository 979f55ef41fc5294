"""The `nats` section and NATS's rules for subjects: where JetStream routes publish.

A route names a subject template (`nats: {subject: "orders.{type}"}`) in place of a topic.
A subject built from row data is checked per event (subject_problem, SubjectGuard): one that
NATS would refuse or misread (empty tokens, whitespace, control characters, the wildcards `*`
and `>`, too long), a system or inbox subject (`$JS.API...`, `_INBOX...`), or one no stream of
`nats.streams` captures is a dead letter at stage route, never a publish. The stream list is the
allow list: a JetStream publish to a subject no stream captures gets no ack, which would stall
every batch after it, so the router only publishes where a declared stream will answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveInt,
    SecretStr,
    field_validator,
    model_validator,
)

from cdc_router.config.fields import ConfigModel, field_problem
from cdc_router.config.nats_servers import server_problem
from cdc_router.config.nats_subjects import subject_matches, subjects_collide
from cdc_router.config.topic_names import Template, parse_template
from cdc_router.errors import show

# The client's PUB line also carries the reply inbox and sizes within the server's 4 KB
# max_control_line; 255 bytes keeps far under it and matches what NATS tooling recommends.
MAX_SUBJECT_BYTES = 255
# Stream names become subjects of the JetStream API ($JS.API.STREAM.INFO.<name>).
_STREAM_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# NATS headers are MIME-style: a name is printable ASCII without ':' or space.
_HEADER_NAME = re.compile(r"[!-9;-~]+")
MSG_ID_HEADER = "Nats-Msg-Id"
# The names nats-py (nats.js.api.Header.STATUS and DESCRIPTION) gives a server status line.
STATUS_HEADER, DESCRIPTION_HEADER = "Status", "Description"
STATUS_HEADERS = frozenset({STATUS_HEADER, DESCRIPTION_HEADER})
DEFAULT_DUPLICATE_WINDOW_MS = 24 * 3600 * 1000
_STORED_OVERHEAD = 4096
# nats-server refuses a message whose header block is this big or bigger
# (JSStreamHeaderExceedsMaximumErr, err_code 10097); no setting of server or stream raises it.
JETSTREAM_MAX_HEADER_BYTES = 64 * 1024
# What nats-py puts in place of header bytes that are not UTF-8 (it decodes with errors="replace").
REPLACEMENT = "\ufffd"


def nats_message_size(data: bytes, msg_id: str, headers: Iterable[tuple[str, bytes]]) -> int:
    """The size nats-server counts against its max_payload for one JetStream publish: the
    data and the header block (a status line, a CRLF-ended "name: value" line per header,
    Nats-Msg-Id's included, a closing CRLF). nats-py checks the data alone (QA 54-d F-1)."""
    size = len(data) + len("NATS/1.0\r\n\r\n") + len(MSG_ID_HEADER) + len(msg_id.encode()) + 4
    for name, raw in headers:
        size += len(name) + len(raw) + 4
    return size


def subject_problem(subject: str, *, wildcards: bool = False) -> str | None:
    """Why NATS would refuse or misread `subject` as a publish subject, or None.

    `wildcards` allows `*` and `>` tokens (a stream's subject filter, never a publish).
    """
    if not subject:
        return "a subject cannot be empty"
    size = len(subject.encode("utf-8", "surrogatepass"))
    if size > MAX_SUBJECT_BYTES:
        return f"a subject has at most {MAX_SUBJECT_BYTES} bytes, this one has {size}"
    bad = sorted({ch for ch in subject if ch.isspace() or not ch.isprintable()})
    if bad:
        return (f"subject {show(subject)} holds whitespace or control characters "
                f"{show(''.join(bad))}")
    tokens = subject.split(".")
    if "" in tokens:
        return f"subject {show(subject)} has an empty token (a leading, trailing or double '.')"
    for position, token in enumerate(tokens):
        if ("*" in token or ">" in token) and not (
                wildcards and (token == "*" or (token == ">" and position == len(tokens) - 1))):
            return (f"subject {show(subject)} holds a wildcard ('*' or '>'), which "
                    "a published subject may not")
    if subject.startswith("$") or subject.startswith("_INBOX."):
        return (f"subject {show(subject)} is a NATS system or inbox subject ($JS, $SYS, "
                "_INBOX); no route may publish there")
    return None


def parse_subject_template(template: str) -> Template:
    """A subject template's pieces (the topic templates' fields); ValueError when invalid."""

    def literal_problem(literal: str) -> str | None:
        if any(ch.isspace() or not ch.isprintable() or ch in "*>" for ch in literal):
            return f"subject template {show(template)} holds whitespace, '*' or '>'"
        return None

    pieces = parse_template(template, literal_problem)
    for index, (literal, field) in enumerate(pieces):
        tokens = literal.split(".")
        for position, token in enumerate(tokens):
            # A literal's first token goes on from the field before it, its last one into the
            # field after it: only a token with '.' or an end of the template on both sides is
            # whole, and a whole empty one is in every subject rendered (QA 49-a F1), whereas
            # a field rendered empty is one row's fault, a dead letter per event.
            whole = (position > 0 or index == 0) and (position < len(tokens) - 1 or
                                                      field is None)
            if whole and not token:
                raise ValueError(f"subject template {show(template)} has an empty token (a "
                                 "leading, trailing or double '.'), which makes every subject "
                                 "it renders invalid")
    return pieces


def msg_id_problem(event_id: str) -> str | None:
    """Why a JetStream consumer cannot trust `event_id` as read from a header, or None.

    nats-py reads any bytes that are not UTF-8 as U+FFFD, so two ids that differ there arrive as
    one text, and dedup would skip the second as a duplicate (QA 54-c F-2): our JetStream
    consumer refuses an id that holds U+FFFD, and the router does not publish one (54-m F-9)."""
    if REPLACEMENT not in event_id:
        return None
    return ("it holds U+FFFD, which the NATS client puts in place of bytes that are not UTF-8, "
            "so two different ids may read the same")


def nats_header_problem(name: str, value: str) -> str | None:
    """Why `name: value` cannot travel as a NATS header, or None (one header line each)."""
    if not _HEADER_NAME.fullmatch(name):
        return f"header name {show(name)} is not printable ASCII without ':' and spaces"
    if name.lower().startswith("nats-"):
        return f"header {show(name)} is reserved for NATS (Nats-*)"
    if name in STATUS_HEADERS:
        # QA 54-c F-1: nats-py keeps a server status line under these names (case-sensitive),
        # and its pull fetch() reads a message that carries one as the server's status: never
        # delivered, a whole batch lost, or a consumer crashed.
        return (f"header {show(name)} is the name under which the NATS client (nats-py) keeps "
                "the server's status line: its consumers would take the message for a status "
                "message and never deliver it; rename the header")
    if "\r" in value or "\n" in value:
        return f"header {show(name)} has a line break in its value"
    if value != value.strip():
        # nats-py strips every header value (Unicode whitespace) when it publishes and again
        # when it reads: the value would arrive changed (QA 32-a).
        return (f"header {show(name)} has whitespace at the start or end of its value, which "
                "the NATS client strips")
    return None


class StreamSpec(ConfigModel):
    """A JetStream stream `streams apply` creates or updates."""

    name: str
    subjects: list[str] = Field(min_length=1)
    # Publishes with a Nats-Msg-Id seen within this window are acked as duplicates and not
    # stored. It must cover the longest a re-publish can come after the first publish: a router
    # killed after the acks and before its Kafka commit re-publishes when it (or another
    # instance) reads the batch again, so size it like dedup.window_ms: longer than the
    # longest outage of the router group you want to survive without a duplicate.
    # nats-server refuses less than 100 ms (err 10052), once `streams apply --yes` runs (QA 34-d).
    duplicate_window_ms: int = Field(default=DEFAULT_DUPLICATE_WINDOW_MS, ge=100)
    max_age_ms: NonNegativeInt = 0  # 0: no age limit
    max_bytes: int = Field(default=-1, ge=-1)  # -1: no limit
    max_msgs: int = Field(default=-1, ge=-1)
    storage: Literal["file", "memory"] = "file"
    replicas: PositiveInt = 1

    @model_validator(mode="after")
    def _window_within_age(self) -> StreamSpec:
        """nats-server refuses a duplicate window longer than max_age, and a max_age under 100
        ms (10052), only once `streams apply --yes` runs (review 34-3)."""
        if 0 < self.max_age_ms < 100:
            raise field_problem("max_age_ms", "must be 0 (no limit) or at least 100",
                                self.max_age_ms)
        if 0 < self.max_age_ms < self.duplicate_window_ms:
            raise field_problem("duplicate_window_ms", f"must be at most max_age_ms "
                                f"({self.max_age_ms}), which nats-server requires; set it",
                                self.duplicate_window_ms)
        return self

    @field_validator("name")
    @classmethod
    def _legal_name(cls, name: str) -> str:
        if not _STREAM_NAME.fullmatch(name):
            raise ValueError(f"stream name {show(name)} must be 1 to 64 letters, digits, "
                             "'_' or '-'")
        return name

    @field_validator("subjects")
    @classmethod
    def _legal_subjects(cls, subjects: list[str]) -> list[str]:
        for subject in subjects:
            problem = subject_problem(subject, wildcards=True)
            if problem:
                raise ValueError(problem)
        return subjects


class NatsTls(ConfigModel):
    """TLS to nats-server: the CA that signed its certificate, and ours for mutual TLS."""

    ca_file: str | None = None  # None: the system's trusted CAs
    cert_file: str | None = None
    key_file: str | None = None
    hostname: str | None = None  # the name its certificate holds, when the URL's differs

    @model_validator(mode="after")
    def _pair(self) -> NatsTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (mutual TLS needs both)")
        return self


class NatsSettings(ConfigModel):
    """How the router reaches NATS, and the streams its routes publish into."""

    url: str = Field(default="nats://127.0.0.1:14222", min_length=1)  # comma-separated servers
    # Credentials, one kind at most (nats-server's authorization): user and password, a
    # token, or a .creds file (a user JWT and its NKey seed, for operator/account setups).
    # Secrets belong in CDC_ROUTER__NATS__PASSWORD-style overrides, not in the file.
    user: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None
    credentials_file: str | None = None
    tls: NatsTls | None = None
    # A batch waits this long for all its JetStream acks, then fails (abort, rewind, backoff).
    # Far below delivery.transaction_timeout_ms, so that the Kafka transaction outlives it.
    ack_timeout_ms: PositiveInt = 10_000
    connect_timeout_ms: PositiveInt = 5_000
    # nats-server's max_payload (1 MiB by default): a bigger message would close the
    # connection, so it is a dead letter at stage route instead.
    max_payload_bytes: PositiveInt = 1024 * 1024
    streams: list[StreamSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _servers(self) -> NatsSettings:
        problem = server_problem(self.url, self.tls is not None)
        if problem is not None:
            raise field_problem("url", *problem)
        return self

    @model_validator(mode="after")
    def _streams_hold_a_message(self) -> NatsSettings:
        """QA 34-d: with `discard: old` (streams apply's), an event bigger than its stream's
        max_bytes is acked and evicted at once, with every older message: silent loss."""
        for index, stream in enumerate(self.streams):
            # JetStream stores the subject (at most a 4 KiB control line) and a few bytes of
            # its own with each message (review 34-3: max_bytes = max_payload_bytes lost one).
            least = self.max_payload_bytes + _STORED_OVERHEAD
            if 0 <= stream.max_bytes < least:
                raise field_problem(
                    f"streams[{index}].max_bytes", f"must be at least {least}, "
                    f"nats.max_payload_bytes ({self.max_payload_bytes}) and {_STORED_OVERHEAD} "
                    "for the subject: a bigger event would be acked and then evicted at once, "
                    "with every older message of the stream; or lower nats.max_payload_bytes",
                    stream.max_bytes)
        return self

    @model_validator(mode="after")
    def _streams_apart(self) -> NatsSettings:
        """QA 49-a F4: JetStream refuses a stream whose subjects overlap another's, only at
        `streams apply --yes`, in words that name neither stream."""
        for index, stream in enumerate(self.streams):
            for earlier_index, earlier in enumerate(self.streams[:index]):
                pairs = [(mine, theirs) for mine in stream.subjects for theirs in earlier.subjects
                         if subjects_collide(mine, theirs)]
                if pairs:
                    mine, theirs = pairs[0]
                    raise field_problem(
                        f"streams[{index}].subjects", f"{mine!r} of stream {stream.name} "
                        f"overlaps {theirs!r} of stream {earlier.name} (nats.streams"
                        f"[{earlier_index}]), and JetStream stores a subject in one stream "
                        "only: take it out of one of them")
        return self

    def stream_warnings(self) -> list[str]:
        """What `rules check` and the router's and the relay's start warn about the streams."""
        return [text for index in range(len(self.streams))
                for text in self.warnings_of(index).values()]

    def warnings_of(self, index: int) -> dict[str, str]:
        """nats.streams[index]'s warnings, by the JetStream setting each is about (`streams
        apply` gives them where its plan sets that setting)."""
        stream, found = self.streams[index], {}
        # QA 34-d: a 100 ms window stored 1,206 messages for 600 ids: a failed batch's
        # re-publish comes one ack timeout, then the backoff, later.
        floor = 2 * self.ack_timeout_ms + 30_000  # the router's longest backoff is 30 s
        if stream.duplicate_window_ms < floor:
            found["duplicate_window"] = (
                f"nats.streams[{index}].duplicate_window_ms {stream.duplicate_window_ms} is "
                f"under {floor} (twice nats.ack_timeout_ms, plus the router's 30 s backoff): "
                "a batch published again after a failure is stored again, at each retry; "
                "size it like dedup.window_ms (README, How close to exactly once)")
        if stream.storage == "memory":  # QA 54-d F-5: 40 acked events gone at a restart
            found["storage"] = (
                f"nats.streams[{index}].storage memory: nats-server keeps the stream in memory "
                "only, so a restart of the server loses the stream and every event stored in "
                "it, acked and committed (their outbox rows cleaned up); use storage: file")
        return found

    @model_validator(mode="after")
    def _one_kind_of_credentials(self) -> NatsSettings:
        if (self.user is None) != (self.password is None):
            raise ValueError("user and password go together")
        kinds = [name for name, value in (("user/password", self.user), ("token", self.token),
                                          ("credentials_file", self.credentials_file))
                 if value is not None]
        if len(kinds) > 1:
            raise ValueError(f"give one kind of credentials, not {' and '.join(kinds)}")
        return self


class NatsDestination(ConfigModel):
    """A route's JetStream destination."""

    subject: str

    @field_validator("subject")
    @classmethod
    def _valid_template(cls, subject: str) -> str:
        parse_subject_template(subject)
        return subject


class SubjectGuard:
    """The subjects the router may publish to: valid, and captured by a declared stream."""

    def __init__(self, streams: Sequence[StreamSpec]) -> None:
        self._filters = [(stream.name, subject) for stream in streams
                         for subject in stream.subjects]

    def stream_of(self, subject: str) -> str | None:
        return next((name for name, filter_ in self._filters
                     if subject_matches(filter_, subject)), None)

    def template_problem(self, pieces: Template) -> str | None:
        """Why no subject a template renders can be captured (its whole tokens before the first
        field already match no stream's subjects), or None when some may be."""
        fixed = ""
        for literal, field in pieces:  # a piece is a literal, then the field that follows it
            fixed += literal
            if field is not None:
                break
        fixed += "\0"  # where row data starts
        prefix = fixed.split(".")[:-1]  # whole tokens only: the last one holds row data
        for _, filter_ in self._filters:
            tokens = filter_.split(".")
            for index, token in enumerate(tokens):
                if token == ">" or index == len(prefix):
                    return None  # the rest of the subject may match
                if token not in ("*", prefix[index]):
                    break
        return ("no stream of nats.streams captures a subject that starts "
                f"{show('.'.join(prefix) + '.')}, as every subject this template renders does: "
                "declare one and run `cdc-router streams apply`")

    def problem(self, subject: str) -> str | None:
        """Why the router may not publish to `subject` (one line), or None."""
        problem = subject_problem(subject)
        if problem is not None:
            return problem
        if self.stream_of(subject) is None:
            return (f"no stream of nats.streams captures subject {show(subject)}: declare one "
                    "and run `cdc-router streams apply`")
        return None
