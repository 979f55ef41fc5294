"""A TLS file librdkafka cannot load, or a key that is not the certificate's, as each command's
one error line tells it: naming the ssl.* property, with advice that fits (fixer 57-y N-1, N-2).
librdkafka's own texts, from files made here; no broker (bootstrap 127.0.0.1:1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from cdc_router.cli import main
from tests.unit.tls_broker import make_certificates

# `run` names the field, the other commands (cli/_kafka_failure) the property in their hint.
_COMMANDS = [["run", "--metrics-port=0"], ["topics", "apply", "--dry-run"], ["dlq", "list"]]


def _refused(tmp_path: Path, args: list[str], settings: dict[str, str]) -> str:
    config = tmp_path / "router.yaml"
    listed = ", ".join(f"{key}: {value}" for key, value in settings.items())
    config.write_text("kafka: {bootstrap_servers: '127.0.0.1:1', security_protocol: SSL,\n"
                      f"        config: {{{listed}}}}}\n"
                      "source: {group_id: g, topics: [raw]}\nroutes: [{topic: orders}]\n",
                      "utf-8")
    words = [arg for arg in args if not arg.startswith("-")]
    result = CliRunner().invoke(main, [*words, "-c", str(config), *args[len(words):]])
    assert result.exit_code == 1, result.output
    assert result.output.count("\n") == 1, result.output
    return result.output


@pytest.mark.parametrize("args", _COMMANDS)
@pytest.mark.parametrize("unloadable", ["ssl.ca.location", "ssl.certificate.location"])
def test_a_tls_file_librdkafka_cannot_load_is_named_without_the_key_password(
        tmp_path: Path, args: list[str], unloadable: str) -> None:
    # Fixer 57-y N-1: `run` said "field 'kafka.config': ... ssl.ca.location failed: ...; see
    # librdkafka's CONFIGURATION.md for the names and values, and check the key password of
    # ssl.key.location" (the key read fine: an unreadable key has its own line), the other
    # commands "check kafka.config's file paths (ssl.*.location), the key password and ...".
    paths = make_certificates(tmp_path)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a PEM file\n", "utf-8")
    settings = {"ssl.ca.location": paths["ca.pem"],
                "ssl.certificate.location": paths["server.pem"],
                "ssl.key.location": paths["server.key"], unloadable: str(junk)}
    line = _refused(tmp_path, args, settings)
    assert f"{unloadable} failed: " in line, line
    assert "key password" not in line and "ssl.key.password" not in line, line
    assert f"check kafka.config.{unloadable}: librdkafka could not load it" in line, line
    if args[0] == "run":
        assert f"field 'kafka.config.{unloadable}': librdkafka refused a client property" \
            in line and f"(got '{junk}')" in line, line


@pytest.mark.parametrize("args", _COMMANDS)
def test_a_key_of_another_certificate_is_told_so_not_to_set_its_password(
        tmp_path: Path, args: list[str]) -> None:
    # Fixer 57-y N-2: librdkafka's "ssl.key.location failed: ... key values mismatch" got the
    # advice of a key it cannot read: "ssl.key.password is not set: if the key is encrypted,
    # set CDC_ROUTER__KAFKA__CONFIG__SSL_KEY_PASSWORD ...; else check that the file is a PEM
    # private key" (it is one: another certificate's).
    paths = make_certificates(tmp_path)
    other = tmp_path / "other.key"
    other.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    line = _refused(tmp_path, args, {"ssl.certificate.location": paths["server.pem"],
                                     "ssl.key.location": str(other)})
    assert "ssl.key.location failed: " in line and "key values mismatch" in line, line
    assert line.endswith("; the key in ssl.key.location is not the one of the certificate in "
                         "ssl.certificate.location: give the key and the certificate that "
                         "belong together\n"), line
    assert "password" not in line.lower(), line
    if args[0] == "run":
        assert "field 'kafka.config.ssl.key.location': librdkafka refused a client " \
            "property" in line and f"(got '{other}')" in line, line
