"""The transaction object against fake clients: the numbered commit procedure, its errors."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc_router.config.delivery import DeliverySettings
from cdc_router.dead_letter import dead_letter
from cdc_router.errors import EXIT_RESTART, FatalKafkaError, MemberFenced, TransactionInDoubt
from cdc_router.kafka.commit_stamp import committed_ms
from cdc_router.kafka.errors import rival_hint
from cdc_router.kafka.producer import LatchingProducer
from cdc_router.nats.publisher import BatchAcks, NatsMessage
from cdc_router.router.routing import OutboundRecord
from cdc_router.router.transaction import BatchFailed, RecordRefused, Transaction
from cdc_router.router.values import Delivered
from tests.unit.router_fakes import (
    CHANGELOG,
    DLQ,
    ORDERS,
    RAW,
    FakeCluster,
    FakeConsumer,
    FakeProducer,
    marked_ids,
)


def transaction(cluster: FakeCluster, guarantee: str = "exactly_once"
                ) -> tuple[Transaction, list[float]]:
    config: dict[str, Any] = {"bootstrap.servers": "x"}
    if guarantee == "exactly_once":
        config["transactional.id"] = "t-1"
    producer = LatchingProducer(config, lambda conf: FakeProducer(cluster, conf))
    consumer = FakeConsumer(cluster, {}, on_idle=lambda: None)
    slept: list[float] = []
    txn = Transaction(producer, consumer, delivery=DeliverySettings(guarantee=guarantee),
                      mark_group="g",
                      changelog_topic=CHANGELOG, bootstrap="x", sleep=slept.append)
    txn.init()
    return txn, slept


def record(event_id: str, value: bytes = b"{}", timestamp_ms: int | None = 1) -> OutboundRecord:
    return OutboundRecord(topic=ORDERS, key=event_id.encode(), value=value, partition=0,
                          headers=(("id", event_id.encode()),), timestamp_ms=timestamp_ms,
                          event_id=event_id, route_index=0, format="json")


def add(txn: Transaction, offset: int, event_id: str, **kwargs: Any) -> None:
    txn.begin()
    txn.consumed(RAW, 0, offset)
    txn.produce(record(event_id, **kwargs), (RAW, 0, offset))
    txn.mark(event_id, 1000)
    txn.delivered(Delivered(event_id, ORDERS, None))


def test_exactly_once_commits_records_marks_and_offsets_together() -> None:
    cluster = FakeCluster()
    txn, _ = transaction(cluster)
    add(txn, 0, "e-0")
    add(txn, 1, "e-1")
    assert cluster.committed(ORDERS) == [] and cluster.committed(CHANGELOG) == []
    committed = txn.commit()
    assert [d.event_id for d in committed.delivered] == ["e-0", "e-1"]
    assert [s.key for s in cluster.committed(ORDERS)] == [b"e-0", b"e-1"]
    assert marked_ids(cluster.committed(CHANGELOG)) == ["e-0", "e-1"]
    assert len(cluster.committed(CHANGELOG)) == 1  # one record for the batch
    assert cluster.group_offsets == {(RAW, 0): 2}
    assert committed.offsets == {(RAW, 0): 2}  # the router's lag is counted from them
    stamp = committed_ms(cluster.offset_metadata[(RAW, 0)])
    assert stamp is not None and abs(stamp - time.time() * 1000) < 60_000
    steps = [entry for entry in cluster.journal if not entry.startswith("acked")]
    assert steps == ["flush", "send_offsets", "commit"]
    assert not txn.open


def test_what_a_batch_passed_over_is_handed_on_at_its_commit_only() -> None:
    # The counters of skipped records and dropped replays count each record once: an aborted
    # batch's are forgotten with it, as its records are read again.
    cluster = FakeCluster()
    txn, _ = transaction(cluster)
    add(txn, 0, "e-0")
    txn.passed_over("heartbeat")
    txn.passed_over(None)
    txn.abort()
    add(txn, 0, "e-0")
    txn.passed_over("heartbeat")
    committed = txn.commit()
    assert committed.passed_over == ["heartbeat"]
    assert [d.event_id for d in committed.delivered] == ["e-0"]


def test_a_refused_record_fails_the_batch_and_abort_names_it() -> None:
    cluster = FakeCluster(refuse=lambda topic, value, ts: KafkaError.INVALID_TIMESTAMP
                          if value == b"future" else None)
    txn, _ = transaction(cluster)
    add(txn, 0, "e-0")
    add(txn, 1, "e-1", value=b"future")
    with pytest.raises(BatchFailed) as failed:
        txn.commit()
    assert failed.value.kafka_error is not None
    failures = txn.abort()
    # The whole request to orders[0] was refused: both records are named, with their source.
    assert {(f.source, f.error.code()) for f in failures} == {
        ((RAW, 0, 0), KafkaError.INVALID_TIMESTAMP), ((RAW, 0, 1), KafkaError.INVALID_TIMESTAMP)}
    assert cluster.committed(ORDERS) == [] and cluster.group_offsets == {}


def test_a_record_librdkafka_refuses_on_the_spot_is_record_refused() -> None:
    cluster = FakeCluster(max_message_bytes=10)
    txn, _ = transaction(cluster)
    txn.begin()
    with pytest.raises(RecordRefused, match="MSG_SIZE_TOO_LARGE") as raised:
        txn.produce(record("e-0", value=b"x" * 11), (RAW, 0, 0))
    # QA, session 29: librdkafka's text says "Broker" although no broker saw the record.
    assert "refused by the router's producer before sending, not by a broker" in \
        str(raised.value) and "kafka.producer.message.max.bytes" in str(raised.value)


def test_retriable_commit_errors_are_retried_abortable_ones_fail_the_batch() -> None:
    cluster = FakeCluster(commit_failures=[KafkaError(KafkaError._TIMED_OUT, retriable=True)] * 2)
    txn, slept = transaction(cluster)
    add(txn, 0, "e-0")
    txn.commit()
    assert slept == [0.1, 0.5] and len(cluster.committed(ORDERS)) == 1
    cluster.commit_failures = [KafkaError(KafkaError._TIMED_OUT, txn_requires_abort=True)]
    add(txn, 1, "e-1")
    with pytest.raises(BatchFailed):
        txn.commit()


@pytest.mark.parametrize("step", ["commit", "offsets"])
def test_a_commit_unanswered_through_every_retry_exits_for_a_restart_without_an_abort(
        step: str) -> None:
    # librdkafka 2.16 (measured against a paused broker): a commit_transaction that timed out
    # can only be resumed; abort_transaction answers _CONFLICT for ever, even once the broker
    # is back. Only a new process's init_transactions settles it.
    timed_out = KafkaError(KafkaError._TIMED_OUT, "retry call to resume", retriable=True)
    cluster = FakeCluster()
    txn, slept = transaction(cluster)
    add(txn, 0, "e-0")
    if step == "commit":
        cluster.commit_failures = [timed_out] * 6
    else:
        cluster.offsets_failures = [timed_out] * 6
    with pytest.raises(TransactionInDoubt, match=rf"step '{step}' got no answer.*exits with 75"
                       ) as raised:
        txn.commit()
    assert raised.value.exit_code == EXIT_RESTART
    assert slept == [0.1, 0.5, 1.0, 2.0, 5.0]
    assert not txn.open
    txn.discard()  # the router's way out: no abort_transaction of the unresolved commit
    assert "abort" not in cluster.journal and cluster.committed(ORDERS) == []


def test_a_fence_meeting_a_commits_retry_is_in_doubt_not_a_renewal() -> None:
    # Review 47-h F1: the try that timed out may have committed; a renewal in this process
    # would forget the batch's ids (a later replay of them went out twice), a restart reads
    # them from the changelog. A fence at the first try renews as before.
    fenced = KafkaError(KafkaError._FENCED, "fenced", fatal=True)
    cluster = FakeCluster(commit_failures=[KafkaError(KafkaError._TIMED_OUT, retriable=True),
                                           fenced])
    txn, _ = transaction(cluster)
    add(txn, 0, "e-0")
    with pytest.raises(TransactionInDoubt, match="step 'commit'"):
        txn.commit()
    cluster = FakeCluster(commit_failures=[fenced])
    txn, _ = transaction(cluster)
    add(txn, 0, "e-0")
    with pytest.raises(FatalKafkaError) as raised:
        txn.commit()
    assert not isinstance(raised.value, TransactionInDoubt)


def test_a_batch_older_than_its_transaction_publishes_no_jetstream_record() -> None:
    # Review 47-h F2: a slow record's JetStream message was published at the commit of a
    # batch Kafka had aborted for its age; read again, it was dead-lettered too: on the
    # stream and in the dead-letter topic both.
    now = [0.0]
    published: list[str] = []

    class Stream:
        def publish_batch(self, messages: list[NatsMessage]) -> BatchAcks:
            published.extend(message.msg_id for message in messages)
            return BatchAcks(len(messages), 0)

    cluster = FakeCluster()
    producer = LatchingProducer({"bootstrap.servers": "x", "transactional.id": "t-1"},
                                lambda conf: FakeProducer(cluster, conf))
    txn = Transaction(producer, FakeConsumer(cluster, {}, on_idle=lambda: None),
                      delivery=DeliverySettings(), mark_group="g", changelog_topic=CHANGELOG,
                      bootstrap="x", sleep=lambda s: None, clock=lambda: now[0],
                      publisher=Stream())  # type: ignore[arg-type]
    txn.init()
    for offset, event_id in enumerate(("n-0", "n-1")):
        txn.begin()
        txn.consumed(RAW, 0, offset)
        txn.produce(replace(record(event_id), topic="orders.x", partition=None, nats=True),
                    (RAW, 0, offset))
        now[0] += 21.0 if event_id == "n-0" else 1.0  # the default timeout is 20 s
        if event_id == "n-0":
            with pytest.raises(BatchFailed, match=r"outlived delivery\.transaction_timeout_ms"):
                txn.commit()
            txn.abort()
        else:
            txn.commit()
    assert published == ["n-1"]


def test_an_abort_refused_as_conflicting_exits_for_a_restart() -> None:
    cluster = FakeCluster()
    txn, slept = transaction(cluster)
    add(txn, 0, "e-0")
    cluster.abort_failures = [KafkaError(
        KafkaError._CONFLICT, "Conflicting commit_transaction API call is already in progress",
        retriable=True)]
    with pytest.raises(TransactionInDoubt, match="step 'abort'"):
        txn.abort()
    assert slept == []


def test_at_least_once_offsets_unanswered_fail_the_batch_not_the_process() -> None:
    cluster = FakeCluster()
    txn, _ = transaction(cluster, "at_least_once")
    add(txn, 0, "e-0")
    cluster.offsets_failures = [KafkaError(KafkaError._TIMED_OUT, retriable=True)] * 6
    with pytest.raises(BatchFailed, match="still fails after 6 tries"):
        txn.commit()


def test_a_fenced_producer_is_fatal() -> None:
    cluster = FakeCluster()
    txn, _ = transaction(cluster)
    add(txn, 0, "e-0")
    cluster.fenced = True
    with pytest.raises(FatalKafkaError, match="for good"):
        txn.commit()


def test_a_fence_served_by_the_flush_is_fatal_and_names_who_else_takes_the_id() -> None:
    # confluent-kafka raises a producer's fatal error from its next flush() (CI, session 29);
    # `dlq replay` and `outbox republish` say who else takes their ids, not "an instance".
    cluster = FakeCluster(fence_on_serve=True)
    txn, _ = transaction(cluster)
    txn.fenced_hint = "another `dlq replay` of this pipeline took over"
    add(txn, 0, "e-0")
    cluster.fence()
    with pytest.raises(FatalKafkaError, match=r"for good \(_FENCED.*another `dlq replay`"):
        txn.commit()


def test_a_refused_transactional_id_is_a_missing_grant_not_another_instance() -> None:
    # QA 35-e F3: TRANSACTIONAL_ID_AUTHORIZATION_FAILED said "another instance may use the
    # same instance id"; the edges name the id and the grant (test_cli_errors.py).
    cluster = FakeCluster()
    txn, _ = transaction(cluster)
    add(txn, 0, "e-0")
    cluster.commit_failures = [KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                          "Transactional Id authorization failed")]
    with pytest.raises(FatalKafkaError) as raised:
        txn.commit()
    assert raised.value.code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    failed = txn._failed(KafkaException(KafkaError(
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)))
    assert "a grant is missing, not a fence" in str(failed)
    assert "another instance" not in str(failed)


def test_a_fenced_static_member_exits_for_a_restart_not_for_good() -> None:
    # The chaos campaign (seed 15): after a broker outage longer than session.timeout.ms the
    # coordinator fenced this very process's member; a new process rejoins at once.
    cluster = FakeCluster()
    txn, _ = transaction(cluster)
    add(txn, 0, "e-0")
    cluster.commit_failures = [KafkaError(KafkaError.FENCED_INSTANCE_ID,
                                          "Static consumer fenced by other consumer")]
    with pytest.raises(MemberFenced, match=r"FENCED_INSTANCE_ID.*exiting with 75") as raised:
        txn.commit()
    assert raised.value.exit_code == EXIT_RESTART == 75
    assert FatalKafkaError("x").exit_code == 1


def test_at_least_once_a_failed_delivery_leaves_no_changelog_mark() -> None:
    # Issue #12 item 1: a mark for an event whose record was never delivered makes the
    # re-read event a "replay", dropped with its offset committed: lost.
    cluster = FakeCluster(refuse=lambda topic, value, ts: KafkaError.MSG_SIZE_TOO_LARGE
                          if value == b"big" else None)
    txn, _ = transaction(cluster, "at_least_once")
    add(txn, 0, "e-0", value=b"big")
    with pytest.raises(BatchFailed):
        txn.commit()
    txn.abort()
    assert cluster.committed(CHANGELOG) == []
    assert cluster.group_offsets == {}


def test_at_least_once_marks_go_after_every_record_is_acked_and_offsets_last() -> None:
    cluster = FakeCluster()
    txn, _ = transaction(cluster, "at_least_once")
    add(txn, 0, "e-0")
    txn.dead_letter(DLQ, dead_letter(topic=RAW, partition=0, offset=1, key=None, value=b"x",
                                     original_headers=[], stage="decode",
                                     error=ValueError("bad")))
    txn.consumed(RAW, 0, 1)
    txn.commit()
    assert cluster.journal == ["flush", f"acked {ORDERS}", f"acked {DLQ}", "flush",
                               f"acked {CHANGELOG}", "commit_offsets"]
    assert cluster.group_offsets == {(RAW, 0): 2}
    assert committed_ms(cluster.offset_metadata[(RAW, 0)]) is not None


def test_marks_take_the_key_prefix_given_and_a_batch_without_offsets_sends_none() -> None:
    cluster = FakeCluster()
    producer = LatchingProducer({"bootstrap.servers": "x", "transactional.id": "t-1"},
                                lambda conf: FakeProducer(cluster, conf))
    txn = Transaction(producer, None, delivery=DeliverySettings(), changelog_topic=CHANGELOG,
                      mark_group="g", bootstrap="x", mark_key_prefix="replayed:")
    txn.init()
    txn.begin()
    txn.produce(record("e-0"), (RAW, 0, 0))
    txn.mark("e-0", 1000)
    txn.commit()
    assert [s.key[:17] for s in cluster.committed(CHANGELOG)] == [b"replayed:1:g:e-0#"]
    assert cluster.group_offsets == {}
    assert "send_offsets" not in cluster.journal


@pytest.mark.parametrize(("code", "hint"), [
    (KafkaError.NOT_COORDINATOR, "its transaction coordinator is not ready yet"),
    (KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "its transaction coordinator is not ready yet"),
    (KafkaError._TRANSPORT, "(kafka.bootstrap_servers) reachable?"),
])
def test_an_init_that_fails_names_a_coordinator_still_loading_not_an_unreachable_cluster(
        code: int, hint: str) -> None:
    # QA 46-a F4: a start right after the broker's own, its coordinator loading, exited 75
    # asking whether the cluster was reachable, "after 1 tries".
    cluster = FakeCluster()
    txn, _ = transaction(cluster)
    cluster.init_failures = [KafkaError(code, retriable=True)]
    with pytest.raises(BatchFailed, match="step 'init' still fails after its one try") as failed:
        txn.init()
    assert hint in str(failed.value)


def test_a_routers_fence_names_the_settings_two_pipelines_may_share() -> None:
    # QA 63-b F-3: two pipelines on the default source.group_id on one host fenced each
    # other, and the line said only "another instance may use the same instance id".
    cluster = FakeCluster()
    txn, _ = transaction(cluster)
    add(txn, 0, "e-0")
    cluster.fenced = True
    with pytest.raises(FatalKafkaError) as raised:
        txn.commit()
    assert str(raised.value).endswith(
        "another process uses its transactional id t-1: an instance with the same "
        "--instance-id (default: the host name), or another pipeline whose source.group_id "
        "(the default of delivery.transactional_id) is 'g' too; give each pipeline its own "
        "source.group_id")


def test_a_set_transactional_id_is_the_setting_named() -> None:
    hint = rival_hint("shop", "g")
    assert "whose delivery.transactional_id is 'shop' too" in hint
    # Review 63: another source.group_id does not change a transactional id that is set.
    assert hint.endswith("give each pipeline its own delivery.transactional_id"), hint


def test_a_step_fenced_for_good_names_the_rivals_too() -> None:
    # QA 63-b F-3: the second pipeline's line was "Kafka transaction step 'abort' failed
    # for good: _FENCED: ..." and no hint at all.
    cluster = FakeCluster()
    txn, _ = transaction(cluster)
    add(txn, 0, "e-0")
    cluster.commit_failures = [KafkaError(KafkaError._FENCED, "fenced by a newer instance",
                                          fatal=True)]
    with pytest.raises(FatalKafkaError) as raised:
        txn.commit()
    assert "step 'commit' failed for good" in str(raised.value)
    assert "another pipeline whose source.group_id" in str(raised.value)
