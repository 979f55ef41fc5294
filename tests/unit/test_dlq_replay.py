"""`dlq replay`'s procedure against the fake cluster: one transaction per batch, a failed batch
commits nothing and the next replay delivers it, a second replay skips what the first did."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message
from confluent_kafka.schema_registry import SchemaRegistryClient

from cdc_router.config.compiled import compile_config
from cdc_router.config.model import RouterConfig
from cdc_router.dead_letter import REPLAY_OF, dead_letter, dead_letter_headers
from cdc_router.errors import DecodeError, DeliveryError, FatalKafkaError, RouteError
from cdc_router.router import dlq_replay
from cdc_router.router.dlq_letters import Selection
from cdc_router.router.dlq_replay import DeadLetterReplay
from cdc_router.router.replay import BATCH_KEY_PREFIX, changelog_records
from cdc_router.serde.avro import AvroSerializer
from tests.unit.router_fakes import (
    CHANGELOG,
    DLQ,
    RAW,
    FakeChangelog,
    FakeCluster,
    FakeConsumer,
    FakeProducer,
    Stored,
    marked_ids,
    raw_event,
)

CUSTOMERS = "customers"


class FakeLetters:
    """The dead-letter topic's reader: every committed letter, then its consumer's offsets."""

    age_ms = 1_000  # how long ago every letter was written

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.consumer = FakeConsumer(cluster, {}, on_idle=lambda: None)

    def read_to_end(self, *, end: str, timeout_s: float) -> Iterator[Message]:
        written_ms = int(time.time() * 1000) - self.age_ms
        for offset, stored in enumerate(self.cluster.committed(DLQ)):
            yield Message(topic=DLQ, partition=0, offset=offset, key=stored.key,
                          value=stored.value, headers=stored.headers, timestamp=(1, written_ms))

    def close(self) -> None:
        pass


class Changelog(FakeChangelog):
    def catch_up(self, timeout_s: float = 0) -> Iterator[tuple[bytes | None, bytes | None]]:
        return super().catch_up()


def cluster_with_letters(*aggregate_types: str) -> FakeCluster:
    """Letters of events e-0, e-1, ... dead-lettered by the router (each with its mark)."""
    cluster = FakeCluster(partitions={RAW: 1, CUSTOMERS: 3, DLQ: 1, CHANGELOG: 1})
    ids = [f"e-{n}" for n in range(len(aggregate_types))]
    for n, (event_id, kind) in enumerate(zip(ids, aggregate_types, strict=True)):
        letter = dead_letter(topic=RAW, partition=0, offset=n, key=None,
                             value=raw_event(event_id, aggregate_type=kind), original_headers=[],
                             stage="route", error=RouteError("no route"), event_id=event_id)
        cluster.publish(DLQ, [Stored(DLQ, 0, letter.key, letter.value, list(letter.headers),
                                     None)])
    mark = changelog_records(ids, 1, BATCH_KEY_PREFIX)[0]
    cluster.publish(CHANGELOG, [Stored(CHANGELOG, 0, mark.key, mark.value, [], None)])
    return cluster


def replayer(cluster: FakeCluster, dedup: dict[str, Any] | None = None,
             **delivery: Any) -> DeadLetterReplay:
    config = RouterConfig.model_validate({
        "source": {"topics": [RAW], "group_id": "g"}, "dead_letter": {"topic": DLQ},
        "dedup": {"changelog_topic": CHANGELOG, **(dedup or {})}, "delivery": delivery,
        "routes": [{"match": {"aggregate_type": "Customer"}, "topic": CUSTOMERS}]})
    return replayer_of(cluster, config)


def replayer_of(cluster: FakeCluster, config: RouterConfig) -> DeadLetterReplay:
    return DeadLetterReplay(
        compile_config(config), dry_run=False,
        producer_factory=lambda conf: FakeProducer(cluster, conf),
        changelog_factory=lambda conf, topic: Changelog(cluster, topic),
        reader_factory=lambda conf, topic, **kwargs: FakeLetters(cluster),
        describe_factory=cluster.describe_factory,
        operations_factory=cluster.operations_factory)


def test_a_replay_delivers_marks_and_moves_the_group_in_one_transaction() -> None:
    cluster = cluster_with_letters("Customer", "Customer", "Bad")
    # One batch, however slow the host.
    replay = replayer(cluster, commit_interval_ms=5_000, transaction_timeout_ms=50_000)
    result = replay.apply(replay.plan(Selection()))
    assert result.committed == {"deliver": 2, "dead_letter": 1}
    assert sorted(s.key for s in cluster.committed(CUSTOMERS)) == [b"e-0", b"e-1"]
    replayed = cluster.committed(CHANGELOG)[1:]
    assert [s.key[:17] for s in replayed] == [b"replayed:1:g:e-0#"] and marked_ids(replayed) == [
        "e-0", "e-1"]
    again = cluster.committed(DLQ)[3]
    assert again.header(REPLAY_OF) == f"{DLQ}[0]@2"
    assert cluster.group_offsets == {(DLQ, 0): 3}
    assert [step for step in cluster.journal if not step.startswith("acked")] == [
        "flush", "send_offsets", "commit"]


def test_letters_older_than_the_dedup_window_are_expired_unless_included(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 48-d F6: the changelog ages a `replayed:` mark out after dedup.window_ms, the
    # dead-letter topic may keep its letter longer: the replay run again delivered it twice.
    cluster = cluster_with_letters("Customer", "Customer")
    first = replayer(cluster, commit_interval_ms=5_000, transaction_timeout_ms=50_000)
    assert first.apply(first.plan(Selection(ids=frozenset({"e-0"})))).committed == {"deliver": 1}
    cluster.topics[CHANGELOG] = []  # the window has passed: every mark aged out
    monkeypatch.setattr(FakeLetters, "age_ms", 3_600_001)
    hour = {"window_ms": 3_600_000}
    second = replayer(cluster, dedup=hour)
    plan = second.plan(Selection())
    assert plan.counts() == {"expired": 2}
    assert "--include-expired" in plan.planned[0].note
    assert second.apply(plan).committed == {}
    assert [s.key for s in cluster.committed(CUSTOMERS)] == [b"e-0"]
    # Told that no replay delivered e-1, the user includes the expired letters by its id.
    third = replayer(cluster, dedup=hour, commit_interval_ms=5_000, transaction_timeout_ms=50_000)
    included = Selection(ids=frozenset({"e-1"}), include_expired=True)
    assert third.apply(third.plan(included)).committed == {"deliver": 1}
    assert sorted(s.key for s in cluster.committed(CUSTOMERS)) == [b"e-0", b"e-1"]


def test_a_letter_refused_again_as_before_is_still_failing_not_dead_lettered_once_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 36-c F8: each replay added one more letter per event it could not fix.
    monkeypatch.setattr(dlq_replay, "_BACKOFF_S", 0.0)
    cluster = cluster_with_letters("Customer")
    big = dead_letter(topic=RAW, partition=0, offset=9, key=None, value=raw_event(
        "e-big", aggregate_type="Customer", payload='{"pad": "' + "x" * 2_000 + '"}'),
        original_headers=[], stage="route", error=RouteError("no route"), event_id="e-big")
    cluster.publish(DLQ, [Stored(DLQ, 0, big.key, big.value, list(big.headers), None)])
    cluster.refuse = lambda topic, value, timestamp: KafkaError.MSG_SIZE_TOO_LARGE \
        if topic == CUSTOMERS and value is not None and len(value) > 1_000 else None
    first = replayer(cluster)
    assert first.apply(first.plan(Selection())).committed == {"deliver": 1, "dead_letter": 1}
    assert len(cluster.committed(DLQ)) == 3  # the refusal's letter, naming the first
    for _ in range(2):
        again = replayer(cluster)
        plan = again.plan(Selection())
        assert plan.counts() == {"already_delivered": 1, "superseded": 1, "deliver": 1}
        # Review 48-d F13: planned a plain `deliver` (what --dry-run shows), without a word.
        [refused] = [item for item in plan.planned if item.letter.stage == "produce"]
        assert refused.note.startswith("the broker refused it before (") and \
            "still_failing" in refused.note
        assert again.apply(plan).committed == {"still_failing": 1}
    assert len(cluster.committed(DLQ)) == 3 and len(cluster.committed(CUSTOMERS)) == 1


def test_a_batch_that_keeps_failing_commits_nothing_and_the_next_replay_delivers_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dlq_replay, "_BACKOFF_S", 0.0)
    cluster = cluster_with_letters("Customer", "Customer")
    cluster.commit_failures = [KafkaError(KafkaError._TIMED_OUT, txn_requires_abort=True)] * 4
    failing = replayer(cluster)
    with pytest.raises(DeliveryError, match="0 letters were committed before; run it again") \
            as stopped:
        failing.apply(failing.plan(Selection()))
    assert stopped.value.exit_code == 75, "QA 56-e F-1: 'run it again' exited 1, final"
    assert cluster.committed(CUSTOMERS) == [] and cluster.group_offsets == {}
    replay = replayer(cluster)
    assert replay.apply(replay.plan(Selection())).committed == {"deliver": 2}
    second = replayer(cluster).plan(Selection())
    assert second.counts() == {"already_delivered": 2}
    assert len(cluster.committed(CUSTOMERS)) == 2


def test_an_abort_refused_after_a_kafka_restart_exits_75_to_run_again_and_the_rerun_delivers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 52-b L1: Kafka restarted mid-apply, the abort then refused with INVALID_TXN_STATE
    # (fatal, which `run` renews its producer for): exit 1 "failed for good", no word to rerun.
    monkeypatch.setattr(dlq_replay, "_BACKOFF_S", 0.0)
    cluster = cluster_with_letters("Customer", "Customer")
    cluster.commit_failures = [KafkaError(KafkaError._TIMED_OUT, txn_requires_abort=True)]
    cluster.abort_failures = [KafkaError(KafkaError.INVALID_TXN_STATE, "Failed to end "
                                         "transaction", fatal=True)]
    failing = replayer(cluster)
    with pytest.raises(FatalKafkaError) as stopped:
        failing.apply(failing.plan(Selection()))
    assert stopped.value.exit_code == 75 and "for good" not in str(stopped.value)
    assert str(stopped.value).endswith("0 letters were committed before; run it again (what "
                                       "was delivered is skipped)")
    assert "INVALID_TXN_STATE" in str(stopped.value)
    replay = replayer(cluster)
    assert replay.apply(replay.plan(Selection())).committed == {"deliver": 2}
    assert len(cluster.committed(CUSTOMERS)) == 2


def test_a_batch_whose_commit_kafka_lost_stops_the_replay_to_run_again_and_the_rerun_delivers(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Review 59-r F-3: Kafka acknowledged the first batch's commit, then lost it (chaos 58); the
    # replay went on after it and ended "deliver: 4", exit 0, with e-0 and e-1 delivered nowhere.
    monkeypatch.setattr(dlq_replay, "_BACKOFF_S", 0.0)
    cluster = cluster_with_letters("Customer", "Customer", "Customer", "Customer")
    cluster.lost_commits = 1
    failing = replayer(cluster, commit_max_records=2, commit_interval_ms=5_000,
                       transaction_timeout_ms=50_000)
    with caplog.at_level(logging.WARNING, logger="cdc_router.router"), \
            pytest.raises(DeliveryError) as stopped:
        failing.apply(failing.plan(Selection()))
    assert stopped.value.exit_code == 75
    assert str(stopped.value) == (
        f"dlq replay stopped: Kafka lost a batch it had acknowledged, as after a broker's crash "
        f"({DLQ}[0] committed none, this instance 2); that batch's letters stay on the "
        "dead-letter topic, undelivered (2 were counted committed); run it again (what was "
        "delivered is skipped)")
    assert f"event=commit_lost partitions=['{DLQ}[0] committed none, this instance 2']" \
        in caplog.text
    assert cluster.committed(CUSTOMERS) == []
    replay = replayer(cluster)
    assert replay.apply(replay.plan(Selection())).committed == {"deliver": 4}
    assert sorted(s.key for s in cluster.committed(CUSTOMERS)) == [b"e-0", b"e-1", b"e-2",
                                                                     b"e-3"]


def test_a_fence_of_the_replay_still_exits_1() -> None:
    cluster = cluster_with_letters("Customer")
    cluster.commit_failures = [KafkaError(KafkaError._FENCED, "fenced", fatal=True)]
    replay = replayer(cluster)
    with pytest.raises(FatalKafkaError, match="_FENCED") as stopped:
        replay.apply(replay.plan(Selection()))
    assert stopped.value.exit_code == 1


def test_a_batch_that_failed_once_is_tried_again_and_delivered_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dlq_replay, "_BACKOFF_S", 0.0)
    cluster = cluster_with_letters("Customer", "Customer")
    cluster.commit_failures = [KafkaError(KafkaError._TIMED_OUT, txn_requires_abort=True)]
    replay = replayer(cluster)
    assert replay.apply(replay.plan(Selection())).committed == {"deliver": 2}
    assert len(cluster.committed(CUSTOMERS)) == 2


def test_batches_commit_by_commit_max_records_each_with_its_offsets() -> None:
    cluster = cluster_with_letters("Customer", "Customer", "Customer")
    replay = replayer(cluster, commit_max_records=2, commit_interval_ms=5_000,
                      transaction_timeout_ms=50_000)
    assert replay.apply(replay.plan(Selection())).committed == {"deliver": 3}
    assert cluster.journal.count("commit") == 2
    assert cluster.group_offsets == {(DLQ, 0): 3}


def undelivered_noted(cluster: FakeCluster) -> int | None:
    """What the replay's last commit says of the letters before it (kafka/commit_stamp.py)."""
    found = re.search(r" undelivered_before=(\d+)$", cluster.offset_metadata.get((DLQ, 0)) or "")
    return int(found.group(1)) if found else None


def test_a_complete_replay_commits_how_many_letters_before_its_offset_are_not_delivered(
        ) -> None:
    # QA 52-b M1: status counted every replayed, delivered letter as a dead letter.
    cluster = cluster_with_letters("Customer", "Customer", "Bad")
    replay = replayer(cluster)
    assert replay.apply(replay.plan(Selection())).committed == {"deliver": 2, "dead_letter": 1}
    # e-0 and e-1 delivered, e-2's letter superseded by its new one at offset 3 (after it)
    assert cluster.group_offsets == {(DLQ, 0): 3} and undelivered_noted(cluster) == 0
    # A filtered replay counts the letters it left out too.
    cluster = cluster_with_letters("Customer", "Customer", "Customer")
    replay = replayer(cluster)
    replay.apply(replay.plan(Selection(ids=frozenset({"e-1"}))))
    assert cluster.group_offsets == {(DLQ, 0): 3} and undelivered_noted(cluster) == 2
    # Nothing left to deliver: the count is committed all the same (the CLI's --yes).
    replay = replayer(cluster)
    replay.apply(replay.plan(Selection()))
    again = replayer(cluster)
    plan = again.plan(Selection())
    assert plan.counts() == {"already_delivered": 3}
    assert again.apply(plan).committed == {} and undelivered_noted(cluster) == 0


def test_the_count_before_the_last_complete_replay_never_grows_when_marks_age_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = cluster_with_letters("Customer", "Bad")
    first = replayer(cluster)
    first.apply(first.plan(Selection()))  # e-0 delivered, e-1 dead-lettered again
    assert cluster.group_offsets == {(DLQ, 0): 2} and undelivered_noted(cluster) == 0
    cluster.topics[CHANGELOG] = []  # the dedup window has passed: every mark aged out
    monkeypatch.setattr(FakeLetters, "age_ms", 3_600_001)
    late = dead_letter(topic=RAW, partition=0, offset=7, key=None, value=raw_event(
        "e-7", aggregate_type="Customer"), original_headers=[], stage="route",
        error=RouteError("no route"), event_id="e-7")
    cluster.publish(DLQ, [Stored(DLQ, 0, late.key, late.value, list(late.headers), None)])
    second = replayer(cluster, dedup={"window_ms": 3_600_000})
    # e-7 is expired too (the fake's letters share one age); --include-expired delivers it.
    second.apply(second.plan(Selection(ids=frozenset({"e-7"}), include_expired=True)))
    # Below offset 2 nothing came undone; e-1's newer letter (offset 2) is still undelivered.
    assert cluster.group_offsets == {(DLQ, 0): 4} and undelivered_noted(cluster) == 1


def test_a_fixed_letter_behind_a_still_failing_one_of_its_id_is_delivered_and_counted(
        ) -> None:
    # Review 53-c F16: e-0 was dead-lettered at decode (empty aggregate id), its row fixed and
    # republished, then dead-lettered at route; once the route exists, `dlq replay` (--id too)
    # planned the second letter `repeated` behind the first, which still fails: never delivered.
    cluster = FakeCluster(partitions={RAW: 1, CUSTOMERS: 3, DLQ: 1, CHANGELOG: 1})
    for offset, (stage, aggregate_id, error) in enumerate([
            ("decode", "", DecodeError("event 'e-0': column 'aggregateid' (aggregate id) is "
                                       "empty")),
            ("route", "fixed", RouteError("no route"))]):
        letter = dead_letter(topic=RAW, partition=0, offset=offset, key=None, value=raw_event(
            "e-0", aggregate_type="Customer", aggregate_id=aggregate_id), original_headers=[],
            stage=stage, error=error, event_id="e-0", group="g")  # type: ignore[arg-type]
        cluster.publish(DLQ, [Stored(DLQ, 0, letter.key, letter.value, list(letter.headers),
                                     None)])
    for selection in (Selection(), Selection(ids=frozenset({"e-0"}))):
        plan = replayer(cluster).plan(selection)
        assert [item.action for item in plan.planned] == ["superseded", "deliver"]
    replay = replayer(cluster)
    assert replay.apply(replay.plan(Selection())).committed == {"deliver": 1}
    assert [s.key for s in cluster.committed(CUSTOMERS)] == [b"e-0"]
    # Neither letter of e-0 is left undelivered, for status and dlq list.
    assert cluster.group_offsets == {(DLQ, 0): 2} and undelivered_noted(cluster) == 0
    assert replayer(cluster).plan(Selection()).counts() == {"already_delivered": 2}


def test_one_replay_dead_letters_an_id_again_once_for_its_newest_failing_letter() -> None:
    # Review 54: e-0 was dead-lettered twice at decode (its row republished in between); both
    # rows now fail at route, a new reason for each: one replay wrote a new letter for each.
    cluster = FakeCluster(partitions={RAW: 1, CUSTOMERS: 3, DLQ: 1, CHANGELOG: 1})
    for offset in range(2):
        letter = dead_letter(topic=RAW, partition=0, offset=offset, key=None, value=raw_event(
            "e-0", aggregate_type="Unrouted", aggregate_id=f"a-{offset}"), original_headers=[],
            stage="decode", error=DecodeError(f"bad row {offset}"), event_id="e-0", group="g")
        cluster.publish(DLQ, [Stored(DLQ, 0, letter.key, letter.value, list(letter.headers),
                                     None)])
    replay = replayer(cluster)
    plan = replay.plan(Selection())
    assert [item.action for item in plan.planned] == ["superseded", "dead_letter"]
    assert plan.planned[0].note.startswith("its id's newer letter 0@1 fails too")
    assert replay.apply(plan).committed == {"dead_letter": 1}
    [*_, again] = cluster.committed(DLQ)
    assert len(cluster.committed(DLQ)) == 3 and (REPLAY_OF, b"%s[0]@1" % DLQ.encode()) in \
        again.headers
    assert undelivered_noted(cluster) == 0  # e-0's one undelivered letter is the new one
    # The next replay writes none: the new letter fails as it did, the first is left to it.
    replay = replayer(cluster)
    plan = replay.plan(Selection())
    assert plan.counts() == {"superseded": 2, "still_failing": 1}
    assert replay.apply(plan).committed == {} and len(cluster.committed(DLQ)) == 3


def test_an_older_letter_still_failing_is_superseded_by_a_newer_failing_one_too() -> None:
    # Review 54-k F-1: e-0's older letter fails at route as it did (still_failing), its newer
    # one (a decode letter) now fails at route, a new reason: the older stayed still_failing,
    # two undelivered letters for one event, where the other order counted one.
    def decode_letter(offset: int) -> Stored:
        letter = dead_letter(topic=RAW, partition=0, offset=offset, key=None, value=raw_event(
            "e-0", aggregate_type="Unrouted", aggregate_id=f"a-{offset}"), original_headers=[],
            stage="decode", error=DecodeError("bad row"), event_id="e-0", group="g")
        return Stored(DLQ, 0, letter.key, letter.value, list(letter.headers), None)

    learned = FakeCluster(partitions={RAW: 1, CUSTOMERS: 3, DLQ: 1, CHANGELOG: 1})
    learned.publish(DLQ, [decode_letter(0)])
    replay = replayer(learned)
    replay.apply(replay.plan(Selection()))
    route = learned.committed(DLQ)[-1]  # a route letter the replay repeats exactly
    cluster = FakeCluster(partitions={RAW: 1, CUSTOMERS: 3, DLQ: 1, CHANGELOG: 1})
    cluster.publish(DLQ, [Stored(DLQ, 0, route.key, route.value, [
        (name, value) for name, value in route.headers if name != REPLAY_OF], None)])
    cluster.publish(DLQ, [decode_letter(1)])
    replay = replayer(cluster)
    plan = replay.plan(Selection())
    assert [item.action for item in plan.planned] == ["superseded", "dead_letter"]
    assert replay.apply(plan).committed == {"dead_letter": 1}
    for _ in range(2):  # the next replays: e-0 counts once, its newest letter
        replay = replayer(cluster)
        plan = replay.plan(Selection())
        assert plan.counts() == {"superseded": 2, "still_failing": 1}
        assert replay.apply(plan).committed == {} and undelivered_noted(cluster) == 1


def test_selection_leaves_the_other_letters_for_a_later_replay() -> None:
    cluster = cluster_with_letters("Customer", "Customer")
    replay = replayer(cluster)
    replay.apply(replay.plan(Selection(ids=frozenset({"e-1"}))))
    assert [s.key for s in cluster.committed(CUSTOMERS)] == [b"e-1"]
    later = replayer(cluster)
    assert later.plan(Selection()).counts() == {"already_delivered": 1, "deliver": 1}


def test_another_pipelines_letter_of_one_of_our_ids_does_not_make_it_undelivered() -> None:
    # Review 2, session 26: e-0 was dead-lettered by us, then delivered (a fixed row
    # republished); another pipeline sharing the dead-letter topic dead-lettered its own e-0.
    # Counted with ours, its letter made our delivery look undone: replayed a second time.
    cluster = cluster_with_letters("Customer")
    mark = changelog_records(["e-0"], int(time.time() * 1000), BATCH_KEY_PREFIX, group="g")[0]
    cluster.publish(CHANGELOG, [Stored(CHANGELOG, 0, mark.key, mark.value, [], None)])
    theirs = dead_letter(topic="billing.public.outbox", partition=0, offset=9, key=None,
                         value=raw_event("e-0", aggregate_type="Customer"),
                         original_headers=[], stage="route", error=RouteError("no route"),
                         event_id="e-0")
    cluster.publish(DLQ, [Stored(DLQ, 0, theirs.key, theirs.value, list(theirs.headers),
                                 None)])
    plan = replayer(cluster).plan(Selection())
    # QA 62 F-9: and the plan leaves it out, counted, as `dlq list` does (it listed it as
    # not_replayable among ours).
    assert [item.action for item in plan.planned] == ["already_delivered"]
    assert (plan.read, plan.others) == (2, 1)
    from cdc_router.cli.dlq import _plan_text

    assert _plan_text(plan, DLQ).endswith(
        "1 of 2 letters selected: 1 already_delivered\n"
        "1 letter of other pipelines left out (`dlq list --all` lists them)")
    # Review 63: an idempotent consumer's letter (its source a destination topic) is no other
    # pipeline's.
    handled = dead_letter_headers(topic=CUSTOMERS, partition=0, offset=4, stage="handle",
                                  error=ValueError("boom"), attempts=5, event_id="e-0")
    cluster.publish(DLQ, [Stored(DLQ, 0, b"e-0", b"{}", handled, None)])
    plan = replayer(cluster).plan(Selection())
    assert (plan.read, plan.others, plan.consumers) == (3, 1, 1)
    assert _plan_text(plan, DLQ).endswith(
        "1 letter of other pipelines and 1 of idempotent consumers left out (`dlq list --all` "
        "lists them)")


def test_a_relay_letter_is_replayed_from_its_row() -> None:
    # QA, session 28: every relay letter was decoded as a Debezium change event and
    # dead-lettered again as "no 'op' field", without its event id.
    from cdc_router.relay.letters import letter_value

    cluster = FakeCluster(partitions={CUSTOMERS: 3, DLQ: 1, CHANGELOG: 1})
    row = {"id": "r-1", "aggregatetype": "Customer", "aggregateid": "c-1", "type": "Moved",
           "payload": '{"to": "Lyon"}', "headers": None, "created_at": None}
    letter = dead_letter(topic="public.outbox", partition=0, offset=7, key=b"r-1",
                         value=letter_value("public.outbox", 7, 42, row, {}),
                         original_headers=None, stage="route", error=RouteError("no route"),
                         event_id="r-1", group="g")
    cluster.publish(DLQ, [Stored(DLQ, 0, letter.key, letter.value, list(letter.headers),
                                 None)])
    config = RouterConfig.model_validate({
        "source": {"group_id": "g"}, "dead_letter": {"topic": DLQ},
        "dedup": {"changelog_topic": CHANGELOG}, "relay": {"table": "public.outbox"},
        "routes": [{"match": {"aggregate_type": "Customer"}, "topic": CUSTOMERS}]})
    replay = replayer_of(cluster, config)
    result = replay.apply(replay.plan(Selection()))
    assert result.committed == {"deliver": 1}
    [delivered] = cluster.committed(CUSTOMERS)
    assert (delivered.key, delivered.value) == (b"r-1", b'{"to": "Lyon"}')
    # QA 53-a F2: a relay letter without its value pointed at "public.outbox[0]@8", a Kafka
    # record that does not exist: its row stays in the table, by its seq.
    big = dead_letter(topic="public.outbox", partition=0, offset=8, key=b"r-2",
                      value=letter_value("public.outbox", 8, 43, {**row, "id": "r-2"}, {}),
                      original_headers=None, stage="route", error=RouteError("too big"),
                      event_id="r-2", group="g", max_bytes=200)
    cluster.publish(DLQ, [Stored(DLQ, 0, big.key, big.value, list(big.headers), None)])
    [_, planned] = replay.plan(Selection()).planned
    assert planned.action == "not_replayable" and planned.note.startswith(
        "its value was left out (dlq.value.dropped.bytes); the row stays in public.outbox with "
        "seq 8 (the relay deletes no dead-lettered row): once the limit is raised, insert it "
        "again for the relay to read")


def test_a_relay_letter_of_an_earlier_version_needs_the_payload_type_to_replay() -> None:
    # Review, session 28: without the columns' types a bytea payload's base64 would pass for
    # JSON; such a letter is read only with source.payload_type set.
    import json

    from cdc_router.config.source import SourceSettings
    from cdc_router.errors import DecodeError
    from cdc_router.relay.letters import letter_event

    old = json.dumps({"source": {"table": "public.outbox", "seq": 1, "txid": 2}, "after": {
        "id": "r-1", "aggregatetype": "A", "aggregateid": "1", "type": "T",
        "payload": "AAE="}}).encode()
    with pytest.raises(DecodeError, match=r"source\.payload_type"):
        letter_event(old, SourceSettings())
    event = letter_event(old, SourceSettings(payload_type="bytes"))
    assert (event.payload, event.payload_is_json) == (b"\x00\x01", False)


def _earlier_relay_letter(payload: object) -> bytes:
    """A letter as the relay wrote it before 0.2.0 (046e869): the row's text, no columns."""
    import json

    return json.dumps({"source": {"table": "public.outbox", "seq": 1, "txid": 2}, "after": {
        "id": "r-1", "aggregatetype": "Poison", "aggregateid": "1", "type": "OrderPaid",
        "payload": payload, "headers": None,
        "created_at": "2026-12-01 10:00:00.000000"}}).encode()


def test_an_earlier_relay_letter_with_a_json_payload_replays_without_the_payload_type() -> None:
    # QA 56-f F-5: every letter of a 0.1.0 relay was dead-lettered again by the first replay,
    # although a jsonb payload's text ({, ", [, .) is no bytea's base64 or hex.
    from cdc_router.config.source import SourceSettings
    from cdc_router.relay.letters import letter_event

    for text, payload in (('{"n": 1, "pad": "xx"}', b'{"n": 1, "pad": "xx"}'),
                          ('[1, 2]', b"[1, 2]"), ('"a string"', b'"a string"'),
                          ("1.5", b"1.5")):
        event = letter_event(_earlier_relay_letter(text), SourceSettings())
        assert (event.event_id, event.payload, event.payload_is_json) == ("r-1", payload, True)


def test_an_earlier_relay_letter_that_may_be_bytes_is_refused_naming_its_id() -> None:
    # QA 56-f F-5: the refusal's log line said id=None; text a bytea's base64 or hex could be
    # (and JSON too, or not JSON) is still refused: the letter does not say which it was.
    from cdc_router.config.source import SourceSettings
    from cdc_router.errors import DecodeError
    from cdc_router.relay.letters import letter_event
    from cdc_router.router.step import decode_letter

    for text in ("1234", "true", "null", "SGk=", "deadbeef", "not json at all", None):
        with pytest.raises(DecodeError, match=r"set source\.payload_type") as caught:
            letter_event(_earlier_relay_letter(text), SourceSettings())
        assert caught.value.event_id == "r-1"
        assert decode_letter(caught.value).shown_id == "r-1"
    bytes_read = letter_event(_earlier_relay_letter("1234"), SourceSettings(payload_type="bytes"))
    assert bytes_read.payload == bytes.fromhex("d76df8")


def test_a_relay_letter_of_a_row_dated_1970_is_decoded_as_the_relay_reads_it() -> None:
    # Reread 53-k F-5: the relay delivers a created_at of exactly 1970-01-01 (QA 53-a F1),
    # but its letters were decoded as Connect's and refused as a JsonConverter default.
    from cdc_router.config.source import SourceSettings
    from cdc_router.relay.letters import letter_event, letter_value

    row = {"id": "r-1", "aggregatetype": "Customer", "aggregateid": "c-1", "type": "Moved",
           "payload": '{"to": "Lyon"}', "headers": None, "created_at": "1970-01-01 00:00:00"}
    event = letter_event(letter_value("public.outbox", 7, 42, row, {}), SourceSettings())
    assert (event.event_id, event.created_at_ms) == ("r-1", 0)


def test_a_relay_letter_whose_columns_are_not_schemas_is_worded() -> None:
    # QA 33-c: {"payload": "bytes"} gave "'str' object has no attribute 'get'".
    import json

    from cdc_router.config.source import SourceSettings
    from cdc_router.errors import DecodeError
    from cdc_router.relay.letters import letter_event

    odd = json.dumps({"after": {"id": "r-1", "aggregatetype": "A", "aggregateid": "1",
                                "type": "T", "payload": "{}"},
                      "columns": {"payload": "bytes"}}).encode()
    with pytest.raises(DecodeError, match=r"its 'columns' must map each column to its schema"):
        letter_event(odd, SourceSettings())


def test_the_replay_tells_a_refused_clock_from_a_refused_record_as_run_does() -> None:
    # Review 33-3: with record_timestamp now, a broker refusing the host's clock made every
    # letter a dead letter again, blaming its row.
    from confluent_kafka import KafkaError as Error

    from cdc_router.router.poison import record_refusals

    cluster = cluster_with_letters("Customer")
    for stamped in ("now", "created_at"):
        replay = replayer(cluster, record_timestamp=stamped)
        assert replay._poison.is_refusal(Error(Error.INVALID_TIMESTAMP)) == (
            stamped == "created_at") == (Error.INVALID_TIMESTAMP in record_refusals(stamped))


@pytest.mark.parametrize("later", ["past max_ids", "past the window"])
def test_a_second_replay_delivers_nothing_again_once_the_replay_filter_forgot_the_ids(
        later: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 43: the second replay judged all but decode letters by the replay filter alone,
    # which keeps dedup.max_ids ids for dedup.window_ms; past either it delivered them again.
    cluster = cluster_with_letters("Customer", "Customer", "Customer")
    first = replayer(cluster, commit_interval_ms=5_000, transaction_timeout_ms=50_000)
    assert first.apply(first.plan(Selection())).committed == {"deliver": 3}
    dedup: dict[str, Any] = {}
    if later == "past max_ids":
        dedup["max_ids"] = 1
    else:
        in_8_days = time.time() + 8 * 24 * 3600
        monkeypatch.setattr(dlq_replay.time, "time", lambda: in_8_days)
    second = replayer(cluster, dedup, commit_interval_ms=5_000, transaction_timeout_ms=50_000)
    plan = second.plan(Selection())
    assert plan.counts() == {"already_delivered": 3}
    second.apply(plan)
    assert sorted(s.key for s in cluster.committed(CUSTOMERS)) == [b"e-0", b"e-1", b"e-2"]


def test_a_topic_librdkafka_calls_unknown_but_the_cluster_lists_is_retried_not_lettered_again(
        ) -> None:
    # Review 43: `run` and the relay retry such a batch (DestinationMetadata.check_refusal);
    # the replay dead-lettered the letter again.
    cluster = cluster_with_letters("Customer", "Customer")
    cluster.unknown_on_produce[CUSTOMERS] = 1  # librdkafka's metadata lags the cluster's
    replay = replayer(cluster, commit_interval_ms=5_000, transaction_timeout_ms=50_000)
    result = replay.apply(replay.plan(Selection()))
    assert result.committed == {"deliver": 2}
    assert sorted(s.key for s in cluster.committed(CUSTOMERS)) == [b"e-0", b"e-1"]
    assert len(cluster.committed(DLQ)) == 2  # the two letters, none again


def test_a_relay_letter_of_text_that_was_not_utf8_is_not_replayed() -> None:
    # QA 47-g F4: the letter holds the text escaped (`caf\xe9`), which a replay delivered as
    # seven characters, as the aggregate id, and the cleanup then deleted the row.
    from cdc_router.config.source import SourceSettings
    from cdc_router.errors import DecodeError
    from cdc_router.relay.letters import letter_event, letter_value

    row = {"id": "r-1", "aggregatetype": "A", "aggregateid": "caf\\xe9", "type": "T",
           "payload": "{}", "headers": None, "created_at": None}
    value = letter_value("public.outbox", 1, 2, row, {}, undecodable=DecodeError(
        "column 'aggregateid' is not UTF-8 text (byte 0xe9 at 3)"))
    with pytest.raises(DecodeError, match=r"not UTF-8 when the relay read it .*0xe9.*not "
                                          r"replayed: fix the row"):
        letter_event(value, SourceSettings())
    assert letter_event(letter_value("public.outbox", 1, 2, row, {}),
                        SourceSettings()).aggregate_id == "caf\\xe9"


def avro_replayer(cluster: FakeCluster, tmp_path: Path, registry: SchemaRegistryClient, *,
                  dry_run: bool) -> DeadLetterReplay:
    schema = tmp_path / "customer.avsc"
    schema.write_text(json.dumps({"type": "record", "name": "Customer", "fields": [
        {"name": "n", "type": "long"}]}))
    config = RouterConfig.model_validate({
        "source": {"topics": [RAW], "group_id": "g"}, "dead_letter": {"topic": DLQ},
        "dedup": {"changelog_topic": CHANGELOG},
        "schema_registry": {"url": "mock://dlq-replay-dry-run", "auto_register": True},
        "routes": [{"match": {"aggregate_type": "Customer"}, "topic": CUSTOMERS,
                    "format": "avro", "schema": str(schema)}]})
    serializer = AvroSerializer(config.routes, config.schema_registry, registry_client=registry)
    return DeadLetterReplay(
        compile_config(config, {"avro": serializer}), dry_run=dry_run,
        producer_factory=lambda conf: FakeProducer(cluster, conf),
        changelog_factory=lambda conf, topic: Changelog(cluster, topic),
        reader_factory=lambda conf, topic, **kwargs: FakeLetters(cluster),
        describe_factory=cluster.describe_factory,
        operations_factory=cluster.operations_factory)


def test_a_dry_run_registers_no_schema_and_the_replay_then_does(tmp_path: Path) -> None:
    # Review 48-d F8: a dry run (and a replay declined at its prompt, which the CLI plans as
    # one) registered the route's schema under its subject, with auto_register on.
    registry = SchemaRegistryClient.new_client({"url": "mock://dlq-replay-dry-run"})
    cluster = cluster_with_letters("Customer")
    dry = avro_replayer(cluster, tmp_path, registry, dry_run=True)
    assert dry.plan(Selection()).counts() == {"deliver": 1}
    assert registry.get_subjects() == []
    replay = avro_replayer(cluster, tmp_path, registry, dry_run=False)
    assert replay.apply(replay.plan(Selection())).committed == {"deliver": 1}
    assert registry.get_subjects() == [f"{CUSTOMERS}-value"]
    schema_id = registry.get_latest_version(f"{CUSTOMERS}-value").schema_id
    [delivered] = cluster.committed(CUSTOMERS)
    assert delivered.value[:5] == b"\x00" + schema_id.to_bytes(4, "big")


def test_a_replay_into_a_nats_route_with_nats_down_stops_with_75_to_run_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 56-e F-1: nats-server down through the three retries: "run it again", exit 1, which a
    # supervisor or script keyed on 75 takes for final. Nothing listens on the port below.
    import socket

    monkeypatch.setattr(dlq_replay, "_BACKOFF_S", 0.0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cluster = cluster_with_letters("Customer")
    config = RouterConfig.model_validate({
        "source": {"topics": [RAW], "group_id": "g"}, "dead_letter": {"topic": DLQ},
        "dedup": {"changelog_topic": CHANGELOG},
        "nats": {"url": f"nats://127.0.0.1:{port}", "connect_timeout_ms": 200,
                 "streams": [{"name": "CUSTOMERS", "subjects": ["customers.>"]}]},
        "routes": [{"match": {"aggregate_type": "Customer"},
                    "nats": {"subject": "customers.{type}"}}]})
    replay = replayer_of(cluster, config)
    try:
        with pytest.raises(DeliveryError, match=f"cannot connect to NATS at nats://127.0.0.1:"
                           f"{port}.*0 letters were committed before; run it again") as stopped:
            replay.apply(replay.plan(Selection()))
    finally:
        replay.close()
    assert stopped.value.exit_code == 75
    assert cluster.group_offsets == {} and cluster.committed(CHANGELOG)[1:] == []
