"""Dead letters read back for `cdc-router dlq replay`: which to replay, which ids are already
delivered, and what the routing step makes of each. Values in, values out; the clients are in
router/dlq_replay.py.

A router dead letter holds the raw change record unchanged (key, value, its own headers) plus
the dlq.* headers, so the replay hands that key and value to the same RecordStep the router
uses, with the same replay filter in front of it.

Which ids are delivered, and how many letters are not: router/dlq_delivered.py.

A letter the replay dead-letters again gets no mark: the router's mark of the first letter
already drops Debezium's replays of that id (a decode letter's replays decode no better).
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from cdc_router.config.topic_names import source_regex
from cdc_router.dead_letter import (
    ATTEMPTS,
    ERROR_MESSAGE,
    EVENT_ID,
    REPLAY_OF,
    SOURCE_GROUP,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    STAGE,
    VALUE_DROPPED,
    DeadLetter,
    dead_letter,
    reason_of,
    without_dead_letter_headers,
)
from cdc_router.router.dlq_raw import gone_note
from cdc_router.router.replay import (
    ReplayFilter,
)
from cdc_router.router.step import DeadLettered, Duplicate, Routed, StepResult

if TYPE_CHECKING:
    from cdc_router.config.model import RouterConfig

ROUTER_STAGES = frozenset({"decode", "route", "serialize", "produce"})
_REPLAY_OF = re.compile(r"(.+)\[(\d+)\]@(\d+)")  # dlq.replay.of: topic[partition]@offset
# The numbers of a reason that move with the clock (router/timestamps.py): "7083.4 s ahead of",
# "8.01 days old" or "90 s old" (unit and all), a route's index, which a route added above it
# moves (QA 45-a F2); no other (review 43-2: "orders.1" and "orders.2" are two reasons).
_VARYING = re.compile(r"\b\d+(?:\.\d+)?(?:(?= s (?:ahead|behind)\b)| (?:s|min|h|days)(?= old\b))|"
                      r"(?<=\broutes\[)\d+(?=\])")

Action = Literal["deliver", "dead_letter", "already_delivered", "repeated", "skip",
                 "not_replayable", "still_failing", "superseded", "expired"]


@dataclass(frozen=True)
class Letter:
    """One record of the dead-letter topic, its dlq.* headers read."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]  # the raw record's own, without dlq.*
    source_topic: str
    source_group: str | None  # dlq.source.group; None in letters of earlier versions
    source_partition: int
    source_offset: int
    stage: str
    event_id: str | None
    reason: str
    value_dropped: bool
    replay_of: str | None
    from_router: bool  # False: the idempotent consumer's, or not a dead letter at all


def read_letter(partition: int, offset: int, timestamp_ms: int, key: bytes | None,
                value: bytes | None, headers: list[tuple[str, bytes]]) -> Letter:
    """A consumed dead-letter record as a Letter (a record without dlq.* headers is one too,
    with from_router False)."""
    named = {name: raw.decode(errors="replace") for name, raw in headers}
    stage = named.get(STAGE, "")
    return Letter(
        partition=partition, offset=offset, timestamp_ms=timestamp_ms, key=key, value=value,
        headers=tuple(without_dead_letter_headers(headers)),
        source_topic=named.get(SOURCE_TOPIC, ""),
        source_group=named.get(SOURCE_GROUP),
        source_partition=_int(named.get(SOURCE_PARTITION)),
        source_offset=_int(named.get(SOURCE_OFFSET)),
        stage=stage, event_id=named.get(EVENT_ID) or None,
        reason=named.get(ERROR_MESSAGE, ""),
        value_dropped=VALUE_DROPPED in named,
        replay_of=named.get(REPLAY_OF),
        from_router=written_by_router(named))


def written_by_router(named: Mapping[str, str]) -> bool:
    """Whether a record's headers (by name) are a router's or relay's dead letter's: a router
    stage, a source topic, and no dlq.attempts, which the idempotent consumer's letters carry
    (its stages: decode, handle)."""
    return named.get(STAGE, "") in ROUTER_STAGES and bool(named.get(SOURCE_TOPIC)) and \
        ATTEMPTS not in named


def _int(text: str | None) -> int:
    try:
        return int(text or "")
    except ValueError:
        return -1


@dataclass(frozen=True)
class Selection:
    """Which letters to replay: every filter given must hold; none given selects all."""

    stages: frozenset[str] = frozenset()
    ids: frozenset[str] = frozenset()
    since_ms: int | None = None
    include_expired: bool = False  # letters older than the dedup window too (plan_replay)

    @functools.cached_property
    def _id_keys(self) -> frozenset[str]:
        """The ids as _id_key reads them, once a selection, not once a letter."""
        return frozenset(_id_key(event_id) for event_id in self.ids)

    def selects(self, letter: Letter) -> bool:
        return ((not self.stages or letter.stage in self.stages)
                and (not self.ids or (letter.event_id is not None and _id_key(
                    letter.event_id) in self._id_keys))
                and (self.since_ms is None or letter.timestamp_ms >= self.since_ms))


def _id_key(event_id: str) -> str:
    """A UUID as its canonical text (a --id in upper case or braces is the same event id:
    review 53-c F13), any other id as it is."""
    try:
        return str(uuid.UUID(event_id))
    except ValueError:
        return event_id


@dataclass(frozen=True)
class Planned:
    """What the replay does with one selected letter."""

    letter: Letter
    action: Action
    result: StepResult | None = None
    note: str = ""


Step = Callable[[str, bytes | None, bytes | None], StepResult]
# ours(dlq.source.topic, dlq.source.group): whether a dead letter is this pipeline's.
OursTest = Callable[[str, str | None], bool]


def sources_of(config: RouterConfig) -> OursTest:
    """Whether a dead letter is this config's pipeline's: its dlq.source.topic is one of
    source.topics (a `^regex` one by its pattern) or the relay's table, and its
    dlq.source.group (absent in letters of earlier versions) is this source.group_id. Both:
    two pipelines may read one raw topic and share a dead-letter topic, and a router and a
    relay of one outbox share a group but not their configs' sources."""
    names = {topic for topic in config.source.topics if not topic.startswith("^")}
    patterns = [source_regex(topic) for topic in config.source.topics if topic.startswith("^")]
    if config.relay is not None:
        names.add(config.relay.qualified_table)
    group = config.source.group_id

    def ours(topic: str, letter_group: str | None) -> bool:
        if letter_group is not None and letter_group != group:
            return False
        return topic in names or any(pattern.search(topic) for pattern in patterns)
    return ours


def of_this_pipeline(letter: Letter, ours: OursTest) -> bool:
    """Whether `letter` is the pipeline's that `ours` accepts, as `dlq list` tells it
    (dead_letter.of_pipeline): one that names no source topic cannot be told apart, and is."""
    return not letter.source_topic or ours(letter.source_topic, letter.source_group)


def plan_replay(letters: Sequence[Letter], step: Step, seen: ReplayFilter,
                delivered: Iterable[str], ours: OursTest,
                superseded: Mapping[tuple[int, int], str] | None = None,
                expired_before_ms: int | None = None,
                relay_table: str | None = None) -> list[Planned]:
    """Each letter through `step` (whose replay check is `seen`), in the order given.

    An id planned `deliver` in this replay is pending in `seen`, so a later letter of it is
    `repeated`, not delivered twice; a letter that fails (or has no value) shadows none: the
    later letter of its id is tried, and when it delivers, the id's failing letters are
    `superseded` by it (review 53-c F16: a fixed letter behind one that still failed was
    `repeated` and never delivered). `ours(source topic, source group)` tells this pipeline's
    letters from those of another that shares the dead-letter topic (its default name is the
    same for all): those are not replayed with this pipeline's routes. A letter an earlier
    replay dead-lettered again (`superseded`, see superseded_letters) is left to its newer
    letter, and one that fails again as it failed before (stage and reason) is
    `still_failing`, not dead-lettered once more: QA 36-c F8, every replay added one letter
    per event it could not fix.

    A letter written before `expired_before_ms` (now less dedup.window_ms) and not known as
    delivered is `expired`: the changelog keeps its marks for the window only, so an earlier
    replay of it may have left no mark (review 48-d F6: a dead-letter topic kept longer than
    the window, a replay run again after it, delivered its letters twice).
    """
    before = set(delivered)
    planned = []
    dropped: set[tuple[int, int]] = set()  # ours, not_replayable for a value left out
    for letter in letters:
        newer = (superseded or {}).get((letter.partition, letter.offset))
        if newer is not None:
            planned.append(Planned(letter, "superseded",
                                   note=f"dead-lettered again by a replay, as {newer}"))
            continue
        if not letter.from_router:
            planned.append(Planned(letter, "not_replayable",
                                   note="not a router dead letter (no dlq.stage of the router)"))
            continue
        if not ours(letter.source_topic, letter.source_group):
            planned.append(Planned(letter, "not_replayable", note=(
                f"another pipeline's: written by group {letter.source_group!r}, not this "
                "config's source.group_id" if ours(letter.source_topic, None) else
                f"another pipeline's: its source {letter.source_topic!r} is none of this "
                "config's source.topics (nor its relay.table)")))
            continue
        if letter.value_dropped:
            planned.append(Planned(letter, "not_replayable", note=_dropped_note(
                letter, relay=letter.source_topic == relay_table)))
            dropped.add((letter.partition, letter.offset))
            continue
        if letter.event_id in before:
            # Delivered since, by an earlier replay or the router (a Debezium replay or snapshot
            # read the row once it routed or decoded): judged on every id the changelog holds,
            # not on the replay filter, which keeps dedup.max_ids of them for dedup.window_ms
            # (review 43: a second replay past either delivered its letters again). A decode
            # letter's raw record would still fail, before any replay check.
            planned.append(Planned(letter, "already_delivered",
                                   note="delivered since it was dead-lettered"))
            continue
        if expired_before_ms is not None and letter.timestamp_ms < expired_before_ms:
            planned.append(Planned(letter, "expired", note=(
                "older than dedup.window_ms, whose marks the changelog no longer keeps: an "
                "earlier replay may have delivered it; if none did, replay it with "
                "--include-expired")))
            continue
        result = step(letter.source_topic, letter.key, letter.value)
        planned.append(_planned(letter, result, before))
        if isinstance(result, Routed):
            seen.add_pending(result.record.event_id, 0)
    return _one_letter_again(_delivered_by_another(planned, dropped))


def _dropped_note(letter: Letter, *, relay: bool) -> str:
    """Where the record of a letter without its value is: the raw topic's coordinates, or, for
    the relay's (`relay`: its source is relay.table), the row, which stays (the cleanup deletes
    delivered rows only), and how the relay can read it again (QA 53-a F2: it named
    "table[0]@seq" as if a Kafka record)."""
    if not relay:
        return gone_note(letter)  # QA 57-b F-1: dlq replay reads a raw record still there
    return (f"its value was left out (dlq.value.dropped.bytes); the row stays in "
            f"{letter.source_topic} with seq {letter.source_offset} (the relay deletes no "
            "dead-lettered row): once the limit is raised, insert it again for the relay to "
            "read (a new seq): under a new id at once, or under its own id once "
            "dedup.window_ms has passed since this letter (until then its id is dropped as a "
            "replay), deleting the old row")


def _delivered_by_another(planned: list[Planned],
                          dropped: Collection[tuple[int, int]]) -> list[Planned]:
    """`planned` with each failing letter of ours (still_failing, dead_letter, or one of
    `dropped`, plan_replay's not_replayable for a value left out) of an id another letter
    delivers in this replay `superseded` by that one: not dead-lettered again, and no longer
    counted as undelivered once the replay commits (undelivered() counts letters by id)."""
    delivering = {item.letter.event_id: item.letter for item in planned
                  if item.action == "deliver" and item.letter.event_id}
    return [replace(item, action="superseded", result=None, note=(
        f"its id is delivered by its letter {by.partition}@{by.offset} in this replay"))
        if (by := delivering.get(item.letter.event_id or "")) is not None and (
            item.action in ("still_failing", "dead_letter") or
            (item.letter.partition, item.letter.offset) in dropped)
        else item for item in planned]


_FAILING = ("dead_letter", "still_failing")


def _one_letter_again(planned: list[Planned]) -> list[Planned]:
    """`planned` with at most one letter of an id dead-lettered again: of an id's letters that
    fail in this replay (dead_letter, still_failing), the newest (by time, then in the order
    given) stays as planned, and every other one is `superseded` by it, still_failing too
    (review 54: each letter of an id that failed for a new reason wrote a new letter; review
    54-k F-1: an older still_failing letter stayed undelivered beside the newest, one event
    counted twice, as the letters came in one order and not the other)."""
    failing = sorted((item.letter.timestamp_ms, index) for index, item in enumerate(planned)
                     if item.letter.event_id and item.action in _FAILING)
    newest = {planned[index].letter.event_id: index for _, index in failing}  # the last wins
    return [replace(item, action="superseded", result=None, note=(
        f"its id's newer letter {by.partition}@{by.offset} fails too in this replay: an id is "
        "dead-lettered again once at most, for its newest letter"))
        if item.action in _FAILING and (at := newest.get(item.letter.event_id, index)) != index
        and (by := planned[at].letter) else item for index, item in enumerate(planned)]


def _planned(letter: Letter, result: StepResult, before: set[str]) -> Planned:
    if isinstance(result, Routed):
        # Only the broker tells whether it takes the record now (review 48-d F13: a record
        # too large for its topic was planned `deliver` on every replay, then still_failing).
        return Planned(letter, "deliver", result, note="" if letter.stage != "produce" else
                       f"the broker refused it before ({letter.reason}): if it does again, "
                       "it stays as it is (still_failing)")
    if isinstance(result, DeadLettered):
        return Planned(letter, "still_failing" if fails_as_before(letter, result)
                       else "dead_letter", result, note=reason_of(result.error))
    if isinstance(result, Duplicate):
        if result.event_id in before:
            return Planned(letter, "already_delivered", result)
        return Planned(letter, "repeated", result, note="an earlier letter of this replay")
    return Planned(letter, "skip", result, note=f"{result.reason} {result.detail}".strip())


def fails_as_before(letter: Letter, failed: DeadLettered) -> bool:
    """The replay of `letter` failed at its stage with its reason, numbers aside: a new letter
    would say nothing new (QA 36-c F8: each replay added one per event it could not fix; QA
    43-a F7: so did a reason with a count of the clock's, "7083.4 s ahead", "8.01 days old")."""
    return (failed.stage, _VARYING.sub("#", reason_of(failed.error))) == \
        (letter.stage, _VARYING.sub("#", letter.reason))


def superseded_letters(letters: Iterable[Letter], topic: str,
                       ours: OursTest) -> dict[tuple[int, int], str]:
    """(partition, offset) of each letter on `topic` that a later letter of this pipeline
    names in dlq.replay.of -> that later letter's topic[partition]@offset. A later letter
    without its value (dlq.value.dropped.bytes) replaces nothing: the earlier one still holds
    the raw record to replay (review 37)."""
    named = {}
    for letter in letters:
        earlier = _REPLAY_OF.fullmatch(letter.replay_of or "")
        if earlier is not None and earlier[1] == topic and not letter.value_dropped and \
                ours(letter.source_topic, letter.source_group):
            named[(int(earlier[2]), int(earlier[3]))] = \
                f"{topic}[{letter.partition}]@{letter.offset}"
    return named


def dead_letter_again(letter: Letter, result: DeadLettered, *, dead_letter_topic: str,
                      max_bytes: int | None, group: str) -> DeadLetter:
    """The new dead letter of a letter that failed again: the same raw record and source
    coordinates, the new stage and reason, dlq.replay.of naming the earlier letter, and the
    replaying pipeline's `group`."""
    earlier = f"{dead_letter_topic}[{letter.partition}]@{letter.offset}".encode()
    return dead_letter(group=group, topic=letter.source_topic, partition=letter.source_partition,
                       offset=letter.source_offset, key=letter.key, value=letter.value,
                       original_headers=[*letter.headers, (REPLAY_OF, earlier)],
                       stage=result.stage, error=result.error, event_id=result.event_id,
                       max_bytes=max_bytes)
