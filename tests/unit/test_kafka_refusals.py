"""Credentials a SASL listener refuses are named, not taken for an unreachable cluster
(tests/unit/sasl_broker.py refuses every credential, as a broker does a wrong password)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

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
        assert f"Kafka at {address} refused this process's credentials: " in section.error, \
            section.error
        assert f"SASL authentication error: {REFUSAL}" in section.error, section.error
        assert "check kafka.sasl_username and its password" in section.error
    assert "FAIL" not in capfd.readouterr().err  # librdkafka's own lines stay unshown


def test_the_idempotent_consumer_stops_naming_the_credentials_kafka_refused(
        capfd: pytest.CaptureFixture[str]) -> None:
    # Review 51-d F2: librdkafka gives a refused SASL login to error_cb alone, never to
    # consume(): run() waited for ever, its lines raw on stderr, 5 a second.
    from cdc_router.consumer import ConsumerSettings, IdempotentConsumer
    from cdc_router.consumer.dedup.memory import MemoryDedupStore
    from cdc_router.errors import FatalKafkaError

    seen: list[str] = []
    with refusing_broker() as address:
        settings = ConsumerSettings(
            bootstrap_servers=address, group_id="g", topics=("t",), dead_letter_topic="t.dlq",
            dead_letter_timeout_s=1.0,  # its existence is not asked for long
            consumer_config={"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                             "sasl.username": "app", "sasl.password": "wrong",
                             "error_cb": lambda error: seen.append(error.name())})
        consumer: IdempotentConsumer[None] = IdempotentConsumer(
            settings, MemoryDedupStore(), lambda event, context: None,
            members_factory=lambda *_: lambda name, timeout_s: True)
        stopper = threading.Timer(30, consumer.stop)  # the code before waited for ever
        stopper.daemon = True  # nor does it hold the test run up once the test is done
        stopper.start()
        with pytest.raises(FatalKafkaError) as stopped:
            consumer.run()
    assert str(stopped.value).startswith(
        "Kafka refused this consumer's credentials: _AUTHENTICATION: ")
    assert f"SASL authentication error: {REFUSAL}" in str(stopped.value)
    assert str(stopped.value).endswith("check consumer_config's sasl.username, sasl.password, "
                                       "sasl.mechanism and security.protocol")
    assert "_AUTHENTICATION" in seen  # the user's own error_cb is still called
    assert "|FAIL|" not in capfd.readouterr().err  # librdkafka's lines go through logging


def test_the_idempotent_consumer_stops_on_refused_credentials_before_its_topic_check_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    # QA 51-i L1: the dead-letter topic's check waited its whole dead_letter_timeout_s (30 s)
    # for metadata a refused login never gets, logged dead_letter_topic_unchecked with
    # _TRANSPORT (the network blamed), and only then raised the refusal.
    from cdc_router.consumer import ConsumerSettings, IdempotentConsumer
    from cdc_router.consumer.dedup.memory import MemoryDedupStore
    from cdc_router.errors import FatalKafkaError

    with refusing_broker() as address:
        settings = ConsumerSettings(
            bootstrap_servers=address, group_id="g", topics=("t",), dead_letter_topic="t.dlq",
            consumer_config={"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                             "sasl.username": "app", "sasl.password": "wrong"})
        consumer: IdempotentConsumer[None] = IdempotentConsumer(
            settings, MemoryDedupStore(), lambda event, context: None,
            members_factory=lambda *_: lambda name, timeout_s: True)
        stopper = threading.Timer(60, consumer.stop)  # a safety net only
        stopper.daemon = True
        stopper.start()
        with pytest.raises(FatalKafkaError, match="Kafka refused this consumer's credentials"):
            consumer.run()
        stopper.cancel()
    assert "dead_letter_topic_unchecked" not in caplog.text


def test_an_oauthbearer_token_not_fetched_does_not_stop_a_consumer_a_refused_login_does(
        ) -> None:
    # Review 51-j F1: librdkafka reports a token endpoint it could not reach to error_cb as
    # _AUTHENTICATION, tries again in 10 s and keeps a token still valid; an OIDC consumer
    # stopped on a blip of its identity provider.
    from confluent_kafka import KafkaError

    from cdc_router.kafka.errors import stops_consumer

    assert not stops_consumer(KafkaError(
        KafkaError._AUTHENTICATION, "Failed to acquire SASL OAUTHBEARER token: Failed to "
        "connect to 127.0.0.1:1 after 0 ms: Could not connect to server"))
    assert stops_consumer(KafkaError(KafkaError._AUTHENTICATION, REFUSAL))
    assert stops_consumer(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED, REFUSAL))


def test_a_consumer_config_with_an_oauth_cb_is_left_without_our_error_cb() -> None:
    # Review 51-j F4: confluent-kafka calls error_cb while a failed oauth_cb's exception is
    # pending: our error_cb's call raised SystemError out of the consumer's construction,
    # where a user saw the ConfigError naming consumer_config.
    from cdc_router.consumer.client import noting_errors

    def token(config: str) -> tuple[str, float]:
        return "t", 0.0

    given = {"sasl.mechanism": "OAUTHBEARER", "oauth_cb": token}
    assert noting_errors(given, []) == given
    assert "error_cb" in noting_errors({"sasl.mechanism": "PLAIN"}, [])


def test_run_with_credentials_kafka_refuses_exits_1_naming_them_not_75() -> None:
    # Review 54: `run` with a wrong SASL password exited 75 (a supervisor restarted it for
    # ever) with "is the cluster at ... reachable?" leading its line.
    with refusing_broker() as address:
        env = {**os.environ, **SASL, "CDC_ROUTER__KAFKA__BOOTSTRAP_SERVERS": address,
               "CDC_ROUTER__DELIVERY__TRANSACTION_TIMEOUT_MS": "3000",  # init's wait
               "PYTHONPATH": str(EXAMPLE.parents[2])}
        ran = subprocess.run([sys.executable, "-m", "cdc_router", "run", "-c", str(EXAMPLE),
                              "--metrics-port", "0"], env=env, capture_output=True, text=True,
                             timeout=120, check=False)
    [line] = [line for line in ran.stderr.splitlines() if line.startswith("error: ")]
    assert ran.returncode == 1, ran.stderr
    assert line.startswith(f"error: Kafka at {address} refused this process's credentials: ") and \
        f"SASL authentication error: {REFUSAL}" in line and "reachable" not in line, line
    assert line.endswith("check kafka.sasl_username and its password (kafka.sasl_password, or "
                         "CDC_ROUTER__KAFKA__SASL_PASSWORD), kafka.sasl_mechanism and "
                         "kafka.security_protocol against the broker's listener; a restart "
                         "does not mend it"), line


def test_topics_apply_stops_at_the_refusal_not_after_its_30_s_lookup(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 56-d F-4: `topics apply` with a wrong password failed after its whole 30 s metadata
    # lookup, though librdkafka logged the refusal within 200 ms. In process, with the lookup
    # made 300 s long: a command that waited it out fails the bound, a loaded machine cannot.
    import time

    from click.testing import CliRunner

    from cdc_router.cli import main
    from cdc_router.kafka import logs
    from cdc_router.router import topics

    monkeypatch.setattr(logs, "_REFUSALS", [])
    monkeypatch.setattr(topics, "_ADMIN_TIMEOUT_S", 300.0)
    with refusing_broker() as address:
        for name, value in {**SASL, "CDC_ROUTER__KAFKA__BOOTSTRAP_SERVERS": address}.items():
            monkeypatch.setenv(name, value)
        started = time.monotonic()
        ran = CliRunner().invoke(main, ["topics", "apply", "-c", str(EXAMPLE), "--dry-run"])
        took_s = time.monotonic() - started
    [line] = [line for line in ran.output.splitlines() if line.startswith("error: ")]
    assert ran.exit_code == 1, ran.output
    assert f"Kafka at {address} refused this process's credentials: " in line, line
    assert took_s < 150, f"{took_s:.1f} s"


def test_status_stops_its_kafka_lookup_at_the_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 56-d F-4: the lookup waited its whole LOOKUP_TIMEOUT_S (10 s) after the refusal.
    import time

    from cdc_router.config.load import load_config
    from cdc_router.kafka import logs
    from cdc_router.ops import probe
    from cdc_router.router.clients import logged_config

    monkeypatch.setattr(logs, "_REFUSALS", [])
    assert probe.LOOKUP_TIMEOUT_S >= 10
    with refusing_broker() as address:
        config = load_config(EXAMPLE, env={**SASL, "CDC_ROUTER__KAFKA__BOOTSTRAP_SERVERS":
                                           address}).config
        admin = probe.admin_client({**logged_config(config), "logger": logs.unshown_logger()})
        started = time.monotonic()
        assert probe._kafka_down(admin) is not None
        took_s = time.monotonic() - started
    assert took_s < 6, f"{took_s:.1f} s"
    assert logs.refused_login() is not None


def test_a_metadata_lookup_waits_for_a_slow_answer_within_its_whole_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Reread 56-s F-3: asked in slices of 1, 2, 4 s, a lookup of 10 s gave up on a broker that
    # answers in 5 s (status called it down; before F-4's slices it waited 10 s).
    from confluent_kafka import KafkaError, KafkaException

    from cdc_router.kafka import logs, lookups

    asked: list[float] = []
    now = [100.0]
    monkeypatch.setattr(lookups, "time", SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(logs, "_REFUSALS", [])

    class SlowBroker:
        def list_topics(self, timeout: float) -> str:
            asked.append(round(timeout))
            if timeout < 5:
                now[0] += timeout  # waited it out
                raise KafkaException(KafkaError(KafkaError._TRANSPORT, "timed out"))
            now[0] += 5
            return "answer"

        def poll(self, _: float) -> int:
            return 0

    assert lookups.metadata(SlowBroker(), 10.0) == "answer"
    assert asked[:2] == [1, 2] and asked[2] >= 6, asked


def test_a_consumer_stops_on_a_refused_certificate_only_before_its_first_assignment() -> None:
    # Reread 56-s F-2: one "certificate verify failed" mid-stream (a proxy's certificate
    # during a rollout) stopped a consumer that had read for hours; the router stops for it
    # only at its start, and so does the consumer now. Later it waits, as for an outage.
    from confluent_kafka import KafkaError

    from cdc_router.consumer.client import raise_reported
    from cdc_router.errors import FatalKafkaError

    def refused() -> list[KafkaError]:
        return [KafkaError(KafkaError._SSL, "ssl://b:9093/1: SSL handshake failed: error:"
                           "0A000086:SSL routines::certificate verify failed")]

    reported = refused()
    raise_reported(reported, at_start=False)
    assert reported == []
    with pytest.raises(FatalKafkaError, match=r"consumer_config ssl\.ca\.location"):
        raise_reported(refused(), at_start=True)
