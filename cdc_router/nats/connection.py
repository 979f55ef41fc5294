"""How every client of ours reaches NATS: the `nats:` section as nats-py's connect options.

The publisher, `streams apply` and the JetStream consumer share it, so credentials and TLS are
read, checked and refused in one place. A server that refuses our credentials answers
`Authorization Violation` (or `Authentication ...` for an expired JWT) and nats-py then retries
for ever; `credentials_refused` tells that answer apart from an outage, so that the caller stops
with the fields to check instead of retrying a password that will never work.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from typing import Any

from cdc_router.config.nats import NatsSettings
from cdc_router.errors import ConfigError

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
    if settings.user is not None:
        options.update(user=settings.user, password=settings.password)
    if settings.token is not None:
        options["token"] = settings.token
    if settings.credentials_file is not None:
        options["user_credentials"] = _readable(settings.credentials_file,
                                                "nats.credentials_file")
    if settings.tls is not None:
        tls = settings.tls
        try:
            context = ssl.create_default_context(
                cafile=_readable(tls.ca_file, "nats.tls.ca_file") if tls.ca_file else None)
        except ssl.SSLError as error:
            raise ConfigError(f"nats.tls.ca_file holds no CA certificate: {error}",
                              field="nats.tls.ca_file", value=tls.ca_file,
                              hint="give the PEM file of the CA that signed the server's "
                                   "certificate") from None
        if tls.cert_file is not None and tls.key_file is not None:
            try:
                context.load_cert_chain(_readable(tls.cert_file, "nats.tls.cert_file"),
                                        _readable(tls.key_file, "nats.tls.key_file"))
            except ssl.SSLError as error:
                raise ConfigError(f"nats.tls.cert_file and key_file do not make a key pair: "
                                  f"{error}", field="nats.tls.cert_file",
                                  value=tls.cert_file,
                                  hint="give the PEM certificate and its private key") from None
        options["tls"] = context
        if tls.hostname is not None:
            options["tls_hostname"] = tls.hostname
    return options


def credentials_refused(error: BaseException | None) -> bool:
    """True when `error` (nats-py's, last seen while connecting) is the server refusing our
    credentials rather than being away."""
    text = str(error).lower() if error is not None else ""
    return type(error).__name__ == "AuthorizationError" or any(
        refused in text for refused in _REFUSED)


def refused_error(url: str, error: BaseException) -> ConfigError:
    """The one line a refusal of our credentials stops a command with."""
    return ConfigError(f"NATS at {url} refused our credentials ({str(error).strip()})",
                       field=CREDENTIAL_FIELDS,
                       hint="check them against the server's authorization (or the account "
                            "of the .creds file); an outage would not say this")


def _readable(path: str, field: str) -> str:
    if not Path(path).is_file():
        raise ConfigError("file not found", field=field, value=path,
                          hint="give the path of a readable file on this host")
    return path
