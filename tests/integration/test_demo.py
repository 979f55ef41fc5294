"""`make demo`, README's first command, on the real stack: its recipe, as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from cdc_router.local.config import StackConfig
from tests.integration.support import StackEndpoints

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_make_demo_routes_both_events_and_ships_the_order_once(stack: StackEndpoints) -> None:
    default = StackConfig(home=REPO / ".cdc-router", jar_cache=REPO)
    if (stack.bootstrap_servers, stack.connect_url, stack.postgres_dsn) != (
            default.bootstrap_servers, default.connect_url, default.postgres_dsn):
        pytest.skip("make demo targets the local stack's default endpoints")
    # -o: the stack is up already (the fixture); the recipe itself runs unchanged.
    result = subprocess.run(["make", "-o", "stack", "-o", "install", "demo"], cwd=REPO,
                            env={**os.environ, "CDC_ROUTER_CONFIG": ""}, capture_output=True,
                            text=True, timeout=300, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert re.search(r"^routed orders\.OrderPaid\[\d+\]@\d+$", output, re.M), output
    assert re.search(r"^routed payments\.confirmed\[\d+\]@\d+$", output, re.M), output
    assert "ce_specversion=1.0" in output
    assert re.search(r"fulfillment: 1 shipment for event \S+ \(2 duplicate deliveries", output), \
        output
    assert "Traceback" not in output
