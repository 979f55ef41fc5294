"""The connector-file checks name the JSON converter without loading the router's decoder
(reread 50-i F5: connect/checks.py imported router/debezium.py for two constants)."""

from __future__ import annotations

import subprocess
import sys


def test_the_connector_checks_do_not_load_the_routers_decoder() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, cdc_router.connect.checks; "
         "print('cdc_router.router.debezium' in sys.modules)"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "False"
