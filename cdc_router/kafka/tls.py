"""A TLS handshake with Kafka that failed for a certificate, told from librdkafka's text: a
configuration's fault (the CA file, the client certificate), which no restart mends (QA 56-d
F-1, F-3: the idempotent consumer waited for ever, `run` and `relay` exited 75 for a
supervisor to restart them for ever). No confluent_kafka import: kafka/logs.py uses it too."""

from __future__ import annotations

import re

# The broker's certificate: signed by no CA of ssl.ca.location, or naming another host.
# OpenSSL's 0A000086 says the same of both; librdkafka does not add which check failed.
BROKER_CERTIFICATE = "broker certificate"
# This process's certificate: none given to a listener with ssl.client.auth=required (TLS 1.3:
# alert 116, certificate required; TLS 1.2: alert 40/42), or one the broker's CA does not sign.
CLIENT_CERTIFICATE = "client certificate"
# The variable that sets kafka.config's ssl.key.password (config/overrides.py's variable_of), and
# what to do when librdkafka cannot read ssl.key.location's key and none is set: `run`'s line
# and the other commands' (cli/_kafka_failure) say it in these words (QA 56-d F-5).
KEY_PASSWORD_VARIABLE = "CDC_ROUTER__KAFKA__CONFIG__SSL_KEY_PASSWORD"
KEY_PASSWORD_ADVICE = (f"if the key is encrypted, set {KEY_PASSWORD_VARIABLE} (ssl.key.password) "
                       "to its passphrase; else check that the file is a PEM private key")
# A key that is not the certificate's (OpenSSL's "key values mismatch"; librdkafka says
# "ssl.key.location failed" of it too, as of a key it cannot read): what to do instead.
KEY_MISMATCH = "key values mismatch"
KEY_MISMATCH_ADVICE = ("the key in ssl.key.location is not the one of the certificate in "
                       "ssl.certificate.location: give the key and the certificate that belong "
                       "together")
# The ssl.* property librdkafka's refusal to build a client names as it fails to load it:
# "ssl.ca.location failed: ...", "Error reading ssl.keystore.location PKCS#12 file",
# "failed to read certificate #0 from ssl.ca.pem" (librdkafka 2.16).
_TLS_PROPERTY = re.compile(r"\b(ssl\.[a-z]+(?:\.[a-z]+)*\.(?:location|pem))\b")
_BROKER_SIGNS = ("certificate verify failed",)
_CLIENT_SIGNS = ("alert bad certificate", "alert certificate required", "alert unknown ca",
                 "alert certificate unknown", "alert certificate expired",
                 "alert certificate revoked", "alert unsupported certificate")


def certificate_refusal(text: str) -> str | None:
    """BROKER_CERTIFICATE or CLIENT_CERTIFICATE when librdkafka's `text` (a log line, an
    error_cb error's text) says a TLS handshake failed for that certificate; else None (a
    connection closed or reset, a handshake cut short: an outage looks the same)."""
    lowered = text.lower()
    if any(sign in lowered for sign in _BROKER_SIGNS):
        return BROKER_CERTIFICATE
    if any(sign in lowered for sign in _CLIENT_SIGNS):
        return CLIENT_CERTIFICATE
    return None


CERTIFICATES = (BROKER_CERTIFICATE, CLIENT_CERTIFICATE)


def certificate_failure(kind: str, said: str, settings: str, kafka: str = "Kafka") -> str:
    """The line of a TLS handshake with `kafka` refused for a certificate of `kind` (librdkafka
    `said` so) and what to check (certificate_advice)."""
    return f"the TLS handshake with {kafka} failed: {said}; {certificate_advice(kind, settings)}"


def certificate_advice(kind: str, settings: str) -> str:
    """What to check for a refused certificate of `kind`; `settings` names where the ssl.*
    properties are given ("kafka.config", "consumer_config")."""
    if kind == CLIENT_CERTIFICATE:
        return (f"the broker's listener refused this process's client certificate (none given, "
                f"or one its CA does not sign): set {settings} ssl.certificate.location and "
                "ssl.key.location to a certificate the listener's truststore trusts")
    return (f"this process could not verify the broker's certificate: either {settings} "
            "ssl.ca.location is not the CA that signs it, or the certificate does not name the "
            "host this process connects to (the host in the bootstrap servers and the brokers' "
            "advertised listeners; OpenSSL's text is the same for both)")


def key_refusal(text: str) -> str | None:
    """What to do when librdkafka's refusal to build a client (`text`) is about the client's
    private key: a key that is not the certificate's (KEY_MISMATCH_ADVICE), or one it could not
    read from ssl.key.location (KEY_PASSWORD_ADVICE); None for any other refusal. `run`'s line
    and the other commands' (cli/_kafka_failure) take it from here (fixer 57-y N-2: a key of
    another certificate was told to set its password)."""
    if KEY_MISMATCH in text:
        return KEY_MISMATCH_ADVICE
    if "ssl.key.location failed" in text:
        return KEY_PASSWORD_ADVICE
    return None


def tls_property(text: str) -> str | None:
    """The ssl.* file or PEM property librdkafka's refusal to build a client (`text`) says it
    could not load (ssl.ca.location, ssl.certificate.location ...), or None: the error names
    it as its field, not kafka.config (fixer 57-y N-1)."""
    found = _TLS_PROPERTY.search(text)
    return found.group(1) if found else None


def unloaded(field: str) -> str:
    """What to do of a TLS property librdkafka could not load; `field` is its config path
    (kafka.config.ssl.ca.location)."""
    return f"check {field}: librdkafka could not load it (its CONFIGURATION.md gives the format)"
