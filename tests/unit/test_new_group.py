"""The renamed-group warning's conditions (the admin lookup is the integration test's:
tests/integration/test_dlq_replay.py, a second group on one raw topic)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_INVALID, TopicPartition

from cdc_router.config.model import RouterConfig
from cdc_router.router import new_group

CONFIG = RouterConfig.model_validate({"source": {"topics": ["raw"], "group_id": "orders"},
                                      "routes": [{"topic": "x"}]})
FRESH = [TopicPartition("raw", 0, OFFSET_INVALID), TopicPartition("raw", 1, OFFSET_INVALID)]


def test_only_a_fresh_group_beside_a_group_reading_its_topics_is_warned_about(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    asked: list[list[str]] = []

    def reading(kafka: object, groups: list[str], partitions: list[TopicPartition]) -> list[str]:
        asked.append(groups)
        assert [(tp.topic, tp.partition) for tp in partitions] == [("raw", 0), ("raw", 1)]
        return [group for group in groups if group != "billing"]

    monkeypatch.setattr(new_group, "_groups_reading", reading)
    with caplog.at_level(logging.WARNING, logger="cdc_router.router"):
        new_group.new_group_check(CONFIG, FRESH, 0, {"orders-old", "billing"})
        new_group.new_group_check(CONFIG, [TopicPartition("raw", 0, 5), FRESH[1]], 0,
                                  {"orders-old"})  # offsets of its own: a restart
        new_group.new_group_check(CONFIG, FRESH, 3, {"orders-old"})  # marks of its own
        new_group.new_group_check(CONFIG, FRESH, 0, set())  # no other group's marks
        new_group.new_group_check(CONFIG, FRESH, 0, {"billing"})  # not on these topics
    warnings = [record.getMessage() for record in caplog.records]
    assert asked == [["billing", "orders-old"], ["billing"]]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("event=new_group_reads_from_start group=orders topics=raw "
                                  "other_groups=orders-old hint=")
    assert "Renaming a pipeline" in warnings[0]


def test_a_spare_instance_or_a_failing_lookup_never_raises_out_of_the_check(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Review 34-2: an instance assigned no partition asked Kafka about an empty list, and
    # confluent-kafka's ValueError left the rebalance callback: exit 1 with a traceback.
    with caplog.at_level(logging.WARNING, logger="cdc_router.router"):
        new_group.new_group_check(CONFIG, [], 0, {"orders-old"})  # the real lookup, not asked

        def broken(*args: object) -> list[str]:
            raise ValueError("'topic_partitions' cannot be empty")

        monkeypatch.setattr(new_group, "_groups_reading", broken)
        new_group.new_group_check(CONFIG, FRESH, 0, {"orders-old"})
    assert caplog.records == []


def test_a_group_with_offsets_but_no_marks_is_warned_about_once_per_empty_filter(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 35-c: a renamed dedup.changelog_topic forgot every delivered id without a word.
    read = [TopicPartition("raw", 0, 5), TopicPartition("raw", 1, OFFSET_INVALID)]
    with caplog.at_level(logging.WARNING, logger="cdc_router.router"):
        new_group.changelog_check(CONFIG, read, 0)
        new_group.changelog_check(CONFIG, read, 12)  # marks restored
        new_group.changelog_check(CONFIG, FRESH, 0)  # a new group: nothing delivered yet
        new_group.changelog_check(CONFIG, [TopicPartition("raw", 0, 0)], 0)  # nothing read
        new_group.changelog_check(CONFIG, [], 0)  # a spare instance
        # Review 35: a group renamed by copying its offsets finds the old name's marks.
        new_group.changelog_check(CONFIG, read, 0, {"orders-old"})
    warning, renamed = [record.getMessage() for record in caplog.records]
    assert warning.startswith("event=changelog_without_marks group=orders "
                              "changelog=cdc-router.dedup hint=")
    assert "dedup.changelog_topic was renamed" in warning
    assert "if this source.group_id was renamed from orders-old" in renamed


def test_readme_says_a_second_group_to_the_same_destinations_delivers_twice() -> None:
    """QA 57-d F-4: the warning's "a second pipeline on purpose may ignore this" was the only
    word; a copied config with only source.group_id changed delivered 7,288 of 7,288 twice."""
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Renaming a pipeline", 1)[1].split("\n### ", 1)[0]
    flat = " ".join(section.split())
    assert "**A second group writing to the same destination topics delivers every event " \
        "twice**" in flat
    assert "a second pipeline on one raw topic must route to topics of its own" in flat
