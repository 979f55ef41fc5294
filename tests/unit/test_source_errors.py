"""The router's handling of the errors its consumer hands out in place of records."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from cdc_router.errors import FatalKafkaError
from cdc_router.kafka.consumer import SOURCE_MISSING_WARN_S, SourceErrors

_LOG = logging.getLogger("test.source_errors")


def test_a_missing_source_topic_is_named_again_at_warning_while_it_stays_missing(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA, session 28: a misspelled source topic got one INFO line, then silence for ever.
    now = [0.0]
    errors = SourceErrors(_LOG, clock=lambda: now[0])
    missing = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "Subscribed topic not available")
    with caplog.at_level(logging.INFO, logger=_LOG.name):
        for step in range(0, int(SOURCE_MISSING_WARN_S * 2) + 1, 10):
            now[0] = float(step)
            errors.handle(missing)
        # Review, session 28: found in between, missing again a day later: a new episode,
        # not "missing for 86400 s".
        now[0] += 86_400
        errors.handle(missing)
    levels = [record.levelname for record in caplog.records]
    assert levels == ["INFO", "WARNING", "WARNING", "INFO"]
    assert "check source.topics" in caplog.records[1].getMessage()


def test_partition_eof_is_nothing_and_a_fenced_member_stops() -> None:
    errors = SourceErrors(_LOG)
    errors.handle(KafkaError(KafkaError._PARTITION_EOF))
    with pytest.raises(FatalKafkaError):
        errors.handle(KafkaError(KafkaError.FENCED_INSTANCE_ID, "fenced", fatal=True))


def test_a_raw_topic_it_may_not_read_stops_it_naming_the_grant() -> None:
    errors = SourceErrors(_LOG)
    with pytest.raises(FatalKafkaError, match=r"Topic authorization failed; grant this "
                                              r"principal Read on the raw topics"):
        errors.handle(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                 "Broker: Topic authorization failed"))
