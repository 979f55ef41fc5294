"""The chaos campaign's own logic: the verifier's murmur2, the fault schedule, the report."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest
from confluent_kafka import Message

from cdc_router.router.partitioner import java_default_partition
from tests.chaos import faults, report, verifier

# Kafka's own vectors (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java).
KAFKA_VECTORS = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}


@pytest.mark.parametrize(("text", "expected"), KAFKA_VECTORS.items())
def test_verifier_murmur2_matches_kafka(text: str, expected: int) -> None:
    assert verifier.murmur2(text.encode()) == expected


def test_verifier_partition_agrees_with_the_router_on_random_ids() -> None:
    rng = random.Random(15)
    for _ in range(2000):
        text = "".join(rng.choice("abcxyz0123-éß") for _ in range(rng.randrange(0, 40)))
        partitions = rng.randrange(1, 13)
        assert verifier.java_partition(text, partitions) == java_default_partition(
            text.encode(), partitions)


def test_verifier_imports_nothing_from_cdc_router() -> None:
    source = Path(verifier.__file__).read_text()
    imported = {alias.name for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.ImportFrom)}
    assert not [name for name in imported if name.startswith(("cdc_router", "tests"))]


def test_schedule_is_seeded_and_has_every_fault_of_the_profile() -> None:
    plan = faults.schedule("full", seed=7)
    assert plan == faults.schedule("full", seed=7)
    assert plan != faults.schedule("full", seed=8)
    kinds = [fault.kind for fault in plan]
    assert {kind: kinds.count(kind) for kind in kinds} == faults.PROFILES["full"]
    assert kinds.count("router_kill") == 10
    assert all(0.2 <= fault.at_fraction <= 0.6 for fault in plan)


def test_short_profile_has_one_fault_of_each_kind() -> None:
    assert sorted(f.kind for f in faults.schedule("short", 1)) == sorted(faults.PROFILES["full"])


def test_verdict_fails_on_any_failure_count_or_new_topic() -> None:
    assert verifier.Verdict().passed
    assert not verifier.Verdict(duplicates=1).passed
    assert not verifier.Verdict(leaked_rows=3).passed
    assert not verifier.Verdict(new_topics=["connect-offsets-2"]).passed
    # Replays on the raw topic are what the router must absorb, not a failure by themselves.
    assert verifier.Verdict(raw_replays=120, dead_letter_duplicates=1).passed


def test_throughput_buckets_the_writers_timeline() -> None:
    timeline = [(100.5, 10), (101.0, 30), (106.0, 80)]
    assert report.throughput(timeline, start=100.0, bucket_s=5) == [(0.0, 6.0), (5.0, 10.0)]


def test_render_names_every_failure_and_finding() -> None:
    verdict = verifier.Verdict(ledger_events=10, expected_deliveries=9, lost=1)
    verdict.sample("lost", "some-id")
    record = faults.FaultRecord("connect_kill", 12.0, None, findings=["task FAILED"])
    built = report.build(header={"run": "r", "profile": "short", "seed": 1, "elapsed_s": 3.0},
                         faults=[record], verdict=verdict, duplicates_dropped=0,
                         write_errors=0, timeline=[], router_progress=[])
    text = report.render(built)
    assert not built["passed"]
    assert "FAILED lost: some-id" in text
    assert "FINDING: task FAILED" in text
    assert text.endswith("FAILED")


def test_last_words_skip_librdkafka_lines_but_not_ours_that_name_it() -> None:
    # The watchdog's line mentions librdkafka; the campaign once quoted the line before it.
    log = ("2026 level=INFO logger=cdc_router.router event=assigned partitions=raw[0]\n"
           "2026 level=CRITICAL logger=cdc_router.kafka event=client_call_hung "
           "call=send_offsets_to_transaction: librdkafka did not return within its timeout\n"
           "2026 level=INFO logger=cdc_router.librdkafka FAIL [thrd:1]: Disconnected\n\n")
    assert "event=client_call_hung" in faults.last_words(log)
    assert faults.last_words("") == "(empty log)"


def _delivered(topic: str, partition: int, offset: int, event_id: str) -> Message:
    return Message(topic=topic, partition=partition, offset=offset, key=event_id.encode(),
                   value=b"{}", headers=[("id", event_id.encode())])


def _check(ids: list[str], unmarked: frozenset[str] = frozenset()) -> verifier.Verdict:
    """check_destinations over `ids` delivered in this order, one aggregate, seq by id."""
    ledger = {i: verifier.LedgerEntry("w0-1", seq, "deliver", "orders")
              for seq, i in enumerate(sorted(set(ids)), 1)}
    partition = verifier.java_partition("w0-1", 2)
    records = [_delivered("orders", partition, offset, i) for offset, i in enumerate(ids)]
    verdict = verifier.Verdict()
    verifier.check_destinations(verdict, ledger, {"orders": records}, {"orders": 2}, unmarked)
    return verdict


def test_a_second_copy_of_an_id_whose_mark_an_abort_took_counts_apart_from_duplicates() -> None:
    # CI, stop 48: one batch delivered twice after the campaign's kafka-transactions abort
    # of a transaction hanging on the router's changelog and the group's offsets.
    clean = _check(["a", "b", "c", "a", "b", "d"], frozenset({"a", "b"}))
    assert clean.passed
    assert (clean.duplicates_after_abort, clean.order_violations_after_abort) == (2, 2)
    # c is not among the aborted marks: its second copy still fails.
    verdict = _check(["a", "b", "c", "a", "b", "d", "c"], frozenset({"a", "b"}))
    assert (verdict.duplicates, verdict.order_violations) == (1, 1)
    assert verdict.samples["duplicates"] == ["c x2"] and not verdict.passed


def test_a_third_copy_of_an_id_whose_mark_an_abort_took_fails_with_all_its_copies() -> None:
    # Review 49-d: an abort explains one more delivery of its batch, never two.
    verdict = _check(["a", "b", "a", "b", "a"], frozenset({"a", "b"}))
    assert (verdict.duplicates, verdict.duplicates_after_abort) == (2, 1)
    assert verdict.order_violations == 2 and verdict.order_violations_after_abort == 1
    assert verdict.samples["duplicates"] == ["a x3"] and not verdict.passed


def test_without_aborted_marks_every_second_copy_is_a_duplicate() -> None:
    ledger = {"a": verifier.LedgerEntry("w0-1", 1, "deliver", "orders")}
    partition = verifier.java_partition("w0-1", 2)
    verdict = verifier.Verdict()
    verifier.check_destinations(verdict, ledger, {"orders": [
        _delivered("orders", partition, 0, "a"), _delivered("orders", partition, 1, "a")]},
        {"orders": 2})
    assert (verdict.duplicates, verdict.order_violations, verdict.duplicates_after_abort) == \
        (1, 1, 0)


def test_a_mark_gives_its_ts_and_ids_and_what_is_not_a_mark_gives_none() -> None:
    def mark(value: bytes) -> Message:
        return Message(topic="dedup", partition=0, offset=0, key=b"batch:x", value=value)
    assert verifier._mark(mark(b'{"ts":1,"ids":["a","b"]}')) == (1, ["a", "b"])
    assert verifier._mark(mark(b'{"ts":3,"ids":["c",7]}')) == (3, ["c"])
    assert verifier._mark(mark(b"not json")) == (None, [])
    assert verifier._mark(mark(b'{"ts":2}')) == (None, [])


def test_render_names_each_hanging_abort_in_full() -> None:
    abort = verifier.HangingAbort("chaos-x-dedup", 0, 31, 3007, 2, 40)
    fault = faults.FaultRecord("kafka_kill", 20.0, 146.0, ["kafka pid 1 killed", "exit 75"],
                               hanging_aborts=[abort])
    result = report.build(header={"run": "r", "profile": "short", "seed": 1, "elapsed_s": 1.0},
                          faults=[fault], verdict=verifier.Verdict(), duplicates_dropped=0,
                          write_errors=0, timeline=[], router_progress=[])
    assert ("NOTE: after kafka_kill, aborted a hanging transaction on chaos-x-dedup-0 from "
            "offset 31 (producer 3007, epoch 2; end offset after the abort 40)"
            ) in report.render(result).splitlines()
    assert str(abort) == "chaos-x-dedup-0 from offset 31 (producer 3007, epoch 2)"
