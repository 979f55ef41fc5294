"""RetryPolicy: exponential ceiling, full jitter, bounded attempts."""

from __future__ import annotations

import random

import pytest

from cdc_router.consumer.retry import RetryPolicy
from cdc_router.errors import ConfigError


def test_ceiling_grows_exponentially_then_caps() -> None:
    policy = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=5.0, multiplier=2.0)
    assert [policy.ceiling(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_ceiling_of_a_very_late_attempt_does_not_overflow() -> None:
    assert RetryPolicy(max_backoff_s=30.0).ceiling(100_000) == 30.0


def test_backoff_is_full_jitter_between_zero_and_ceiling() -> None:
    policy = RetryPolicy(initial_backoff_s=1.0, max_backoff_s=8.0)
    rng = random.Random(7)
    draws = [policy.backoff(4, rng) for _ in range(2000)]
    assert all(0.0 <= d <= 8.0 for d in draws)
    # Full jitter spreads over the whole range, not just near the ceiling.
    assert min(draws) < 1.0 and max(draws) > 7.0


def test_exhausted_after_max_attempts() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert [policy.exhausted(n) for n in (1, 2, 3, 4)] == [False, False, True, True]


@pytest.mark.parametrize(("field", "value"), [
    ("max_attempts", 0), ("initial_backoff_s", -1.0), ("max_backoff_s", 0.01),
    ("multiplier", 0.5),
    # Review 43: NaN passed every `x < 0` check; a float or an infinite count never ran out.
    ("initial_backoff_s", float("nan")), ("max_backoff_s", float("inf")),
    ("multiplier", float("nan")), ("max_attempts", float("nan")), ("max_attempts", 2.5),
    ("max_attempts", True)])
def test_bad_values_are_config_errors_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        RetryPolicy(**{field: value})  # type: ignore[arg-type]


def test_attempts_are_one_based() -> None:
    with pytest.raises(ValueError):
        RetryPolicy().ceiling(0)
