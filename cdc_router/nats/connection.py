"""How every client of ours reaches NATS: the `nats:` section as nats-py's connect options.

The publisher, `streams apply` and the JetStream consumer share it, so credentials and TLS are
read, checked and refused in one place. A server that refuses our credentials answers
`Authorization Violation` (or `Authentication ...` for an expired JWT), and a certificate that
does not verify fails the TLS handshake; nats-py retries either for ever. `config_failure`
tells those apart from an outage, so that the caller stops with the fields to check instead of
retrying what will never work.

nats-py upgrades a connection to TLS only when the server's INFO requires it, whatever the URL
or the `tls` option say: pointed at a plain port, it would send our password in clear text.
`require_tls` reads each server's INFO first and refuses a server that does not require TLS,
with `tls` set or a tls:// URL (nats-py then upgrades with the system's CAs).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cdc_router.config.nats import NatsSettings
from cdc_router.config.redact import shown_url
from cdc_router.dead_letter import shown_error
from cdc_router.errors import ConfigError

# How many of the errors nats-py reports while connecting a caller keeps for config_failure: a
# refusal is followed by the server hanging up (a broken pipe, a reset), so the last alone hides it.
RECENT_ERRORS = 8
CREDENTIAL_FIELDS = "nats.user / nats.password, nats.token or nats.credentials_file"
# Substrings of nats-server's -ERR lines that say who we are was refused, not where.
_REFUSED = ("authorization violation", "authentication expired", "authentication revoked")


def _not_asyncio_tls_eof_noise(record: logging.LogRecord) -> bool:
    # asyncio warns this on every TLS connection the server closes (nats-py's protocol returns
    # True from eof_received, meaningless under TLS): noise beside our own one-line errors.
    return "eof_received() has no effect when using ssl" not in record.getMessage()


logging.getLogger("asyncio").addFilter(_not_asyncio_tls_eof_noise)


def connect_options(settings: NatsSettings) -> dict[str, Any]:
    """nats.connect() keyword arguments for the credentials and TLS of `settings`.

    Raises ConfigError naming the field when a file it names cannot be read.
    """
    options: dict[str, Any] = {}
    if settings.user is not None and settings.password is not None:
        options.update(user=settings.user, password=settings.password.get_secret_value())
    if settings.token is not None:
        options["token"] = settings.token.get_secret_value()
    if settings.credentials_file is not None:
        options["user_credentials"] = _readable(settings.credentials_file,
                                                "nats.credentials_file")
    if settings.tls is not None:
        options.update(_tls_options(settings))
    return options


def _tls_options(settings: NatsSettings) -> dict[str, Any]:
    tls = settings.tls
    assert tls is not None
    try:
        context = ssl.create_default_context(
            cafile=_readable(tls.ca_file, "nats.tls.ca_file") if tls.ca_file else None)
    except (ssl.SSLError, OSError) as error:
        raise ConfigError(f"nats.tls.ca_file holds no readable CA certificate: {error}",
                          field="nats.tls.ca_file", value=tls.ca_file,
                          hint="give the PEM file of the CA that signed the server's "
                               "certificate") from None
    if tls.cert_file is not None and tls.key_file is not None:
        try:
            context.load_cert_chain(_readable(tls.cert_file, "nats.tls.cert_file"),
                                    _readable(tls.key_file, "nats.tls.key_file"))
        except (ssl.SSLError, OSError) as error:
            raise ConfigError(f"nats.tls.cert_file and key_file are no readable key pair: "
                              f"{error}", field="nats.tls.cert_file", value=tls.cert_file,
                              hint="give the PEM certificate and its private key") from None
    options: dict[str, Any] = {"tls": context}
    if tls.hostname is not None:
        options["tls_hostname"] = tls.hostname
    return options


async def require_tls(url: str, options: dict[str, Any], timeout_s: float, *,
                      url_field: str = "nats.url", tls_field: str = "nats.tls") -> None:
    """With TLS configured, or asked for by a server's tls:// scheme, refuse (ConfigError) a
    server of `url` whose INFO does not require TLS. A server that does not answer is left to
    the connection to report. With tls_handshake_first nats-py starts TLS before it reads a
    word, so nothing goes in clear, and a TLS-first server sends no plain INFO to read: no probe
    (review 61-w W-5: each server waited its connect timeout). The error names the caller's
    fields: `url_field` for the URL, `tls_field` for the TLS options (the router's by default;
    review 61-w W-6: the consumer's said nats.url)."""
    if options.get("tls_handshake_first"):
        return
    for server in servers(url):
        # QA 61-b F2: tls:// alone (a server certificate of a public CA needs no nats.tls)
        # sent the password in clear text to a server that did not ask for TLS.
        by_url = urlsplit(server).scheme.lower() == "tls"
        if "tls" not in options and not by_url:
            continue
        info = await _server_info(server, timeout_s)
        if info is not None and not info.get("tls_required"):
            raise ConfigError(f"the NATS server at {shown_url(server)} does not require TLS, "
                              "so nats-py would send our credentials in clear text",
                              field=tls_field if "tls" in options else url_field,
                              hint=f"point {url_field} at the server's TLS listener" + (
                                  f", or remove {tls_field}" if "tls" in options else
                                  " (its tls:// asks for TLS), or use nats:// where the "
                                  "server speaks plain text"))


def servers(url: str) -> list[str]:
    """nats.url's comma-separated servers, as the list nats.connect() takes (review 31: given
    the string whole, nats-py refused it as one URL, 'invalid connect url option')."""
    return [server.strip() for server in url.split(",") if server.strip()]


async def _server_info(server: str, timeout_s: float) -> dict[str, Any] | None:
    parts = urlsplit(server if "://" in server else f"nats://{server}")
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname, parts.port or 4222), timeout_s)
    except (OSError, TimeoutError):
        return None
    try:
        line = await asyncio.wait_for(reader.readline(), timeout_s)
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()
    if not line.startswith(b"INFO "):
        return None
    try:
        info: dict[str, Any] = json.loads(line[5:])
    except ValueError:
        return None
    return info


def credentials_refused(error: BaseException | None) -> bool:
    """True when `error` (nats-py's, last seen while connecting) is the server refusing our
    credentials rather than being away."""
    text = str(error).lower() if error is not None else ""
    return type(error).__name__ == "AuthorizationError" or any(
        refused in text for refused in _REFUSED)


def config_failure(url: str, errors: Sequence[BaseException | None]) -> ConfigError | None:
    """The ConfigError to stop with when one of `errors` (seen while connecting) is no outage:
    our credentials refused, or a TLS handshake that failed for good (a certificate, no TLS
    version in common); else None (a handshake cut short is an outage)."""
    for error in errors:
        if error is None:
            continue
        if credentials_refused(error):
            return ConfigError(f"NATS at {shown_url(url)} refused our credentials "
                               f"({str(error).strip()})",
                               field=CREDENTIAL_FIELDS,
                               hint="check them against the server's authorization (or the "
                                    "account of the .creds file); an outage would not say this")
        tls = _tls_misconfigured(url, error)
        if tls is not None:
            return tls
    return None


# The TLS handshake failures no retry mends, by OpenSSL's reason: the server refused our client
# certificate, or we and the server share no TLS version (or one of us speaks no TLS). Any other
# SSLError (SSLEOFError, SSLZeroReturnError, SSLSyscallError: a connection cut while NATS
# restarts) is an outage, retried: taken for a config error it stopped the router and the
# relay with a wrong hint (review 46 F4).
_CLIENT_CERTIFICATE_REFUSED = frozenset({
    "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE", "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "SSLV3_ALERT_CERTIFICATE_REVOKED", "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED"})
_NO_COMMON_TLS = frozenset({
    "WRONG_VERSION_NUMBER", "UNSUPPORTED_PROTOCOL", "NO_PROTOCOLS_AVAILABLE",
    "TLSV1_ALERT_PROTOCOL_VERSION", "SSLV3_ALERT_HANDSHAKE_FAILURE"})


def _tls_misconfigured(url: str, error: BaseException) -> ConfigError | None:
    if not isinstance(error, ssl.SSLError):
        return None
    failed = f"the TLS handshake with NATS at {shown_url(url)} failed: {error}"
    reason = getattr(error, "reason", None)  # OpenSSL's; unset on an error Python raised
    if isinstance(error, ssl.SSLCertVerificationError) or reason == "CERTIFICATE_VERIFY_FAILED":
        return ConfigError(failed, field="nats.tls.ca_file / nats.tls.hostname",
                           hint="give the CA that signed the server's certificate, and the "
                                "name the certificate holds when the URL's differs")
    if reason in _CLIENT_CERTIFICATE_REFUSED:
        return ConfigError(failed, field="nats.tls.cert_file / nats.tls.key_file",
                           hint="the server refused our client certificate (or wants one): "
                                "give a certificate signed by a CA the server trusts")
    if reason in _NO_COMMON_TLS:
        return ConfigError(failed, field="nats.url / nats.tls",
                           hint="point nats.url at the server's TLS listener, and check that "
                                "it accepts TLS 1.2 or later")
    return None


def error_text(error: BaseException) -> str:
    """One line for a nats-py error: its class, and its message when it has one."""
    text = shown_error(error)  # a handler's RetriableError may have a failing __str__
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _readable(path: str, field: str) -> str:
    if not Path(path).is_file():
        raise ConfigError("file not found", field=field, value=path,
                          hint="give the path of a readable file on this host")
    return path
