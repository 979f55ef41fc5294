"""What a router publishing to a real nats-server tells its operator (QA 60-a): a subject
templated on row data keeps at most MAX_TOPIC_SERIES series of cdc_router_events_routed (F-1),
and a server that stops answering while its connection stays open is named as the likely
cause (F-4). Each test runs a nats-server of its own."""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cdc_router.local import process
from cdc_router.router.metrics import MAX_TOPIC_SERIES, OTHER_TOPICS
from tests.integration.nats_server import nats_server, read_stream
from tests.integration.pipeline import Pipeline, Row, pipeline
from tests.integration.support import StackEndpoints, free_port, scrape
from tests.integration.test_nats import _apply_streams

pytestmark = pytest.mark.integration

OVER = 20  # subjects past the cap


def _route_to_jetstream(pipe: Pipeline, url: str, subject: str,
                        ack_timeout_ms: int | None = None) -> tuple[str, str]:
    """routes[0] (Order events) to `<prefix>.<subject>` in a stream of the test's."""
    prefix = pipe.name.replace("_", "-")
    config = yaml.safe_load(pipe.config_path.read_text())
    config["routes"][0] = {"match": {"aggregate_type": "Order*"},
                           "nats": {"subject": f"{prefix}.{subject}"}}
    stream = _apply_streams(pipe.config_path, config, url, prefix)
    if ack_timeout_ms is not None:
        config = yaml.safe_load(pipe.config_path.read_text())
        config["nats"]["ack_timeout_ms"] = ack_timeout_ms
        pipe.config_path.write_text(yaml.safe_dump(config))
    return stream, prefix


def _stored(url: str, stream: str, count: int, timeout_s: float = 90) -> list[Any]:
    """The stream's messages once it holds `count` (or what it holds after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        messages = read_stream(url, stream)
        if len(messages) >= count or time.monotonic() > deadline:
            return messages
        time.sleep(0.5)


def _routed(port: int) -> dict[str, float]:
    """cdc_router_events_routed by its topic label, as the router serves it."""
    for family in text_string_to_metric_families(scrape(port) or ""):
        if family.name == "cdc_router_events_routed":
            return {sample.labels["topic"]: sample.value for sample in family.samples
                    if sample.name.endswith("_total")}
    return {}


def test_a_subject_per_aggregate_keeps_at_most_the_capped_series(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 60-a F-1: a subject templated on {aggregate_id} added a series per aggregate for the
    # life of the process. Past MAX_TOPIC_SERIES, events are counted under OTHER_TOPICS.
    subjects = MAX_TOPIC_SERIES + OVER
    rows: list[Row] = [("Order", f"a-{n}", "OrderPaid", {"n": n}) for n in range(subjects)]
    rows += [("Order", "a-0", "OrderPaid", {"again": 1}),  # a subject with a series
             ("Order", f"a-{subjects}", "OrderPaid", {"again": 2})]  # one more without
    port = free_port()
    with nats_server(tmp_path / "nats") as server, pipeline(stack, tmp_path) as pipe:
        stream, prefix = _route_to_jetstream(pipe, server.url, "{aggregate_id}")
        pipe.start_router("a", "--metrics-port", str(port), wait=True)
        ids = pipe.insert(rows[:subjects], per_transaction=100)
        assert len(_stored(server.url, stream, subjects)) == subjects
        ids += pipe.insert(rows[subjects:])
        messages = _stored(server.url, stream, len(rows))
        routed: dict[str, float] = {}
        deadline = time.monotonic() + 60  # the commit after the acks counts them
        while sum(routed.values()) < len(rows) and time.monotonic() < deadline:
            routed = _routed(port)
            time.sleep(0.5)
        log = pipe.router_log()
    assert Counter(message.headers["id"] for message in messages) == Counter(ids)
    assert sum(routed.values()) == len(rows), routed
    assert len(routed) == MAX_TOPIC_SERIES + 1, len(routed)
    # Commits follow the raw topic's order: the first MAX_TOPIC_SERIES subjects got a series.
    assert set(routed) - {OTHER_TOPICS} == {f"{prefix}.a-{n}" for n in range(MAX_TOPIC_SERIES)}
    assert routed[f"{prefix}.a-0"] == 2
    assert routed[OTHER_TOPICS] == OVER + 1
    assert log.count("event=metrics_topics_capped topics=500") == 1, log[-3000:]


def test_a_hung_nats_server_is_named_and_its_events_are_stored_once_it_answers(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # QA 60-a F-4: a SIGSTOP'd server keeps its connection: no disconnect is said, each
    # publish times out, and the abort's line ended 'TimeoutError: nats: timeout'.
    before: list[Row] = [("Order", f"o-{n}", "OrderPaid", {"n": n}) for n in range(5)]
    during: list[Row] = [("Order", f"o-{n}", "OrderShipped", {"n": n}) for n in range(5)]
    with nats_server(tmp_path / "nats") as server, pipeline(stack, tmp_path) as pipe:
        stream, _ = _route_to_jetstream(pipe, server.url, "{type}", ack_timeout_ms=1_000)
        pipe.start_router(wait=True)
        ids = pipe.insert(before)
        assert len(_stored(server.url, stream, len(before))) == len(before)
        pid = process.read_pid(server.config.pid_path(server.part))
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # the test's own server, by its pid
        try:
            ids += pipe.insert(during)
            hint = "no acknowledgement within nats.ack_timeout_ms (1000 ms): is nats-server " \
                   "answering (hung, overloaded, or cut off with the connection still open)?"
            deadline = time.monotonic() + 60
            while hint not in pipe.router_log() and time.monotonic() < deadline:
                time.sleep(0.2)
            log = pipe.router_log()
        finally:
            os.kill(pid, signal.SIGCONT)
        messages = _stored(server.url, stream, len(ids))
        time.sleep(3)  # a batch published again lands before the last read
        messages = read_stream(server.url, stream)
        assert pipe.routers["a"].poll() is None, pipe.router_log()[-3000:]
    assert hint in log, log[-3000:]
    assert re.search(r"JetStream did not acknowledge (\d+) of \1 messages", log), log[-3000:]
    assert Counter(message.headers["id"] for message in messages) == Counter(ids)
