"""A `source.outbox` column the table calls otherwise, on the real stack: the router stops with
the field to set instead of dead-lettering every event (QA 48-a F-med-1), and once the config
is fixed it delivers each event once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

from tests.integration.pipeline import pipeline
from tests.integration.support import StackEndpoints

EVENTS = 150  # more than router/missing_columns.RUN_LIMIT, fewer than one poll's batch


def test_a_misnamed_column_stops_the_router_and_the_fix_delivers_each_event_once(
        stack: StackEndpoints, tmp_path: Path) -> None:
    # One batch of every event, however the fetches split them (CI, stop 58: a first batch of
    # 75 committed their dead letters before the run reached RUN_LIMIT in the next).
    config = {"source": {"outbox": {"payload": "body"}},
              "delivery": {"commit_interval_ms": 6000, "transaction_timeout_ms": 60_000}}
    with pipeline(stack, tmp_path, config=config) as pipe:
        ids = pipe.insert([("Order", f"o-{n % 5}", "OrderPaid", {"n": n})
                           for n in range(EVENTS)])
        # Every change event on the raw topic first: one batch holds the run that stops it.
        assert len(pipe.read(pipe.raw_topic, EVENTS)) == EVENTS
        pipe.start_router()
        assert pipe.routers.pop("a").wait(timeout=180) == 1
        log = pipe.router_log()
        assert "field 'source.outbox.payload'" in log and "no column 'body'" in log
        assert "its rows have id, aggregatetype, aggregateid, type, payload" in log
        assert pipe.read_all(pipe.dlq_topic, settle_s=0) == []  # the batch was aborted

        config = yaml.safe_load(pipe.config_path.read_text())
        del config["source"]["outbox"]
        pipe.config_path.write_text(yaml.safe_dump(config))
        pipe.start_router("b")
        assert len(pipe.read(pipe.orders_topic, EVENTS)) == EVENTS
        delivered = Counter(record.key().decode()
                            for record in pipe.read_all(pipe.orders_topic))
        assert sorted(delivered) == sorted(ids) and set(delivered.values()) == {1}
        assert pipe.read_all(pipe.dlq_topic, settle_s=0) == []
