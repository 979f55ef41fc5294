"""The `nats:` section's credentials and TLS as nats-py's connect options, and a refusal of
our credentials told apart from an outage (nats/connection.py)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from nats.errors import AuthorizationError
from nats.errors import Error as NatsError
from pydantic import ValidationError

from cdc_router.config.nats import NatsSettings
from cdc_router.config.redact import shown_url
from cdc_router.errors import ConfigError
from cdc_router.nats.connection import (
    config_failure,
    connect_options,
    credentials_refused,
    require_tls,
)


def test_no_credentials_no_options() -> None:
    assert connect_options(NatsSettings()) == {}


def test_user_and_password_or_a_token() -> None:
    assert connect_options(NatsSettings(user="u", password="p")) == {"user": "u",
                                                                      "password": "p"}
    assert connect_options(NatsSettings(token="t")) == {"token": "t"}


@pytest.mark.parametrize(("fields", "message"), [
    ({"user": "u"}, "user and password go together"),
    ({"password": "p"}, "user and password go together"),
    ({"user": "u", "password": "p", "token": "t"}, "not user/password and token"),
    ({"token": "t", "credentials_file": "x.creds"}, "not token and credentials_file"),
    ({"tls": {"cert_file": "c.pem"}}, "cert_file and key_file go together"),
])
def test_credentials_of_more_than_one_kind_or_half_a_pair_are_refused(
        fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        NatsSettings.model_validate(fields)


def test_a_missing_file_names_its_field(tmp_path: Path) -> None:
    missing = str(tmp_path / "none.creds")
    with pytest.raises(ConfigError, match=r"field 'nats.credentials_file': file not found"):
        connect_options(NatsSettings(credentials_file=missing))
    with pytest.raises(ConfigError, match=r"field 'nats.tls.ca_file': file not found"):
        connect_options(NatsSettings.model_validate({"tls": {"ca_file": missing}}))


def test_a_file_that_holds_no_ca_is_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError,
                       match=r"field 'nats.tls.ca_file': .*no readable CA certificate"):
        connect_options(NatsSettings.model_validate({"tls": {"ca_file": str(junk)}}))


def test_tls_without_a_ca_trusts_the_system_and_keeps_the_hostname() -> None:
    options = connect_options(NatsSettings.model_validate({"tls": {"hostname": "nats.local"}}))
    assert isinstance(options["tls"], ssl.SSLContext)
    assert options["tls_hostname"] == "nats.local"


@pytest.mark.parametrize(("error", "refused"), [
    (AuthorizationError(), True),
    (NatsError("nats: 'Authorization Violation'"), True),
    (NatsError("nats: 'User Authentication Expired'"), True),
    (ConnectionRefusedError(111, "Connection refused"), False),
    (TimeoutError(), False),
    (None, False),
])
def test_a_refusal_of_our_credentials_is_not_an_outage(error: BaseException | None,
                                                       refused: bool) -> None:
    assert credentials_refused(error) is refused


def test_the_refusal_names_the_fields_and_never_the_secret() -> None:
    failure = config_failure("nats://h:4222", [None, NatsError("nats: 'Authorization Violation'")])
    text = str(failure)
    assert "nats.password" in text and "nats.token" in text and "refused our credentials" in text


def test_a_certificate_that_does_not_verify_is_a_config_failure_and_an_outage_is_not() -> None:
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed: unable to get local "
                                             "issuer certificate")
    failure = config_failure("tls://h:4222", [TimeoutError(), verify])
    assert failure is not None and "nats.tls.ca_file" in str(failure)
    assert config_failure("nats://h:4222", [ConnectionRefusedError(111, "refused"), None]) is None


def ssl_error(kind: type[ssl.SSLError], reason: str, message: str) -> ssl.SSLError:
    """An SSLError as the ssl module raises it, `reason` being OpenSSL's."""
    error = kind(1, f"[SSL: {reason}] {message}")
    error.reason = reason
    return error


@pytest.mark.parametrize("error", [
    ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),
    ssl.SSLZeroReturnError(6, "TLS/SSL connection has been closed (EOF)"),
    ssl.SSLSyscallError(5, "Some I/O error occurred"),
    ssl_error(ssl.SSLError, "UNEXPECTED_EOF_WHILE_READING", "unexpected eof while reading"),
])
def test_a_tls_connection_cut_while_nats_restarts_is_an_outage(error: ssl.SSLError) -> None:
    # Review 46 F4: every SSLError was a config error, so a TLS handshake cut by a restarting
    # NATS stopped the router and the relay with "give the CA ..." advice.
    assert config_failure("tls://h:4222", [error]) is None


@pytest.mark.parametrize(("error", "field"), [
    (ssl_error(ssl.SSLError, "CERTIFICATE_VERIFY_FAILED", "certificate verify failed"),
     "nats.tls.ca_file"),
    (ssl_error(ssl.SSLError, "TLSV1_ALERT_UNKNOWN_CA", "tlsv1 alert unknown ca"),
     "nats.tls.cert_file"),
    (ssl_error(ssl.SSLError, "TLSV13_ALERT_CERTIFICATE_REQUIRED", "certificate required"),
     "nats.tls.cert_file"),
    (ssl_error(ssl.SSLError, "WRONG_VERSION_NUMBER", "wrong version number"), "nats.url"),
])
def test_a_handshake_refused_for_good_names_the_setting_to_fix(error: ssl.SSLError,
                                                                field: str) -> None:
    failure = config_failure("tls://h:4222", [ConnectionResetError(104, "reset"), error])
    assert failure is not None and field in str(failure)


def test_an_unreadable_ca_file_is_one_line(tmp_path: Path) -> None:
    unreadable = tmp_path / "ca-dir.pem"
    unreadable.mkdir()  # a directory: is_file() is False
    with pytest.raises(ConfigError, match=r"field 'nats.tls.ca_file'"):
        connect_options(NatsSettings.model_validate({"tls": {"ca_file": str(unreadable)}}))


def test_secrets_are_never_in_the_settings_repr() -> None:
    settings = NatsSettings(user="u", password="hunter2", token=None)
    assert "hunter2" not in repr(settings)


async def _serve_info(info: bytes) -> tuple[asyncio.Server, str]:
    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(info)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"tls://127.0.0.1:{port}"


@pytest.mark.parametrize(("info", "refused"), [
    (b'INFO {"server_id":"x","tls_required":true}\r\n', False),
    (b'INFO {"server_id":"x","tls_available":true}\r\n', True),
    (b'INFO {"server_id":"x"}\r\n', True),
    (b"", False),  # says nothing: the connection itself will report
])
def test_with_tls_configured_a_server_that_does_not_require_it_is_refused(info: bytes,
                                                                          refused: bool) -> None:
    async def check() -> None:
        server, url = await _serve_info(info)
        try:
            await require_tls(url, {"tls": ssl.create_default_context()}, 2.0)
        finally:
            server.close()

    if refused:
        with pytest.raises(ConfigError, match=r"does not require TLS.*clear text"):
            asyncio.run(check())
    else:
        asyncio.run(check())


def test_without_tls_nothing_is_probed() -> None:
    asyncio.run(require_tls("nats://127.0.0.1:1", {}, 0.1))


def test_a_url_in_a_log_or_error_line_shows_no_password_nor_token() -> None:
    # QA, session 26: nats-py takes credentials from the URL; the router logged them.
    assert shown_url("nats://u:s3cret@h:4222,tls://t0ken@h2:4223,h3") == \
        "nats://u:*****@h:4222,tls://*****@h2:4223,h3"
