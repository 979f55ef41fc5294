"""The `routes` section: which events go where, keyed and framed how."""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator

# Moved from settings.py with their bodies unchanged, hence the short local names.
from cdc_router.config.fields import ConfigModel as _Model
from cdc_router.config.fields import Patterns, TextMap
from cdc_router.config.fields import field_problem as _fail
from cdc_router.config.headers import RESERVED_HEADERS, header_name_problem, is_reserved_header
from cdc_router.config.nats import NatsDestination, nats_header_problem
from cdc_router.config.patterns import GLOB_CHARS, REGEX_PREFIX, compile_pattern
from cdc_router.config.topic_names import (
    TOPIC_TEMPLATE_FIELDS,
    static_topic,
    topic_name_problem,
)
from cdc_router.config.yaml_text import yaml_kind

# RFC 3986's characters: unreserved, reserved and '%' (of a percent-encoding).
_URI_CHAR = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")


def _uri_reference_problem(text: str) -> str | None:
    """Why `text` is no URI-reference (RFC 3986), what CloudEvents' `source` must be; or None."""
    if not text:
        return "is empty"
    for position, char in enumerate(text):
        # Beyond ASCII, as java.net.URI (the CloudEvents Java SDK's) takes it: an IRI's.
        if not (_URI_CHAR.fullmatch(char) or (ord(char) > 127 and char.isprintable()
                and not char.isspace())):
            return (f"holds {char!r} (character {position + 1}), which a URI cannot (write it "
                    "percent-encoded; the value is sent as written, never a template)")
    if re.search(r"%(?![0-9A-Fa-f]{2})", text):
        return "holds a '%' without two hex digits after it (a percent-encoding)"
    scheme, colon, _ = re.split(r"([/?#])", text, maxsplit=1)[0].partition(":")
    if colon and not _SCHEME.fullmatch(scheme):
        return f"starts with {scheme + colon!r}, which is no URI scheme"
    try:
        urlsplit(text)
    except ValueError as error:  # an unclosed '[' of an IPv6 host
        return f"does not parse as a URI: {error}"
    return None


class RouteMatch(_Model):
    """Conditions an event must meet, all of them; each pattern is exact, glob or `re:` regex."""

    aggregate_type: Patterns | None = None
    type: Patterns | None = None
    header: dict[str, Patterns] | None = None  # the row's own headers (headers column)

    @field_validator("aggregate_type", "type")
    @classmethod
    def _compile(cls, value: Patterns | None) -> Patterns | None:
        if value == []:  # a list rendered from an empty template value, say
            raise ValueError("an empty list of patterns matches no event; give at least one "
                             "pattern, or leave the key out")
        for pattern in [value] if isinstance(value, str) else value or []:
            if isinstance(pattern, str) and not pattern.strip():
                # Review 48-e F16: the route never matched, its events took the next route.
                raise ValueError("a pattern cannot be empty or blank: give one (an unset "
                                 "variable?), or write 're:^$' to match an empty value")
            compile_pattern(pattern)
        return value

    @field_validator("header")
    @classmethod
    def _compile_headers(cls, value: dict[str, Patterns] | None) -> dict[str, Patterns] | None:
        for name, patterns in (value or {}).items():
            if not name.strip():
                raise ValueError(f"header name {name!r} is empty or blank: name the header of the "
                                 "row's headers column to match")
            cls._compile(patterns)
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> RouteMatch:
        if self.aggregate_type is None and self.type is None and not self.header:
            raise ValueError("a match needs aggregate_type, type or header; "
                             "leave out 'match' for a default route")
        return self

    def covers(self, later: RouteMatch) -> bool:
        """True when every event `later` matches is matched here too, as far as can be told
        from the patterns (a later route this covers can never match): each condition here
        is one `later` has, with each of its patterns one of these, an exact value one of
        these matches, or any value under `*`. False when that cannot be told."""
        pairs = [(self.aggregate_type, later.aggregate_type), (self.type, later.type),
                 *((mine, (later.header or {}).get(name))
                   for name, mine in (self.header or {}).items())]
        return all(mine is None or (theirs is not None and _covered(mine, theirs))
                   for mine, theirs in pairs)


def _covered(mine: Patterns, theirs: Patterns) -> bool:
    """Whether the values `theirs` matches are all matched by `mine` (False: not known)."""
    patterns = [mine] if isinstance(mine, str) else mine
    if "*" in patterns:  # every value (a glob tried on another glob's text proves nothing:
        return True      # `Order?` matches the text `Order*`)
    return all(pattern in patterns or (_exact(pattern) and any(
        _compiled(own)(pattern) for own in patterns))
        for pattern in ([theirs] if isinstance(theirs, str) else theirs))


# Each pair of routes is compared: compiling a pattern per pair made the start of a router of
# 1,000 routes take 25 s, not 2.5 (review 62); compiled once each, and only for an exact value.
_compiled = functools.lru_cache(maxsize=4096)(compile_pattern)


def _exact(pattern: str) -> bool:
    return not pattern.startswith(REGEX_PREFIX) and not GLOB_CHARS.intersection(pattern)


class RouteRule(_Model):
    """One route: which events (match), where to (a Kafka topic template, or a JetStream
    subject template under `nats:`; exactly one) and how (key, partition...)."""

    match: RouteMatch | None = None  # None: the default route, takes every event
    topic: str | None = None
    nats: NatsDestination | None = None
    # "id" (the event id), "aggregate_id", or the name of any column of the outbox table; a
    # column renamed under a backlog: its names, old and new, the first with a value in a row
    # (QA 63-a F-7)
    key: Literal["id", "aggregate_id"] | str | list[str] = Field(default="id", min_length=1)
    partition: Literal["aggregate_id", "key", "kafka_default"] = "aggregate_id"
    format: Literal["json", "avro"] = "json"
    # With format avro: one .avsc file, or a mapping of event type -> .avsc ("*": any other
    # type). A relative path is relative to the folder of the config file.
    schema_path: str | dict[str, str] | None = Field(None, alias="schema")
    # Avro: payload keys the schema has no field for. 'reject' dead-letters the event (the
    # schema is the contract; dropping data silently is worse); 'ignore' leaves them out.
    extra_fields: Literal["reject", "ignore"] = "reject"
    cloudevents: bool = False  # add the CloudEvents Kafka binding (binary mode) headers
    ce_source: str | None = None  # CloudEvents 'source', a URI-reference; needed with cloudevents
    headers: TextMap = Field(default_factory=dict)  # static extra headers

    @field_validator("topic")
    @classmethod
    def _valid_template(cls, topic: str | None) -> str | None:
        if topic is not None and static_topic(topic):
            problem = topic_name_problem(topic)
            if problem:
                raise ValueError(problem)
        return topic

    @field_validator("key", "ce_source", mode="before")
    @classmethod
    def _text(cls, value: object, info: ValidationInfo) -> object:
        if value is None and info.field_name == "ce_source":
            return value
        what = ("the outbox column whose value keys the record (id, the default; aggregate_id, "
                "type, aggregate_type or another column)" if info.field_name == "key" else
                "the producer as a URI-reference (e.g. /orders-service)")
        if info.field_name == "key" and isinstance(value, list):
            return _key_names(value, what)
        if not isinstance(value, str):
            raise ValueError(f"YAML reads it as {yaml_kind(value)}, not text: name {what}, "
                             "quoted if YAML would read it otherwise")
        if info.field_name == "key" and not value.strip():
            raise ValueError(f"is empty: name {what}, or leave key out")
        return value

    @field_validator("schema_path")
    @classmethod
    def _schema_files(cls, value: str | dict[str, str] | None,
                      info: ValidationInfo) -> str | dict[str, str] | None:
        folder = (info.context or {}).get("config_dir")

        def resolved(path: str) -> str:
            if not path.strip():
                raise ValueError("a schema file path cannot be empty")
            return str(Path(folder, path)) if folder is not None else path

        if isinstance(value, dict):
            if any(not event_type for event_type in value):
                raise ValueError("an event type in a schema mapping cannot be empty")
            return {event_type: resolved(path) for event_type, path in value.items()}
        return None if value is None else resolved(value)

    @model_validator(mode="after")
    def _consistent(self) -> RouteRule:
        if (self.topic is None) == (self.nats is None):
            raise _fail("topic", "a route needs exactly one destination: `topic:` (Kafka) or "
                        "`nats: {subject: ...}` (JetStream)", self.topic)
        if any("{" in name or "}" in name for name in self.key_names):
            raise _fail("key", "names the column whose value keys the record (id, aggregate_id, "
                        "type, aggregate_type or another outbox column), never a template; a "
                        "composite key needs a column of its own", self.key)
        given = {"key", "partition"} & self.model_fields_set
        if self.nats is not None and given:
            raise _fail(sorted(given)[0], "a JetStream route has no key or partition: the "
                        "event id travels as Nats-Msg-Id, and a stream has no partitions")
        if self.format == "avro" and not self.schema_path:
            raise _fail("schema", "format avro needs a schema file (or a mapping of event "
                        "type to schema file)")
        if self.schema_path and self.format != "avro":
            raise _fail("schema", "a schema only applies with format: avro", self.schema_path)
        if self.cloudevents and self.ce_source is None:
            raise _fail("ce_source", "cloudevents: true needs ce_source, a URI-reference that "
                        "names the producer (e.g. /orders-service)")
        if self.ce_source and not self.cloudevents:
            raise _fail("ce_source", "ce_source only applies with cloudevents: true",
                        self.ce_source)
        if self.nats and self.ce_source:  # a header of every event (review 32-2)
            problem = nats_header_problem("ce_source", self.ce_source)
            if problem:
                raise _fail("ce_source", problem, self.ce_source)
        problem = _uri_reference_problem(self.ce_source) if self.cloudevents and \
            self.ce_source is not None else None
        if problem:
            raise _fail("ce_source", f"is no URI-reference (RFC 3986), which CloudEvents' "
                        f"source must be: it {problem}; e.g. /orders-service or "
                        "https://example.com/orders", self.ce_source)
        for name in self.headers:
            if not name.strip():  # Kafka carries it, but no consumer asks for it by name
                raise _fail("headers", f"header name {name!r} is empty or blank: name the "
                            "header, or leave it out", name)
            if is_reserved_header(name, cloudevents=self.cloudevents):
                raise _fail("headers", f"header {name!r} is reserved for the router: "
                            f"{RESERVED_HEADERS}", name)
            problem = header_name_problem(name)
            if problem:
                raise _fail("headers", f"header name {name!r} {problem}", name)
            problem = nats_header_problem(name, self.headers[name]) if self.nats else None
            if problem:
                raise _fail("headers", problem, name)
        return self

    @property
    def key_names(self) -> tuple[str, ...]:
        """The key's column, or its names over a rename (the first with a value in a row)."""
        return (self.key,) if isinstance(self.key, str) else tuple(self.key)

    @property
    def destination(self) -> str:
        """The destination template: the topic, or the JetStream subject."""
        return self.nats.subject if self.nats is not None else self.topic or ""

    @property
    def is_default(self) -> bool:
        """True for a route without conditions: it takes every event that reaches it."""
        return self.match is None


def shadowed_routes(routes: Sequence[RouteRule]) -> list[str]:
    """A line for each route an earlier one leaves nothing to match (the first match wins)."""
    found = []
    for index, route in enumerate(routes):
        match = route.match
        if match is None:
            continue
        earlier = next((i for i, other in enumerate(routes[:index])
                        if other.match is not None and other.match.covers(match)), None)
        if earlier is None:
            continue
        covered = routes[earlier].match
        found.append(f"routes[{index}] can never match: routes[{earlier}] has the same match "
                     "and comes first (the first match wins)"
                     # each covers the other: the same, a list in another order say
                     if covered is not None and match.covers(covered) else
                     # QA 62-a: a specific route after a general one was said to be valid.
                     f"routes[{index}] can never match: routes[{earlier}] comes first and "
                     "matches every event it does (the first match wins); put the more "
                     "specific route first")
    return found


def literal_header_fields(routes: Sequence[RouteRule]) -> list[str]:
    """A line for each static header whose value holds a template field (`{aggregate_type}`):
    it is sent as written, the same text on every record (QA 62-a: `rules check` said valid)."""
    found = []
    for index, route in enumerate(routes):
        for name, value in route.headers.items():
            fields = [f"{{{field}}}" for field in TOPIC_TEMPLATE_FIELDS if f"{{{field}}}" in value]
            if fields:
                verb = "is" if len(fields) == 1 else "are"
                found.append(f"routes[{index}].headers.{name} {value!r} is sent as written, the "
                             f"same on every record: static headers are no template "
                             f"({', '.join(fields)} {verb} not filled in); a value that varies "
                             "per event belongs in the row's headers column")
    return found


# What a route's key names besides a column of the row (the aliases of the two it keys by most).
KEY_ALIASES = ("id", "aggregate_id", "type", "aggregate_type")
# How close a key must be to a known name to be called its typo (difflib's ratio). Above 0.8,
# which every 3-letter name ending in 'id' has to 'id' (uid, pid, sid) and a column that swaps
# a last word does (created_by ~ created_at, aggregate_key ~ aggregate_type): real columns,
# said to be typos (review rv62b). A typo of a longer name (agregate_id: 0.96) stays above.
_NEAR_MISS = 0.85


def misspelt_keys(routes: Sequence[RouteRule], columns: Collection[str]) -> list[str]:
    """A line for each route keyed by a name close to, but not, an alias or a column the outbox
    config names: most likely a typo, which dead-letters every event of the route (QA 62-a L2:
    `key: agregate_id` passed `rules check`). A name close to none may be a column of the
    user's own, which only the rows can tell."""
    known = {name.lower(): name for name in (*KEY_ALIASES, *columns)}  # ID for id too
    found = []
    for index, route in enumerate(routes):
        for key in route.key_names:
            close = difflib.get_close_matches(key.lower(), sorted(known), n=1,
                                              cutoff=_NEAR_MISS)
            if key not in known.values() and close:
                found.append(f"routes[{index}].key {key!r} is no column the outbox config "
                             f"names: did you mean {known[close[0]]!r}? If the rows have no "
                             f"column {key!r}, every event of the route is dead-lettered")
    return found


def _key_names(names: list[object], what: str) -> str | list[str]:
    """A key given as a list: a column's names over a rename, each a name, once."""
    if not names:
        raise ValueError(f"an empty list names no column: name {what}, or list one column's "
                         "names over a rename (old and new, e.g. [tenant, tenant_id])")
    for name in names:
        if not isinstance(name, str) or not name.strip():
            shown = repr(name) if isinstance(name, str) else yaml_kind(name)  # not Python's None
            raise ValueError(f"lists {shown}, which is no column name: each item names "
                             "the column (quoted if YAML would read it otherwise)")
    twice = sorted({str(name) for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"lists {', '.join(map(repr, twice))} twice: each name once")
    return str(names[0]) if len(names) == 1 else [str(name) for name in names]
