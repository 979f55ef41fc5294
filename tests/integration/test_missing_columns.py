"""A `source.outbox` column the table calls otherwise, on the real stack: the router stops with
the field to set instead of dead-lettering every event (QA 48-a F-med-1), and once the config
is fixed it delivers each event once."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import yaml

from cdc_router.router.missing_columns import RUN_LIMIT
from tests.integration.pipeline import REPO, pipeline
from tests.integration.support import StackEndpoints

EVENTS = 150  # more than router/missing_columns.RUN_LIMIT, fewer than one poll's batch
FIRST = 40  # fewer than RUN_LIMIT: dead letters before the run stops the router


def test_a_misnamed_column_stops_the_router_and_the_fix_delivers_each_event_once(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, config={"source": {"outbox": {"payload": "body"}}}) as pipe:
        rows = [("Order", f"o-{n % 5}", "OrderPaid", {"n": n}) for n in range(EVENTS)]
        # A run short of RUN_LIMIT is each event's dead letter, committed: `dlq replay`
        # delivers them once the config is fixed.
        ids = pipe.insert(rows[:FIRST])
        pipe.start_router()
        assert len(pipe.read(pipe.dlq_topic, FIRST)) == FIRST
        ids += pipe.insert(rows[FIRST:])
        assert pipe.routers.pop("a").wait(timeout=180) == 1
        log = pipe.router_log()
        assert "field 'source.outbox.payload'" in log and "no column 'body'" in log
        assert "its rows have id, aggregatetype, aggregateid, type, payload" in log
        # The batch the stop aborted wrote no letter; one committed before the run reached
        # RUN_LIMIT kept its letters (a fetch may split the rest: CI, stop 58, 75 and 75).
        lettered = len(pipe.read_all(pipe.dlq_topic, settle_s=0))
        assert FIRST <= lettered < RUN_LIMIT

        config = yaml.safe_load(pipe.config_path.read_text())
        del config["source"]["outbox"]
        pipe.config_path.write_text(yaml.safe_dump(config))
        pipe.start_router("b")
        assert len(pipe.read(pipe.orders_topic, EVENTS - lettered)) == EVENTS - lettered
        done = subprocess.run([sys.executable, "-m", "cdc_router", "dlq", "replay", "-c",
                               str(pipe.config_path), "-o", "json", "--yes"],
                              capture_output=True, text=True, cwd=REPO, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["committed"]["deliver"] == lettered, done.stdout
        delivered = Counter(record.key().decode()
                            for record in pipe.read_all(pipe.orders_topic))
        assert sorted(delivered) == sorted(ids) and set(delivered.values()) == {1}
        assert len(pipe.read_all(pipe.dlq_topic, settle_s=0)) == lettered
