"""What a schema registry's failure means: registry_failure, the one place that tells the
subject's answer (missing, incompatible, refused) from an outage and from the configuration's
fault, for every caller (the serializer, the decoder, `schemas`, `status`). Split from
serde/registry.py (review 63: over 400 lines)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

from cdc_router.config.redact import shown_url
from cdc_router.errors import RegistryError, on_one_line

# A 409's text as a reason keeps this much: Confluent's details of one field fit in 300.
INCOMPATIBILITY_CHARS = 500
_OLD_SCHEMA = re.compile(r",?\s*\{oldSchema: '.*?'\}", re.DOTALL)
_JAVA_CLASS = re.compile(r"^(?:[\w$]+\.)+[\w$]*Exception:\s*")

# Confluent's error codes (the registry's REST API reference).
NOT_FOUND = 40400  # generic; what confluent-kafka's mock:// registry answers for an unknown id
SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
SCHEMA_NOT_FOUND = 40403

# What every outage's line ends with: it is no answer about the schema, and what comes of it.
OUTAGE = ("an outage, not an answer about the schema: `run` and `relay` exit 75 for their "
          "supervisor to restart them, and the restart asks again")


@dataclass(frozen=True)
class RegistrySettings:
    """Where the address and the credentials of a registry were given, as an error about it
    names them: the router config's settings, or those of a client the user built."""

    url: str = "schema_registry.url"
    url_hint: str = "its host and port; CDC_ROUTER__SCHEMA_REGISTRY__URL overrides it"
    credentials: str = "schema_registry.basic_auth_user_info"


CONFIG_SETTINGS = RegistrySettings()
# A PayloadDecoder built on the user's own SchemaRegistryClient (review 62 #9: told to check
# schema_registry.url, which it has no such thing as).
CLIENT_SETTINGS = RegistrySettings(
    url="the url of the SchemaRegistryClient given to PayloadDecoder", url_hint="its host "
    "and port", credentials="that client's basic.auth.user.info")


def registry_failure(what: str, error: Exception, url: str,
                     settings: RegistrySettings = CONFIG_SETTINGS) -> RegistryError:
    """The RegistryError for `error`, raised by the client of the registry at `url` while
    trying to `what`: the one place that decides what is the subject's (missing,
    incompatible, refused), an outage's, or the configuration's (named as `settings` say)."""
    if isinstance(error, RegistryError):
        return error
    if isinstance(error, ClientError):
        return _refusal(what, error, shown_url(url), settings)
    cause = f"{type(error).__name__}: {_masked(str(error), url)}"
    if isinstance(error, ValueError):  # json's JSONDecodeError: it answered 2xx, not JSON
        return RegistryError(f"cannot {what}: the schema registry at {shown_url(url)} "
                             f"answered with a body that is not JSON ({cause}): a proxy's "
                             "page, or not the registry's API (Apicurio: its /apis/ccompat/v7 "
                             f"path); {OUTAGE}", outage=True)
    # Anything else is the HTTP layer's own (httpx, httpx2, authlib: by version). A host name
    # that does not resolve, or a port nothing listens on, reads the same as an outage: say
    # which setting holds the address (QA 62-b: a config's url without its override).
    return RegistryError(f"cannot {what}: the schema registry at {shown_url(url)} did not "
                         f"answer ({cause}); if this lasts, check {settings.url} "
                         f"({settings.url_hint}); {OUTAGE}", outage=True)


def _refusal(what: str, error: ClientError, url: str,
             settings: RegistrySettings) -> RegistryError:
    code: Any = error.error_code
    status = error.http_status_code
    # The registry's own not-found codes (404xx) only: a bare 404, from a wrong URL or path,
    # is no subject missing, and must stop the router rather than dead-letter events.
    if code == SCHEMA_NOT_FOUND:  # the subject exists, with other versions (QA 34-b)
        return RegistryError(f"cannot {what}: not among its subject's registered versions "
                             f"({error.error_message}); if the .avsc changed, `cdc-router "
                             "schemas check -c ...` says whether it fits them and names the "
                             "field: register a compatible one (`cdc-router schemas register`"
                             ", or schema_registry.auto_register: true), or put the registered "
                             "one back", missing=True)
    if code in (SUBJECT_NOT_FOUND, VERSION_NOT_FOUND) or (
            status == 404 and isinstance(code, int) and code // 100 == 404):
        return RegistryError(f"cannot {what}: not registered ({error.error_message}); "
                             "register it (`cdc-router schemas register -c ... --subject "
                             "<that subject>`) or set schema_registry.auto_register: true",
                             missing=True)
    if status == 409:  # QA 63-a: the registry's own words on what breaks were dropped
        words = _incompatibility(error)
        return RegistryError(f"cannot {what}: the registry finds it incompatible with the "
                             "subject's registered versions" + (f" ({words})" if words else "")
                             + ": change the schema so that the subject's compatibility "
                             "level takes it (BACKWARD, the default: it reads them, a default "
                             "for each new field; FORWARD: they read it; `cdc-router schemas "
                             "check -c ...` names the field, or the other type of schema the "
                             "subject holds)", incompatible=True)
    if status == 401:
        return RegistryError(f"cannot {what}: the registry at {url} refused the credentials "
                             f"(HTTP {status}); check {settings.credentials}")
    # Only an answer in the registry's own words (its 5-digit error codes: 42201 an invalid
    # schema) is about the subject. A bare 4xx, or a code that only repeats the status, is a
    # proxy's or another server's (schema_registry.url aimed at Connect's 8083): no record's
    # fault, and every Avro event of a templated topic was dead-lettered (review 44-2 H1).
    # A 403 is the subject's whatever its code: Apicurio's ccompat API sends 0 (review 44-3),
    # and the start's check (AvroSerializer.preflight) has seen the registry answer.
    registry_code = isinstance(code, int) and code >= 10_000
    if status == 403:
        return RegistryError(f"cannot {what}: the registry at {url} forbids it (HTTP 403): "
                             f"check {settings.credentials} and the registry's "
                             "permissions for this subject", refused=True)
    # 408 and 429 say "later": an outage's, not the subject's.
    transient = isinstance(status, int) and (status >= 500 or status in (408, 429))
    definite = isinstance(status, int) and 400 <= status < 500 and not transient
    if status == 407:  # rv66: the proxy's own credentials, no registry's answer at all
        return RegistryError(f"cannot {what}: an HTTP proxy on the way to the schema registry at "
                             f"{shown_url(url)} wants credentials of its own (HTTP 407 Proxy "
                             "Authentication Required): give them in the proxy variable "
                             "(HTTPS_PROXY, or HTTP_PROXY for an http:// registry: "
                             "http://USER:PASSWORD@HOST:PORT), or name the registry's host in "
                             "NO_PROXY")
    if definite and not registry_code:
        # A proxy's or another server's page: the status and the start of its body (a whole
        # HTML page was the line's bulk).
        return RegistryError(f"cannot {what}: HTTP {status} from {shown_url(url)} ("
                             f"{_cut(_masked(str(error.error_message), url))}); that answer "
                             f"has no schema registry error code: is {settings.url} the "
                             "registry's (Apicurio: its /apis/ccompat/v7 path), and does a "
                             "proxy on the way let it through?")
    if transient:  # QA 55-c F-4: the line named neither the registry nor an outage
        return RegistryError(f"cannot {what}: the schema registry at {url} answered HTTP "
                             f"{status} ({_masked(str(error), url)}); {OUTAGE}", outage=True)
    return RegistryError(f"cannot {what}: {error}", refused=definite)


def _incompatibility(error: ClientError) -> str:
    """The registry's own words on an incompatible schema, on one line: Confluent's name the
    field, the old version and the compatibility level, but quote the old schema whole (left
    out here); Apicurio's start with its Java exception's class (left out too)."""
    text = on_one_line(str(error.error_message or ""))
    text = _JAVA_CLASS.sub("", _OLD_SCHEMA.sub("", text))
    return text if len(text) <= INCOMPATIBILITY_CHARS else \
        f"{text[:INCOMPATIBILITY_CHARS - 1]}…"


def _cut(text: str, limit: int = 160) -> str:
    """`text` on one line, at most `limit` characters."""
    text = on_one_line(text)
    return text if len(text) <= limit else f"{text[:limit - 1]}…"


def _masked(text: str, url: str) -> str:
    """`text` (an HTTP library's message, which may quote the URL) with each server URL of
    `url` shown as shown_url() shows it."""
    for server in url.split(","):
        text = text.replace(server.strip(), shown_url(server)) if server.strip() else text
    return text
