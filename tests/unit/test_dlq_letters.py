"""Dead letters read back for `dlq replay`: selection, delivered ids, the plan, letters again."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cdc_router.config.compiled import compile_config
from cdc_router.config.model import RouterConfig
from cdc_router.dead_letter import ATTEMPTS, REPLAY_OF, dead_letter
from cdc_router.errors import DeliveryError, RouteError
from cdc_router.router.dlq_delivered import delivered_ids, undelivered
from cdc_router.router.dlq_letters import (
    Letter,
    Selection,
    dead_letter_again,
    fails_as_before,
    plan_replay,
    read_letter,
    sources_of,
    superseded_letters,
)
from cdc_router.router.replay import (
    BATCH_KEY_PREFIX,
    DEAD_LETTERED_KEY_PREFIX,
    REPLAYED_KEY_PREFIX,
    ReplayFilter,
    changelog_records,
)
from cdc_router.router.step import DeadLettered, RecordStep, Routed
from tests.unit.router_fakes import raw_event

RAW = "outbox.public.outbox"
DLQ = "cdc-router.dlq"


def letter(event_id: str | None, *, offset: int = 0, aggregate_type: str = "Customer",
           stage: str = "route", timestamp_ms: int = 1_000, max_bytes: int | None = None,
           extra: list[tuple[str, bytes]] | None = None, topic: str = RAW,
           group: str | None = None) -> Letter:
    """The router's dead letter of a raw event, as the replay reads it back."""
    value = raw_event(event_id or "no-id", aggregate_type=aggregate_type)
    made = dead_letter(topic=topic, partition=0, offset=40 + offset, key=b'{"id":"k"}',
                       value=value, original_headers=[("h", b"1")], stage=stage,  # type: ignore[arg-type]
                       error=RouteError("no route matches"), event_id=event_id,
                       max_bytes=max_bytes, group=group)
    return read_letter(0, offset, timestamp_ms, made.key, made.value,
                       [*made.headers, *(extra or [])])


def marks(prefix: str, *event_ids: str, group: str = "g"
          ) -> list[tuple[bytes | None, bytes | None]]:
    return [(r.key, r.value) for r in changelog_records(list(event_ids), 5, prefix, group=group)]


def step(**top: Any) -> tuple[RecordStep, ReplayFilter]:
    config = RouterConfig.model_validate({
        "source": {"topics": [RAW]},
        "routes": [{"match": {"aggregate_type": "Customer"}, "topic": "customers"}], **top})
    seen = ReplayFilter(window_ms=10**12, max_ids=1000)
    return RecordStep(compile_config(config), {"customers": 3}.get, seen=seen.seen), seen


def test_a_router_dead_letter_reads_back_with_its_origin_and_raw_headers() -> None:
    read = letter("e-1", offset=7)
    assert (read.source_topic, read.source_partition, read.source_offset) == (RAW, 0, 47)
    assert (read.stage, read.event_id, read.reason) == ("route", "e-1", "no route matches")
    assert read.headers == (("h", b"1"),) and read.from_router
    assert read.key == b'{"id":"k"}' and read.value == raw_event("e-1",
                                                                 aggregate_type="Customer")


def test_the_consumers_dead_letters_are_not_the_routers() -> None:
    assert not letter("e-1", extra=[(ATTEMPTS, b"3")]).from_router
    assert not read_letter(0, 0, 0, None, b"x", []).from_router


def test_selection_filters_by_stage_id_and_time() -> None:
    one = letter("e-1", timestamp_ms=2_000)
    assert Selection().selects(one)
    assert Selection(stages=frozenset({"route"}), ids=frozenset({"e-1"}),
                     since_ms=2_000).selects(one)
    assert not Selection(stages=frozenset({"decode"})).selects(one)
    assert not Selection(ids=frozenset({"e-2"})).selects(one)
    assert not Selection(since_ms=2_001).selects(one)


def test_an_id_selects_the_letters_of_the_same_uuid_in_any_case_or_braces() -> None:
    # Review 53-c F13: `dlq replay --id A329D702-...` selected none ("no dead letters selected").
    one = letter("a329d702-0000-7000-8000-00000000000a")
    for given in ("A329D702-0000-7000-8000-00000000000A", "{a329d702-0000-7000-8000-00000000000a}"):
        assert Selection(ids=frozenset({given})).selects(one)
    assert not Selection(ids=frozenset({"a329d702-0000-7000-8000-00000000000b"})).selects(one)
    assert not Selection(ids=frozenset({"E-1"})).selects(letter("e-1")), "text: as given"


def test_a_dead_letters_own_mark_is_not_a_delivery() -> None:
    letters = [letter("dead")]
    assert delivered_ids(marks(BATCH_KEY_PREFIX, "dead", "routed"), letters, group="g") \
        == {"routed": 5}


def test_a_dead_mark_is_no_delivery_and_a_batch_mark_beside_a_letter_naming_its_group_is_one(
        ) -> None:
    # Review 43: a letter of a version that keys its mark dead: took a batch: mark away all
    # the same; once the dead: mark had left the changelog (its retention), the router's
    # later delivery of the id counted for nothing, and a replay delivered it again.
    letters = [letter("x", group="g")]
    assert delivered_ids(marks(DEAD_LETTERED_KEY_PREFIX, "x"), letters, group="g") == {}
    assert delivered_ids(marks(BATCH_KEY_PREFIX, "x"), letters, group="g") == {"x": 5}
    assert delivered_ids([*marks(DEAD_LETTERED_KEY_PREFIX, "x"), *marks(BATCH_KEY_PREFIX, "x")],
                         letters, group="g") == {"x": 5}


def test_a_letter_without_a_group_but_with_its_dead_mark_takes_no_batch_mark_away() -> None:
    # Review 43-2: versions between the dead: key and dlq.source.group wrote such letters;
    # counted as the older kind, the router's later delivery of the id was taken away, and a
    # replay delivered it again.
    between = [letter("x")]
    assert delivered_ids([*marks(DEAD_LETTERED_KEY_PREFIX, "x"), *marks(BATCH_KEY_PREFIX, "x")],
                         between, group="g") == {"x": 5}
    assert delivered_ids(marks(DEAD_LETTERED_KEY_PREFIX, "x"), between, group="g") == {}
    assert delivered_ids(marks(BATCH_KEY_PREFIX, "x"), between, group="g") == {}  # the older kind


def test_a_decode_letter_leaves_no_mark_so_its_rows_later_mark_is_a_delivery() -> None:
    # The row failed to decode, was fixed and republished: its one mark is that delivery.
    assert delivered_ids(marks(BATCH_KEY_PREFIX, "fixed"), [letter("fixed", stage="decode")],
                         group="g") == {"fixed": 5}


def test_a_replayed_mark_or_one_mark_more_than_letters_is_a_delivery() -> None:
    letters = [letter("replayed"), letter("twice", offset=1)]
    found = delivered_ids([*marks(BATCH_KEY_PREFIX, "replayed", "twice"),
                           *marks(REPLAYED_KEY_PREFIX, "replayed"),
                           *marks(BATCH_KEY_PREFIX, "twice")], letters, group="g")
    assert set(found) == {"replayed", "twice"}


def test_a_letter_the_replay_wrote_again_is_not_counted_as_the_routers() -> None:
    again = letter("e-1", offset=1, extra=[(REPLAY_OF, b"dlq[0]@0")])
    assert delivered_ids(marks(BATCH_KEY_PREFIX, "e-1"), [again], group="g") == {"e-1": 5}
    assert delivered_ids(marks(BATCH_KEY_PREFIX, "e-1"), [letter("e-1"), again], group="g") == {}


def test_another_pipelines_marks_are_no_delivery_and_unnamed_old_ones_are() -> None:
    # Two pipelines sharing the default changelog, both with integer ids: the other's "1"
    # is not ours.
    found = delivered_ids([*marks(BATCH_KEY_PREFIX, "1", "2", group="other"),
                           *marks(REPLAYED_KEY_PREFIX, "3", group="other"),
                           *marks(BATCH_KEY_PREFIX, "4", group="g"),
                           *[(r.key, r.value) for r in changelog_records(["5"], 5)]],
                          [], group="g")
    assert found == {"4": 5, "5": 5}


def test_the_plan_delivers_once_skips_delivered_and_dead_letters_what_still_fails() -> None:
    routed_step, seen = step()
    letters = [letter("new"), letter("new", offset=1), letter("old", offset=2),
               letter("bad", offset=3, aggregate_type="Bad"),
               letter("big", offset=4, max_bytes=10), letter("x", offset=5,
                                                              extra=[(ATTEMPTS, b"1")])]
    seen.restore([("old", 5)], 10)
    planned = plan_replay(letters, routed_step, seen, {"old"}, lambda topic, group: True)
    assert [item.action for item in planned] == [
        "deliver", "repeated", "already_delivered", "dead_letter", "not_replayable",
        "not_replayable"]
    first = planned[0].result
    assert isinstance(first, Routed) and first.record.topic == "customers"
    assert "no route matches aggregate_type 'Bad'" in planned[3].note
    # QA 57-b F-1: plan_replay sees such a letter only when its raw record could not be read
    # again (dlq_raw.refilled): the note names the one path left.
    assert f"its raw record {RAW}[0]@44 is no longer on the raw topic" in planned[4].note
    assert "insert it again under a new id, and delete the old row" in planned[4].note


def test_another_pipelines_letters_on_a_shared_dead_letter_topic_are_not_replayed() -> None:
    # Review, session 26: the dead-letter topic's default name is the same for every pipeline.
    config = RouterConfig.model_validate({
        "source": {"topics": [RAW, "^billing\\..*"]}, "routes": [{"topic": "customers"}],
        "relay": {"table": "shop.outbox"}})
    ours = sources_of(config)
    assert [ours(topic, None) for topic in (RAW, "billing.public.outbox", "shop.outbox",
                                            "other.public.outbox")] == [True, True, True, False]
    routed_step, seen = step()
    planned = plan_replay([letter("mine"), letter("theirs", topic="other.public.outbox")],
                          routed_step, seen, set(), ours)
    assert [item.action for item in planned] == ["deliver", "not_replayable"]
    assert "another pipeline's: its source 'other.public.outbox'" in planned[1].note


def test_a_decode_letter_of_an_id_delivered_since_is_already_delivered() -> None:
    # QA, session 26: a snapshot read the row once it decoded again and delivered it; the
    # replay planned its letter (whose raw record still fails) as dead_letter again.
    routed_step, seen = step()
    broken = letter("fixed", stage="decode")
    broken = replace(broken, value=b"{not json")
    planned = plan_replay([broken], routed_step, seen, {"fixed"}, lambda topic, group: True)
    assert [item.action for item in planned] == ["already_delivered"]


def test_a_letter_dead_lettered_again_keeps_its_source_and_names_the_earlier_one() -> None:
    earlier = letter("bad", offset=3, aggregate_type="Bad")
    failed = DeadLettered("route", RouteError("still no route"), "bad")
    again = dead_letter_again(earlier, failed, dead_letter_topic=DLQ, max_bytes=None,
                              group="pipeline-a")
    read = read_letter(0, 9, 0, again.key, again.value, list(again.headers))
    assert (read.source_topic, read.source_offset, read.reason) == (RAW, 43, "still no route")
    assert read.source_group == "pipeline-a"
    assert read.replay_of == f"{DLQ}[0]@3" and read.headers == (("h", b"1"),)
    assert read.value == earlier.value and read.from_router


def test_a_letter_failing_again_as_before_is_still_failing_and_its_older_letter_superseded(
        ) -> None:
    # QA 36-c F8: every replay dead-lettered each unfixable letter once more (the original, as
    # the letter the previous replay wrote was `repeated`): the topic grew by one a run.
    routed_step, seen = step()
    bad = letter("bad", offset=3, aggregate_type="Bad")
    [first] = plan_replay([bad], routed_step, seen, set(), lambda topic, group: True)
    assert first.action == "dead_letter" and isinstance(first.result, DeadLettered)
    again = dead_letter_again(bad, first.result, dead_letter_topic=DLQ, max_bytes=None,
                              group="g")
    later = read_letter(0, 9, 0, again.key, again.value, list(again.headers))
    ours = sources_of(RouterConfig.model_validate({"source": {"topics": [RAW], "group_id": "g"},
                                                   "routes": [{"topic": "x"}]}))
    superseded = superseded_letters([bad, later], DLQ, ours)
    assert superseded == {(0, 3): f"{DLQ}[0]@9"}
    assert superseded_letters([bad, later], "other.dlq", ours) == {}
    dropped = replace(later, value=None, value_dropped=True)  # too big for the letter's limit
    assert superseded_letters([bad, dropped], DLQ, ours) == {}, "the older one holds the record"
    routed_step, seen = step()
    planned = plan_replay([bad, later], routed_step, seen, set(), ours, superseded=superseded)
    assert [item.action for item in planned] == ["superseded", "still_failing"]
    assert f"as {DLQ}[0]@9" in planned[0].note and "'Bad'" in planned[1].note


def test_a_failing_letter_shadows_no_later_letter_of_its_id_which_supersedes_it() -> None:
    # Review 53-c F16: a row dead-lettered at decode (empty aggregate id), fixed and
    # republished, then dead-lettered at route: once the route was fixed, its letter was
    # `repeated` ("an earlier letter of this replay") behind the decode letter that still
    # fails, and was never delivered, --id or not.
    routed_step, seen = step()
    broken = letter("x", stage="decode")
    broken = replace(broken, value=raw_event("x", aggregate_type="Customer", aggregate_id=""),
                     reason="event 'x': column 'aggregateid' (aggregate id) is empty")
    dropped = replace(letter("x", offset=2), value=None, value_dropped=True)
    planned = plan_replay([broken, letter("x", offset=1), dropped, letter("x", offset=3)],
                          routed_step, seen, set(), lambda topic, group: True)
    assert [item.action for item in planned] == ["superseded", "deliver", "superseded",
                                                 "repeated"]
    assert planned[0].note == "its id is delivered by its letter 0@1 in this replay"
    # One that fails and has no later letter to deliver is not repeated: its id's newer
    # failing letter supersedes it (review 54-k F-1: it stayed still_failing, counted too).
    routed_step, seen = step()
    planned = plan_replay([broken, letter("x", offset=1, aggregate_type="Bad")], routed_step,
                          seen, set(), lambda topic, group: True)
    assert [item.action for item in planned] == ["superseded", "dead_letter"]


def test_a_reason_that_differs_only_in_a_number_the_clock_moves_fails_as_before() -> None:
    # QA 43-a F7: "... is 7083.4 s ahead of the clock" at one replay read "7071.5 s ahead" at
    # the next: every replay wrote one more letter of each such event.
    earlier = replace(letter("late", stage="produce"), reason=(
        "Kafka would refuse the record for t (INVALID_TIMESTAMP): its timestamp "
        "2026-12-04T23:57:00.000Z is 7083.4 s ahead of the clock, over the topic's "
        "message.timestamp.after.max.ms (3600000) less a 3 s margin"))
    now = earlier.reason.replace("7083.4", "7071.5")
    assert fails_as_before(earlier, DeadLettered("produce", DeliveryError(now), "late"))
    assert not fails_as_before(earlier, DeadLettered("route", DeliveryError(now), "late"))
    old = replace(earlier, reason="its timestamp 2026-11-26T10:00:00.000Z is 8.01 days old")
    assert fails_as_before(old, DeadLettered("produce", DeliveryError(
        "its timestamp 2026-11-26T10:00:00.000Z is 8.13 days old"), "late"))
    # QA 57-a F-5: an age in the unit that reads best moves from "90 s" to "2 min" between
    # replays: the same reason, numbers (and unit) aside.
    young = replace(earlier, reason="its timestamp 2026-12-06T16:49:35+00:00 is 90 s old, within")
    assert fails_as_before(young, DeadLettered("produce", DeliveryError(
        "its timestamp 2026-12-06T16:49:35+00:00 is 2 min old, within"), "late"))
    # QA 45-a F2: a route added above the event's moved "routes[4]" to "routes[5]".
    moved = "event e: routes[4] topic 'odd.{type}' renders 'odd../etc', which Kafka refuses"
    assert fails_as_before(replace(earlier, stage="route", reason=moved), DeadLettered(
        "route", DeliveryError(moved.replace("[4]", "[5]")), "late"))
    for before, now in (("topic orders.1 does not exist", "topic orders.2 does not exist"),
                        ("over the 10 allowed", "over the 64 allowed"),
                        ("headers[4] is empty", "headers[5] is empty")):
        assert not fails_as_before(replace(earlier, reason=before),
                                   DeadLettered("produce", DeliveryError(now), "late"))


def test_letters_of_another_group_on_the_same_raw_topic_are_neither_replayed_nor_counted() -> None:
    # QA, session 28: pipelines A and B read one raw topic and share the dead-letter topic. A
    # delivered E, B dead-lettered it: B's letter cancelled A's one mark ("not delivered"), and
    # A's replay delivered E a second time.
    config = RouterConfig.model_validate({
        "source": {"topics": [RAW], "group_id": "a"}, "routes": [{"topic": "customers"}]})
    ours = sources_of(config)
    assert (ours(RAW, "a"), ours(RAW, "b"), ours(RAW, None)) == (True, False, True)
    # Review, session 28: a relay of the same outbox shares the group, not the config's
    # sources: its letters are not this router config's to replay.
    assert ours("public.outbox", "a") is False
    theirs = letter("e", group="b")
    assert theirs.source_group == "b"
    mine = [item for item in [theirs] if ours(item.source_topic, item.source_group)]
    assert delivered_ids(marks(BATCH_KEY_PREFIX, "e", group="a"), mine, group="a") == {"e": 5}
    routed_step, seen = step()
    planned = plan_replay([theirs, letter("f", group="a", offset=1)], routed_step, seen,
                          {"e"}, ours)
    assert [item.action for item in planned] == ["not_replayable", "deliver"]
    assert "written by group 'b'" in planned[0].note


def test_a_reason_cut_for_the_table_says_so() -> None:
    # QA 47-d F1: cut at 120 characters mid-word, the what-to-do lost without a sign.
    from cdc_router.cli.dlq import _cut

    assert _cut("short reason") == "short reason"
    cut = _cut("x" * 200)
    assert len(cut) <= 120 and cut.endswith(" ... (whole in -o json)")


def test_letters_left_undelivered_are_this_pipelines_not_delivered_nor_settled() -> None:
    # QA 52-b M1: what a complete replay commits for `status`, per dead-letter partition.
    ours = sources_of(RouterConfig.model_validate({
        "source": {"topics": [RAW], "group_id": "g"}, "routes": [{"topic": "customers"}]}))
    letters = [letter("done", offset=0), letter("left", offset=1), letter("old", offset=2),
               letter("theirs", offset=3, group="other"), letter(None, offset=4),
               letter("new", offset=5)]
    letters[4] = replace(letters[4], source_topic="")  # names no source: counted as ours
    assert undelivered(letters, {"done"}, {(0, 2)}, ours, {}) == {0: 3}  # left, no id, new
    # Before the previous complete replay's offset 5, no more than it counted there (1),
    # less what this replay did there.
    assert undelivered(letters, {"done"}, {(0, 2)}, ours, {0: (5, 1)}) == {0: 2}
    assert undelivered(letters, {"done"}, {(0, 2)}, ours, {0: (5, 1)}, [(0, 1)]) == {0: 1}
    assert undelivered(letters, {"done"}, {(0, 2)}, ours, {0: (5, None)}) == {0: 3}
