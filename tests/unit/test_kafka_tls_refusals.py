"""A TLS handshake refused for a certificate stops every process with one line naming the
setting, and a listener that closes each connection at once is named as a protocol mismatch
(QA 56-d F-1, F-2, F-3; tests/unit/tls_broker.py makes the listeners and the certificates)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.unit.tls_broker import closing_broker, make_certificates, tls_broker

EXAMPLE = Path(__file__).parents[2] / "cdc_router" / "examples" / "router.yaml"


def _consumer_stops(address: str, config: dict[str, str]) -> str:
    """The FatalKafkaError's text a consumer of `address` with `config` stops with."""
    from cdc_router.consumer import ConsumerSettings, IdempotentConsumer
    from cdc_router.consumer.dedup.memory import MemoryDedupStore
    from cdc_router.errors import FatalKafkaError

    settings = ConsumerSettings(bootstrap_servers=address, group_id="g", topics=("t",),
                                dead_letter_topic="t.dlq", consumer_config=config)
    consumer: IdempotentConsumer[None] = IdempotentConsumer(
        settings, MemoryDedupStore(), lambda event, context: None,
        members_factory=lambda *_: lambda name, timeout_s: True)
    stopper = threading.Timer(30, consumer.stop)  # the code before waited for ever
    stopper.daemon = True
    stopper.start()
    try:
        with pytest.raises(FatalKafkaError) as stopped:
            consumer.run()
    finally:
        stopper.cancel()
    return str(stopped.value)


def test_the_idempotent_consumer_stops_on_a_broker_certificate_its_ca_does_not_sign(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths = make_certificates(tmp_path)
    with tls_broker(paths) as address:
        line = _consumer_stops(address, {"security.protocol": "SSL",
                                         "ssl.ca.location": paths["otherca.pem"]})
    # librdkafka reports the failed verification as _SSL, or as _TRANSPORT when the broker's
    # side closes first (seen under load, QA 62-b); the line is classified by its text, not code.
    assert line.startswith(("the TLS handshake with Kafka failed: _SSL: ",
                            "the TLS handshake with Kafka failed: _TRANSPORT: ")), line
    assert "certificate verify failed" in line
    assert "consumer_config ssl.ca.location is not the CA that signs it, or the certificate " \
        "does not name the host" in line, line
    assert "dead_letter_topic_unchecked" not in caplog.text  # no 30 s wait first


def test_the_idempotent_consumer_stops_when_the_listener_demands_a_client_certificate(
        tmp_path: Path) -> None:
    paths = make_certificates(tmp_path)
    with tls_broker(paths, client_certificate=True) as address:
        line = _consumer_stops(address, {"security.protocol": "SSL",
                                         "ssl.ca.location": paths["ca.pem"]})
    assert line.startswith("the TLS handshake with Kafka failed: _TRANSPORT: "), line
    assert "alert certificate required" in line or "alert bad certificate" in line, line
    assert "refused this process's client certificate (none given, or one its CA does not " \
        "sign): set consumer_config ssl.certificate.location and ssl.key.location" in line


def _run(env: dict[str, str]) -> tuple[int, str]:
    """`run` of the example config with `env`: its exit code and its one error line."""
    ran = subprocess.run(
        [sys.executable, "-m", "cdc_router", "run", "-c", str(EXAMPLE), "--metrics-port", "0"],
        env={**os.environ, **env, "CDC_ROUTER__DELIVERY__TRANSACTION_TIMEOUT_MS": "3000",
             "PYTHONPATH": str(EXAMPLE.parents[2])},
        capture_output=True, text=True, timeout=120, check=False)
    lines = [line for line in ran.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, ran.stderr
    return ran.returncode, lines[0]


def test_run_with_a_ca_that_does_not_sign_the_broker_exits_1_naming_ssl_ca_location(
        tmp_path: Path) -> None:
    # QA 56-d F-3: it exited 75, "is the cluster reachable?", and a supervisor restarting on
    # 75 restarted it for ever; a wrong CA file is the configuration's, as a wrong password.
    paths = make_certificates(tmp_path)
    with tls_broker(paths) as address:
        code, line = _run({"CDC_ROUTER__KAFKA__BOOTSTRAP_SERVERS": address,
                           "CDC_ROUTER__KAFKA__SECURITY_PROTOCOL": "SSL",
                           "CDC_ROUTER__KAFKA__CONFIG__SSL_CA_LOCATION": paths["otherca.pem"]})
    assert code == 1, line
    assert line.startswith(f"error: the TLS handshake with Kafka at {address} failed: "), line
    assert "certificate verify failed" in line and "reachable" not in line, line
    assert "kafka.config ssl.ca.location is not the CA that signs it" in line, line
    assert line.endswith("a restart does not mend it"), line


def test_run_against_a_listener_that_closes_each_connection_names_security_protocol() -> None:
    # QA 56-d F-2: PLAINTEXT against an SSL or SASL listener (the broker closes the
    # connection at once) said only "is the cluster at ... (kafka.bootstrap_servers)
    # reachable?". Still exit 75: a broker going down closes connections too.
    with closing_broker() as address:
        code, line = _run({"CDC_ROUTER__KAFKA__BOOTSTRAP_SERVERS": address})
    assert code == 75, line
    assert "reachable?" in line and "closed it at once" in line, line
    assert "check kafka.security_protocol (now PLAINTEXT) against the listener's" in line, line
