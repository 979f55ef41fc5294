"""Credentials a SASL listener refuses are named, not taken for an unreachable cluster
(tests/unit/sasl_broker.py refuses every credential, as a broker does a wrong password)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.sasl_broker import REFUSAL, refusing_broker

EXAMPLE = Path(__file__).parents[2] / "cdc_router" / "examples" / "router.yaml"
SASL = {"CDC_ROUTER__KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "CDC_ROUTER__KAFKA__SASL_MECHANISM": "PLAIN",
        "CDC_ROUTER__KAFKA__SASL_USERNAME": "router",
        "CDC_ROUTER__KAFKA__SASL_PASSWORD": "wrong"}


def test_status_names_the_credentials_kafka_refused(monkeypatch: pytest.MonkeyPatch,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    # Review 51-d F1: status silenced librdkafka (log_level 0), so nothing noted the refusal
    # and each Kafka section said "UNREACHABLE: ... Broker transport failure".
    from cdc_router.config.load import load_config
    from cdc_router.kafka import logs
    from cdc_router.ops import probe
    from cdc_router.router.clients import logged_config

    monkeypatch.setattr(logs, "_REFUSALS", [])
    monkeypatch.setattr(probe, "LOOKUP_TIMEOUT_S", 2.0)  # the refusal comes at once
    with refusing_broker() as address:
        config = load_config(EXAMPLE, env={**SASL, "CDC_ROUTER__KAFKA__BOOTSTRAP_SERVERS":
                                           address}).config
        report = probe.check(config, probe.Endpoints(
            "postgresql://u:p@127.0.0.1:1/db", "http://127.0.0.1:1", logged_config(config)))
    for section in (report.router, report.dead_letters, report.dedup_changelog):
        assert section.error is not None
        assert "(Kafka refused this process's credentials: " in section.error, section.error
        assert f"SASL authentication error: {REFUSAL}" in section.error, section.error
        assert "check kafka.sasl_username, its password and kafka.sasl_mechanism)" in \
            section.error
    assert "FAIL" not in capfd.readouterr().err  # librdkafka's own lines stay unshown
