"""OutboxRouter against fake clients over a fake cluster (tests/unit/router_fakes.py)."""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from cdc_router.cli.run import GC_GEN0, tune_gc
from cdc_router.config.compiled import compile_config
from cdc_router.config.model import RouterConfig
from cdc_router.errors import (
    EXIT_RESTART,
    ConfigError,
    FatalKafkaError,
    GrantRevoked,
    JetStreamError,
    JetStreamRefused,
    MemberFenced,
    OffsetsUnfetched,
    ProducerHung,
    RestoreFailed,
    TransactionInDoubt,
)
from cdc_router.kafka import closing, membership
from cdc_router.kafka.budget import MAX_RENEWALS
from cdc_router.kafka.reader import ReadTimedOut
from cdc_router.kafka.watchdog import CallWatchdog
from cdc_router.nats.publisher import BatchAcks, NatsMessage
from cdc_router.router.loop import POLL_BATCH, OutboxRouter
from cdc_router.router.metrics import RouterMetrics
from cdc_router.router.missing_columns import RUN_LIMIT
from cdc_router.router.partitioner import java_default_partition
from cdc_router.router.replay import DEAD_LETTERED_KEY_PREFIX, changelog_records
from tests.unit.consumer_fakes import closed_within
from tests.unit.router_fakes import (
    CHANGELOG,
    DLQ,
    ORDERS,
    RAW,
    FakeChangelog,
    FakeCluster,
    FakeConsumer,
    FakeProducer,
    Stored,
    marked_ids,
    raw_event,
)

NOW_US = int(time.time() * 1_000_000)
HOUR_US = 3600 * 1_000_000

# One batch however slow the host: commits only at a revoke, a stop or a full poll.
SLOW_COMMIT = {"commit_interval_ms": 6000, "transaction_timeout_ms": 60_000}


def broker_timestamp_rule(topic: str, value: bytes | None, timestamp: int | None) -> int | None:
    """message.timestamp.after.max.ms = 1 hour, as Kafka 4.x defaults."""
    if timestamp is not None and timestamp > time.time() * 1000 + 3600_000:
        return KafkaError.INVALID_TIMESTAMP
    return None


class Harness:
    """One router over `cluster`; stops once every raw record's offset is committed."""

    def __init__(self, cluster: FakeCluster, hooks: list[Any] | None = None,
                 publisher: Any = None, **config: Any) -> None:
        self.cluster = cluster
        self.hooks = hooks or []
        self.waits: list[float] = []
        self.metrics = RouterMetrics()
        self.consumer: FakeConsumer | None = None
        self.consumers: list[FakeConsumer] = []  # every one built, a renewed one too
        self.idle_calls = 0
        self.handed: list[tuple[str, str]] = []  # (id, topic) to the cleanup, at each commit
        self.started = 0  # on_started calls (the cleanup's start)
        settings = RouterConfig.model_validate({
            "source": {"topics": [RAW], "group_id": "g"},
            "routes": config.pop("routes", [{"topic": ORDERS}]),
            "dead_letter": {"topic": DLQ}, "dedup": {"changelog_topic": CHANGELOG},
            **config})
        self.router = OutboxRouter(
            compile_config(settings), instance_id="i-1", metrics=self.metrics,
            on_delivered=lambda done: self.handed.extend((e.event_id, e.topic) for e in done),
            on_started=self._started, producer_factory=lambda conf: FakeProducer(cluster, conf),
            consumer_factory=self._consumer, wait=self.waits.append,
            changelog_factory=lambda conf, topic: FakeChangelog(cluster, topic),
            describe_factory=cluster.describe_factory, publisher=publisher,
            operations_factory=cluster.operations_factory,
            members_factory=cluster.members_factory, holder_factory=cluster.holder_factory)

    def _started(self) -> None:
        self.started += 1

    def _consumer(self, conf: dict[str, Any]) -> FakeConsumer:
        consumer = self.consumer = FakeConsumer(self.cluster, conf, on_idle=self._idle)
        self.consumers.append(consumer)
        if self.hooks:  # run before the second consume(), with the first poll's batch open
            consumer.before_consume.append(lambda c: c.before_consume.extend(self.hooks))
        return consumer

    def _idle(self) -> None:
        self.idle_calls += 1
        done = all(self.cluster.group_offsets.get((RAW, p), 0) == len(log)
                   for p, log in self.cluster.raw.items())
        if done or self.idle_calls > 2_000:
            self.router.stop()

    def run(self) -> Harness:
        self.router.run()
        assert self.idle_calls <= 2_000, "the router never committed everything"
        return self

    def metric(self, name: str, **labels: str) -> float:
        """The sample of `name` with `labels`; without labels, its samples summed."""
        if labels:
            return self.metrics.registry.get_sample_value(name, labels) or 0.0
        return sum(sample.value for family in self.metrics.registry.collect()
                   for sample in family.samples if sample.name == name)

    def delivered(self) -> list[str]:
        return [s.key.decode() for s in self.cluster.committed(ORDERS) if s.key]

    def letters(self) -> list[Stored]:
        return self.cluster.committed(DLQ)


def cluster_with(*values: bytes | None, **kwargs: Any) -> FakeCluster:
    cluster = FakeCluster(**kwargs)
    cluster.raw[0] = [(b"k", value) for value in values]
    return cluster


def events(count: int, **columns: Any) -> list[bytes]:
    return [raw_event(f"e-{i}", aggregate_id=f"order-{i % 3}", **columns) for i in range(count)]


def test_every_event_once_with_its_offsets_and_changelog_marks() -> None:
    cluster = cluster_with(*events(30))
    harness = Harness(cluster, delivery={"commit_max_records": 10}).run()
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(30))
    assert sorted(marked_ids(cluster.committed(CHANGELOG))) == sorted(
        f"e-{i}" for i in range(30))
    # One changelog record per batch, not per event (#14).
    assert len(cluster.committed(CHANGELOG)) == cluster.journal.count("commit")
    assert cluster.group_offsets == {(RAW, 0): 30}
    assert cluster.journal.count("commit") >= 3
    assert harness.waits == [] and harness.metric("cdc_router_batches_aborted_total") == 0


def test_every_dead_letter_stage_and_the_stream_goes_on() -> None:
    nested = '{"a": ' * 3000 + "1" + "}" * 3000
    poison = {
        "decode": b'{"op": "c", "after": {"id": ',
        "decode-depth": raw_event("p-headers", headers=nested),
        "route": raw_event("p-route", event_type="Missing"),
        "serialize": raw_event("p-payload", payload=nested),
        "produce": raw_event("p-future", created_at_us=NOW_US + 3 * HOUR_US),
    }
    good = events(12, created_at_us=NOW_US)
    cluster = cluster_with(*good[:6], *poison.values(), *good[6:], refuse=broker_timestamp_rule)
    harness = Harness(cluster, routes=[{"match": {"type": "Missing"}, "topic": "nowhere"},
                                       {"topic": ORDERS}]).run()
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(12))
    by_stage = {(s.header("dlq.stage"), s.header("dlq.error.class")) for s in harness.letters()}
    assert by_stage == {("decode", "DecodeError"), ("route", "RouteError"),
                        ("serialize", "SerializeError"), ("produce", "DeliveryError")}
    assert len(harness.letters()) == 5
    assert harness.metric("cdc_router_batches_aborted_total") <= 4
    assert harness.waits == []
    # Counted once each, at commit: the produce refusal aborted the batch that lettered the
    # others, and the re-read lettered them again (QA 43-a: alerts on the metric over-counted).
    assert {stage: harness.metric("cdc_router_dead_letters_total", stage=stage) for stage in
            ("decode", "route", "serialize", "produce")} == {
        "decode": 2.0, "route": 1.0, "serialize": 1.0, "produce": 1.0}
    # The ids dead-lettered after decoding are marked, keyed as dead letters: the cleanup's
    # sweep must never take them for deliveries, letter or no letter (QA, session 25).
    changelog = cluster.committed(CHANGELOG)
    dead = [record for record in changelog if record.key.startswith(b"dead:")]
    assert sorted(marked_ids(dead)) == ["p-future", "p-payload", "p-route"]
    assert not set(marked_ids([r for r in changelog if r not in dead])) & {
        "p-future", "p-payload", "p-route", "p-headers"}


def test_a_timestamp_the_broker_refuses_costs_at_most_two_aborts_then_a_dead_letter() -> None:
    values = events(20, created_at_us=NOW_US)
    values[9] = raw_event("p-future", created_at_us=NOW_US + 3 * HOUR_US)
    cluster = cluster_with(*values, refuse=broker_timestamp_rule)
    harness = Harness(cluster).run()
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(20) if i != 9)
    [letter] = harness.letters()
    assert letter.header("dlq.stage") == "produce"
    assert letter.header("dlq.event.id") == "p-future"
    assert "INVALID_TIMESTAMP" in letter.header("dlq.error.message")
    assert "delivery.record_timestamp: now" in letter.header("dlq.error.message")
    # Two refusals, each followed by the abort in which librdkafka bumps its epoch.
    assert harness.metric("cdc_router_batches_aborted_total") <= 4
    assert harness.waits == []  # a record's fault: no backoff


def test_with_the_topics_limits_known_the_refused_timestamp_is_never_produced() -> None:
    values = events(20, created_at_us=NOW_US)
    values[9] = raw_event("p-future", created_at_us=NOW_US + 3 * HOUR_US)
    cluster = cluster_with(*values, refuse=broker_timestamp_rule)
    cluster.topic_configs[ORDERS] = {"message.timestamp.type": "CreateTime",
                                     "message.timestamp.after.max.ms": "3600000"}
    harness = Harness(cluster).run()
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(20) if i != 9)
    [letter] = harness.letters()
    assert (letter.header("dlq.stage"), letter.header("dlq.event.id")) == ("produce", "p-future")
    assert "dead-lettered before producing" in letter.header("dlq.error.message")
    assert harness.metric("cdc_router_batches_aborted_total") == 0, "no refusal, no abort"


def test_record_timestamp_now_delivers_the_row_with_a_future_created_at() -> None:
    values = [*events(5, created_at_us=NOW_US),
              raw_event("future", created_at_us=NOW_US + 3 * HOUR_US)]
    cluster = cluster_with(*values, refuse=broker_timestamp_rule)
    harness = Harness(cluster, delivery={"record_timestamp": "now"}).run()
    assert "future" in harness.delivered() and harness.letters() == []
    assert all(s.timestamp is None for s in cluster.committed(ORDERS))


def test_a_batch_failing_for_cluster_reasons_backs_off_and_dead_letters_nothing() -> None:
    timeout = KafkaError(KafkaError._TIMED_OUT, "coordinator moving", txn_requires_abort=True)
    cluster = cluster_with(*events(10), commit_failures=[timeout] * 9)
    harness = Harness(cluster).run()
    assert harness.waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert harness.letters() == []
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(10))
    assert harness.metric("cdc_router_consecutive_aborts") == 0  # reset by the commit


def test_a_producer_that_never_gets_metadata_again_is_renewed_after_aborts_in_a_row() -> None:
    # QA 37-b: after the controller fenced the only broker for 4.5 s, the producer's metadata
    # requests failed for good while Kafka answered new clients; the router backed off for ever.
    cluster = cluster_with(*events(4))
    harness: Harness

    def lose_metadata(consumer: FakeConsumer) -> None:
        cluster.raw[0] += [(b"k", value) for value in events(8)[4:]]
        cluster.metadata_lost_producers = cluster.producers_built
        harness.router._destinations.clear()  # its cached counts expire: asked again

    harness = Harness(cluster, hooks=[lose_metadata])
    harness.run()
    assert sorted(harness.delivered()) == [f"e-{i}" for i in range(8)]
    assert harness.waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]  # then a new producer
    assert cluster.producers_built == 2 and cluster.producers_purged == 1


def test_a_consumer_whose_rewinds_keep_failing_is_renewed_after_aborts_in_a_row() -> None:
    # QA 41-a: after a broker outage both instances' consumers timed out every committed()
    # ("Failed to get committed offsets: Local: Timed out") while Kafka answered new clients:
    # the loop never polled again, so the group stayed empty; renewing the producer did not
    # help, and nothing was delivered for minutes until the processes were restarted.
    timeout = KafkaError(KafkaError._TIMED_OUT, "coordinator moving", txn_requires_abort=True)
    cluster = cluster_with(*events(4), commit_failures=[timeout])

    def stale_first(conf: dict[str, Any]) -> FakeConsumer:
        consumer = made(conf)
        answered = consumer.committed

        def committed(partitions: Any, timeout: float) -> Any:
            if not rewinds:  # at its assignment: it answers
                rewinds.append(1)
                return answered(partitions, timeout)
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                            "Failed to get committed offsets: Local: Timed out"))
        if len(harness.consumers) == 1:
            consumer.committed = committed  # type: ignore[method-assign]
        return consumer

    rewinds: list[int] = []

    def wait(seconds: float) -> None:
        harness.waits.append(seconds)
        if len(harness.waits) > 20:
            harness.router.stop()  # never renewed: no poll, no end

    harness = Harness(cluster)
    made, harness.router._consumer_factory = harness.router._consumer_factory, stale_first
    harness.router._wait = wait
    harness.run()
    assert harness.waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]  # then a new consumer too
    assert len(harness.consumers) == 2 and closed_within(harness.consumers[0])
    assert sorted(harness.delivered()) == [f"e-{i}" for i in range(4)]  # each once


def test_a_producer_fenced_again_after_its_renewal_stops_the_router() -> None:
    # A rival that fences every producer of the id: one renewal, then the router stops.
    cluster = cluster_with(*events(10))
    harness = Harness(cluster)
    cluster.fenced = True
    with pytest.raises(FatalKafkaError, match="_FENCED"):
        harness.run()
    assert cluster.committed(ORDERS) == [] and cluster.group_offsets == {}
    assert harness.consumer is not None and harness.consumer.closed


def _close_fails(self: FakeConsumer) -> None:
    raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down at close"))


def test_a_close_failing_on_the_way_out_keeps_the_error_the_router_leaves_on(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 30: consumer.close() raised from run()'s finally and replaced the fence (and its
    # exit code) with a bare KafkaException.
    monkeypatch.setattr(FakeConsumer, "close", _close_fails)
    cluster = cluster_with(*events(10))
    harness = Harness(cluster)
    cluster.fenced = True
    with pytest.raises(FatalKafkaError, match="_FENCED"):
        harness.run()
    assert "event=close_failed client=FakeConsumer error=KafkaError" in caplog.text
    assert "broker down at close" in caplog.text


def test_a_destination_the_principal_may_not_write_to_is_its_events_dead_letter() -> None:
    # QA 31-c: Describe without Write on one route's topic: the refusal came in
    # AddPartitionsToTxn, the abort failed INVALID_TXN_STATE, and the router stopped at every
    # restart, every route with it.
    cluster = cluster_with(*events(4), raw_event("p-1", aggregate_type="Payment"))
    cluster.granted[ORDERS] = frozenset({"READ", "DESCRIBE"})
    cluster.partitions["pay"] = 1
    harness = Harness(cluster, routes=[{"match": {"aggregate_type": "Payment"}, "topic": "pay"},
                                       {"topic": ORDERS}]).run()
    assert [s.key for s in cluster.committed("pay")] == [b"p-1"]
    reasons = [dict(s.headers)["dlq.error.message"].decode() for s in cluster.committed(DLQ)]
    assert len(reasons) == 4 and all(
        f"may not write topic {ORDERS} (the broker grants it describe, read there): grant it "
        "Write on the topic" in reason for reason in reasons), reasons
    assert harness.metric("cdc_router_dead_letters_total", stage="route") == 4


def test_a_dead_letter_topic_the_principal_may_not_write_to_stops_the_start() -> None:
    cluster = cluster_with(*events(2))
    cluster.granted[DLQ] = frozenset({"DESCRIBE"})
    with pytest.raises(ConfigError, match=r"field 'dead_letter.topic': .*may not write topic "):
        Harness(cluster).run()
    assert cluster.committed(ORDERS) == []


@pytest.mark.parametrize("cleanup", ["delete", "none"])
def test_with_cleanup_a_dead_letter_topic_the_principal_may_not_read_stops_the_start(
        cleanup: str) -> None:
    # Review 51-d F8: the cleanup's sweep reads the dead-letter topic; refused, it stalled
    # without a line. Without the cleanup nothing reads it: the router starts.
    cluster = cluster_with(*events(2))
    cluster.granted[DLQ] = frozenset({"DESCRIBE", "WRITE"})
    harness = Harness(cluster, cleanup={"mode": cleanup, "dsn": "postgresql://unused"})
    if cleanup == "none":
        assert sorted(harness.run().delivered()) == ["e-0", "e-1"]
        return
    with pytest.raises(ConfigError, match=rf"field 'dead_letter.topic': .*may not read topic "
                       rf"{DLQ} .*grant it Read on the topic \(the cleanup's sweep reads it"):
        harness.run()
    assert cluster.committed(ORDERS) == []


def test_a_changelog_the_principal_may_not_read_stops_the_start() -> None:
    cluster = cluster_with(*events(2))
    cluster.granted[CHANGELOG] = frozenset({"DESCRIBE", "WRITE"})
    with pytest.raises(ConfigError, match=r"field 'dedup.changelog_topic': .*may not read topic "
                       rf"{CHANGELOG} .*grant it Read on the topic \(each start restores"):
        Harness(cluster).run()
    assert cluster.committed(ORDERS) == []


def test_a_close_failing_on_a_clean_stop_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FakeConsumer, "close", _close_fails)
    cluster = cluster_with(*events(3))
    with pytest.raises(KafkaException, match="broker down at close"):
        Harness(cluster).run()
    assert len(cluster.committed(ORDERS)) == 3


def _fence_served_by_the_abort(cluster: FakeCluster) -> Any:
    """A producer factory whose batch fails for another reason (abortable offsets) while a
    fence waits to be served: the abort's poll(0) is the first call to meet it."""
    abortable = KafkaError(KafkaError._TIMED_OUT, "coordinator moving", txn_requires_abort=True)

    def producer(conf: dict[str, Any]) -> FakeProducer:
        made = FakeProducer(cluster, conf)
        flush = made.flush

        def fenced() -> bool:
            return made._epoch is not None and made._epoch < cluster.producer_epoch

        def served_later(timeout: float = 0) -> int:  # this flush does not serve the fence
            return 0 if fenced() else flush(timeout)

        def offsets(offsets: Any, metadata: Any, timeout: float) -> None:
            if fenced():
                raise KafkaException(abortable)
            FakeProducer.send_offsets_to_transaction(made, offsets, metadata, timeout)

        made.flush, made.send_offsets_to_transaction = served_later, offsets  # type: ignore[method-assign]
        return made

    return producer


@pytest.mark.parametrize("where", ["commit", "flush", "abort"])
def test_a_producer_fenced_once_renews_and_every_event_goes_once(where: str) -> None:
    # QA, session 28: a transaction that outlived transaction.timeout.ms was aborted by its
    # coordinator, which bumps the epoch; the next end of transaction was fenced (_FENCED,
    # measured with a bare producer on Kafka 4.3) and the router exited 1.
    # flush: CI rehearsal, session 29: confluent-kafka raises a producer's fatal error from its
    # next poll() or flush() as a bare KafkaException; it passed every handler of the batch
    # and the router exited 1 ("the router stopped on a Kafka error: KafkaError{FATAL,...}").
    # abort: review, session 30: a batch failing for another reason met the fence in its abort.
    cluster = cluster_with(*events(4), fence_on_serve=where != "commit")

    def fence(consumer: FakeConsumer) -> None:
        cluster.raw[0] += [(b"k", value) for value in events(8)[4:]]
        cluster.fence()

    harness = Harness(cluster, hooks=[fence], delivery=SLOW_COMMIT)
    if where == "abort":
        harness.router._producer._factory = _fence_served_by_the_abort(cluster)
    harness.run()
    assert sorted(harness.delivered()) == [f"e-{i}" for i in range(8)]
    assert cluster.producers_initialised == 2
    assert cluster.group_offsets == {(RAW, 0): 8}


def test_a_send_offsets_hung_past_its_timeout_renews_the_producer_not_the_process(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 37-a: after a move of the group coordinator, send_offsets_to_transaction blocked past
    # its timeout (librdkafka #5456, #5511) at 5 of 10 instance-moves; each exited 75.
    cluster = cluster_with(*events(6))
    release = threading.Event()

    def hangs_first(producer: FakeProducer, offsets: Any, metadata: Any, timeout: float) -> None:
        if producer.index == 0:
            assert release.wait(30)
            return  # nothing of the abandoned producer's transaction ever commits
        real_send(producer, offsets, metadata, timeout)

    purged: list[int] = []
    real_send, real_purge = FakeProducer.send_offsets_to_transaction, FakeProducer.purge
    harness = Harness(cluster)
    # The process-wide default (exit 75) would only release the call here.
    harness.router._producer._watchdog = CallWatchdog(factor=0.0, slack_s=0.1,
                                                      on_hang=lambda *_: release.set())
    with pytest.MonkeyPatch.context() as patch, caplog.at_level("WARNING"):
        patch.setattr(FakeProducer, "send_offsets_to_transaction", hangs_first)
        patch.setattr(FakeProducer, "purge", lambda made: (purged.append(made.index),
                                                           real_purge(made)))
        harness.run()
    release.set()
    assert sorted(harness.delivered()) == [f"e-{i}" for i in range(6)]  # each once
    assert cluster.producers_initialised == 2
    assert 0 not in purged, "nothing calls into the blocked client"
    assert cluster.group_offsets == {(RAW, 0): 6}
    assert "event=client_call_hung call=send_offsets_to_transaction" in caplog.text
    assert "event=producer_renewed reason=\"librdkafka's send_offsets_to_transaction " \
        "blocked" in caplog.text
    # QA 54-b F-5: the renewal re-read the batch, and cdc_router_batches_aborted_total said 0.
    assert harness.metric("cdc_router_batches_aborted_total") == 1


def test_send_offsets_hanging_again_and_again_exits_for_a_restart_without_a_false_abort(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 38: the exit after the budget built a new client to abort the given-up batch, and
    # logged `abort_failed` (_STATE "Operation not valid in state Init") for it.
    release = threading.Event()

    def hangs(producer: FakeProducer, offsets: Any, metadata: Any, timeout: float) -> None:
        assert release.wait(30)

    harness = Harness(cluster_with(*events(3)))
    harness.router._producer._watchdog = CallWatchdog(factor=0.0, slack_s=0.1,
                                                      on_hang=lambda *_: release.set())
    try:
        with pytest.MonkeyPatch.context() as patch, caplog.at_level("WARNING"), \
                pytest.raises(ProducerHung) as raised:
            patch.setattr(FakeProducer, "send_offsets_to_transaction", hangs)
            harness.run()
    finally:
        release.set()
    assert raised.value.exit_code == EXIT_RESTART
    assert harness.cluster.producers_built == 1 + MAX_RENEWALS  # one a renewal, none wasted
    assert caplog.text.count("event=producer_renewed") == MAX_RENEWALS
    assert "event=renewal_budget_spent" in caplog.text
    assert "abort_failed" not in caplog.text
    assert harness.delivered() == []


def test_a_renewal_while_the_cluster_s_metadata_does_not_answer_still_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 35-2: the grants' re-check of a renewal took a metadata timeout for a verdict,
    # and a healthy router stopped (exit 1) in the broker outage that had fenced it.
    cluster = cluster_with(*events(4))
    failing = {"once": False}
    listing = FakeProducer.list_topics

    def flaky(self: FakeProducer, topic: str | None = None, timeout: float = -1) -> Any:
        if failing["once"]:
            failing["once"] = False
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "all brokers down"))
        return listing(self, topic, timeout)

    monkeypatch.setattr(FakeProducer, "list_topics", flaky)

    def fence(consumer: FakeConsumer) -> None:
        cluster.raw[0] += [(b"k", value) for value in events(8)[4:]]
        cluster.fence()
        failing["once"] = True

    harness = Harness(cluster, hooks=[fence], delivery=SLOW_COMMIT)
    harness.run()
    assert sorted(harness.delivered()) == [f"e-{i}" for i in range(8)]
    assert cluster.producers_initialised == 2
    assert cluster.group_offsets == {(RAW, 0): 8}


def test_a_refusal_of_a_dead_letter_stops_the_router() -> None:
    cluster = cluster_with(b"{broken", refuse=lambda topic, value, ts:
                           KafkaError.TOPIC_AUTHORIZATION_FAILED if topic == DLQ else None)
    with pytest.raises(FatalKafkaError, match="dead-letter and dedup changelog"):
        Harness(cluster).run()
    assert cluster.group_offsets == {}


def _revoke_dead_letter_write(cluster: FakeCluster, *, broker_says: bool) -> Any:
    """A hook: Write on the dead-letter topic revoked (explicit Describe kept, as in QA 35-e),
    then a poison record first in the next batch and events after it."""
    def revoke(consumer: FakeConsumer) -> None:
        cluster.add_partitions_refused.add(DLQ)
        if broker_says:
            cluster.granted[DLQ] = frozenset({"DESCRIBE", "DESCRIBE_CONFIGS"})
        cluster.raw[0] += [(b"k", b"{broken"), *((b"k", value) for value in events(6)[3:])]
    return revoke


@pytest.mark.parametrize("abort_refused", [False, True])
def test_write_on_the_dead_letter_topic_revoked_while_running_stops_naming_it(
        abort_refused: bool) -> None:
    # QA 35-e F5: AddPartitionsToTxn refused the dead-letter topic; every later produce() said
    # only "Erroneous state" (_STATE), and the router aborted batches as the cluster's trouble
    # for ever. Now the transaction's own error (TOPIC_AUTHORIZATION_FAILED) reaches the poison
    # isolation, and the grants are asked again: the dead-letter topic is refused by name.
    # With the abort refused too (INVALID_TXN_STATE, as measured), at the producer's renewal.
    cluster = cluster_with(*events(3))
    if abort_refused:
        cluster.abort_failures.append(KafkaError(
            KafkaError.INVALID_TXN_STATE, "Failed to end transaction", fatal=True))
    harness = Harness(cluster, hooks=[_revoke_dead_letter_write(cluster, broker_says=True)],
                      delivery=SLOW_COMMIT)
    with pytest.raises(ConfigError, match=f"may not write topic {DLQ}.*grant it Write") as \
            raised:
        harness.run()
    assert raised.value.field == "dead_letter.topic" and raised.value.exit_code == 1
    assert cluster.group_offsets == {(RAW, 0): 3}
    assert sorted(harness.delivered()) == ["e-0", "e-1", "e-2"]


def test_a_topic_refused_to_the_transaction_exits_75_when_the_broker_names_no_grant() -> None:
    cluster = cluster_with(*events(3))
    harness = Harness(cluster, hooks=[_revoke_dead_letter_write(cluster, broker_says=False)],
                      delivery=SLOW_COMMIT)
    with pytest.raises(GrantRevoked, match="TOPIC_AUTHORIZATION_FAILED") as raised:
        harness.run()
    assert raised.value.exit_code == EXIT_RESTART
    assert cluster.group_offsets == {(RAW, 0): 3}


# More than one full poll: a batch stays open after the first poll (a short poll commits).
_BUSY = POLL_BATCH + 10


def test_revoke_commits_the_open_batch() -> None:
    cluster = cluster_with(*events(_BUSY))
    seen: dict[str, Any] = {}

    def revoke(consumer: FakeConsumer) -> None:
        consumer.revoke_all()
        seen["offsets"] = dict(cluster.group_offsets)

    harness = Harness(cluster, hooks=[revoke], delivery=SLOW_COMMIT).run()
    assert seen["offsets"] == {(RAW, 0): POLL_BATCH}
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(_BUSY))


def test_an_assignment_reads_the_destinations_partition_counts_afresh() -> None:
    # QA, session 30: after partitions were added to a destination, instances whose cached
    # counts disagreed (5 minutes) sent one aggregate's events back and forth at each rebalance.
    cluster = cluster_with(*events(4))

    def add_partitions_then_rebalance(consumer: FakeConsumer) -> None:
        cluster.partitions[ORDERS] = 5
        cluster.raw[0] += [(b"k", value) for value in events(8)[4:]]
        consumer.revoke_all()

    Harness(cluster, hooks=[add_partitions_then_rebalance]).run()
    after = [stored for stored in cluster.committed(ORDERS) if stored.key not in
             {f"e-{i}".encode() for i in range(4)}]
    assert len(after) == 4  # partitioned by aggregate id (order-<i % 3>), keyed by event id
    assert [stored.partition for stored in after] == [
        java_default_partition(f"order-{int(stored.key[2:]) % 3}".encode(), 5)
        for stored in after]


@pytest.mark.parametrize("dedup", [True, False])
def test_lost_partitions_abort_and_the_batch_is_read_again_once(dedup: bool) -> None:
    # Review 45: the consume() that ran the callback went on to return the new assignment's
    # records, which were handled in a new batch; the rewind the abort asked for then read
    # them again into that same open transaction. Without dedup (nothing to catch them) each
    # id was committed twice, and with it a record without an id (a dead letter) was.
    cluster = cluster_with(b"not json", *events(_BUSY))
    harness = Harness(cluster, hooks=[lambda consumer: consumer.revoke_all(lost=True)],
                      delivery=SLOW_COMMIT,
                      dedup={"enabled": dedup, "changelog_topic": CHANGELOG}).run()
    assert "abort" in cluster.journal
    assert harness.waits == []  # no backoff inside a rebalance
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(_BUSY))
    assert [dict(letter.headers).get("dlq.source.offset") for letter in harness.letters()] \
        == [b"0"]


def test_a_commit_kafka_lost_after_acknowledging_it_is_read_and_delivered_again(
        caplog: pytest.LogCaptureFixture) -> None:
    # Chaos 58 (CI rehearsal, 283 events lost): Kafka 4.3 acknowledged a commit, lost it at
    # a kill -9, and aborted it with the next batch. The rewind read the lost batch again,
    # and the replay filter, which counted its ids delivered, dropped each one.
    cluster = cluster_with(*events(4), lost_commits=1)
    later = [(b"k", value) for value in events(8)[4:]]

    class LateEvents(Harness):
        def _idle(self) -> None:  # after the lost commit: the next batch, which fails
            if later:
                cluster.raw[0] += later
                later.clear()
            super()._idle()

    with caplog.at_level(logging.WARNING, logger="cdc_router.router"):
        harness = LateEvents(cluster).run()
    assert cluster.journal.count("commit lost") == 1 and "abort" in cluster.journal
    assert sorted(harness.delivered()) == [f"e-{i}" for i in range(8)]
    assert sorted(marked_ids(cluster.committed(CHANGELOG))) == [f"e-{i}" for i in range(8)]
    assert f"event=commit_lost partitions=['{RAW}[0] committed none, this instance 4']" \
        in caplog.text


def _marked(cluster: FakeCluster, ids: list[str]) -> None:
    """Marks of `ids` on the changelog, as a previous run of the group left them."""
    now_ms = int(time.time() * 1000)
    cluster.publish(CHANGELOG, [Stored(CHANGELOG, 0, r.key, r.value, [], now_ms)
                                for r in changelog_records(ids, now_ms, group="g")])


def test_after_a_rebalance_debezium_s_replays_of_ids_restored_before_it_still_drop() -> None:
    # Review 59-r F-1: the assignment's restore emptied the filter and read the changelog on
    # from its last read: the ids of the first restore were gone, and their replays went out
    # again.
    cluster = cluster_with(*[raw_event(f"old-{i}") for i in range(4)], *events(2))
    cluster.group_offsets[(RAW, 0)] = 4
    _marked(cluster, [f"old-{i}" for i in range(4)])

    def rebalance_then_replays(consumer: FakeConsumer) -> None:
        consumer.revoke_all()
        cluster.raw[0] += [(b"k", raw_event(f"old-{i}")) for i in range(4)]

    harness = Harness(cluster, hooks=[rebalance_then_replays]).run()
    assert sorted(harness.delivered()) == ["e-0", "e-1"]


def test_after_a_lost_commit_only_its_ids_are_delivered_again_once(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 59-r F-1 and F-4: older marks stay (their replays drop), and the loss is handled
    # once, not again at each abort until the next commit.
    cluster = cluster_with(*[raw_event(f"old-{i}") for i in range(4)], *events(4),
                           lost_commits=1)
    cluster.group_offsets[(RAW, 0)] = 4
    _marked(cluster, [f"old-{i}" for i in range(4)])
    later = [(b"k", value) for value in events(8)[4:]]
    replays = [(b"k", raw_event(f"old-{i}")) for i in range(4)]
    refusals = [KafkaError.MSG_SIZE_TOO_LARGE] * 2  # two poison aborts after the loss's

    def refuse(topic: str, value: bytes | None, timestamp: int | None) -> int | None:
        return refusals.pop() if topic == ORDERS and "abort" in cluster.journal \
            and refusals else None

    cluster.refuse = refuse

    class LateEvents(Harness):
        def _idle(self) -> None:
            if later:
                cluster.raw[0] += later
                later.clear()
            elif replays and "abort" in cluster.journal:
                cluster.raw[0] += replays
                replays.clear()
            super()._idle()

    with caplog.at_level(logging.INFO, logger="cdc_router.router"):
        harness = LateEvents(cluster).run()
    assert sorted(set(harness.delivered())) == sorted(harness.delivered())
    assert set(harness.delivered()) | {dict(letter.headers)["dlq.event.id"].decode()
                                       for letter in harness.letters()} \
        == {f"e-{i}" for i in range(8)}
    assert caplog.text.count("event=commit_lost") == 1
    assert "event=lost_commit_ids_forgotten ids=4" in caplog.text


def test_a_poll_that_takes_less_than_a_full_batch_commits_at_once() -> None:
    # Caught up: nothing waits for commit_interval_ms (90 s here) on a quiet stream.
    cluster = cluster_with(*events(3))
    seen: dict[str, Any] = {}
    harness = Harness(cluster, hooks=[lambda _: seen.update(offsets=dict(cluster.group_offsets))],
                      delivery={"commit_interval_ms": 90_000,
                                "transaction_timeout_ms": 900_000}).run()
    assert seen["offsets"] == {(RAW, 0): 3}  # committed before the next poll
    assert sorted(harness.delivered()) == ["e-0", "e-1", "e-2"]


def test_full_polls_share_one_transaction_until_it_is_due() -> None:
    cluster = cluster_with(*events(3 * POLL_BATCH))
    Harness(cluster, delivery={"commit_interval_ms": 90_000,
                               "transaction_timeout_ms": 900_000,
                               "commit_max_records": 2 * POLL_BATCH}).run()
    # Two full polls make one due batch; the third poll is full too, and the empty poll
    # after it finds the stream caught up and commits the rest.
    assert cluster.journal.count("commit") == 2
    assert cluster.group_offsets == {(RAW, 0): 3 * POLL_BATCH}


def test_ids_in_the_changelog_are_replays_and_dropped(caplog: pytest.LogCaptureFixture) -> None:
    # Both formats: a batch's ids in one record, and one record per id (earlier versions).
    caplog.set_level(logging.INFO, logger="cdc_router")
    now_ms = int(time.time() * 1000)
    cluster = cluster_with(*events(10))
    [batch] = changelog_records(["e-0", "e-1", "e-2"], now_ms)
    cluster.topics[CHANGELOG] = [Stored(CHANGELOG, 0, batch.key, batch.value, [], None)] + [
        Stored(CHANGELOG, 0, f"e-{i}".encode(), b'{"ts": %d}' % now_ms, [], None)
        for i in (3, 4)]
    harness = Harness(cluster).run()
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(5, 10))
    assert harness.metric("cdc_router_duplicates_dropped_total") == 5
    # QA 44-a: an id reused by the application was dropped without a line.
    dropped = [r.getMessage() for r in caplog.records if "event=replay_dropped" in r.getMessage()]
    assert len(dropped) == 5 and "id='e-0'" in dropped[0] and "offset=0" in dropped[0]
    # QA 32-a: a replay's row goes to the cleanup too (a new row reusing a delivered id
    # stayed until the next start's sweep).
    assert sorted(harness.handed) == sorted([(f"e-{i}", "") for i in range(5)] +
                                            [(f"e-{i}", ORDERS) for i in range(5, 10)])


def test_the_ids_the_replay_filter_holds_are_a_gauge() -> None:
    # QA 65-b: in a soak nothing showed how many ids the router held against dedup.max_ids
    # (memory: about 120 bytes each) but the `event=assigned dedup_ids=` line of each start.
    now_ms = int(time.time() * 1000)
    cluster = cluster_with(*events(10))
    [batch] = changelog_records(["e-0", "e-1", "e-2"], now_ms)
    cluster.topics[CHANGELOG] = [Stored(CHANGELOG, 0, batch.key, batch.value, [], None)]
    harness = Harness(cluster).run()
    assert harness.metrics.registry.get_sample_value("cdc_router_dedup_ids") == 10
    off = Harness(cluster_with(*events(2)), dedup={"enabled": False}).run()
    assert off.metrics.registry.get_sample_value("cdc_router_dedup_ids") is None


def test_a_replay_of_a_dead_lettered_event_keeps_its_row() -> None:
    # Review 32-2: replays' rows go to the cleanup (an id reused), but the filter holds
    # dead-lettered ids too: their rows, never delivered, must stay (README).
    now_ms = int(time.time() * 1000)
    poison = raw_event("p-1", event_type="Missing")
    cluster = cluster_with(poison, raw_event("e-0"), poison, raw_event("p-2",
                                                                       event_type="Missing"))
    [mark] = changelog_records(["p-2"], now_ms, DEAD_LETTERED_KEY_PREFIX, group="g")
    cluster.topics[CHANGELOG] = [Stored(CHANGELOG, 0, mark.key, mark.value, [], None)]
    harness = Harness(cluster, routes=[{"match": {"type": "Missing"}, "topic": "nowhere"},
                                       {"topic": ORDERS}]).run()
    assert harness.handed == [("e-0", ORDERS)]
    assert harness.metric("cdc_router_duplicates_dropped_total") == 2


def test_marks_of_another_group_on_a_shared_changelog_are_not_replays() -> None:
    # Review, session 26: two pipelines on the default changelog; the other's e-0..e-2 are
    # not ours. The router marks what it delivers with its own group.
    now_ms = int(time.time() * 1000)
    cluster = cluster_with(*events(5))
    theirs = changelog_records(["e-0", "e-1", "e-2"], now_ms, group="billing")
    ours = changelog_records(["e-3"], now_ms, group="g")
    cluster.topics[CHANGELOG] = [Stored(CHANGELOG, 0, mark.key, mark.value, [], None)
                                 for mark in (*theirs, *ours)]
    harness = Harness(cluster).run()
    assert sorted(harness.delivered()) == ["e-0", "e-1", "e-2", "e-4"]
    written = [json.loads(stored.value) for stored in cluster.committed(CHANGELOG)[2:]]
    assert {mark["group"] for mark in written} == {"g"}


def test_stop_finishes_and_commits_the_open_batch() -> None:
    cluster = cluster_with(*events(10))
    stopper: list[Harness] = []
    harness = Harness(cluster, hooks=[lambda consumer: stopper[0].router.stop()],
                      delivery=SLOW_COMMIT)
    stopper.append(harness)
    harness.run()
    assert cluster.group_offsets == {(RAW, 0): 10} and len(harness.delivered()) == 10


def test_a_dead_letter_too_big_for_kafka_keeps_its_reason_without_the_value() -> None:
    cluster = cluster_with(b"x" * 950_000, *events(2))
    harness = Harness(cluster).run()
    [letter] = harness.letters()
    assert letter.value is None and letter.header("dlq.value.dropped.bytes") == "950000"
    assert letter.header("dlq.stage") == "decode"


def test_a_row_failing_to_decode_is_dead_lettered_with_its_id_and_left_unmarked() -> None:
    # dlq.event.id lets `dlq list` show it and `dlq replay --id` select it; no changelog mark,
    # so that the row, once fixed and republished, is routed instead of dropped as a replay.
    # A route-stage letter's id is marked: a replay of that event drops.
    values = [*events(3), raw_event("bad-row", aggregate_type=""),
              raw_event("no-route", aggregate_type="Nope")]
    cluster = cluster_with(*values)
    harness = Harness(cluster, routes=[{"match": {"aggregate_type": "Order"}, "topic": ORDERS}],
                      unmatched="dead_letter").run()
    stages = {letter.header("dlq.event.id"): letter.header("dlq.stage")
              for letter in harness.letters()}
    assert stages == {"bad-row": "decode", "no-route": "route"}
    marks = set(marked_ids(cluster.committed(CHANGELOG)))
    assert "no-route" in marks and "bad-row" not in marks


def test_at_least_once_a_refused_record_never_leaves_a_mark_without_its_record() -> None:
    values = events(8)
    values[3] = raw_event("big", payload='{"blob": "' + "x" * 500 + '"}')
    cluster = cluster_with(*values, refuse=lambda topic, value, ts:
                           KafkaError.MSG_SIZE_TOO_LARGE if topic == ORDERS and value
                           and len(value) > 400 else None)
    harness = Harness(cluster, delivery={"guarantee": "at_least_once"}).run()
    marks = set(marked_ids(cluster.committed(CHANGELOG)))
    letters = {letter.header("dlq.event.id") for letter in harness.letters()}
    assert letters == {"big"}
    assert set(harness.delivered()) == {f"e-{i}" for i in range(8) if i != 3}
    assert marks <= set(harness.delivered()) | letters


def test_a_topic_librdkafka_calls_unknown_but_the_cluster_lists_is_retried_not_dead_lettered(
) -> None:
    # Review, session 26: produce() refusing _UNKNOWN_TOPIC on the spot was a dead letter at
    # once, even when only librdkafka's metadata lagged (a broker restarting).
    cluster = cluster_with(*events(6), unknown_on_produce={ORDERS: 2})
    harness = Harness(cluster).run()
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(6))
    assert harness.letters() == []
    assert harness.metric("cdc_router_batches_aborted_total") >= 1


def test_a_destination_topic_deleted_under_the_router_dead_letters_its_events() -> None:
    later = [raw_event(f"late-{i}") for i in range(3)]

    def delete_orders(consumer: FakeConsumer) -> None:  # after the first poll's commit
        del consumer.cluster.partitions[ORDERS]
        consumer.cluster.unknown_on_produce[ORDERS] = 1  # librdkafka has not heard yet
        consumer.cluster.raw[0] += [(b"k", value) for value in later]

    harness = Harness(cluster_with(*events(6)), hooks=[delete_orders]).run()
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(6))
    letters = {letter.header("dlq.event.id"): letter.header("dlq.error.message")
               for letter in harness.letters()}
    assert sorted(letters) == ["late-0", "late-1", "late-2"]
    assert "_UNKNOWN_TOPIC" in letters["late-0"]  # refused by produce(), the topic gone
    assert "does not exist" in letters["late-1"]  # known missing since: never produced


def test_a_destination_deleted_with_records_in_flight_costs_one_abort_not_one_each() -> None:
    # QA 50-a F2: the broker refused the in-flight records (UNKNOWN_TOPIC_OR_PART) and each
    # was produced again alone to the topic the cached listing still named: one abort each
    # here; on a real cluster each waited 20 s undelivered, and every route waited 139 s.
    cluster = cluster_with(*events(6), refuse=lambda topic, value, timestamp: (
        KafkaError.UNKNOWN_TOPIC_OR_PART if topic not in cluster.partitions else None))
    later = [raw_event(f"late-{i}") for i in range(5)]

    def delete_orders(consumer: FakeConsumer) -> None:  # after the first poll's commit
        del consumer.cluster.partitions[ORDERS]
        consumer.cluster.raw[0] += [(b"k", value) for value in later]

    harness = Harness(cluster, hooks=[delete_orders]).run()
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(6))
    assert sorted(letter.header("dlq.event.id") for letter in harness.letters()) == [
        f"late-{i}" for i in range(5)]
    assert {letter.header("dlq.stage") for letter in harness.letters()} == {"route"}
    assert harness.metric("cdc_router_batches_aborted_total") <= 2


class _StreamWithMaxMsgSize:
    """A JetStream stream of max_msg_size 100: each bigger message is refused alone (err_code
    10054), the others stored once (Nats-Msg-Id dedup)."""

    def __init__(self) -> None:
        self.stored: dict[str, bytes] = {}
        self.batches = 0

    def publish_batch(self, messages: Sequence[NatsMessage]) -> BatchAcks:
        self.batches += 1
        refused = {index: f"JetStream refused the message for {message.subject}: message "
                          "size exceeds maximum allowed"
                   for index, message in enumerate(messages) if len(message.data) > 100}
        for index, message in enumerate(messages):
            if index not in refused:
                self.stored.setdefault(message.msg_id, message.data)
        if refused:
            raise JetStreamRefused("JetStream refused some", refused)
        return BatchAcks(len(messages), 0)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_a_message_its_jetstream_stream_refuses_is_dead_lettered_and_the_rest_delivered(
        guarantee: str) -> None:
    # QA session 27-b: one event over its stream's max_msg_size failed every batch as if NATS
    # were down, backing off for ever; nothing behind it was delivered.
    values = events(8)
    values[2] = raw_event("big-2", payload=json.dumps({"blob": "x" * 200}))
    values[6] = raw_event("big-6", payload=json.dumps({"blob": "y" * 200}))
    stream = _StreamWithMaxMsgSize()
    harness = Harness(cluster_with(*values), publisher=stream,
                      routes=[{"nats": {"subject": "orders.{type}"}}],
                      nats={"streams": [{"name": "ORDERS", "subjects": ["orders.>"]}]},
                      delivery={"guarantee": guarantee}).run()
    assert sorted(stream.stored) == sorted(f"e-{i}" for i in range(8) if i not in (2, 6))
    letters = {letter.header("dlq.event.id"): letter for letter in harness.letters()}
    assert sorted(letters) == ["big-2", "big-6"]
    assert letters["big-2"].header("dlq.stage") == "produce"
    assert "exceeds maximum" in letters["big-2"].header("dlq.error.message")
    assert harness.waits == []  # a refusal is no outage: no backoff


class _FullStorage:
    """JetStream with its storage full for the first `full` batches (nats-server's err_code
    10047 'insufficient storage resources available', raised as JetStreamPublisher does:
    from the nats-py error), then room."""

    def __init__(self, full: int) -> None:
        self.full = full
        self.stored: dict[str, bytes] = {}

    def publish_batch(self, messages: Sequence[NatsMessage]) -> BatchAcks:
        from nats.js.errors import ServiceUnavailableError

        if self.full:
            self.full -= 1
            raise JetStreamError("JetStream did not acknowledge 1 message; JetStream's storage "
                                 "is full") from ServiceUnavailableError(
                code=503, err_code=10047, description="insufficient storage resources available")
        for message in messages:
            self.stored.setdefault(message.msg_id, message.data)
        return BatchAcks(len(messages), 0)

    def close(self) -> None:
        pass


def test_a_batch_jetstream_storage_full_refused_counts_under_its_own_cause(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 65-b F-1, lw66 item 2: storage full was seen only as a stall; the aborts now say their
    # cause on /metrics (an alert rule's) and in the log line.
    stream = _FullStorage(full=3)
    caplog.set_level(logging.WARNING, logger="cdc_router.router")
    harness = Harness(cluster_with(*events(6)), publisher=stream,
                      routes=[{"nats": {"subject": "orders.{type}"}}],
                      nats={"streams": [{"name": "ORDERS", "subjects": ["orders.>"]}]}).run()
    assert sorted(stream.stored) == sorted(f"e-{i}" for i in range(6))
    assert harness.metric("cdc_router_batches_aborted_total",
                          cause="jetstream_storage_full") == 3
    assert harness.metric("cdc_router_batches_aborted_total", cause="cluster") == 0
    assert harness.metric("cdc_router_batches_aborted_total") == 3
    assert "event=batch_aborted cause=jetstream_storage_full consecutive=1" in caplog.text
    assert harness.waits, "storage full is no record's fault: it backs off"
    assert harness.letters() == []


def test_a_commit_failing_mid_poll_rereads_the_rest_of_the_poll_and_loses_nothing() -> None:
    # One poll brings all 20 records; the first of its four commits fails. The records after
    # it in the same poll must not go into a new batch whose offsets would skip the aborted one.
    failed = KafkaError(KafkaError._TIMED_OUT, "coordinator moving", txn_requires_abort=True)
    cluster = cluster_with(*events(20), commit_failures=[failed])
    harness = Harness(cluster, delivery={"commit_max_records": 5}).run()
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(20))
    assert cluster.group_offsets == {(RAW, 0): 20}


def test_consume_raising_a_cluster_error_aborts_rewinds_and_goes_on() -> None:
    """A broker restarting makes consume() raise (FENCED_LEADER_EPOCH, seen on Kafka 4.x after
    a kill -9): the open batch is aborted and re-read, nothing lost or doubled, no exit."""
    def broker_restarting(consumer: FakeConsumer) -> None:
        raise KafkaException(KafkaError(KafkaError.FENCED_LEADER_EPOCH,
                                        "Leader epoch is older than broker epoch"))

    cluster = cluster_with(*events(30))
    harness = Harness(cluster, hooks=[broker_restarting],
                      delivery=SLOW_COMMIT).run()
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(30))
    assert harness.metric("cdc_router_batches_aborted_total") == 1
    assert harness.waits, "a batch failing for no record's fault backs off"


def test_a_fatal_consumer_error_in_the_rewind_renews_the_consumer_instead_of_backing_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review, session 30: committed() of the rewind after an abort raising the consumer's
    # fatal error (a fenced static member) was backed off and retried for ever. The new
    # consumer (QA 36-a) is fenced at its assignment too here: exit 75.
    failed = KafkaError(KafkaError._TIMED_OUT, "coordinator moving", txn_requires_abort=True)
    cluster = cluster_with(*events(5), commit_failures=[failed])
    calls, real = [], FakeConsumer.committed

    def committed(self: FakeConsumer, partitions: Any, timeout: float) -> Any:
        calls.append(timeout)
        if len(calls) == 1:  # the assignment's: the rewind's comes after the abort
            return real(self, partitions, timeout)
        raise KafkaException(KafkaError(KafkaError.FENCED_INSTANCE_ID, "fenced", fatal=True))

    monkeypatch.setattr(FakeConsumer, "committed", committed)
    harness = Harness(cluster, delivery=SLOW_COMMIT)
    with pytest.raises(RestoreFailed) as raised:
        harness.run()
    assert raised.value.exit_code == EXIT_RESTART and len(harness.consumers) == 2
    assert len(calls) == 3 and len(harness.waits) <= 1


def test_consume_raising_a_fatal_error_renews_the_consumer_not_the_producer() -> None:
    def fatal(consumer: FakeConsumer) -> None:
        raise KafkaException(KafkaError(KafkaError._FATAL, "fatal", fatal=True))

    cluster = cluster_with(*events(5))
    harness = Harness(cluster, hooks=[fatal]).run()  # the consumer's: a fenced static member
    assert cluster.producers_initialised == 1, "the producer is not renewed for it"
    assert len(harness.consumers) == 2 and sorted(harness.delivered()) == [
        f"e-{i}" for i in range(5)]


def _fence(consumer: FakeConsumer) -> None:
    # As librdkafka raises it: a message error, not flagged fatal() (chaos campaign, seed 15).
    consumer.events.append(Message(topic=RAW, partition=0, error=KafkaError(
        KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced by other consumer "
        "with same group.instance.id")))


def test_a_consumer_fenced_once_is_replaced_and_every_event_goes_once() -> None:
    # QA 36-a: on a 3-broker cluster every move of the group coordinator fenced the static
    # member of every instance, and every instance exited 75 (no supervisor: the stream stopped).
    cluster = cluster_with(*events(4))
    fences: list[int] = []

    def fence_once(consumer: FakeConsumer) -> None:
        if not fences:  # with a batch open: the first poll's
            fences.append(1)
            cluster.raw[0] += [(b"k", value) for value in events(8)[4:]]
            _fence(consumer)

    harness = Harness(cluster, hooks=[fence_once], delivery=SLOW_COMMIT).run()
    assert sorted(harness.delivered()) == [f"e-{i}" for i in range(8)]  # each once
    assert len(harness.consumers) == 2 and closed_within(harness.consumers[0])
    assert cluster.group_offsets == {(RAW, 0): 8} and harness.letters() == []


@pytest.mark.parametrize("producer_fenced_too", [False, True])
def test_a_consumer_fenced_with_a_batch_open_ends_it_with_a_new_producer(
        producer_fenced_too: bool) -> None:
    # Review 37: the fenced member's batch was aborted in place, and when the coordinator had
    # meanwhile aborted its expired transaction (epoch bumped) the abort was fenced: exit 1.
    cluster = cluster_with(*events(POLL_BATCH + 200))
    fences: list[int] = []

    def fence_once(consumer: FakeConsumer) -> None:  # after a full poll: its batch is open
        if not fences:
            fences.append(1)
            if producer_fenced_too:
                cluster.fence()
            _fence(consumer)

    harness = Harness(cluster, hooks=[fence_once],
                      delivery={**SLOW_COMMIT, "commit_max_records": 10_000}).run()
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(POLL_BATCH + 200))
    assert len(harness.consumers) == 2 and cluster.producers_initialised == 2
    assert cluster.group_offsets == {(RAW, 0): POLL_BATCH + 200} and harness.letters() == []


def test_at_least_once_a_fenced_consumer_refusing_the_commit_is_replaced() -> None:
    # Review 37: its _FATAL through the offsets step was taken for the producer's fence.
    fatal = KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced")
    cluster = cluster_with(*events(6), offsets_failures=[fatal])
    harness = Harness(cluster, delivery={**SLOW_COMMIT, "guarantee": "at_least_once"}).run()
    assert len(harness.consumers) == 2  # a new consumer, not only a producer (fence budget)
    assert set(harness.delivered()) == {f"e-{i}" for i in range(6)}


def test_a_consumer_fenced_again_and_again_exits_for_a_restart() -> None:
    # A rival with the same --instance-id (or a group that keeps fencing): after the budget of
    # new consumers (router/renewal.py), exit 75 for the supervisor, as before QA 36-a.
    cluster = cluster_with(*events(5))

    def fence_always(consumer: FakeConsumer) -> None:  # each consumer, with more to read
        cluster.raw[0].append((b"k", raw_event(f"x-{len(cluster.raw[0])}")))
        _fence(consumer)

    harness = Harness(cluster, hooks=[fence_always])
    with pytest.raises(MemberFenced, match="Static consumer fenced") as raised:
        harness.run()
    assert raised.value.exit_code == EXIT_RESTART
    assert len(harness.consumers) == 4  # the first and three new ones


def test_a_consumer_fenced_by_a_newer_process_with_its_instance_id_stops_for_good() -> None:
    # QA 65-a F-3: two processes with one --instance-id fenced each other back and forth, and
    # the one left was not necessarily the newer. KIP-345: the newer's join fences the older,
    # which now stops (exit 1: a supervisor restarting on 75 does not bring it back).
    cluster = cluster_with(*events(5))
    cluster.rival = ("rdkafka-9f2c", "cdc-router", "/10.0.0.7")
    harness = Harness(cluster, hooks=[_fence])
    with pytest.raises(ConfigError) as raised:
        harness.run()
    assert str(raised.value).startswith(
        "field '--instance-id': another process took this instance's group.instance.id "
        "'i-1.")
    assert "in group 'g' (now member rdkafka-9f2c of client 'cdc-router' on /10.0.0.7): " \
        "Kafka fences the older of two static members with one id, so this one stops for " \
        "good and the newer runs on; give each instance its own --instance-id" \
        in str(raised.value)
    assert str(raised.value).endswith("(got 'i-1')")
    assert raised.value.exit_code == 1
    assert len(harness.consumers) == 1, "not renewed: renewing would fence the newer one"
    # The group lists this process's own member (librdkafka rejoined after a coordinator
    # move, QA 36-a): a new consumer, as before.
    cluster = cluster_with(*events(5))
    harness = Harness(cluster, hooks=[_fence])
    cluster.rival = None
    harness.run()
    assert len(harness.consumers) == 2 and sorted(harness.delivered()) == [
        f"e-{i}" for i in range(5)]


def test_a_replaced_consumer_closes_aside_and_its_callbacks_leave_the_new_one_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 40-1 F5: the fenced consumer's close held the loop, unbounded. Here it is held
    # until the new one has a batch open (given up after CLOSE_WAIT_S); the revoke it then
    # runs (on the close's thread) must neither commit nor mark anything of the new one's.
    monkeypatch.setattr(closing, "CLOSE_WAIT_S", 0.2)
    count = POLL_BATCH + 8
    cluster = cluster_with(*events(count))
    release = threading.Event()

    def fence_once(consumer: FakeConsumer) -> None:
        if len(harness.consumers) == 1:
            close = consumer.close

            def held() -> None:
                assert release.wait(10)
                close()
            consumer.close = held  # type: ignore[method-assign]
            _fence(consumer)
        elif not release.is_set():  # the new consumer, its first batch open
            assert harness.router._txn is not None and harness.router._txn.open
            journal = list(cluster.journal)
            release.set()
            assert closed_within(harness.consumers[0])
            assert cluster.journal == journal, "the stale consumer's revoke acted"

    harness = Harness(cluster, hooks=[fence_once],
                      delivery={**SLOW_COMMIT, "commit_max_records": 10_000})
    harness.run()
    assert release.is_set()
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(count))  # each once
    assert cluster.group_offsets == {(RAW, 0): count}


def _strand(cluster: FakeCluster) -> Any:
    """A hook: the consumer loses its partitions and never joins again, and the group does not
    list it (QA 39-c F1: librdkafka's session timed out in a broker's outage)."""
    def strand(consumer: FakeConsumer) -> None:  # with more to read
        cluster.raw[0].append((b"k", raw_event(f"x-{len(cluster.raw[0])}")))
        consumer.revoke_all(lost=True)
        consumer.stranded = True
        cluster.group_members.clear()
    return strand


@pytest.fixture
def quick_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The membership watch checks at every poll and renews at the second answer without it."""
    monkeypatch.setattr(membership, "CHECK_EVERY_S", 0.0)
    monkeypatch.setattr(membership, "GAP_S", 60.0)
    monkeypatch.setattr(membership, "SESSIONS_OUT", 0)


@pytest.mark.usefixtures("quick_watch")
def test_a_consumer_the_group_no_longer_lists_is_replaced_and_every_event_goes_once() -> None:
    # Review 40-1 F8: with a batch open (a full poll, no commit yet), which its lost partitions
    # abort; the new consumer reads it again from the committed offsets.
    count = POLL_BATCH + 8
    cluster = cluster_with(*events(count))
    stranded: list[int] = []

    def strand_once(consumer: FakeConsumer) -> None:
        if not stranded:
            stranded.append(1)
            assert harness.router._txn is not None and harness.router._txn.open
            _strand(cluster)(consumer)
            cluster.group_members.add("another-instance")

    def rejoin(conf: dict[str, Any]) -> FakeConsumer:
        cluster.group_members.add("i-1")
        return made(conf)

    harness = Harness(cluster, hooks=[strand_once],
                      delivery={**SLOW_COMMIT, "commit_max_records": 10_000})
    made, harness.router._consumer_factory = harness.router._consumer_factory, rejoin
    harness.run()
    assert sorted(harness.delivered()) == sorted(  # each once
        [*(f"e-{i}" for i in range(count)), f"x-{count}"])
    assert len(harness.consumers) == 2 and closed_within(harness.consumers[0])
    assert cluster.group_offsets == {(RAW, 0): count + 1} and cluster.members_lookups == 2


@pytest.mark.usefixtures("quick_watch")
def test_a_consumer_that_never_rejoins_exits_for_a_restart_after_the_budget() -> None:
    cluster = cluster_with(*events(5))
    harness = Harness(cluster, hooks=[_strand(cluster)])
    with pytest.raises(MemberFenced, match="did not list member i-1") as raised:
        harness.run()
    assert raised.value.exit_code == EXIT_RESTART
    assert len(harness.consumers) == 1 + MAX_RENEWALS


@pytest.mark.usefixtures("quick_watch")
def test_an_instance_without_partitions_but_in_the_group_is_kept() -> None:
    # More instances than partitions: a member with none is no stranded consumer.
    cluster = cluster_with(*events(3))
    polls: list[int] = []

    def idle_member(consumer: FakeConsumer) -> None:
        cluster.raw[0].append((b"k", raw_event("x-3")))  # another member's to read
        consumer.revoke_all()
        consumer.stranded = True
        consumer.before_consume.append(count)

    def count(consumer: FakeConsumer) -> None:
        polls.append(1)
        if len(polls) < 20:
            consumer.before_consume.append(count)
        else:
            harness.router.stop()

    harness = Harness(cluster, hooks=[idle_member])
    harness.run()
    assert len(harness.consumers) == 1 and cluster.members_lookups >= 19


def test_committed_offsets_librdkafka_will_not_fetch_again_exit_for_a_new_consumer() -> None:
    # QA 31-b: after a 90 s broker freeze the OffsetFetch of the new assignment met a
    # request-level NOT_COORDINATOR; librdkafka (issue #5586) never asked again, and the router
    # polled an assigned, never fetched partition for 5 min with this one warning.
    def stranded(consumer: FakeConsumer) -> None:
        consumer.events.append(Message(error=KafkaError(
            KafkaError.NOT_COORDINATOR, "Failed to fetch committed offsets for 0 partition(s) "
            "in group \"g\": Broker: Not coordinator")))

    cluster = cluster_with(*events(5))
    with pytest.raises(OffsetsUnfetched, match="issue #5586") as raised:
        Harness(cluster, hooks=[stranded]).run()
    assert raised.value.exit_code == EXIT_RESTART
    assert sorted(s.key for s in cluster.committed(ORDERS)) == [
        f"e-{i}".encode() for i in range(5)]


@pytest.mark.parametrize("dedup", [True, False])
def test_a_committed_offset_below_the_log_start_is_reported_with_or_without_dedup(
        dedup: bool, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 31-b: retention deleted records the group had not read, and nothing said so; review
    # 31-2: the first fix said it only with dedup on.
    cluster = cluster_with(*events(5))
    cluster.group_offsets[(RAW, 0)] = 1

    def log_start_3(self: FakeConsumer, tp: TopicPartition, timeout: Any = None,
                    cached: bool = False) -> tuple[int, int]:
        return 3, len(self.cluster.raw[tp.partition])

    monkeypatch.setattr(FakeConsumer, "get_watermark_offsets", log_start_3)
    Harness(cluster, dedup={"enabled": dedup, "changelog_topic": CHANGELOG}).run()
    [line] = [r.getMessage() for r in caplog.records if "raw_records_deleted" in r.getMessage()]
    assert f"topic={RAW} partition=0 offsets=1-2 count=2" in line
    # Review 50-b F9: without -c the command exited 2 (Missing option '-c' / '--config').
    assert "`cdc-router outbox republish -c CONFIG --since TIME --dry-run`" in line


def test_a_source_topic_the_credentials_may_not_read_stops_the_router_with_the_reason() -> None:
    # Review, session 26: TOPIC_AUTHORIZATION_FAILED arrived as a message error, and the
    # router logged a warning for each poll, for ever.
    def refused(consumer: FakeConsumer) -> None:
        consumer.events.append(Message(topic=RAW, partition=0, error=KafkaError(
            KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed")))

    harness = Harness(cluster_with(*events(5)), hooks=[refused])
    with pytest.raises(FatalKafkaError, match="TOPIC_AUTHORIZATION_FAILED") as raised:
        harness.run()
    assert raised.value.exit_code == 1


class _FlakyChangelog(FakeChangelog):
    error: Exception = KafkaException(KafkaError(KafkaError._TIMED_OUT, "ListOffsets timed out"))

    def catch_up(self, *, since_ms: int | None = None) -> Any:
        raise self.error


@pytest.mark.parametrize("error", [
    KafkaException(KafkaError(KafkaError._TIMED_OUT, "ListOffsets timed out")),
    ReadTimedOut("the read of the dedup changelog topic c made no progress for over 300s")])
def test_a_changelog_restore_failing_at_assignment_exits_for_a_restart_and_routes_nothing(
        error: Exception) -> None:
    # confluent-kafka assigns the partitions even when on_assign raises: a KafkaException out
    # of consume() was taken for a passing outage, and the router routed on with a replay
    # filter short of the ids delivered, replays included (review, session 25).
    now_ms = int(time.time() * 1000)
    cluster = cluster_with(*events(10))
    [batch] = changelog_records([f"e-{i}" for i in range(5)], now_ms)
    cluster.topics[CHANGELOG] = [Stored(CHANGELOG, 0, batch.key, batch.value, [], None)]
    harness = Harness(cluster)
    harness.router._changelog = flaky = _FlakyChangelog(cluster, CHANGELOG)
    flaky.error = error
    with pytest.raises(RestoreFailed, match=r"timed out|no progress for over 300s") as raised:
        harness.run()
    assert raised.value.exit_code == EXIT_RESTART
    assert harness.delivered() == [] and cluster.group_offsets == {}


class _RevokedBetweenConsumes(FakeConsumer):
    """A rebalance served by the poll's second consume() (timeout 0), after the first one
    returned a record; the partitions come back at the next poll, from the committed offsets."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rebalanced = False
        self.offsets_sent_unowned: list[Any] = []

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        if timeout == 0 and not self.rebalanced:
            self.rebalanced = True
            self.revoke_all()
            return []
        return super().consume(num_messages, timeout)


def test_a_record_whose_partition_is_revoked_after_it_was_fetched_is_left_to_its_owner() -> None:
    # librdkafka drops records of a revoked partition within one consume() call only; the
    # router's poll is two calls (review, session 25).
    cluster = cluster_with(*events(3))
    harness = Harness(cluster)
    consumers: list[_RevokedBetweenConsumes] = []

    def consumer(conf: dict[str, Any]) -> FakeConsumer:
        made = _RevokedBetweenConsumes(cluster, conf, on_idle=harness._idle)
        harness.consumer = made
        consumers.append(made)
        return made

    sends: list[tuple[list[int], list[int]]] = []
    real_send = FakeProducer.send_offsets_to_transaction

    def send_offsets(producer: FakeProducer, offsets: Any, metadata: Any, timeout: float) -> None:
        sends.append(([tp.partition for tp in offsets], list(consumers[0].assigned)))
        real_send(producer, offsets, metadata, timeout)

    harness.router._consumer_factory = consumer
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FakeProducer, "send_offsets_to_transaction", send_offsets)
        harness.run()
    assert consumers[0].rebalanced
    assert sends and all(set(partitions) <= set(owned) for partitions, owned in sends), sends
    assert sorted(harness.delivered()) == ["e-0", "e-1", "e-2"]
    assert harness.metric("cdc_router_duplicates_dropped_total") == 0


def test_consumer_lag_and_the_last_commit_are_in_the_metrics() -> None:
    seen: list[float] = []
    cluster = cluster_with(*events(700))
    harness = Harness(cluster, hooks=[lambda consumer: seen.append(
        harness.metric("cdc_router_consumer_lag", topic=RAW, partition="0"))])
    started = time.time()
    harness.run()
    assert seen == [200.0]  # after the first poll of 500 records, 200 left to read
    last_commit = harness.metric("cdc_router_last_commit_timestamp_seconds")
    assert started <= last_commit <= time.time()
    assert 0 <= harness.metric("cdc_router_last_commit_age_seconds") < 60


def test_tune_gc_freezes_the_start_up_objects_and_makes_collections_rarer() -> None:
    thresholds = gc.get_threshold()
    gc.unfreeze()
    try:
        tune_gc()
        frozen, tuned = gc.get_freeze_count(), gc.get_threshold()
    finally:  # the rest of the test session's objects stay collectable, as often as before
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    assert frozen > 0
    assert tuned == (GC_GEN0, *thresholds[1:])


def test_the_library_run_leaves_the_collector_alone() -> None:
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    Harness(cluster_with(*events(3))).run()
    assert (gc.get_threshold(), gc.get_freeze_count()) == (thresholds, frozen)


@pytest.mark.parametrize(("missing", "field"), [(DLQ, "dead_letter.topic"),
                                                (CHANGELOG, "dedup.changelog_topic")])
def test_a_missing_dead_letter_or_changelog_topic_stops_the_router_at_start(
        missing: str, field: str) -> None:
    # QA session 27-a: without its dead-letter topic the router ran until its first poison
    # event, then every route halted 20 s and the router exited 1.
    # QA 35-e F2: Kafka hides a topic the principal may not describe (a revoked Write takes
    # Describe with it): "does not exist" alone sent the operator to `topics apply`.
    cluster = cluster_with(*events(3))
    del cluster.partitions[missing]
    harness = Harness(cluster)
    with pytest.raises(ConfigError, match=f"field '{field}': topic {missing} does not exist, "
                       "or this process's principal may not describe it .*topics apply.*, or "
                       "grant the principal Write on the topic") as raised:
        harness.run()
    assert ("Describe) and Read" in str(raised.value)) == (missing == CHANGELOG)
    assert cluster.committed(ORDERS) == []
    # QA 61-a F-5: the cleanup (on_started) did not start, so its sweep said nothing first.
    assert harness.started == 0


def test_on_started_is_called_once_when_the_router_has_started() -> None:
    assert Harness(cluster_with(*events(3))).run().started == 1


def test_a_routes_fixed_topic_missing_at_start_is_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 47-d F9: `rules check` warned, the router started without a word and dead-lettered
    # every event of the route (457).
    caplog.set_level(logging.WARNING, logger="cdc_router")
    Harness(cluster_with(*events(2)), routes=[{"match": {"type": "Missing"}, "topic": "nowhere"},
                                             {"topic": ORDERS}]).run()
    [line] = [r.getMessage() for r in caplog.records if "destination_missing" in r.getMessage()]
    assert "routes[0] sends to topic nowhere, which does not exist in the cluster" in line


def test_a_changelog_that_forgets_ids_before_the_window_stops_the_router_at_start() -> None:
    # QA session 29-b: a changelog kept 20 s restored 6 of 30 ids, and replays of the others
    # were delivered again.
    cluster = cluster_with(*events(3))
    cluster.topic_configs[CHANGELOG] = {"retention.ms": "20000"}
    with pytest.raises(ConfigError, match=f"field 'dedup.changelog_topic': topic {CHANGELOG} "
                       r"keeps its records 20000 ms \(retention.ms\), less than "
                       "dedup.window_ms.*topics apply"):
        Harness(cluster).run()
    assert cluster.committed(ORDERS) == []
    cluster.topic_configs[CHANGELOG] = {"retention.ms": "20000", "cleanup.policy": "compact"}
    Harness(cluster).run()  # compact only: nothing deleted by time (review, session 29)
    assert len(cluster.committed(ORDERS)) == 3


def test_a_changelog_stamped_by_the_broker_is_a_warning_at_start(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 66-c F-2: the restore starts at the first record stamped window + 1 h ago; with
    # LogAppendTime that is the broker's clock, and one far behind leaves marks unread.
    caplog.set_level(logging.WARNING, logger="cdc_router")
    cluster = cluster_with(*events(2))
    cluster.topic_configs[CHANGELOG] = {"message.timestamp.type": "LogAppendTime"}
    Harness(cluster).run()  # routing goes on
    assert len(cluster.committed(ORDERS)) == 2
    [line] = [r.getMessage() for r in caplog.records
              if "changelog_log_append_time" in r.getMessage()]
    assert f"topic={CHANGELOG}" in line and "message.timestamp.type=CreateTime" in line
    caplog.clear()
    cluster.topic_configs[CHANGELOG] = {"message.timestamp.type": "CreateTime"}
    Harness(cluster_with(*events(1))).run()
    assert "changelog_log_append_time" not in caplog.text


def test_a_changelog_kept_less_than_the_cleanup_retention_is_a_warning_at_start(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 49-b F2: after a restart the retention cleanup finds the rows delivered before it
    # only by the changelog's marks; kept for the window alone, rows delivered longer ago
    # than the window but younger than the retention stayed in the table for good.
    caplog.set_level(logging.WARNING, logger="cdc_router")
    cluster = cluster_with(*events(2))
    week_ms, month_ms = 7 * 86_400_000, 30 * 86_400_000
    cluster.topic_configs[CHANGELOG] = {"retention.ms": str(week_ms)}
    cleanup = {"mode": "retention", "retention_ms": month_ms, "dsn": "postgresql://unused"}
    Harness(cluster, cleanup=cleanup).run()  # routing goes on
    assert len(cluster.committed(ORDERS)) == 2
    [line] = [r.getMessage() for r in caplog.records if "cleanup_sweep_short" in r.getMessage()]
    assert f"retention_ms={week_ms}" in line and f"cleanup.retention_ms ({month_ms}) + 1 h" \
        in line and f"raise its retention.ms to {month_ms + 3_600_000} with `cdc-router " \
        "topics apply" in line
    caplog.clear()
    cluster.topic_configs[CHANGELOG] = {"retention.ms": str(month_ms + 3_600_000)}
    Harness(cluster_with(*events(1)), cleanup=cleanup).run()
    assert "cleanup_sweep_short" not in caplog.text


def test_a_stop_during_an_outage_tries_the_commit_once_and_forgets_the_batch() -> None:
    # QA session 27-b: SIGTERM with Kafka down took 6 min 18 s: the stop's commit, its abort
    # and the close's revoke each waited out every retry of every call.
    down = KafkaError(KafkaError._TIMED_OUT, "Kafka is down", retriable=True)
    cluster = cluster_with(*events(4))
    harness: Harness

    def outage_then_stop(consumer: FakeConsumer) -> None:
        cluster.raw[0] += [(b"k", value) for value in events(8)[4:]]
        cluster.commit_failures = [down] * 50
        cluster.abort_failures = [down] * 50
        harness.router.stop()

    harness = Harness(cluster, hooks=[outage_then_stop], delivery=SLOW_COMMIT)
    # The commit got no answer: in doubt, which only a new process settles (exit 75).
    with pytest.raises(TransactionInDoubt):
        harness.router.run()
    assert len(cluster.commit_failures) == 49  # one try, not six
    assert len(cluster.abort_failures) == 50  # librdkafka refuses the abort then: none tried
    assert sorted(harness.delivered()) == [f"e-{i}" for i in range(4)]  # the first batch
    assert cluster.group_offsets == {(RAW, 0): 4}  # the rest is read again on restart



_INVALID_TXN_STATE = KafkaError(KafkaError.INVALID_TXN_STATE, "Failed to end transaction: "
                                "Broker: Producer attempted a transactional operation in an "
                                "invalid state", fatal=True)
_TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, "1 message(s) timed out",
                        txn_requires_abort=True)


def test_a_destination_deleted_under_an_open_batch_renews_the_producer_and_goes_on() -> None:
    # Measured on Kafka 4.x: the records of a topic deleted under an open transaction time
    # out, and the abort is refused for good (INVALID_TXN_STATE); the router stopped there.
    cluster = cluster_with(*events(4))

    def delete_orders(consumer: FakeConsumer) -> None:
        cluster.raw[0] += [(b"k", value) for value in events(8)[4:]]
        del cluster.partitions[ORDERS]
        cluster.abort_failures = [_INVALID_TXN_STATE]
        # Review, session 28: the new producer's init timing out ended in a traceback.
        cluster.init_failures = [KafkaError(KafkaError._TIMED_OUT, "init timed out",
                                            retriable=True)]

    harness = Harness(cluster, hooks=[delete_orders], delivery=SLOW_COMMIT).run()
    assert sorted(harness.delivered()) == [f"e-{i}" for i in range(4)]
    letters = harness.letters()
    assert sorted(letter.header("dlq.event.id") for letter in letters) == \
        [f"e-{i}" for i in range(4, 8)]
    assert {letter.header("dlq.stage") for letter in letters} == {"route"}
    assert all(f"{ORDERS} does not exist" in letter.header("dlq.error.message")
               for letter in letters)
    assert (cluster.producers_initialised, cluster.producers_purged) == (2, 1)
    assert cluster.init_failures == [] and 0.5 in harness.waits  # retried after a backoff
    assert cluster.group_offsets == {(RAW, 0): 8}


def test_an_abort_that_keeps_timing_out_is_ended_by_a_new_producer() -> None:
    # QA 36-b: the group expelled the member (UNKNOWN_MEMBER_ID on the offsets), and the abort
    # that followed timed out at every try for 8.5 min, its EndTxn stuck in the producer's
    # queue: the router retried it without end, consuming nothing and never exiting.
    expelled = KafkaError(KafkaError.UNKNOWN_MEMBER_ID, "Broker: Unknown member",
                          txn_requires_abort=True)
    stuck = KafkaError(KafkaError._TIMED_OUT, "Timed out", retriable=True)
    cluster = cluster_with(*events(4))

    def expel(consumer: FakeConsumer) -> None:
        cluster.raw[0] += [(b"k", value) for value in events(8)[4:]]
        cluster.offsets_failures = [expelled]
        cluster.abort_failures = [stuck] * 60

    harness = Harness(cluster, hooks=[expel], delivery=SLOW_COMMIT).run()
    assert len(cluster.abort_failures) == 54  # one abort's tries, then a new producer
    assert (cluster.producers_initialised, cluster.producers_purged) == (2, 1)
    assert sorted(harness.delivered()) == [f"e-{i}" for i in range(8)]  # each once
    assert harness.letters() == [] and cluster.group_offsets == {(RAW, 0): 8}


def test_the_first_commit_after_aborted_batches_is_said_once(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 60-a F-3: after the operator's fix (a stream recreated) the router went on after its
    # backoff and no line said so; only cdc_router_consecutive_aborts falling to 0 did.
    cluster = cluster_with(*events(4))
    cluster.commit_failures = [_TIMED_OUT, _TIMED_OUT]
    with caplog.at_level(logging.INFO, logger="cdc_router.router"):
        harness = Harness(cluster, delivery=SLOW_COMMIT).run()
    assert sorted(harness.delivered()) == [f"e-{i}" for i in range(4)]
    said = [r.getMessage() for r in caplog.records if "after_aborts" in r.getMessage()]
    assert said == ["event=batch_committed_after_aborts aborted=2"]


def test_a_second_fatal_transaction_error_before_any_commit_stops_the_router() -> None:
    cluster = cluster_with(*events(4))

    def fail_twice(consumer: FakeConsumer) -> None:
        cluster.raw[0] += [(b"k", value) for value in events(8)[4:]]
        cluster.commit_failures = [_TIMED_OUT, _TIMED_OUT]
        cluster.abort_failures = [_INVALID_TXN_STATE, _INVALID_TXN_STATE]

    harness = Harness(cluster, hooks=[fail_twice], delivery=SLOW_COMMIT)
    with pytest.raises(FatalKafkaError, match="INVALID_TXN_STATE"):
        harness.router.run()
    assert cluster.producers_initialised == 2  # renewed once, then stopped
    assert sorted(harness.delivered()) == [f"e-{i}" for i in range(4)]
    assert cluster.group_offsets == {(RAW, 0): 4}


def test_a_dead_lettered_id_read_again_is_dropped_with_the_replay_that_delivers_it(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 48-a F-med-3: the row of a dead letter, republished once the rules were fixed, was
    # dropped as a replay with an INFO line: its letter is what delivers it.
    big = raw_event("e-big", payload='{"pad": "' + "x" * 300 + '"}')
    cluster = cluster_with(big, *events(2), big)
    with caplog.at_level(logging.INFO, logger="cdc_router.router"):
        harness = Harness(cluster, delivery={"max_payload_bytes": 200}).run()
    assert sorted(harness.delivered()) == ["e-0", "e-1"] and len(harness.letters()) == 1
    dropped = [record for record in caplog.records if "replay_dropped" in record.getMessage()]
    assert [(record.levelname, record.getMessage().split(": ", 1)[1]) for record in dropped] == [
        ("WARNING", "the id was dead-lettered; unless a `dlq replay` delivered it since, "
                    "`cdc-router dlq replay --id 'e-big'` delivers its letter (one without its "
                    "value, for size, from its raw record while the raw topic keeps it; if that "
                    "is gone, the replay says what to do)")]


def test_a_column_no_event_of_the_topic_has_stops_the_router_with_the_fix() -> None:
    # QA 48-a F-med-1: source.outbox naming a column the table calls otherwise dead-lettered
    # every event (7,219 of 7,219 in under a second), the router running on.
    cluster = cluster_with(*events(RUN_LIMIT + 20))
    # One batch: with the default 100 ms commit interval a loaded machine committed part of
    # the run's dead letters before the limit (a flake, fixer 53-g).
    harness = Harness(cluster, source={"topics": [RAW], "group_id": "g",
                                       "outbox": {"payload": "body"}}, delivery=SLOW_COMMIT)
    with pytest.raises(ConfigError) as stopped:
        harness.router.run()
    assert stopped.value.field == "source.outbox.payload" and stopped.value.exit_code == 1
    assert f"the last {RUN_LIMIT} change events of {RAW} have no column 'body'" in \
        str(stopped.value)
    assert "its rows have id, aggregatetype, aggregateid, type, payload" in str(stopped.value)
    assert "COMMIT_MAX_RECORDS" not in str(stopped.value)
    # Review 64 (low): no event had it (a typo, a new pipeline): no rename advice either.
    assert "renamed" not in str(stopped.value) and "[body, NEW]" not in str(stopped.value)
    assert cluster.group_offsets == {} and harness.letters() == []  # the batch aborted


def test_a_column_renamed_under_a_backlog_is_read_under_both_names_listed() -> None:
    # QA 63-a F-1: `payload` renamed `body` while rows written before the rename were still to
    # route; one batch held both, so the old name stopped the router at the run of new rows
    # and the new name at the run of old ones, each batch aborted: no restart made progress.
    renamed = [json.loads(value) for value in events(2 * (RUN_LIMIT + 20))]
    for envelope in renamed[RUN_LIMIT + 20:]:
        envelope["after"]["body"] = envelope["after"].pop("payload")
    cluster = cluster_with(*[json.dumps(envelope).encode() for envelope in renamed])
    for name in ("body", "payload"):  # either name alone stalls, as QA saw
        with pytest.raises(ConfigError) as stopped:
            Harness(cluster, source={"topics": [RAW], "group_id": "g", "outbox": {
                "payload": name}}, delivery=SLOW_COMMIT).router.run()
        assert cluster.group_offsets == {}  # the batch aborted, the whole events with it
    assert "Earlier events had it: if it was renamed while rows written before the rename " \
        "were still to route, list the new name after the old ones, `source.outbox.payload: " \
        "[payload, NEW]` (the first name with a value in a row is read), start the router " \
        "again, and drop 'payload' from the list once its rows are routed" in str(stopped.value), \
        str(stopped.value)
    assert "COMMIT_MAX_RECORDS" not in str(stopped.value)
    harness = Harness(cluster, source={"topics": [RAW], "group_id": "g", "outbox": {
        "payload": ["payload", "body"]}}, delivery=SLOW_COMMIT).run()
    assert sorted(harness.delivered()) == sorted(f"e-{i}" for i in range(len(renamed)))
    assert harness.letters() == [] and cluster.group_offsets == {(RAW, 0): len(renamed)}
    assert {stored.value for stored in cluster.committed(ORDERS)} == {b'{"n": 1}'}


def test_a_listed_column_none_of_whose_names_a_row_has_still_stops_the_router() -> None:
    cluster = cluster_with(*events(RUN_LIMIT + 20))
    harness = Harness(cluster, source={"topics": [RAW], "group_id": "g", "outbox": {
        "aggregatetype": ["kind", "category"]}}, delivery=SLOW_COMMIT)
    with pytest.raises(ConfigError) as stopped:
        harness.router.run()
    assert stopped.value.field == "source.outbox.aggregatetype"
    assert stopped.value.value == ["kind", "category"]
    assert f"the last {RUN_LIMIT} change events of {RAW} have none of the columns 'kind', " \
        "'category'" in str(stopped.value)
    # No event had any of them: names to correct, no rename to list (review 64).
    assert "NEW]" not in str(stopped.value)


def test_events_without_a_column_among_events_with_it_are_dead_letters_only() -> None:
    lacking = [json.loads(value) for value in events(3 * RUN_LIMIT)]
    for envelope in lacking:
        del envelope["after"]["payload"]
    values = [json.dumps(envelope).encode() for envelope in lacking]
    for n in range(0, len(values), RUN_LIMIT - 1):  # one whole event in every RUN_LIMIT - 1
        values[n] = raw_event(f"whole-{n}")
    harness = Harness(cluster_with(*values)).run()
    assert len(harness.delivered()) == 4 and len(harness.letters()) == 3 * RUN_LIMIT - 4
    assert "the row has 'id, aggregatetype" in harness.letters()[0].header("dlq.error.message")


def _with_columns(values: list[bytes], **columns: Any) -> list[bytes]:
    """`values` (raw events) with these columns added to each row."""
    envelopes = [json.loads(value) for value in values]
    for envelope in envelopes:
        envelope["after"].update(columns)
    return [json.dumps(envelope).encode() for envelope in envelopes]


def test_a_key_column_no_event_of_the_route_has_stops_the_router_with_the_fix() -> None:
    # QA 60-c F-2: `key: no_such_column` passed the start, then dead-lettered every event of
    # the route (18,736 letters in 20 s), the router running on.
    cluster = cluster_with(*_with_columns(events(RUN_LIMIT + 20), tenant="acme"))
    harness = Harness(cluster, routes=[{"topic": ORDERS, "key": "no_such_column"}],
                      delivery=SLOW_COMMIT)
    with pytest.raises(ConfigError) as stopped:
        harness.router.run()
    assert stopped.value.field == "routes[0].key" and stopped.value.exit_code == 1
    assert stopped.value.value == "no_such_column"
    assert f"the last {RUN_LIMIT} events of routes[0] have no column 'no_such_column'" in \
        str(stopped.value)
    assert "the rows' other columns are 'tenant': set routes[0].key to one of them" in \
        str(stopped.value)
    assert cluster.group_offsets == {} and harness.letters() == []  # the batch aborted
    assert "list the new name after the old ones, `routes[0].key: [no_such_column, NEW]`" in \
        str(stopped.value)


def test_a_key_column_renamed_under_a_backlog_is_read_under_both_names_listed() -> None:
    # QA 63-a F-7: as F-1, for a route's key column (zone renamed zone_id).
    old = _with_columns(events(50), zone="acme")
    new = _with_columns([raw_event(f"n-{n}") for n in range(RUN_LIMIT + 20)], zone_id="beta")
    cluster = cluster_with(*old, *new)
    with pytest.raises(ConfigError) as stopped:
        Harness(cluster, routes=[{"topic": ORDERS, "key": "zone"}],
                delivery=SLOW_COMMIT).router.run()
    assert "`routes[0].key: [zone, NEW]`" in str(stopped.value)
    harness = Harness(cluster, routes=[{"topic": ORDERS, "key": ["zone", "zone_id"]}],
                      delivery=SLOW_COMMIT).run()
    assert sorted(harness.delivered()) == ["acme"] * 50 + ["beta"] * (RUN_LIMIT + 20)
    assert harness.letters() == []
    lacking = Harness(cluster_with(*events(RUN_LIMIT + 5)), routes=[
        {"topic": ORDERS, "key": ["zone", "zone_id"]}], delivery=SLOW_COMMIT)
    with pytest.raises(ConfigError) as stopped:
        lacking.router.run()
    assert stopped.value.value == ["zone", "zone_id"]
    assert "have none of the columns 'zone', 'zone_id'" in str(stopped.value)


def test_a_null_key_column_or_one_some_events_of_the_route_have_is_a_letter_only() -> None:
    null = _with_columns(events(RUN_LIMIT + 5), region=None)
    lacking = [raw_event(f"x-{n}") for n in range(2 * RUN_LIMIT)]
    for n in range(0, len(lacking), RUN_LIMIT - 1):  # one with the column every RUN_LIMIT - 1
        lacking[n] = _with_columns([raw_event(f"has-{n}")], region="eu")[0]
    harness = Harness(cluster_with(*null, *lacking), routes=[{"topic": ORDERS,
                                                              "key": "region"}]).run()
    assert harness.delivered() == ["eu"] * 3  # has-0, has-99, has-198, keyed by region
    reasons = [letter.header("dlq.error.message") for letter in harness.letters()]
    assert len(reasons) == RUN_LIMIT + 5 + 2 * RUN_LIMIT - 3
    assert sum("is null in the row: the route needs a value there in every row it takes "
               "(or another key; then `cdc-router dlq replay` delivers this one)" in reason
               for reason in reasons) == RUN_LIMIT + 5
    assert sum("is not a column of the row" in reason for reason in reasons) == \
        2 * RUN_LIMIT - 3


def test_an_idle_router_serves_its_producer_s_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    # librdkafka's log lines reach Python only when the producer is served: an idle router
    # logged a refused connection 23 s late, at its next transaction (chaos 53-e F1).
    served: list[float] = []
    poll = FakeProducer.poll

    def counted(self: FakeProducer, timeout: float = 0) -> int:
        served.append(timeout)
        return poll(self, timeout)

    monkeypatch.setattr(FakeProducer, "poll", counted)
    harness = Harness(cluster_with()).run()
    assert harness.idle_calls == 1 and served == [0]


def test_a_rebalance_that_assigns_nothing_reads_no_changelog(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Chaos 53-e F2: the instance a zombie took its partition back from read the whole dedup
    # changelog for nothing; it still logs event=assigned, its sign that it joined.
    read: list[str] = []
    catch_up = FakeChangelog.catch_up
    monkeypatch.setattr(FakeChangelog, "catch_up",
                        lambda self, *a, **k: read.append("read") or catch_up(self, *a, **k))
    harness = Harness(cluster_with())
    with caplog.at_level(logging.INFO, logger="cdc_router"):
        harness.router._on_assign(None, [])
    assert read == []
    assert [r.getMessage() for r in caplog.records if "event=assigned" in r.getMessage()] \
        == ["event=assigned partitions= dedup_ids=0 restored=0 slices=0 seconds=0.0"]


class _LoweredLater(dict[str, dict[str, str]]):
    """topic_configs whose dead-letter topic has no limit at the router's start, then 4000."""

    def get(self, topic: str, default: Any = None) -> Any:  # type: ignore[override]
        if topic != DLQ:
            return super().get(topic, default)
        self.reads = getattr(self, "reads", 0) + 1
        return {} if self.reads == 1 else {"max.message.bytes": "4000"}


def test_a_dead_letter_topic_limit_lowered_while_running_sends_the_letter_without_its_value(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 57-a F-3: the dead-letter topic's max.message.bytes lowered to 4000 while the router
    # ran: a letter of 5.6 KB was refused and the router stopped (exit 1), saying to check
    # ACLs; a restart sent it without its value. It now reads the limit again and goes on.
    values = events(4)
    values[2] = raw_event("big", payload='{"blob": "' + "x" * 5000 + '"}')
    cluster = cluster_with(*values, refuse=lambda topic, value, ts: KafkaError.MSG_SIZE_TOO_LARGE
                           if value and len(value) > (4000 if topic == DLQ else 3000) else None)
    cluster.topic_configs = _LoweredLater()
    harness = Harness(cluster).run()
    assert sorted(harness.delivered()) == ["e-0", "e-1", "e-3"]
    [letter] = harness.letters()
    assert letter.header("dlq.event.id") == "big" and letter.value is None
    assert int(letter.header("dlq.value.dropped.bytes") or 0) > 5000
    assert "MSG_SIZE_TOO_LARGE" in (letter.header("dlq.error.message") or "")
    # Reread 57-a F-4: the hint said raising the limit was enough; only a restart reads it.
    assert "raise the topic's max.message.bytes and restart the router" in caplog.text


def test_a_letter_refused_at_an_unchanged_limit_stops_saying_a_restart_does_not_help(
        caplog: pytest.LogCaptureFixture) -> None:
    # Reread 57-a F-1: the dead-letter topic refuses a letter within its max.message.bytes
    # (a batch of letters over it, say): reading the limit again finds it unchanged; the stop
    # line said "or restart", which takes the same path. It now says what helps, with values.
    values = events(4)
    values[2] = raw_event("big", payload='{"blob": "' + "x" * 5000 + '"}')
    cluster = cluster_with(*values, refuse=lambda topic, value, ts: KafkaError.MSG_SIZE_TOO_LARGE
                           if value and len(value) > 3000 else None)
    cluster.topic_configs = {DLQ: {"max.message.bytes": "100000"}}
    with pytest.raises(FatalKafkaError) as stopped:
        Harness(cluster).run()
    assert "a restart does not help: cdc-router.dlq's max.message.bytes (100000, as read " \
        "now) must exceed the producer's batch.size (1000000)" in str(stopped.value)
    assert "event=dead_letter_limit_lowered" not in caplog.text
