"""What the idempotent consumer says when librdkafka refuses its TLS files as it builds the
client: the advice `run` gives, in words for a consumer_config (fixer 57-y's note: each got
"check the file paths, the key password and the property names")."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Consumer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from cdc_router.consumer.settings import built
from cdc_router.errors import ConfigError
from tests.unit.tls_broker import make_certificates

BASE = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "security.protocol": "SSL"}


def refusal(config: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as refused:
        built(Consumer, {**BASE, **config}, "consumer_config")
    return str(refused.value)


def _encrypted(key_path: str, directory: Path) -> Path:
    """The key of `key_path`, encrypted with a passphrase, in a file of its own."""
    key = serialization.load_pem_private_key(Path(key_path).read_bytes(), None)
    encrypted = directory / "encrypted.key"
    encrypted.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"s3cret")))
    return encrypted


def test_a_key_of_another_certificate_is_named_as_such(tmp_path: Path) -> None:
    paths = make_certificates(tmp_path)
    other = tmp_path / "other.key"
    other.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    said = refusal({"ssl.certificate.location": paths["server.pem"],
                    "ssl.key.location": str(other)})
    assert "key values mismatch; the key in ssl.key.location is not the one of the " \
        "certificate in ssl.certificate.location: give the key and the certificate that " \
        "belong together" in said, said
    assert "check the file paths" not in said


def test_an_encrypted_key_without_its_password_is_told_to_set_ssl_key_password(
        tmp_path: Path) -> None:
    paths = make_certificates(tmp_path)
    encrypted = _encrypted(paths["server.key"], tmp_path)
    said = refusal({"ssl.certificate.location": paths["server.pem"],
                    "ssl.key.location": str(encrypted)})
    assert said.endswith("; if the key in ssl.key.location is encrypted, set "
                         "ssl.key.password to its passphrase; else check that the file is a "
                         "PEM private key"), said
    assert "CDC_ROUTER__" not in said  # a library's config, not the router's variables


def test_an_encrypted_key_with_a_wrong_password_is_told_to_check_it(tmp_path: Path) -> None:
    # QA 58-d F-3: with ssl.key.password set (wrongly), the advice was to set it.
    paths = make_certificates(tmp_path)
    encrypted = _encrypted(paths["server.key"], tmp_path)
    said = refusal({"ssl.certificate.location": paths["server.pem"],
                    "ssl.key.location": str(encrypted), "ssl.key.password": "wrong"})
    assert said.endswith("; ssl.key.password is set: check that it is the passphrase of the "
                         "key in ssl.key.location, and that the file is a PEM private key"), said
    assert "wrong" not in said


@pytest.mark.parametrize("field", ["ssl.ca.location", "ssl.certificate.location"])
def test_a_file_that_is_no_pem_names_its_property(tmp_path: Path, field: str) -> None:
    paths = make_certificates(tmp_path)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n", encoding="utf-8")
    config = {field: str(junk)}
    if field == "ssl.certificate.location":
        config["ssl.key.location"] = paths["server.key"]
    said = refusal(config)
    assert said.endswith(f"; check {field}: librdkafka could not load it (its "
                         "CONFIGURATION.md gives the format)"), said


def test_a_missing_key_file_is_named_missing_not_a_password_to_set(tmp_path: Path) -> None:
    paths = make_certificates(tmp_path)
    said = refusal({"ssl.certificate.location": paths["server.pem"],
                    "ssl.key.location": str(tmp_path / "nope.key")})
    assert f"ssl.key.location {tmp_path / 'nope.key'} does not exist" in said, said
    assert "ssl.key.password" not in said


def test_status_gives_the_tls_advice_run_gives_for_a_router_yaml(tmp_path: Path) -> None:
    # Reread 58-r F-4: for one router.yaml, `status` said "set ssl.key.password" where `run`
    # and `topics` name the variable, and "check ssl.ca.location" without kafka.config.
    from cdc_router.kafka.tls import KEY_PASSWORD_ADVICE
    from cdc_router.ops.offsets import client_config_problem

    paths = make_certificates(tmp_path)
    encrypted = _encrypted(paths["server.key"], tmp_path)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n", encoding="utf-8")
    base = {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SSL"}
    said = client_config_problem({**base, "ssl.certificate.location": paths["server.pem"],
                                  "ssl.key.location": str(encrypted)})
    assert said is not None and said.endswith(f"; {KEY_PASSWORD_ADVICE}"), said
    said = client_config_problem({**base, "ssl.ca.location": str(junk)})
    assert said is not None and said.endswith(
        "; check kafka.config.ssl.ca.location: librdkafka could not load it (its "
        "CONFIGURATION.md gives the format)"), said


def test_an_unknown_property_gets_advice_about_its_name_only() -> None:
    # QA 61-b F6: a typo'd key was told to check the file paths and the key password.
    text = refusal({"sesion.timeout.ms": "6000"})
    assert 'No such configuration property: "sesion.timeout.ms"; check the property\'s name' \
        in text
    assert "file paths" not in text and "key password" not in text
