"""Secrets masked for display: the one rule for every config we print.

A value is a secret when its key says so (`database.password`, `ssl.keystore.key`,
`basic.auth.user.info`, `sasl.jaas.config`, ...), whatever the case. Connectors, router.yaml
sections and error lines all pass what they show through `redact` or `redact_tree`.

A Kafka Connect config-provider reference (`${env:DB_PASSWORD}`, `${file:/s.properties:pw}`) is
not a secret but where to find one, and users need to see which one a connector uses: it is
always shown, and only the text around it is masked.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from cdc_router.config.placeholders import provider_references

MASK = "*****"

# Words that name a credential in Kafka, librdkafka, Connect, Debezium and schema-registry keys
# (and what librdkafka itself redacts: sasl.oauthbearer.config, QA 64-b).
_SECRET_KEY = re.compile(
    r"password|passwd|passphrase|secret|token|credential|user[._-]?info|jaas[._-]?config"
    r"|oauthbearer[._-]?config"
    r"|keystore[._-]?key|private[._-]?key|api[._-]?key|key[._-]?pem|(?:^|[._-])(?:dsn|pwd)$",
    re.IGNORECASE)
# Keys holding one of those words that say where or how to get a secret, not the secret:
# `basic.auth.credentials.source`, `sasl.oauthbearer.token.endpoint.url`, `*.location`, ...
_NOT_SECRET_KEY = re.compile(r"[._-](source|location|file|url|type|class|mechanism)$",
                             re.IGNORECASE)
# `scheme://user:password@host` inside any value (a registry URL, a MongoDB connection string).
# The scheme's length is bounded: unbounded, each letter of a long word was a start that read the
# word to its end (QA 33-b: a 100,000-letter value took 28 s). Any scheme character may start it
# (review 34-2: with a letter first, 'a' and 40 digits before `://` hid the password), so the
# match starts within 32 characters of its `://` whatever precedes them.
# The password runs to the last '@' before a '/' or a blank (QA 64-b: `u:P@ss@h` showed `ss`):
# each try still ends at the next '/', which every later `://` holds.
_URL_PASSWORD = re.compile(
    r"(?P<head>[A-Za-z0-9+.-]{1,32}://[^/:@\s]*:)(?P<password>[^/\s]+)@")
# A URL's parameter, `?name=value`, `&name=value` or JDBC's `;name=value` (a value in braces
# may hold `;`): a secret by is_secret_key's rule on its name (review 31: a JDBC sink's
# connection.url was shown in clear; review 31-2: sslpassword, trustStorePassword, access_token).
_URL_PARAMETER = re.compile(r"(?P<head>[?&;](?P<name>[\w.-]+)=)(?P<password>\{[^}]*\}?|[^&;]+)")


def is_secret_key(key: str) -> bool:
    """True for config keys whose values are credentials (never printed in plain text)."""
    return bool(_SECRET_KEY.search(key)) and not _NOT_SECRET_KEY.search(key)


def redact(key: str, value: str | None) -> str | None:
    """`value` fit to print: a secret key's text is masked except its provider references.

    Any other value only loses the password of a `scheme://user:password@` URL in it.
    None and the empty string stay as they are (nothing to hide, and "unset" is worth seeing).
    """
    if not value:
        return value
    if is_secret_key(key):
        return _mask_around_references(value)
    return _URL_PARAMETER.sub(_mask_param_password,
                              _URL_PASSWORD.sub(_mask_url_password, value))


# The user info of one server of a URL list: `user:password@`, or a token, `token@` (NATS),
# through the server's last '@': a password may hold an '@' or a '/' written as is (QA 64-b:
# `u:Url@S3c@host` showed `S3c`, `u:Url/S3c@host` all of it), and over-masking a path's '@'
# only costs a URL shown less.
_USER_INFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)?(?P<info>.*)@", re.DOTALL)


def shown_url(url: str) -> str:
    """A comma-separated list of server URLs fit for a log or an error line: each server's
    password, or its token, masked, and a secret among its parameters (`?token=...`)."""
    def masked(match: re.Match[str]) -> str:
        user, colon, _ = match["info"].partition(":")
        user = user if "/" not in user and "@" not in user else ""
        return f"{match['scheme'] or ''}{user + ':' if colon else ''}{MASK}@"

    return ",".join(_URL_PARAMETER.sub(_mask_param_password,
                                       _USER_INFO.sub(masked, server.strip(), count=1))
                    for server in url.split(",") if server.strip())


def user_info_problem(url: str) -> str | None:
    """Why an HTTP server URL's user info would be misread, or None: a '/', '?' or '#' of its
    password written as is ends the URL's authority there, so a piece of the password is read
    as the host or port, and shown as such (QA 64-b). An '@' is fine: urllib and httpx, as
    URLs do, end the user info at the authority's last '@'."""
    rest = url.partition("://")[2] or url
    authority = re.match(r"[^/?#]*", rest)[0]  # type: ignore[index]  # matches any text
    if "@" not in authority and "@" in rest[len(authority):]:
        return ("its user info holds a '/', '?' or '#' that is not percent-encoded, so a piece "
                "of the password would be read as the host or port: write them as %2F, %3F "
                "and %23")
    return None


def redact_tree(value: Any, key: str = "") -> Any:
    """A JSON-like tree with every string under a secret key (at any depth) redacted."""
    if isinstance(value, dict):
        return {name: redact_tree(item, str(name)) for name, item in value.items()}
    if isinstance(value, list):
        return [redact_tree(item, key) for item in value]
    if isinstance(value, str):
        return redact(key, value)
    if value is not None and is_secret_key(key) and not isinstance(value, bool):
        return MASK  # a number under a password key is still the password
    return value


def masked_repr(instance: Any, **masks: Callable[[Any], Any]) -> str:
    """A dataclass's repr with the fields named in `masks` shown through them (a field of
    repr=False too), the other repr=False ones left out: settings a service may log."""
    shown = {item.name: masks[item.name](getattr(instance, item.name)) if item.name in masks
             else getattr(instance, item.name)
             for item in dataclasses.fields(instance) if item.repr or item.name in masks}
    return f"{type(instance).__name__}(" + ", ".join(
        f"{name}={value!r}" for name, value in shown.items()) + ")"


def _mask_around_references(value: str) -> str:
    references = provider_references(value)
    if not references:
        return MASK
    pattern = "(" + "|".join(re.escape(reference) for reference in references) + ")"
    parts = re.split(pattern, value)
    return "".join(part if part in references else (MASK if part else "") for part in parts)


def _mask_url_password(match: re.Match[str]) -> str:
    password = match.group("password")
    if provider_references(password) == [password]:
        return match.group(0)
    return f"{match.group('head')}{MASK}@"


def _mask_param_password(match: re.Match[str]) -> str:
    password = match.group("password")
    if not is_secret_key(match.group("name")) or provider_references(password) == [password]:
        return match.group(0)
    return f"{match.group('head')}{MASK}"
