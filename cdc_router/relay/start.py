"""What the relay reads at its start besides its table: the committed records of a topic (its
position, the dedup changelog), and the rows a killed at_least_once relay left behind.

The rows left behind (QA 55-b F-1): the cleanup deletes a batch's rows after its commit, on
its own thread, so a relay killed in between leaves them in the table, behind its position, where
no read takes them again. Exactly once, the cleanup's sweep finds them in the dedup changelog. At
least once has no sweep (config/model.py), but the relay's marks still prove a delivery:
Transaction.commit sends them, and the position with them, only once every record of their batch
is acknowledged. So at each start the relay hands the cleanup the rows behind its stored position
whose ids the restored changelog marks delivered; a dead-lettered id (its `dead:` mark) is no
delivery, its row stays. Ids delivered longer ago than dedup.window_ms (or crowded out by
dedup.max_ids) are no longer held: such rows stay for `outbox purge --force`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import psycopg

from cdc_router.config.model import RouterConfig
from cdc_router.errors import DeliveryError
from cdc_router.kafka.reader import TopicReader
from cdc_router.postgres import one_line
from cdc_router.relay.guard import DatabaseIdentity, RelayPosition
from cdc_router.router.changelog_restore import SlicedChangelog, restore_newest
from cdc_router.router.replay import ReplayFilter
from cdc_router.router.values import Delivered

log = logging.getLogger("cdc_router.relay")

KeyValue = tuple[bytes | None, bytes | None]
# How long a read of a topic may take by default (TopicReader.read_to_end's own default).
READ_TIMEOUT_S = 300.0


class Records(Protocol):
    """(kafka config, topic, what) -> every committed (key, value) of the topic, read within
    `timeout_s` (else KafkaException or DeliveryError): topic_records."""

    def __call__(self, kafka: dict[str, Any], topic: str, what: str, *,
                 timeout_s: float = READ_TIMEOUT_S) -> Iterable[KeyValue]: ...


def topic_records(kafka: dict[str, Any], topic: str, what: str, *,
                  timeout_s: float = READ_TIMEOUT_S) -> Iterator[KeyValue]:
    """Every committed (key, value) of `topic` up to its log end as of now: a transaction
    still open there is waited for (our init_transactions has ended any of ours)."""
    reader = TopicReader(kafka, topic, what=what, lean=True, group_id=_reader_group(kafka))
    try:
        for message in reader.read_to_end(end="log_end", timeout_s=timeout_s):
            yield message.key(), message.value()
    finally:
        reader.close()


def stored_position(config: RouterConfig, records: Records, kafka: dict[str, Any],
                    database: DatabaseIdentity | None, *,
                    timeout_s: float = READ_TIMEOUT_S) -> RelayPosition:
    """The last committed position of the relay's table (our init_transactions resolved any
    transaction still open on the topic), or the start for a table never relayed; read within
    `timeout_s`."""
    topic, table = config.relay_position_topic, config.relay_settings().qualified_table
    found: bytes | None = None
    for key, value in records(kafka, topic, "relay position", timeout_s=timeout_s):
        if key == table.encode():
            found = value
    try:
        stored = RelayPosition() if found is None else RelayPosition.from_json(found)
    except ValueError as error:
        raise DeliveryError(f"the relay position topic {topic} holds a bad record for "
                            f"{table}: {error}; fix or delete it") from None
    assert database is not None  # the start's snapshot() connected
    return stored.of_database(database, f"of {table} in topic {topic}")


class Changelogs(Protocol):
    """(kafka config, topic, group_id=, timeout_s=) -> the dedup changelog's reader for a
    restore (kafka/changelog_reader.py ChangelogReader; a test's fake)."""

    def __call__(self, config: dict[str, Any], topic: str, *, group_id: str,
                 timeout_s: float) -> RestoredChangelog: ...


class RestoredChangelog(SlicedChangelog, Protocol):
    def close(self) -> None: ...


def restore_filter(config: RouterConfig, replay: ReplayFilter | None, changelogs: Changelogs,
                   kafka: dict[str, Any], *, timeout_s: float = READ_TIMEOUT_S) -> int:
    """The dedup changelog's marks into `replay`, which forgets the ids of its own commits
    they lack (relay/lost_commit.py); how many there were. Read within `timeout_s` by a
    reader of `changelogs`, newest slices first, as the router's
    (router/changelog_restore.py)."""
    if replay is None:
        return 0
    reader = changelogs(kafka, config.dedup.changelog_topic, group_id=_reader_group(kafka),
                        timeout_s=timeout_s)
    try:
        return restore_newest(replay, reader, int(time.time() * 1000),
                              group=config.source.group_id)[0]
    finally:
        reader.close()


def _reader_group(kafka: dict[str, Any]) -> str:
    """The group.id of the relay's readers, which never join it (README's ACLs name it)."""
    return f"{kafka.get('client.id', 'cdc-router')}-relay-reader"


class PassedRows(Protocol):
    """What reads the ids of the rows a position has passed (relay/reader.py OutboxReader)."""

    def passed_ids(self, position: RelayPosition, keep: Callable[[str], bool]) -> list[str]: ...


def hand_left_behind(config: RouterConfig, reader: PassedRows, position: RelayPosition,
                     replay: ReplayFilter | None,
                     on_delivered: Callable[[Sequence[Delivered]], None] | None) -> None:
    """Hand `on_delivered` (the cleanup) the rows behind `position` whose ids `replay`, just
    restored from the changelog, holds as delivered; only without the cleanup's sweep."""
    if replay is None or on_delivered is None or config.cleanup.mode == "none" or \
            config.cleanup_sweeps():
        return
    table = config.relay_settings().qualified_table
    try:
        ids = reader.passed_ids(position, replay.delivered)
    except psycopg.Error as error:
        log.warning("event=cleanup_left_behind_failed table=%s error=%r: the delivered rows a "
                    "killed relay left stay until the next start", table, one_line(error))
        return
    if ids:
        log.info("event=cleanup_left_behind table=%s rows=%d", table, len(ids))
        on_delivered([Delivered(event_id, "", None) for event_id in ids])
