"""The idempotent consumers' settings print without their credentials."""

from __future__ import annotations

from cdc_router.consumer.jetstream_settings import JetStreamSettings
from cdc_router.consumer.settings import ConsumerSettings


def test_consumer_settings_show_no_credential_of_their_librdkafka_properties() -> None:
    # QA 64-b: the dataclass's repr showed consumer_config's sasl.password in clear, so a
    # service that logged its settings at start logged the password.
    settings = ConsumerSettings(
        bootstrap_servers="127.0.0.1:9092", group_id="g", topics=("t",), dead_letter_topic="d",
        consumer_config={"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                         "sasl.username": "svc", "sasl.password": "Sasl-S3cret"},
        producer_config={"ssl.key.password": "K3y-S3cret", "linger.ms": "5"})
    shown = repr(settings)
    assert "S3cret" not in shown
    assert "'sasl.username': 'svc'" in shown and "'linger.ms': '5'" in shown
    assert shown.startswith("ConsumerSettings(bootstrap_servers='127.0.0.1:9092', group_id='g'")
    assert settings.consumer_config["sasl.password"] == "Sasl-S3cret"  # only the repr masks


def test_jetstream_settings_show_no_password_nor_token_of_their_url() -> None:
    settings = JetStreamSettings(url="nats://svc:Nats-S3cret@h:4222,nats://T0k-S3cret@h2",
                                 stream="ORDERS", durable="svc", dead_letter_subject="dlq.svc",
                                 connect_options={"password": "Opt-S3cret"})
    shown = repr(settings)
    assert "S3cret" not in shown
    assert shown.startswith("JetStreamSettings(url='nats://svc:*****@h:4222,nats://*****@h2', "
                            "stream='ORDERS', durable='svc'"), shown
