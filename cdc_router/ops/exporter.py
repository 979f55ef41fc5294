"""`status --serve`: the latest Report as Prometheus gauges, for dashboards and alert rules.

A collector renders the latest check at each scrape, so a slot or partition that went away
disappears from the exposition instead of keeping its last value. A section that could not
be checked sets cdc_router_status_up{part} to 0 and exposes none of its gauges.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cdc_router.ops.problem import Problem
from cdc_router.ops.report import SECTIONS, Report, sections
from cdc_router.ops.verdict import EXIT_CODES, outbox_tables, verdict
from cdc_router.router.process_info import info_metric

WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")
CONNECTOR_STATES = ("RUNNING", "PAUSED", "STOPPED", "FAILED", "UNASSIGNED", "RESTARTING")


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"cdc_router_{name}", doc, labels=list(labels))


class StatusCollector(Collector):
    """Gauges of the latest Report; `update` is called by the check loop, `collect` by scrapes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: tuple[Report, list[Problem]] | None = None
        self._failed = False
        self._reported_at: float | None = None
        # The parts a check without a report sets to 0: the last report's (jetstream only
        # with JetStream routes), every one before the first report.
        self._parts = SECTIONS

    def update(self, report: Report, problems: list[Problem]) -> None:
        with self._lock:
            self._latest, self._failed, self._reported_at = (report, problems), False, time.time()
            self._parts = tuple(name for name, _ in sections(report))

    def failed(self) -> None:
        """The last check gave no report (its process died or did not answer): critical, and
        no part's gauges, rather than the previous check's values (review 49-b F1)."""
        with self._lock:
            self._latest, self._failed = None, True

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            latest, failed, reported_at, parts = (self._latest, self._failed,
                                                  self._reported_at, self._parts)
        if reported_at is not None:
            at = _gauge("status_reported_timestamp_seconds",
                        "Unix time of the last check that gave a report")
            at.add_metric([], reported_at)
            yield at
        if failed:
            yield from _no_report(parts)
        if latest is None:
            return
        report, problems = latest
        yield from _verdict(report, problems)
        yield from _wal(report)
        yield from _outbox(report)
        yield from _connector(report)
        yield from _router(report)
        yield from _topics(report)
        yield from _jetstream(report)


def _no_report(parts: tuple[str, ...]) -> Iterator[GaugeMetricFamily]:
    status = _gauge("status", "Verdict of the last check: 0 ok, 1 warning, 2 critical")
    status.add_metric([], EXIT_CODES["critical"])
    up = _gauge("status_up", "1 when this part answered the last check (0: it did not answer)",
                ("part",))
    checked = _gauge("status_checked", "1 when the last check could read this part (0: it did "
                     "not answer, or refused a query: status says why)", ("part",))
    for name in parts:
        up.add_metric([name], 0)
        checked.add_metric([name], 0)
    yield from (status, up, checked)


def _verdict(report: Report, problems: list[Problem]) -> Iterator[GaugeMetricFamily]:
    status = _gauge("status", "Verdict of the last check: 0 ok, 1 warning, 2 critical")
    status.add_metric([], EXIT_CODES[verdict(problems)])
    count = _gauge("status_problems", "Problems found by the last check", ("level",))
    for level in ("warning", "critical"):
        count.add_metric([level], sum(1 for p in problems if p.level == level))
    up = _gauge("status_up", "1 when this part answered the last check (0: it did not answer)",
                ("part",))
    checked = _gauge("status_checked", "1 when the last check could read this part (0: it did "
                     "not answer, or refused a query: status says why)", ("part",))
    for name, section in sections(report):
        # Review 54-k F-6: a part that answered but refused a query (a renamed column) is
        # NOT CHECKED, not "does not answer" (CdcRouterStatusUnreachable).
        up.add_metric([name], 0 if section.error and not getattr(section, "answered", False)
                      else 1)
        checked.add_metric([name], 0 if section.error or _unnamed(name, report) else 1)
    yield from (status, count, up, checked)


def _unnamed(part: str, report: Report) -> bool:
    """True for the publication when the connector's config, which names it, was not read
    (Connect down, or no such connector): it was not checked (review 57-b F-8). A relay-only
    config has no connector and no publication to check."""
    connector = report.connector
    return part == "publication" and report.publication.name is None and (
        connector.error is not None or connector.exists is False)


def _wal(report: Report) -> Iterator[GaugeMetricFamily]:
    wal = report.wal
    if wal.error is not None:
        return
    if wal.max_slot_wal_keep_size_bytes is not None:
        limit = _gauge("max_slot_wal_keep_size_bytes", "Postgres max_slot_wal_keep_size; "
                       "-1: unlimited")
        limit.add_metric([], wal.max_slot_wal_keep_size_bytes)
        yield limit
    exists = _gauge("slot_exists", "1 when the connector's replication slot exists", ("slot",))
    active = _gauge("slot_active", "1 while a client streams from the slot", ("slot",))
    retained = _gauge("slot_retained_wal_bytes", "WAL the slot holds back: current LSN - "
                      "restart_lsn", ("slot",))
    safe = _gauge("slot_safe_wal_size_bytes", "WAL that may still be written before the "
                  "slot is lost (absent: no limit)", ("slot",))
    lag = _gauge("slot_flush_lag_bytes", "current LSN - confirmed_flush_lsn", ("slot",))
    status = _gauge("slot_wal_status", "1 for the slot's wal_status", ("slot", "wal_status"))
    for slot in wal.slots:
        exists.add_metric([slot.name], int(slot.exists))
        if not slot.exists:
            continue
        active.add_metric([slot.name], int(bool(slot.active)))
        for family, value in ((retained, slot.retained_wal_bytes),
                              (safe, slot.safe_wal_size_bytes), (lag, slot.flush_lag_bytes)):
            if value is not None:
                family.add_metric([slot.name], value)
        for name in WAL_STATUSES:
            status.add_metric([slot.name, name], int(slot.wal_status == name))
    yield from (exists, active, retained, safe, lag, status)


def _outbox(report: Report) -> Iterator[GaugeMetricFamily]:
    """One sample per table checked: the outbox and the connector's other captured tables."""
    checked = [outbox for outbox in outbox_tables(report)
               if outbox.error is None and outbox.rows is not None]
    if not checked:
        return
    rows = _gauge("outbox_rows", "Rows in the outbox table (backlog)", ("table",))
    size = _gauge("outbox_size_bytes", "The outbox table's size with indexes and TOAST",
                  ("table",))
    age = _gauge("outbox_oldest_row_age_seconds", "Age of the oldest outbox row, dead-lettered "
                 "rows included (they stay until replayed or purged); 0 when empty", ("table",))
    for outbox in checked:
        labels = [outbox.table or ""]
        rows.add_metric(labels, outbox.rows or 0)
        size.add_metric(labels, outbox.size_bytes or 0)
        age.add_metric(labels, outbox.oldest_age_s or 0.0)
    yield from (rows, size, age)


def _connector(report: Report) -> Iterator[GaugeMetricFamily]:
    connector = report.connector
    if connector.error is not None or connector.name is None:
        return
    state = _gauge("connector_state", "1 for the connector's state (MISSING: not deployed)",
                   ("connector", "state"))
    current = connector.state if connector.exists else "MISSING"
    for name in (*CONNECTOR_STATES, "MISSING"):
        state.add_metric([connector.name, name], int(current == name))
    failed = _gauge("connector_failed_tasks", "Tasks of the connector in state FAILED",
                    ("connector",))
    failed.add_metric([connector.name], sum(1 for t in connector.tasks if t.state == "FAILED"))
    yield from (state, failed)


def _router(report: Report) -> Iterator[GaugeMetricFamily]:
    router = report.router
    if router.error is not None:
        return
    labels = ("group", "topic", "partition")
    lag = _gauge("group_lag", "Committed raw records the router group has not committed",
                 labels)
    commit = _gauge("group_last_commit_age_seconds", "Since the group's last offset commit, "
                    "per partition (from the router's commit stamp)", labels)
    # Status judges a stall on the smaller of the two ages (review 52-j F4: an idle
    # partition's first record is not a stall), so the alert rule needs both.
    pending = _gauge("group_oldest_pending_age_seconds", "Age of the oldest record the group "
                     "has not committed, per partition (absent: none waits)", labels)
    for p in router.partitions:
        values = [router.group or "", p.topic, str(p.partition)]
        lag.add_metric(values, p.lag)
        if p.last_commit_age_s is not None:
            commit.add_metric(values, p.last_commit_age_s)
        if p.lag > 0 and p.oldest_pending_age_s is not None:
            pending.add_metric(values, p.oldest_pending_age_s)
    members = _gauge("group_members", "Router instances in the group", ("group",))
    members.add_metric([router.group or ""], len(router.members))
    yield from (lag, commit, pending, members)


def _topics(report: Report) -> Iterator[GaugeMetricFamily]:
    letters = report.dead_letters
    if letters.error is None and letters.count is not None:
        count = _gauge("dlq_records", "This pipeline's dead letters not delivered since (by "
                       "`dlq replay`), as status counts them", ("topic",))
        count.add_metric([letters.topic or ""], letters.count if letters.undelivered is None
                         else letters.undelivered)
        on_topic = _gauge("dlq_topic_records", "This pipeline's dead letters on the "
                          "dead-letter topic, delivered since or not", ("topic",))
        on_topic.add_metric([letters.topic or ""], letters.count)
        yield from (count, on_topic)
        if letters.newest is not None and letters.newest.age_s is not None:
            age = _gauge("dlq_newest_age_seconds", "Age of the newest dead letter",
                         ("topic",))
            age.add_metric([letters.topic or ""], letters.newest.age_s)
            yield age
    changelog = report.dedup_changelog
    if changelog.error is None and changelog.retained_offsets is not None:
        size = _gauge("dedup_changelog_offsets", "Offsets retained in the dedup changelog (the "
                      "marks of every pipeline writing there)",
                      ("topic",))
        size.add_metric([changelog.topic or ""], changelog.retained_offsets)
        yield size


def _jetstream(report: Report) -> Iterator[GaugeMetricFamily]:
    state = report.jetstream
    if state is None or state.error is not None:
        return
    exists = _gauge("jetstream_stream_exists", "1 when the JetStream stream of nats.streams "
                    "exists on the server", ("stream",))
    messages = _gauge("jetstream_stream_messages", "Messages stored in the stream", ("stream",))
    stored = _gauge("jetstream_stream_bytes", "Bytes stored in the stream", ("stream",))
    for stream in state.streams:
        exists.add_metric([stream.name], int(stream.exists))
        for family, value in ((messages, stream.messages), (stored, stream.bytes)):
            if value is not None:
                family.add_metric([stream.name], value)
    yield from (exists, messages, stored)


def serve(collector: StatusCollector, port: int, info: Mapping[str, str] | None = None,
          host: str = "0.0.0.0") -> None:
    """Serve /metrics on `port` from a daemon thread; `info`: cdc_router_info's labels."""
    registry = CollectorRegistry()
    registry.register(collector)
    if info is not None:
        info_metric(registry, info)
    start_http_server(port, addr=host, registry=registry)
