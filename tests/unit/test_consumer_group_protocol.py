"""A member its group refuses for its assignors (INCONSISTENT_GROUP_PROTOCOL) stops the
idempotent consumer with what to do (fixer 57-y N-3: it warned every 2 s for ever and read
nothing); the fakes of tests/unit/consumer_fakes.py."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from cdc_router.consumer.client import raise_reported
from cdc_router.errors import CdcRouterError, FatalKafkaError
from tests.unit.consumer_fakes import Harness, rec

# librdkafka 2.16's text, a default (eager) member joining a cooperative-sticky group (Kafka 4.3).
_REFUSED = "JoinGroup failed: Broker: Inconsistent group protocol"
_ADVICE = ("its consumer_config partition.assignment.strategy is not of the kind the group's "
           "other members use")


def _refusal() -> KafkaError:
    return KafkaError(KafkaError.INCONSISTENT_GROUP_PROTOCOL, _REFUSED)


def test_a_join_refused_for_the_assignors_stops_the_loop_with_what_to_do() -> None:
    h = Harness({0: [rec("a")]})
    h.kafka.pending_errors.append(_refusal())
    with pytest.raises(FatalKafkaError) as stopped:
        h.run()
    line = str(stopped.value)
    assert isinstance(stopped.value, CdcRouterError) and \
        stopped.value.code == KafkaError.INCONSISTENT_GROUP_PROTOCOL
    # Fixer 58-a: the line did not say which group.
    assert line.startswith(f"the consumer group 'fulfillment' refused this member: "
                           f"INCONSISTENT_GROUP_PROTOCOL: {_REFUSED}; {_ADVICE}"), line
    assert "switch every member of the group at once" in line and \
        '"Partition assignment"' in line, line
    # QA 58-d F-2: a group of another kind of application (Connect's workers) refuses it too,
    # where no assignor helps.
    assert line.endswith("; or another application (Kafka Connect's workers, say) uses this "
                         "group: give the consumer a group of its own"), line
    assert h.effects == [] and h.kafka.closed


def test_a_join_refused_for_the_assignors_given_to_error_cb_alone_stops_too() -> None:
    # Whichever way librdkafka hands it over: error_cb's are read after each poll.
    for at_start in (True, False):
        with pytest.raises(FatalKafkaError, match=r"^the consumer group 'g' refused .*"
                           r"partition\.assignment\.strategy"):
            raise_reported([_refusal()], at_start=at_start, group="g")


def test_the_router_stops_when_its_group_refuses_its_join_too() -> None:
    # Its assignor is pinned (roundrobin,range), so only another application's consumer in
    # its group (source.group_id) with a cooperative one does this: on the stack, a
    # cooperative-sticky consumer of group g57r, then `run` with source.group_id g57r logged
    # `event=consumer_error error=INCONSISTENT_GROUP_PROTOCOL` every 2 s and read nothing.
    import logging

    from cdc_router.kafka.consumer import SourceErrors

    with pytest.raises(FatalKafkaError) as stopped:
        SourceErrors(logging.getLogger("test"), group="g57r").handle(_refusal())
    assert str(stopped.value).startswith(  # fixer 58-a: the line did not say which group
        f"the consumer group 'g57r' refused this router: INCONSISTENT_GROUP_PROTOCOL: "
        f"{_REFUSED}; ")
    assert "source.group_id" in str(stopped.value) and \
        "give it a group of its own" in str(stopped.value)


def test_the_router_and_the_consumer_build_the_line_with_one_helper() -> None:
    """Session 58: the check stood in kafka/consumer.py and consumer/client.py alike; one
    helper now says it for both, each with its own fix, and None for any other error."""
    import logging

    from cdc_router.consumer.client import protocol_refused
    from cdc_router.kafka.consumer import SourceErrors, group_protocol_refusal

    other = KafkaError(KafkaError.UNKNOWN_MEMBER_ID, "JoinGroup failed: unknown member")
    assert group_protocol_refusal(other, "this member", "fix") is None
    assert protocol_refused(other) is None
    assert group_protocol_refusal(_refusal(), "me", "do this") == \
        f"the consumer group refused me: INCONSISTENT_GROUP_PROTOCOL: {_REFUSED}; do this"
    member = protocol_refused(_refusal())
    assert member is not None
    assert member == group_protocol_refusal(_refusal(), "this member",
                                            member.split(f"{_REFUSED}; ", 1)[1])
    with pytest.raises(FatalKafkaError) as stopped:
        SourceErrors(logging.getLogger("test")).handle(_refusal())
    fix = str(stopped.value).split(f"{_REFUSED}; ", 1)[1]
    assert str(stopped.value) == group_protocol_refusal(_refusal(), "this router", fix)
    assert stopped.value.code == KafkaError.INCONSISTENT_GROUP_PROTOCOL


def test_a_missing_topic_names_the_setting_and_the_fix(caplog: pytest.LogCaptureFixture) -> None:
    """QA 67-b F-1: a consumer of `qb-ordrs` (a typo) logged librdkafka's "Subscribed topic not
    available" once, without the setting or what to do, and waited for ever in silence."""
    import logging

    from cdc_router.consumer.client import consumer_error

    error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART,
                       "Subscribed topic not available: qb-ordrs: Broker: Unknown topic or "
                       "partition")
    with caplog.at_level(logging.WARNING, logger="cdc_router.consumer.client"):
        consumer_error(error, "fulfillment")  # waited for, not raised
    line = caplog.records[-1].getMessage()
    assert line.startswith("event=topic_missing group=fulfillment ")
    assert "qb-ordrs" in line and "ConsumerSettings.topics" in line
    assert "check the name" in line and "create the topic" in line
