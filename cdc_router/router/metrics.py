"""Prometheus metrics of the router and its /metrics, /healthz and /readyz endpoints."""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any, get_args
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from cdc_router.dead_letter import Stage
from cdc_router.kafka.consumer import partition_marks
from cdc_router.kafka.reachable import BrokerReach
from cdc_router.kafka.watchdog import blocked_calls
from cdc_router.router.held import HeldPartitions
from cdc_router.router.poison import AbortCause
from cdc_router.router.process_info import info_metric
from cdc_router.router.replay import ReplayFilter

if TYPE_CHECKING:
    from confluent_kafka import TopicPartition

    from cdc_router.config.delivery import DedupSettings
    from cdc_router.router.values import Committed

log = logging.getLogger("cdc_router.router")

# cdc_router_events_routed's topic series at most (QA 60-a F-1: a JetStream subject templated
# on {aggregate_id} made one a subject, for the life of the process); the events of any later
# topic are counted under OTHER_TOPICS, which no Kafka topic or JetStream subject can be named.
MAX_TOPIC_SERIES = 500
OTHER_TOPICS = "(other topics)"

# cdc_router_batches_aborted's causes: abort_batch()'s, and the router's own: the abort after a
# refusal that bumps the producer's epoch, a batch a new producer dropped, letters re-fitted.
ABORT_CAUSES = (*get_args(AbortCause), "epoch_bump", "renewal", "letter_too_large")

# The consumer lag gauge is refreshed this often: scrapes come every 15 s or so, and each
# refresh is a call per assigned partition.
LAG_INTERVAL_S = 1.0


class RouterMetrics:
    """Counters of one router; each instance has its own registry (tests run several).
    `info`: the labels of cdc_router_info (process_info), none without."""

    def __init__(self, info: Mapping[str, str] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        if info is not None:
            info_metric(r, info)
        self.routed = Counter("cdc_router_events_routed", "Events committed on a destination "
                              "topic", ["topic"], registry=r)
        self._routed_topics: set[str] = set()
        self.skipped = Counter("cdc_router_records_skipped", "Raw records with no event to "
                               "deliver (deletes, tombstones, heartbeats, ...)", ["reason"],
                               registry=r)
        self.duplicates = Counter("cdc_router_duplicates_dropped", "Replayed events dropped "
                                  "because their id was already delivered", registry=r)
        self.dead_letters = Counter("cdc_router_dead_letters", "Records sent to the dead-letter "
                                    "topic", ["stage"], registry=r)
        # Each stage's series from 0 at the start: Prometheus' increase() never counts a
        # series' first sample, so letters that created it alerted nobody (QA 54-b F-2).
        for stage in get_args(Stage):
            self.dead_letters.labels(stage)
        self.transactions = Counter("cdc_router_batches_committed", "Batches committed",
                                    registry=r)
        self.aborted = Counter("cdc_router_batches_aborted", "Batches aborted and re-read, by "
                               "cause (README, Operations)", ["cause"], registry=r)
        for cause in ABORT_CAUSES:  # from 0, as the letters' stages (QA 54-b F-2)
            self.aborted.labels(cause)
        self.throttled = Counter("cdc_router_produce_throttled_seconds", "How long Kafka "
                                 "delayed the producer's requests for a quota on its client id "
                                 "(throttle_time_ms; event=throttled in the log)", registry=r)
        self.fetch_throttled = Counter(
            "cdc_router_fetch_throttled_seconds", "How long Kafka delayed the raw topic's "
            "consumer's fetches for a quota on its client id (consumer_byte_rate; "
            "event=throttled requests=fetch in the log)", registry=r)
        self.consecutive_aborts = Gauge("cdc_router_consecutive_aborts", "Batches aborted in "
                                        "a row for no record's fault (broker down, coordinator "
                                        "moving); 0 once a batch commits", registry=r)
        self.consumer_lag = Gauge("cdc_router_consumer_lag", "Records of an assigned raw "
                                  "partition the router has not finished (high watermark - "
                                  "the offset it committed while records read there are not; "
                                  "else - the position, past commit markers)",
                                  ["topic", "partition"], registry=r)
        self.last_commit = Gauge("cdc_router_last_commit_timestamp_seconds", "When the router "
                                 "last committed a batch (Unix time; its start before that)",
                                 registry=r)
        self.last_commit.set(time.time())
        # Computed at each scrape, so a stuck loop shows a growing age without updating it.
        last_commit_age = Gauge("cdc_router_last_commit_age_seconds", "Seconds since the "
                                "router last committed a batch (since its start before that); "
                                "it grows when idle, so alert on it only with consumer lag",
                                registry=r)
        last_commit_age.set_function(lambda: time.time() - self._last_commit_s)
        self._last_commit_s = time.time()
        blocked = Gauge("cdc_router_blocked_client_calls", "librdkafka calls given up past "
                        "their timeout (a replaced consumer's close: 5 s) and still blocked, "
                        "each holding a client (a renewal past 3 ends the process)", registry=r)
        blocked.set_function(blocked_calls)
        # QA 58-b F-6: in an outage the lag's series go with the assignment, and an idle
        # router aborts nothing: this says it. 1 until the consumer's first statistics (a
        # start that cannot reach Kafka exits 75).
        reachable = Gauge("cdc_router_kafka_reachable", "1 while the raw topic's consumer "
                          "has a connection to a Kafka broker up, 0 while it has none (Kafka "
                          "down, unreachable, refusing the connection), as librdkafka's "
                          "statistics said at the consumer's last poll", registry=r)
        reachable.set(1)
        self.reach = BrokerReach(lambda up: reachable.set(1 if up else 0))
        self._lag_labels: set[tuple[str, str]] = set()
        # Per assigned partition, the next offset the group would read after a crash: the
        # one at the assignment, then each commit's (QA 55-c F-3: a batch stuck in routing).
        self._finished: dict[tuple[str, int], int] = {}
        self._lag_observed = float("-inf")
        self.held = HeldPartitions()
        self.joined = False  # an assignment came (assigned): /readyz
        self.latency = BatchHistogram("cdc_router_end_to_end_seconds", "From the outbox "
                                      "row's created_at to the commit of its record",
                                      (.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
        r.register(self.latency)

    def dedup_filter(self, dedup: DedupSettings) -> ReplayFilter | None:
        """The replay filter of `dedup` (None with dedup off), its size served as
        cdc_router_dedup_ids (QA 65-b: nothing showed the ids held against dedup.max_ids)."""
        if not dedup.enabled:
            return None
        replay = ReplayFilter(window_ms=dedup.window_ms, max_ids=dedup.max_ids)
        Gauge("cdc_router_dedup_ids", "Delivered event ids the replay filter holds in memory "
              "(within dedup.window_ms, at most dedup.max_ids; about 120 bytes each)",
              registry=self.registry).set_function(lambda: len(replay))
        return replay

    def committed(self, committed: Committed, now_ms: int) -> None:
        """A batch committed: its delivered events, dead letters, skipped records and dropped
        replays, counted here, once (a batch aborted and read again letters its records
        again, QA 43-a)."""
        self.transactions.inc()
        delivered = committed.delivered
        for stage, count in Tally(committed.dead_letter_stages).items():
            self.dead_letters.labels(stage).inc(count)
        for reason, count in Tally(committed.passed_over).items():
            (self.duplicates if reason is None else self.skipped.labels(reason)).inc(count)
        self._last_commit_s = now_ms / 1000
        self.last_commit.set(self._last_commit_s)
        self._finished.update(committed.offsets)
        # One labels() lookup per topic, not per event: it takes a lock and builds a key.
        for topic, count in Tally(event.topic for event in delivered).items():
            self.routed.labels(self._topic_label(topic)).inc(count)
        self.latency.observe_all([max(0.0, (now_ms - event.created_at_ms) / 1000)
                                  for event in delivered if event.created_at_ms is not None])

    def _topic_label(self, topic: str) -> str:
        """`topic`, or OTHER_TOPICS once MAX_TOPIC_SERIES topics have a series (said once)."""
        topics = self._routed_topics
        if topic in topics:
            return topic
        if len(topics) < MAX_TOPIC_SERIES:
            topics.add(topic)
            return topic
        if OTHER_TOPICS not in topics:
            topics.add(OTHER_TOPICS)
            log.warning("event=metrics_topics_capped topics=%d hint='cdc_router_events_routed "
                        "counts the events of every later topic under topic=\"%s\": a route "
                        "templated on row data (such as {aggregate_id}) renders a name an "
                        "event'", MAX_TOPIC_SERIES, OTHER_TOPICS)
        return OTHER_TOPICS

    def assigned(self, partitions: Iterable[TopicPartition],
                 committed: Iterable[TopicPartition] | None) -> None:
        """Partitions assigned, with the group's committed offsets when they came: the lag is
        counted from them until this router commits there (else from its position). The
        first assignment, even of nothing, says the router joined its group (/readyz)."""
        self.joined = True
        for partition in partitions:
            self._finished.pop((partition.topic, partition.partition), None)
        for partition in committed or ():
            if partition.error is None and partition.offset >= 0:
                self._finished[(partition.topic, partition.partition)] = partition.offset

    def observe_lag(self, consumer: Any, now: float, held_warning_s: float,
                    busy: Callable[[], Collection[tuple[str, int]]]) -> None:
        """cdc_router_consumer_lag from the watermarks of the consumer's last fetch (no network
        call), and the partitions whose position is held behind them for `held_warning_s`
        (router/held.py), at most every LAG_INTERVAL_S. `busy`: the partitions with records
        read and not yet committed (the open batch's, the poll's); their lag counts from the
        offset this router committed (QA 55-c F-3: a batch stuck in routing read 0), every other
        from the position, which librdkafka moves past the commit markers of a transactional
        raw topic (reread 55-r F-1: from the committed offset an idle partition read 1 for
        ever, and CdcRouterConsumerStuck fired on every quiet period)."""
        if now - self._lag_observed < LAG_INTERVAL_S:
            return
        self._lag_observed = now
        marks = partition_marks(consumer)
        finished, pending = self._finished, busy()
        self.lag({key: max(0, high - (finished.get(key, position) if key in pending
                                      else position))
                  for key, (position, high) in marks.items()})
        # The held watch keeps the position: it asks whether the consumer reads on at all.
        self.held.observe(marks, now, held_warning_s)

    def lag(self, lags: Mapping[tuple[str, int], int]) -> None:
        """Set the consumer lag of the assigned partitions; partitions gone lose their series."""
        labels = {(topic, str(partition)) for topic, partition in lags}
        for gone in self._lag_labels - labels:
            self.consumer_lag.remove(*gone)
        for (topic, partition), lag in lags.items():
            self.consumer_lag.labels(topic, str(partition)).set(lag)
        self._lag_labels = labels


class BatchHistogram(Collector):
    """A histogram observed a batch at a time, exposed like prometheus_client's Histogram.

    Histogram.observe() takes a lock for the sum and one for the bucket: 2.7 us an event of
    CPU at each commit, measured (#14). This one takes its lock once per batch.
    """

    def __init__(self, name: str, documentation: str, bounds: Sequence[float]) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = [float(bound) for bound in bounds]
        self._labels = [repr(bound) for bound in self._bounds] + ["+Inf"]  # as Histogram's
        self._lock = threading.Lock()
        self._counts = [0] * len(self._labels)  # per bucket, not cumulative; the last: +Inf
        self._sum = 0.0

    def observe_all(self, amounts: Sequence[float]) -> None:
        counts = [0] * len(self._counts)
        bounds = self._bounds
        for amount in amounts:
            counts[bisect_left(bounds, amount)] += 1  # the first bucket whose le >= amount
        total = sum(amounts)
        with self._lock:
            self._counts = [mine + new for mine, new in zip(self._counts, counts, strict=True)]
            self._sum += total

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            counts, total = self._counts, self._sum
        yield HistogramMetricFamily(self._name, self._documentation, sum_value=total,
                                    buckets=list(zip(self._labels, accumulate(counts),
                                                     strict=True)))


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return  # one line per scrape would drown the router's own logs


def metrics_app(metrics: RouterMetrics, alive: Callable[[], bool],
                ready: Callable[[], bool] | None = None) -> Callable[..., Iterable[bytes]]:
    """The WSGI app: prometheus_client's own exposition on /metrics, liveness on /healthz
    (200 while `alive()`, else 503), readiness on /readyz (200 while `ready()` and `alive()`,
    else 503; without `ready`, as /healthz), 404 elsewhere."""
    exposition = make_wsgi_app(metrics.registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return exposition(environ, start_response)  # type: ignore[no-any-return]
        if path == "/healthz":
            ok = alive()
            body, status = (b"ok\n", "200 OK") if ok else (b"stalled\n", "503 Service Unavailable")
        elif path == "/readyz":
            body, status = _readiness(alive(), ready is None or ready())
        else:
            body, status = b"not found\n", "404 Not Found"
        start_response(status, [("Content-Type", "text/plain"),
                                ("Content-Length", str(len(body)))])
        return [body]

    return app


def _readiness(alive: bool, ready: bool) -> tuple[bytes, str]:
    """/readyz's body and status."""
    if not alive:
        return b"stalled\n", "503 Service Unavailable"
    return (b"ready\n", "200 OK") if ready else (b"not in its group yet\n",
                                                 "503 Service Unavailable")


def serve(metrics: RouterMetrics, port: int, alive: Callable[[], bool],
          host: str = "0.0.0.0", ready: Callable[[], bool] | None = None) -> WSGIServer:
    """Serve /metrics, /healthz and /readyz (see metrics_app) on a daemon thread."""
    server = make_server(host, port, metrics_app(metrics, alive, ready), ThreadingWSGIServer,
                         handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def poll_is_recent(last_poll: Callable[[], float], max_age_s: float) -> Callable[[], bool]:
    """Liveness: the loop polled Kafka within `max_age_s` (a stuck loop stops polling)."""
    return lambda: time.monotonic() - last_poll() < max_age_s


def cleanup_metrics(registry: CollectorRegistry | None,
                    ) -> tuple[Counter, Gauge, Counter, Counter, Counter]:
    """The outbox cleanup's gauges: rows deleted, lag, ids given up, ids swept, rows kept."""
    return (Counter("cdc_router_outbox_rows_deleted", "Outbox rows deleted by the cleanup",
                    registry=registry),
            Gauge("cdc_router_cleanup_lag_seconds", "Age of the oldest delivered id whose row "
                  "is not deleted yet", registry=registry),
            Counter("cdc_router_cleanup_ids_given_up", "Delivered ids dropped from the cleanup "
                    "queue at its bound (Postgres unreachable; retention mode's ids)",
                    registry=registry),
            Counter("cdc_router_cleanup_ids_swept", "Committed ids the cleanup read back from "
                    "the dedup changelog", registry=registry),
            Counter("cdc_router_cleanup_rows_kept", "Delivered rows Postgres refused to delete "
                    "(a value, a foreign key to them, a trigger): left in the outbox",
                    registry=registry))
