"""A renamed source.group_id, said before it delivers everything again.

A group with no committed offsets reads the raw topic from its beginning, and its dedup filter
counts only its own marks: every event still on the raw topic is delivered again (QA 30-c: 2,700
of 2,700). That is what a second pipeline on one raw topic wants, and what a renamed group does
by mistake, silently (stop 32's left-out). When a group starts with neither offsets nor marks,
the groups whose marks share its changelog and that have offsets on its raw topics are named in
one WARNING, with README's way to rename.

The other way round: a group with committed offsets whose changelog gives the filter no id at
all has lost its marks: a renamed (or deleted and recreated) dedup.changelog_topic (QA 35-c:
`dlq replay` then delivered 253 ids again), or marks all older than the window. Said once, as
the ids it delivered before will pass the filter again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

from cdc_router.config.model import RouterConfig
from cdc_router.ops.offsets import LOOKUP_TIMEOUT_S, admin_client
from cdc_router.router.clients import common_config
from cdc_router.router.replay import ReplayFilter

log = logging.getLogger("cdc_router.router")


def assignment_checks(config: RouterConfig, committed: list[TopicPartition], restored: int,
                      replay: ReplayFilter) -> None:
    """Both checks, after the changelog's marks were restored for newly assigned partitions."""
    new_group_check(config, committed, restored, replay.other_groups)
    changelog_check(config, committed, len(replay), replay.other_groups)


def changelog_check(config: RouterConfig, committed: list[TopicPartition], remembered: int,
                    others: Iterable[str] = ()) -> None:
    """WARNING when source.group_id has committed offsets past the start of a raw partition
    but the filter holds no id (`remembered`) after the changelog was read; `others`: the
    groups whose marks the changelog holds (a renamed group's old name, review 35)."""
    if remembered or not any(tp.error is None and tp.offset > 0 for tp in committed):
        return
    named = sorted(others)
    cause = (f"if this source.group_id was renamed from {', '.join(named[:5])} (whose marks "
             "are there), its offsets copied, the old name's ids" if named else
             "if dedup.changelog_topic was renamed, or the topic deleted, the ids delivered "
             "before")
    log.warning(
        "event=changelog_without_marks group=%s changelog=%s hint=%r", config.source.group_id,
        config.dedup.changelog_topic,
        "this group has read the raw topics (committed offsets) but the dedup changelog holds "
        f"none of its marks within dedup.window_ms: {cause} are forgotten, and a Debezium "
        "replay, `outbox republish` or `dlq replay` delivers them again (README, Renaming a "
        "pipeline). Expected after an idle spell longer than the window, with dedup just "
        "turned on, or when every event so far was a dead letter at stage decode")


def new_group_check(config: RouterConfig, committed: list[TopicPartition], restored: int,
                    others: Iterable[str]) -> None:
    """WARNING when source.group_id starts afresh (no offset in `committed`, no mark restored)
    on raw topics where one of `others` (groups with marks on the changelog) has offsets.

    `others` are the groups of the marks the restore read: the window plus an hour (review
    66). A renamed group idle for longer is not named, whatever offsets it keeps: README,
    Renaming a pipeline, says to copy the offsets first."""
    if restored or not others or not committed or \
            any(tp.error is None and tp.offset >= 0 for tp in committed):
        return  # a spare instance (no partition) has nothing to read (review 34-2)
    partitions = [TopicPartition(tp.topic, tp.partition) for tp in committed]
    try:
        readers = _groups_reading(common_config(config), sorted(others), partitions)
    except Exception as error:  # advice, in a rebalance callback: never the process's stop
        log.debug("event=new_group_check_failed error=%r", str(error))
        return
    if not readers:
        return
    log.warning(
        "event=new_group_reads_from_start group=%s topics=%s other_groups=%s hint=%r",
        config.source.group_id,
        ",".join(sorted({tp.topic for tp in committed})), ",".join(readers),
        "this source.group_id has no committed offsets and no dedup marks, so it reads from the "
        "beginning and delivers again every event still on the raw topic, which the groups "
        "named have read: if it is one of them renamed, stop every instance now and copy that "
        "group's offsets (README, Renaming a pipeline); a second pipeline on purpose may "
        "ignore this")


def _groups_reading(kafka: Mapping[str, Any], groups: list[str],
                    partitions: list[TopicPartition]) -> list[str]:
    """Those of `groups` with a committed offset on one of `partitions`; a group whose offsets
    do not come is named too (a warning too many beats a silent rename)."""
    admin = admin_client(kafka)
    # Every request first, then one deadline for all the answers: inside a rebalance callback,
    # one LOOKUP_TIMEOUT_S at worst, not one per group.
    asked = {group: admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, partitions)], request_timeout=LOOKUP_TIMEOUT_S)[group]
        for group in groups}
    deadline = time.monotonic() + LOOKUP_TIMEOUT_S
    reading = []
    for group, future in asked.items():
        try:
            found = future.result(timeout=max(0.0, deadline - time.monotonic())).topic_partitions
        except (KafkaException, TimeoutError):
            reading.append(group)
            continue
        if any(tp.error is None and tp.offset >= 0 for tp in found):
            reading.append(group)
    return reading
