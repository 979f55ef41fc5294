"""/metrics (prometheus_client's exposition) and /healthz over real HTTP on a free port."""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Histogram

from cdc_router.router.metrics import MAX_TOPIC_SERIES, OTHER_TOPICS, RouterMetrics, serve
from cdc_router.router.values import Committed, Delivered


@pytest.fixture
def served() -> Iterator[tuple[RouterMetrics, list[bool], str]]:
    metrics, alive = RouterMetrics(), [True]
    server = serve(metrics, 0, lambda: alive[0], host="127.0.0.1")
    try:
        yield metrics, alive, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def test_metrics_are_prometheus_text(served: tuple[RouterMetrics, list[bool], str]) -> None:
    metrics, _, base = served
    metrics.dead_letters.labels("route").inc(3)
    status, kind, body = get(f"{base}/metrics")
    assert status == 200 and kind.startswith("text/plain")
    assert 'cdc_router_dead_letters_total{stage="route"} 3.0' in body


def test_healthz_follows_liveness(served: tuple[RouterMetrics, list[bool], str]) -> None:
    _, alive, base = served
    assert get(f"{base}/healthz")[::2] == (200, "ok\n")
    alive[0] = False
    assert get(f"{base}/healthz")[::2] == (503, "stalled\n")


def test_other_paths_are_not_found(served: tuple[RouterMetrics, list[bool], str]) -> None:
    assert get(f"{served[2]}/")[0] == 404


def test_a_committed_batch_counts_each_topic_latency_letter_skip_and_duplicate() -> None:
    metrics = RouterMetrics()
    delivered = [Delivered("a", "orders", 1_000), Delivered("b", "orders", None),
                 Delivered("c", "payments", 500)]
    metrics.committed(Committed(delivered, ["decode", "produce", "decode"],
                                ["heartbeat", None, "heartbeat", None, None]), now_ms=2_000)
    value = metrics.registry.get_sample_value
    assert value("cdc_router_records_skipped_total", {"reason": "heartbeat"}) == 2
    assert value("cdc_router_duplicates_dropped_total") == 3
    assert value("cdc_router_dead_letters_total", {"stage": "decode"}) == 2
    assert value("cdc_router_dead_letters_total", {"stage": "produce"}) == 1
    assert value("cdc_router_events_routed_total", {"topic": "orders"}) == 2
    assert value("cdc_router_events_routed_total", {"topic": "payments"}) == 1
    assert value("cdc_router_end_to_end_seconds_count") == 2
    assert value("cdc_router_end_to_end_seconds_sum") == 2.5
    assert value("cdc_router_batches_committed_total") == 1


def test_topic_series_stop_at_max_topic_series_and_later_topics_count_as_other(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 60-a F-1: a subject templated on {aggregate_id} added a series an aggregate, for the
    # life of the process (200 after 45 minutes; a million aggregates, a million series).
    metrics = RouterMetrics()
    topics = [f"ship.a{n}" for n in range(MAX_TOPIC_SERIES + 40)]
    with caplog.at_level(logging.WARNING, logger="cdc_router.router"):
        for batch in (topics[:300], topics[300:], topics[:10] + topics[-10:]):
            metrics.committed(Committed([Delivered(t, t, None) for t in batch], [], []),
                              now_ms=1_000)
    value = metrics.registry.get_sample_value
    series = {sample.labels["topic"] for family in metrics.registry.collect()
              if family.name == "cdc_router_events_routed" for sample in family.samples
              if sample.name.endswith("_total")}
    assert len(series) == MAX_TOPIC_SERIES + 1 and OTHER_TOPICS in series
    assert value("cdc_router_events_routed_total", {"topic": "ship.a0"}) == 2
    assert value("cdc_router_events_routed_total", {"topic": OTHER_TOPICS}) == 40 + 10
    assert caplog.text.count("event=metrics_topics_capped topics=500") == 1


def test_every_dead_letter_stage_starts_at_0_so_increase_sees_the_first_letters() -> None:
    # QA 54-b F-2: the series were born with the first letters (at 5, at 1): increase() over
    # them is 0, and CdcRouterDeadLetters never fired for a router's first letters.
    value = RouterMetrics().registry.get_sample_value
    for stage in ("decode", "route", "serialize", "produce"):
        assert value("cdc_router_dead_letters_total", {"stage": stage}) == 0


def test_consumer_lag_follows_the_assignment() -> None:
    metrics = RouterMetrics()
    value = metrics.registry.get_sample_value
    metrics.lag({("raw", 0): 5, ("raw", 1): 0})
    assert value("cdc_router_consumer_lag", {"topic": "raw", "partition": "0"}) == 5
    metrics.lag({("raw", 1): 3})  # partition 0 was revoked: its series goes
    assert value("cdc_router_consumer_lag", {"topic": "raw", "partition": "0"}) is None
    assert value("cdc_router_consumer_lag", {"topic": "raw", "partition": "1"}) == 3


def test_the_last_commit_age_is_computed_at_each_scrape() -> None:
    metrics = RouterMetrics()
    metrics.committed(Committed([], [], []), now_ms=int(time.time() * 1000) - 90_000)
    age = metrics.registry.get_sample_value("cdc_router_last_commit_age_seconds")
    assert age is not None and 90 <= age < 150


def test_the_given_up_calls_still_blocked_are_a_gauge(monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_router.kafka import watchdog

    metrics = RouterMetrics()
    monkeypatch.setattr(watchdog, "_abandoned", 2)
    assert metrics.registry.get_sample_value("cdc_router_blocked_client_calls") == 2


def test_the_latency_histogram_exposes_what_prometheus_clients_histogram_would() -> None:
    # Observed a batch at a time (BatchHistogram): the same samples as one observe() each.
    amounts = [0.0, 0.004, 0.01, 0.0100001, 0.3, 1.0, 2.5, 59.9, 60.0, 61.0, 3600.0]
    metrics = RouterMetrics()
    metrics.latency.observe_all(amounts[:4])
    metrics.latency.observe_all(amounts[4:])
    reference_registry = CollectorRegistry()
    reference = Histogram("cdc_router_end_to_end_seconds", "x", registry=reference_registry,
                          buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
    for amount in amounts:
        reference.observe(amount)

    def samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
        return {(sample.name, sample.labels.get("le", "")): sample.value
                for family in registry.collect() for sample in family.samples
                if sample.name.startswith("cdc_router_end_to_end_seconds")
                and not sample.name.endswith("_created")}

    assert samples(metrics.registry) == samples(reference_registry)
