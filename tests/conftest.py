"""Settings for every test: Hypothesis draws the same examples each run (derandomize), with no
per-example deadline and no example database, so that a loaded 2-core CI machine neither fails
a test on a slow example nor makes a run depend on an earlier one's failures."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("cdc-router", derandomize=True, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("cdc-router")
