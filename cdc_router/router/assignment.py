"""What the router learns when partitions of the raw topic are assigned to it, before it reads
them: every id delivered so far by any instance of its group (the dedup changelog's marks), and
the offsets whose records retention deleted before they were read."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from cdc_router.config.model import RouterConfig
from cdc_router.errors import RestoreFailed
from cdc_router.kafka.consumer import report_deleted_offsets
from cdc_router.kafka.errors import kafka_error_of
from cdc_router.kafka.reader import ReadTimedOut
from cdc_router.router.changelog_restore import restore_newest
from cdc_router.router.clients import Timeouts
from cdc_router.router.lost_commits import CommitLedger
from cdc_router.router.new_group import assignment_checks
from cdc_router.router.replay import ReplayFilter

log = logging.getLogger("cdc_router.router")

# What the group coordinator's broker answers while the coordinator moves (a broker restarted,
# a leader elected), and how long to wait before asking again: the answer comes at once, and a
# move takes seconds (QA 39-b: NOT_COORDINATOR for a few seconds after the broker's return).
_COORDINATOR_MOVING = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                                 KafkaError.COORDINATOR_LOAD_IN_PROGRESS})
_COORDINATOR_WAIT_S = 0.5


def restore_assigned(consumer: Any, partitions: list[TopicPartition], *, config: RouterConfig,
                     replay: ReplayFilter | None, changelog: Any, timeouts: Timeouts,
                     clock: Callable[[], float], ledger: CommitLedger | None = None,
                     ) -> list[TopicPartition] | None:
    """Restore the replay filter from the changelog for newly assigned `partitions` (no dedup:
    only report deleted offsets); RestoreFailed when the changelog cannot be read. Returns the
    partitions' committed offsets (None when they did not come). `ledger`: this instance's
    commits, to tell of one Kafka lost (the restore forgets its ids in any case)."""
    if changelog is None or replay is None:
        return report_deleted_offsets(consumer, partitions, timeouts.call_s, log)
    # A previous owner may still hold an open transaction with offsets (and dedup marks) for
    # these partitions; fetching the committed offsets waits until it is resolved
    # (require_stable), so that the changelog read below sees its marks.
    started = clock()
    # A rebalance that gave this instance nothing has nothing to learn (chaos 53-e F2: it read
    # the whole changelog); it still says so, an instance's sign that it joined the group.
    (restored, slices), offsets = _restore(
        consumer, partitions, config=config, replay=replay, changelog=changelog,
        timeouts=timeouts, ledger=ledger) if partitions else ((0, 0), [])
    # restored: the marks read (of this group); slices: the changelog's reads, newest first
    # (router/changelog_restore.py).
    log.info("event=assigned partitions=%s dedup_ids=%d restored=%d slices=%d seconds=%.1f",
             ",".join(f"{tp.topic}[{tp.partition}]" for tp in partitions), len(replay),
             restored, slices, clock() - started)
    return offsets


def _restore(consumer: Any, partitions: list[TopicPartition], *, config: RouterConfig,
             replay: ReplayFilter, changelog: Any, timeouts: Timeouts,
             ledger: CommitLedger | None) -> tuple[tuple[int, int], list[TopicPartition]]:
    """The marks the changelog restored for `partitions` and the slices read, checked against
    their offsets; and those offsets."""
    # Not a KafkaException out of consume(): the loop would take it for a passing outage and
    # route on, while confluent-kafka assigns the partitions anyway.
    try:
        offsets = committed_offsets(consumer, partitions, timeouts.stable_offsets_s)
    except KafkaException as failure:
        raise RestoreFailed("the group's committed offsets", failure,
                            _unstable_hint(failure, timeouts.stable_offsets_s)) from failure
    if ledger is not None and _said_lost(ledger, offsets):  # before the read's line
        ledger.reset(offsets)  # (review 59-r2 F-6)
    try:
        # The ids this instance committed since the last read and the read lacks are
        # forgotten: Kafka lost their commit (router/lost_commits.py, chaos 58).
        restored, slices = restore_newest(replay, changelog, int(time.time() * 1000),
                                          group=config.source.group_id)
    except (KafkaException, ReadTimedOut) as failure:
        raise RestoreFailed(f"the dedup changelog {config.dedup.changelog_topic!r}",
                            failure) from failure
    report_deleted_offsets(consumer, partitions, timeouts.call_s, log, committed=offsets)
    assignment_checks(config, offsets, restored, replay)
    return (restored, slices), offsets


_LOST_HINT = ("Kafka lost a commit it had acknowledged (or the group's offsets were reset): "
              "the replay filter forgets the ids whose marks the dedup changelog lacks, and "
              "the records after the committed offset are read and delivered again")


def _said_lost(ledger: CommitLedger, committed: list[TopicPartition]) -> bool:
    """Whether `committed` is behind this instance's commits; if so, said once in the log."""
    lost = ledger.behind(committed)
    if lost:
        log.warning("event=commit_lost partitions=%r hint='%s'", lost, _LOST_HINT)
    return bool(lost)


def restore_if_lost(ledger: CommitLedger, committed: list[TopicPartition], *,
                    config: RouterConfig, replay: ReplayFilter | None, changelog: Any) -> None:
    """After a rewind to `committed`: when Kafka lost a commit of this instance (router/
    lost_commits.py), the filter reads the changelog's marks since its last read and forgets
    the ids of its own commits they lack. KafkaException or ReadTimedOut when the changelog
    cannot be read (the rewind is tried again)."""
    if replay is None or changelog is None or not _said_lost(ledger, committed):
        return
    restored = replay.restore_changelog(changelog.catch_up(), int(time.time() * 1000),
                                        group=config.source.group_id)
    ledger.reset(committed)
    log.info("event=restored_after_lost_commit restored=%d dedup_ids=%d", restored, len(replay))


def _unstable_hint(failure: KafkaException, waited_s: float) -> str:
    """For a timeout: what the wait was for, and what to do when every restart ends so (CI,
    stop 48: a transaction Kafka left hanging on the group's offsets after a kill -9)."""
    error = kafka_error_of(failure)
    if error is None or error.code() != KafkaError._TIMED_OUT:
        return ""
    return (f"; besides an unreachable broker, they wait for an open transaction on them to "
            f"end, at most {waited_s:.0f} s (twice delivery.transaction_timeout_ms): if every "
            "restart ends here while Kafka answers, a transaction may hang on the group's "
            "offsets (README, Operations: `kafka-transactions find-hanging`)")


def committed_offsets(consumer: Any, partitions: list[TopicPartition],
                      timeout_s: float) -> list[TopicPartition]:
    """consumer.committed(partitions), asked again while the group coordinator moves, until
    `timeout_s` (QA 39-b: NOT_COORDINATOR, 7 s after the broker came back, ended a router
    with exit 75; a new lookup finds the new coordinator)."""
    deadline, warned = time.monotonic() + timeout_s, False
    while True:
        try:
            return consumer.committed(  # type: ignore[no-any-return]
                partitions, timeout=max(1.0, deadline - time.monotonic()))
        except KafkaException as failure:
            error = kafka_error_of(failure)
            if error is None or error.code() not in _COORDINATOR_MOVING \
                    or time.monotonic() + _COORDINATOR_WAIT_S >= deadline:
                raise
            if not warned:  # once: the answer comes twice a second while the move lasts
                warned = True
                log.warning("event=committed_lookup_failed error=%r; asking again until the "
                            "coordinator answers, for up to %.0f s", str(failure), timeout_s)
        time.sleep(_COORDINATOR_WAIT_S)
