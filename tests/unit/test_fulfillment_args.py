"""The fulfillment example's command line: bad values are one usage line, never a traceback."""

from __future__ import annotations

import pytest

from cdc_router.examples.fulfillment import parse_args

KAFKA = ["--bootstrap", "localhost:9092", "--topic", "payments", "--dsn", "postgresql://x"]


@pytest.mark.parametrize("item", ["foo", "=6000"])
def test_a_consumer_config_that_is_not_key_value_is_a_usage_error_naming_it(
        item: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Review L5: `--consumer-config foo` was a ValueError traceback from dict() in build().
    with pytest.raises(SystemExit) as stopped:
        parse_args([*KAFKA, "--consumer-config", item])
    assert stopped.value.code == 2
    assert f"--consumer-config {item!r}: expected KEY=VALUE" in capsys.readouterr().err


def test_consumer_config_items_become_properties_split_at_the_first_equals() -> None:
    args = parse_args([*KAFKA, "--consumer-config", "session.timeout.ms=6000",
                       "--consumer-config", "sasl.password=a=b"])
    assert args.consumer_config == {"session.timeout.ms": "6000", "sasl.password": "a=b"}
