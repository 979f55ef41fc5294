"""The fulfillment example's command line: bad values are one usage line, never a traceback."""

from __future__ import annotations

from contextlib import nullcontext

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


def test_the_demo_exits_non_zero_when_the_service_did_not_ship_exactly_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 50-b F5: `cdc-router demo` (make demo's last step) said "fulfillment: 0 shipment"
    # and exited 0: the project's acceptance demo passed having shipped nothing.
    from click.testing import CliRunner

    from cdc_router.cli import demo as demo_command
    from cdc_router.cli import main
    from cdc_router.local import demo

    monkeypatch.setattr(demo_command, "database", lambda dsn: nullcontext(_Connection()))
    monkeypatch.setattr(demo, "require_outbox", lambda conn: None)
    monkeypatch.setattr(demo, "run_demo", lambda compiled, dsn, say: [_Record()])
    for shipped, code in ((0, 1), (2, 1), (1, 0)):
        monkeypatch.setattr(demo, "run_fulfillment",
                            lambda config, dsn, payment, say, shipped=shipped: shipped)
        result = CliRunner().invoke(main, ["demo", "--dsn", "postgresql://x"])
        assert result.exit_code == code, result.output
        if code:
            assert f"error: the fulfillment service shipped the payment event {shipped} " \
                "times, not once: its log lines above say why (a dead letter to " \
                "cdc-router.dlq?)" in result.output


class _Connection:
    def commit(self) -> None:
        pass


class _Record:
    def topic(self) -> str:
        return "payments.confirmed"
