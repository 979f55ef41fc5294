"""Which topics the router may produce to: Kafka's naming rules, topic templates, TopicGuard.

A route's topic is a template filled from row data, so one row can name any topic. TopicGuard,
compiled once per config, refuses a name (a dead letter at run time; a ConfigError at load for
a static route topic) that:
- Kafka refuses (characters, length, `.`, `..`), or that starts with `__` (Kafka's internal
  topics, Debezium's heartbeats);
- is one of the router's own: a source topic, a name a `^regex` source subscribes to (the router
  would consume its own output), the dead-letter topic, the dedup changelog;
- matches protected_topics: by default Kafka Connect's config, offset and status storage and
  the schema registry's `_schemas`;
- matches no allowed_topics pattern, when that list is set.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Mapping, Sequence

from cdc_router.config.patterns import GLOB_CHARS, REGEX_PREFIX, compile_pattern
from cdc_router.errors import show

MAX_TOPIC_LENGTH = 249
TOPIC_TEMPLATE_FIELDS = ("aggregate_type", "aggregate_id", "type", "id")
# Kafka Connect's default config.storage.topic, offset.storage.topic and status.storage.topic,
# and the schema registry's kafkastore.topic.
DEFAULT_PROTECTED_TOPICS = ("connect-configs", "connect-offsets", "connect-status", "_schemas")
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")

Template = tuple[tuple[str, str | None], ...]  # (literal, field or None) pieces


def topic_name_problem(name: str, *, internal_ok: bool = False) -> str | None:
    """Why Kafka would refuse `name` as a topic, or None when it is fine.

    Kafka's rules (legal characters, length, `.`/`..`), plus: never an internal topic (any
    name starting with `__`), unless internal_ok.
    """
    if not name:
        return "a topic name cannot be empty"
    if len(name) > MAX_TOPIC_LENGTH:
        return f"a topic name has at most {MAX_TOPIC_LENGTH} characters, this one has {len(name)}"
    if name in (".", ".."):
        return f"{name!r} is not a legal topic name"
    if not _LEGAL_TOPIC.fullmatch(name):
        bad = "".join(sorted({ch for ch in name if not _LEGAL_TOPIC.fullmatch(ch)}))
        return (f"illegal characters {show(bad)} in topic {show(name)}; Kafka allows only "
                "ASCII letters, digits, '.', '_' and '-'")
    if name.startswith("__") and not internal_ok:
        return f"{show(name)} starts with '__', which marks Kafka's internal topics"
    return None


def _topic_literal_problem(literal: str) -> str | None:
    problem = topic_name_problem(literal)
    if problem and not literal.startswith("__") and literal not in (".", ".."):
        return problem
    return None


def parse_topic_template(template: str) -> Template:
    """Split a topic template into (literal, field-or-None) pieces; ValueError when invalid,
    including a template no row could fill into a name Kafka takes."""
    pieces = parse_template(template, _topic_literal_problem)
    if any(field for _, field in pieces):  # a static topic is checked whole by the caller
        problem = _template_problem(pieces)
        if problem:
            raise ValueError(problem)
    return pieces


def static_topic(template: str) -> bool:
    """The template names one fixed topic (no field that row data fills); ValueError when
    invalid, as parse_topic_template."""
    return render_topic(parse_topic_template(template), {}) is not None


def _template_problem(pieces: Template) -> str | None:
    """Why every name the template renders breaks one of Kafka's rules (QA 36-b F5: `__{type}`
    passed `rules check`, then dead-lettered every event it matched), or None."""
    if pieces[0][0].startswith("__"):
        return ("every topic it renders starts with '__', which marks Kafka's internal "
                "topics; give the template another fixed start")
    # A field renders at least one character: the identifier columns are never empty.
    shortest = sum(len(literal) + (field is not None) for literal, field in pieces)
    if shortest > MAX_TOPIC_LENGTH:
        return (f"every topic it renders has over {MAX_TOPIC_LENGTH} characters (its fixed "
                "text and at least one per field: "
                f"{shortest}); a topic name has at most {MAX_TOPIC_LENGTH}")
    return None


def parse_template(template: str, literal_problem: Callable[[str], str | None]) -> Template:
    """Split a destination template (a topic, a NATS subject) into (literal, field-or-None)
    pieces; ValueError when a literal has a `literal_problem` or a field is unknown.

    Fields are plain `{name}`s from TOPIC_TEMPLATE_FIELDS: no conversions, format specs, indexes
    or attributes (those would let a template reach into Python objects).
    """
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as error:
        raise ValueError(f"unbalanced braces in template {template!r}: {error}") from None
    pieces: list[tuple[str, str | None]] = []
    for literal, field, spec, conversion in parsed:
        if literal:
            problem = literal_problem(literal)
            if problem:
                raise ValueError(problem)
        if field is None:
            pieces.append((literal, None))
            continue
        if field not in TOPIC_TEMPLATE_FIELDS or spec or conversion:
            allowed = ", ".join("{" + name + "}" for name in TOPIC_TEMPLATE_FIELDS)
            shown = "{" + field + ("!" + conversion if conversion else "")
            shown += (":" + spec if spec else "") + "}"
            raise ValueError(f"unknown template field {shown}; the fields are {allowed}")
        pieces.append((literal, field))
    return tuple(pieces)


def render_topic(pieces: Template, fields: Mapping[str, str]) -> str | None:
    """The topic `pieces` name with `fields` filled in; None when they use a field not given.

    The one rendering of a template: with no fields it gives the topic of a static route (None
    when row data fills it); with an event's fields, that event's destination; with the type
    alone, what the Avro subject planning can know before any event.
    """
    out = []
    for literal, field in pieces:
        out.append(literal)
        if field is not None:
            if field not in fields:
                return None
            out.append(fields[field])
    return "".join(out)


def source_regex(pattern: str) -> re.Pattern[str]:
    """A `^regex` source topic as librdkafka reads it (searched, anchored only by its `^`).

    Python's syntax stands in for librdkafka's, POSIX extended (glibc's regcomp): the two read
    a pattern alike once _posix_problem has found nothing. Raises ValueError when it does not
    compile or reads otherwise.
    """
    problem = _posix_problem(pattern)
    if problem:
        raise ValueError(f"source topic {pattern!r}: {problem}")
    try:
        return re.compile(pattern)
    except (re.error, OverflowError) as error:  # OverflowError: a{99999999999} (QA 33-b)
        raise ValueError(f"invalid regular expression in source topic {pattern!r}: "
                         f"{error}") from None


# Escapes POSIX extended regexes (glibc) and Python read alike: a backreference, and glibc's
# word and space classes. Any other letter escaped means something else to one of them.
_SHARED_ESCAPES = frozenset("123456789wWsSbB")


def _posix_problem(pattern: str) -> str | None:
    """What librdkafka's engine reads otherwise than Python's (review 31-2: `\\d` is a plain
    `d` to it, so `^outbox\\.tenant\\d+` subscribed to nothing, unsaid)."""
    if "[:" in pattern:
        return ("a POSIX class such as [[:digit:]] is read otherwise by the router's own "
                "checks; write the class out, e.g. [0-9]")
    escaped = iter(range(len(pattern)))
    for index in escaped:
        if pattern[index] != "\\" or index + 1 == len(pattern):
            continue
        letter = pattern[index + 1]
        next(escaped, None)
        if letter.isalnum() and letter not in _SHARED_ESCAPES:
            written = {"d": "[0-9]", "D": "[^0-9]"}.get(letter, "a bracket expression")
            return (f"librdkafka's regex engine (POSIX extended) reads \\{letter} as a plain "
                    f"'{letter}'; write {written}")
    return None


def librdkafka_takes_pattern(pattern: str) -> None:
    """ValueError unless librdkafka's own regex engine takes `pattern` (review 31: Python's
    took lookaheads and named groups, which librdkafka refuses at subscribe(), and the router
    stopped there blaming kafka.config). Asks a consumer that never connects: subscribe()
    compiles the pattern at once."""
    from confluent_kafka import Consumer, KafkaException

    consumer = Consumer({"group.id": "cdc-router-pattern-check", "log_level": 0,
                         "bootstrap.servers": "127.0.0.1:9"})
    try:
        consumer.subscribe([pattern])
    except KafkaException:
        raise ValueError(f"librdkafka cannot read the regular expression of source topic "
                         f"{pattern!r}: its engine (POSIX extended) has no lookarounds, named "
                         "groups or other (?...) forms; use plain groups, bracket expressions "
                         "and alternatives") from None
    finally:
        consumer.close()


class TopicGuard:
    """The names the router may produce to, compiled once; problem() is pure and cheap."""

    def __init__(self, *, sources: Sequence[str], own: Mapping[str, str],
                 protected: Sequence[str] = DEFAULT_PROTECTED_TOPICS,
                 allowed: Sequence[str] | None = None) -> None:
        """`own` maps the router's output topics to what they are, for the reason."""
        self._own = dict(own)
        self._source_names = frozenset(name for name in sources if not name.startswith("^"))
        self._source_patterns = [(pattern, source_regex(pattern)) for pattern in sources
                                 if pattern.startswith("^")]
        self._protected = _compiled(protected)
        self._allowed = None if allowed is None else _compiled(allowed)
        self._allowed_text = ", ".join(map(repr, allowed or ()))

    def template_problem(self, pieces: Template) -> str | None:
        """Why no name a template renders can match allowed_topics (its fixed start agrees
        with no pattern's literal start: neither begins the other), or None when some may."""
        if self._allowed is None:
            return None
        fixed = pieces[0][0]  # the literal before the first field: every name starts so
        if any(_may_match(fixed, pattern) for pattern, _ in self._allowed):
            return None
        return (f"every topic it renders starts with {show(fixed)}, which matches none of "
                f"allowed_topics ({self._allowed_text}); add a pattern for it there, or change "
                "the route's topic")

    def problem(self, name: str) -> str | None:
        """Why the router may not produce to `name` (one line naming the rule), or None."""
        problem = topic_name_problem(name)
        if problem is not None:
            return problem
        role = self._own.get(name)
        if role is not None:
            return f"{show(name)} is one of the router's own topics (its {role})"
        source = self.source_of(name)
        if source is not None:
            how = "is" if source == name else f"matches source pattern {source!r}, that is"
            return (f"{show(name)} {how} one of the router's own topics (source.topics): it "
                    "would consume its own output")
        for pattern, matches in self._protected:
            if matches(name):
                return (f"{show(name)} is protected by protected_topics entry {pattern!r} "
                        "(by default Kafka Connect's storage topics and _schemas)")
        if self._allowed is not None and not any(matches(name) for _, matches in self._allowed):
            return (f"{show(name)} matches none of allowed_topics ({self._allowed_text}); add "
                    "a pattern for it there, or change the route's topic")
        return None

    @property
    def source_names(self) -> frozenset[str]:
        """The source topics given by name (not by `^regex`)."""
        return self._source_names

    def source_of(self, name: str) -> str | None:
        """The source.topics entry (a name, or a `^regex` pattern) that consumes `name`."""
        if name in self._source_names:
            return name
        for pattern, regex in self._source_patterns:
            if regex.search(name):
                return pattern
        return None

    def protected_by(self, name: str) -> str | None:
        """The protected_topics entry that protects `name`, or None."""
        return next((pattern for pattern, matches in self._protected if matches(name)), None)


def _compiled(patterns: Sequence[str]) -> list[tuple[str, Callable[[str], bool]]]:
    return [(pattern, compile_pattern(pattern)) for pattern in patterns]


def _may_match(fixed: str, pattern: str) -> bool:
    """Whether a name of `fixed`, then row data, may match a config pattern (patterns.py):
    False only when it cannot, as the text every match of the pattern begins with (a glob's
    before its first wildcard, a `re:` regex's literal start) and `fixed` disagree."""
    if pattern.startswith(REGEX_PREFIX):
        start = _literal_start("^" + pattern[len(REGEX_PREFIX):])
    elif GLOB_CHARS.intersection(pattern):
        start = pattern[:min(pattern.index(char) for char in GLOB_CHARS if char in pattern)]
    else:  # an exact name: the row data, at least one character, must still fit in it
        return pattern.startswith(fixed) and len(pattern) > len(fixed)
    return fixed.startswith(start) or start.startswith(fixed)


def template_warnings(templates: Sequence[str], sources: Sequence[str],
                      allowed_topics: Sequence[str] | None) -> list[str]:
    """What `rules check` warns about the templated routes: names row data can reach.

    `templates` are the routes' topics in order; `sources` and `allowed_topics` the config's.

    - A template that can render a source topic, or a name a `^regex` source subscribes to. The
      router dead-letters such an event rather than consume its own output, but the config is
      likely wrong. For a regex the test is conservative: the template's fixed start and the
      pattern's literal start agree (one begins the other), or a sample rendering matches.
    - A template that starts with a field, without allowed_topics: a row can name any topic.
    """
    warnings = []
    allowed = None if allowed_topics is None else _compiled(allowed_topics)
    for index, template in enumerate(templates):
        pieces = parse_topic_template(template)
        if render_topic(pieces, {}) is not None:
            continue  # a static topic a source reads is refused at load
        where = f"routes[{index}] topic {template!r}"
        for source in sources:
            if allowed is not None and not source.startswith("^") and not any(
                    matches(source) for _, matches in allowed):
                continue
            reach = _reaches(pieces, source)
            if reach is not None:
                warnings.append(f"{where} {reach}: such events are dead-lettered, as the router "
                                "never consumes its own output; give the template a fixed start "
                                "that source cannot match")
        if pieces[0][0] == "" and allowed is None:
            warnings.append(f"{where} starts with row data, so a row can name any topic (only "
                            "Kafka's, protected and the router's own are refused), another "
                            "pipeline's raw topic too, where a payload shaped as a change event "
                            "is that pipeline's event (QA 60-c F-1); consider allowed_topics")
    return warnings


def _reaches(pieces: Template, source: str) -> str | None:
    """How the template can render a name `source` consumes, or None when it cannot."""
    if not source.startswith("^"):
        shape = re.compile("".join(re.escape(literal) + ("([a-zA-Z0-9._-]+)" if field else "")
                                   for literal, field in pieces))
        found = shape.fullmatch(source)
        if found is None:
            return None
        fields = [field for _, field in pieces if field]
        when = ", ".join(f"{field} {value!r}" for field, value in zip(fields, found.groups(),
                                                                       strict=True))
        return f"renders source topic {source!r} (with {when})"
    regex = source_regex(source)
    fixed, pattern_start = pieces[0][0], _literal_start(source)
    if not (fixed.startswith(pattern_start) or pattern_start.startswith(fixed)):
        return None
    # A sample: the pattern's literal start where the template leaves it open, then 'x'.
    first = {pieces[0][1] or "": pattern_start[len(fixed):] + "x"}
    sample = render_topic(pieces, dict.fromkeys(TOPIC_TEMPLATE_FIELDS, "x") | first) or ""
    if regex.search(sample):
        return f"renders names source pattern {source!r} subscribes to (e.g. {sample!r})"
    return (f"may render names source pattern {source!r} subscribes to (its fixed start "
            f"{fixed!r} and the pattern's {pattern_start!r} agree)")


def _literal_start(pattern: str) -> str:
    """The text every match of a `^regex` begins with: '^orders\\.v1.*' gives 'orders.v1'."""
    if _top_level_alternation(pattern):
        return ""
    out: list[str] = []
    i = 1  # after the '^'
    while i < len(pattern):
        char, step = pattern[i], 1
        if char == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            char, step = pattern[i + 1], 2  # an escaped symbol: '\\.' is a dot
        elif not (char.isalnum() or char in "-_"):
            break  # '.', a class, a group, an anchor, a quantifier: no longer literal
        if pattern[i + step:i + step + 1] in ("?", "*", "{"):
            break  # that character may be absent
        out.append(char)
        i += step
    return "".join(out)


def _top_level_alternation(pattern: str) -> bool:
    depth, i = 0, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        depth += (char == "(") - (char == ")")
        if char == "|" and depth == 0:
            return True
        i += 1
    return False
