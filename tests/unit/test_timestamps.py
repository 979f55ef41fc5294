"""Destination topics' timestamp and size limits: a created_at or a size the broker would refuse
is a dead letter before it is produced (router/timestamps.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc_router.config.compiled import compile_config
from cdc_router.config.model import RouterConfig
from cdc_router.dead_letter import batch_size
from cdc_router.router.step import DeadLettered, RecordStep, Routed
from cdc_router.router.timestamps import (
    LIMITS_TTL_S,
    MARGIN_MS,
    SmallTopics,
    TopicLimits,
    TopicLimitsCache,
    compresses,
    limits_from_config,
)
from tests.unit.router_fakes import raw_event

SOURCE = "outbox.public.outbox"
NOW_MS = 1_796_021_196_617
HOUR_MS = 3_600_000
KAFKA_4_DEFAULTS = {"message.timestamp.type": "CreateTime",
                    "message.timestamp.before.max.ms": str(2**63 - 1),
                    "message.timestamp.after.max.ms": str(HOUR_MS)}


def test_kafka_4_defaults_refuse_an_hour_ahead_less_the_margin_and_nothing_behind() -> None:
    limits = limits_from_config(KAFKA_4_DEFAULTS)
    assert limits == TopicLimits(2**63 - 1, HOUR_MS)
    assert limits.problem("orders", NOW_MS + HOUR_MS - MARGIN_MS, NOW_MS) is None
    ahead = limits.problem("orders", NOW_MS + HOUR_MS - MARGIN_MS + 1, NOW_MS)
    assert ahead is not None
    assert "orders" in ahead and "INVALID_TIMESTAMP" in ahead
    assert "message.timestamp.after.max.ms (3600000)" in ahead
    assert "delivery.record_timestamp: now" in ahead
    assert limits.problem("orders", 0, NOW_MS) is None, "the epoch is fine without a before limit"


@pytest.mark.parametrize(("ahead_ms", "hint"), [
    (9 * HOUR_MS - 500, "; 9 h ahead, a time zone's offset: is created_at written in local time"),
    (int(5.5 * HOUR_MS) + 90_000, "; 5.5 h ahead, a time zone's offset"),
    (2 * HOUR_MS + 20 * 60_000, None), (20 * HOUR_MS, None)])
def test_a_skew_of_whole_hours_names_the_time_zone(ahead_ms: int, hint: str | None) -> None:
    # QA 31-a: a created_at written in Tokyo's local time, 9 h ahead, was only told to set
    # delivery.record_timestamp: now.
    limits = limits_from_config(KAFKA_4_DEFAULTS)
    assert limits is not None
    problem = limits.problem("orders", NOW_MS + ahead_ms, NOW_MS)
    assert problem is not None
    assert (hint in problem) if hint else "time zone" not in problem


def test_a_before_limit_refuses_an_old_timestamp() -> None:
    limits = TopicLimits(before_ms=24 * HOUR_MS, after_ms=HOUR_MS)
    old = limits.problem("orders", NOW_MS - 24 * HOUR_MS, NOW_MS)
    assert old is not None and "behind" in old and "before.max.ms" in old
    assert limits.problem("orders", NOW_MS - 23 * HOUR_MS, NOW_MS) is None


@pytest.mark.parametrize(("limits", "timestamp_ms", "refused"), [
    # A 30 s limit: a row of this second is fine; the margin is a tenth of the limit.
    (TopicLimits(2**63 - 1, 30_000), NOW_MS + 50, False),
    (TopicLimits(2**63 - 1, 30_000), NOW_MS + 26_999, False),
    (TopicLimits(2**63 - 1, 30_000), NOW_MS + 27_001, True),
    # A 2 min before limit: a backlog a minute behind is still delivered.
    (TopicLimits(120_000, HOUR_MS), NOW_MS - 61_000, False),
    (TopicLimits(120_000, HOUR_MS), NOW_MS - 108_001, True),
])
def test_the_margin_is_at_most_a_tenth_of_a_short_limit(limits: TopicLimits,
                                                        timestamp_ms: int,
                                                        refused: bool) -> None:
    assert (limits.problem("orders", timestamp_ms, NOW_MS) is not None) is refused


def test_a_broker_before_3_6_has_one_symmetric_limit_or_none() -> None:
    assert limits_from_config({"message.timestamp.difference.max.ms": "600000"}) == \
        TopicLimits(600_000, 600_000)
    assert limits_from_config({}) == TopicLimits(2**63 - 1, 2**63 - 1)


DAY_MS = 24 * HOUR_MS


def test_a_timestamp_past_the_topics_time_retention_is_refused_before_it_is_lost() -> None:
    # QA, session 28: 50 rows with a created_at 8 days old were delivered to a topic of 7 days'
    # retention, and the broker deleted their segment 4 minutes later.
    limits = limits_from_config({**KAFKA_4_DEFAULTS, "retention.ms": str(7 * DAY_MS),
                                 "cleanup.policy": "delete"})
    assert limits == TopicLimits(2**63 - 1, HOUR_MS, 7 * DAY_MS)
    old = limits.problem("orders", NOW_MS - 8 * DAY_MS, NOW_MS)
    assert old is not None and "retention.ms of orders (604800000)" in old
    assert "delivery.record_timestamp: now" in old and "8.00 days old" in old
    assert limits.problem("orders", NOW_MS - 7 * DAY_MS + HOUR_MS - 1, NOW_MS) is not None
    assert limits.problem("orders", NOW_MS - 7 * DAY_MS + HOUR_MS + 1, NOW_MS) is None
    # A short retention keeps a tenth of itself as headroom: a backlog of 50 minutes still
    # flows onto a topic of an hour's retention.
    short = TopicLimits(2**63 - 1, HOUR_MS, HOUR_MS)
    assert short.problem("t", NOW_MS - 50 * 60_000, NOW_MS) is None
    assert short.problem("t", NOW_MS - 55 * 60_000, NOW_MS) is not None


@pytest.mark.parametrize(("age_ms", "said"), [
    (90_000, "90 s old"), (54 * 60_000, "54 min old"), (30 * HOUR_MS, "30.0 h old"),
    (8 * DAY_MS, "8.00 days old")])
def test_the_retention_reason_gives_the_age_in_a_unit_that_reads(age_ms: int, said: str) -> None:
    # QA 57-a F-5: a row 90 s old on a topic of 60 s retention read "0.00 days old".
    limits = TopicLimits(2**63 - 1, HOUR_MS, 60_000 if age_ms < HOUR_MS else DAY_MS)
    reason = limits.problem("dest.G", NOW_MS - age_ms, NOW_MS)
    assert reason is not None and f" is {said}, within " in reason


@pytest.mark.parametrize("entries", [
    {"retention.ms": "-1", "cleanup.policy": "delete"},
    {"retention.ms": str(DAY_MS), "cleanup.policy": "compact"},
])
def test_no_time_retention_no_retention_check(entries: dict[str, str]) -> None:
    limits = limits_from_config({**KAFKA_4_DEFAULTS, **entries})
    assert limits is not None and limits.retention_ms is None
    assert limits.problem("t", 0, NOW_MS) is None


def test_log_append_time_topics_have_no_limit() -> None:
    assert limits_from_config({"message.timestamp.type": "LogAppendTime"}) is None


class _Describe:
    def __init__(self, answers: Mapping[str, Mapping[str, str] | Exception]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def __call__(self, topic: str, timeout_s: float) -> Mapping[str, str]:
        self.calls.append(topic)
        answer = self.answers[topic]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_limits_are_cached_and_read_again_after_their_ttl() -> None:
    describe, now = _Describe({"orders": KAFKA_4_DEFAULTS}), [0.0]
    limits = TopicLimitsCache(describe, clock=lambda: now[0])
    assert limits("orders") == limits("orders") == TopicLimits(2**63 - 1, HOUR_MS)
    assert describe.calls == ["orders"]
    now[0] = LIMITS_TTL_S + 1
    limits("orders")
    assert describe.calls == ["orders", "orders"]


def test_a_forgotten_topic_read_again_keeps_its_limits_when_the_read_fails() -> None:
    # Reread 57-a F-3: after a size refusal the entry was dropped before the re-read; a
    # re-read that timed out cached None, the size pre-check off for LIMITS_TTL_S.
    describe = _Describe({"orders": {**KAFKA_4_DEFAULTS, "max.message.bytes": "5000"}})
    limits = TopicLimitsCache(describe)
    assert (known := limits("orders")) is not None and known.max_message_bytes == 5000
    describe.answers = {"orders": TimeoutError()}
    limits.forget("orders")
    assert limits("orders") == known and describe.calls == ["orders", "orders"]
    describe.answers = {"orders": {**KAFKA_4_DEFAULTS, "max.message.bytes": "4000"}}
    limits.forget("orders")
    assert (fresh := limits("orders")) is not None and fresh.max_message_bytes == 4000


def test_an_unreadable_config_means_no_check_never_a_failure(
        caplog: pytest.LogCaptureFixture) -> None:
    refused = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    limits = TopicLimitsCache(_Describe({"orders": refused, "slow": TimeoutError()}))
    with caplog.at_level("WARNING", logger="cdc_router.router"):
        assert limits("orders") is None
        assert limits("slow") is None
    # Review 51-d F3: the refusal named no grant, though README's ACL table names it optional.
    orders, slow = [r.getMessage() for r in caplog.records if "topic_config_unreadable" in
                    r.getMessage()]
    assert orders.endswith("reason='grant this principal DescribeConfigs on the topic orders "
                           "(optional: without it the router does not check its timestamp "
                           "and size limits; the broker's own refusal still isolates a bad "
                           "record)'"), orders
    assert "reason=" not in slow  # a timeout is no missing grant


def _step(limits: dict[str, TopicLimits | None], **delivery: Any) -> RecordStep:
    config = RouterConfig.model_validate({"source": {"topics": [SOURCE]},
                                          "routes": [{"topic": "orders"}],
                                          "delivery": delivery})
    return RecordStep(compile_config(config), {"orders": 3}.get, timestamp_limits=limits.get,
                      clock=lambda: NOW_MS / 1000)


@pytest.mark.parametrize(("ahead_ms", "dead"), [(0, False), (HOUR_MS // 2, False),
                                                 (3 * HOUR_MS, True)])
def test_the_step_dead_letters_a_created_at_the_topic_would_refuse(ahead_ms: int,
                                                                   dead: bool) -> None:
    step = _step({"orders": TopicLimits(2**63 - 1, HOUR_MS)})
    result = step(SOURCE, None, raw_event("e-1", created_at_us=(NOW_MS + ahead_ms) * 1000))
    if dead:
        assert isinstance(result, DeadLettered)
        assert (result.stage, result.event_id) == ("produce", "e-1")
        assert "INVALID_TIMESTAMP" in str(result.error)
    else:
        assert isinstance(result, Routed)


def test_record_timestamp_now_is_never_checked() -> None:
    step = _step({"orders": TopicLimits(0, 0)}, record_timestamp="now")
    result = step(SOURCE, None, raw_event("e-1", created_at_us=(NOW_MS + 3 * HOUR_MS) * 1000))
    assert isinstance(result, Routed) and result.record.timestamp_ms is None


def _blob(size: int) -> str:
    return '{"blob": "' + "x" * size + '"}'


def test_a_record_over_the_topics_max_message_bytes_is_dead_lettered_before_producing() -> None:
    """QA 53-b F2: refused by the broker, it aborted batches for minutes with 3 instances."""
    limits = limits_from_config({**KAFKA_4_DEFAULTS, "max.message.bytes": "3000"})
    assert limits is not None and limits.max_message_bytes == 3000
    step = _step({"orders": limits})
    fits = step(SOURCE, None, raw_event("e-1", payload=_blob(2000)))
    assert isinstance(fits, Routed)
    size = batch_size(fits.record.key, fits.record.value, list(fits.record.headers))
    assert 2000 < size < 3000
    big = step(SOURCE, None, raw_event("e-2", payload=_blob(5000)))
    assert isinstance(big, DeadLettered)
    assert (big.stage, big.event_id) == ("produce", "e-2")
    assert "MSG_SIZE_TOO_LARGE" in str(big.error) and "max.message.bytes (3000)" in str(big.error)
    assert "raise the topic's max.message.bytes (and kafka.producer.message.max.bytes if the " \
           "record is over it too) or make the event smaller" in str(big.error)


def test_the_size_is_checked_with_record_timestamp_now_and_without_a_timestamp_limit() -> None:
    limits = limits_from_config({"message.timestamp.type": "LogAppendTime",
                                 "max.message.bytes": "1000"})
    assert limits is not None and limits.retention_ms is None
    result = _step({"orders": limits}, record_timestamp="now")(
        SOURCE, None, raw_event("e-1", payload=_blob(5000)))
    assert isinstance(result, DeadLettered) and "MSG_SIZE_TOO_LARGE" in str(result.error)


def test_a_compressing_producer_leaves_the_size_to_the_broker() -> None:
    config = RouterConfig.model_validate({
        "source": {"topics": [SOURCE]}, "routes": [{"topic": "orders"}],
        "kafka": {"producer": {"compression.type": "zstd"}}})
    limits = {"orders": TopicLimits(2**63 - 1, HOUR_MS, max_message_bytes=1000)}
    step = RecordStep(compile_config(config), {"orders": 3}.get, timestamp_limits=limits.get,
                      clock=lambda: NOW_MS / 1000)
    assert isinstance(step(SOURCE, None, raw_event("e-1", payload=_blob(5000))), Routed)
    assert compresses({"compression.codec": "lz4"}) and not compresses({})
    assert not compresses({"compression.type": "gzip"}, {"compression.type": "none"})


def test_batch_size_counts_the_record_format_framing() -> None:
    """A batch of one record, as Kafka's v2 format writes it: 61 bytes of batch header, then
    length 1, attributes 1, deltas 1+1, key length 1, key 3, value length 1, value 2, header
    count 1, one header (name length 1, name 1, value length 1, value 1)."""
    assert batch_size(b"abc", b"{}", [("h", b"v")]) == 61 + 1 + 1 + 2 + 1 + 3 + 1 + 2 + 1 + 4
    assert batch_size(None, None, []) == 61 + 1 + 6


def test_a_topic_limit_below_the_producers_batch_size_is_warned_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """The broker refuses a whole batch over max.message.bytes, small records and all."""
    small = SmallTopics({}, {"batch.size": 500_000})
    with caplog.at_level("WARNING", logger="cdc_router.router"):
        small("orders", TopicLimits(1, 1, max_message_bytes=3000))
        small("orders", TopicLimits(1, 1, max_message_bytes=3000))
        small("big", TopicLimits(1, 1, max_message_bytes=500_000))
        small("unknown", TopicLimits(1, 1))
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1, lines
    assert lines[0].startswith("event=batch_over_topic_limit topic=orders "
                               "max_message_bytes=3000 batch_size=500000 ")
    assert "set kafka.producer.batch.size below 2900" in lines[0]
