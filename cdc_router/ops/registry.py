"""`status`'s schema registry section: the registry of schema_registry.url, asked as the
router's start asks it (QA 55-c F-1: with the registry killed, `status` said ok while the
router's next start would exit 75 in a loop).

The client is the router's (serde/registry.SchemaIds over schema_registry's client config: its
credentials and TLS), with a shorter timeout and no retry: `status` reports, it does not wait.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc_router.config.model import RouterConfig
from cdc_router.config.redact import shown_url
from cdc_router.errors import EXIT_RESTART, ConfigError, RegistryError
from cdc_router.ops.report import RegistryState
from cdc_router.serde.registry_answers import slow_lookups_shown

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

# The router's own lookups wait schema_registry.config.timeout (5 s) twice; a check that
# waits that long on each of its parts makes `status --watch` lag behind.
TIMEOUT_S = 3.0

# What an outage means for the router now, after the error (which says it is one: OUTAGE).
CONSEQUENCE = ("the router's next start exits 75 until the registry answers, and a running "
               "router cannot encode events of a subject or schema id it has not looked up yet")


def registry_state(config: RouterConfig, *, timeout_s: float = TIMEOUT_S,
                   client: SchemaRegistryClient | None = None) -> RegistryState | None:
    """The registry section of `config`'s Report; None without schema_registry. Never raises
    for a registry that is down or refuses us: that is the section's error."""
    settings = config.schema_registry
    if settings is None:
        return None
    # Here, not at the top: the registry client's import (authlib, httpx) costs every
    # `status` half a second, which a config without schema_registry has no use for.
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from cdc_router.serde.registry import SchemaIds

    url = shown_url(settings.url)
    try:
        if client is None:
            conf = settings.client_config()
            conf["timeout"] = min(float(conf["timeout"]), timeout_s)
            conf["max.retries"] = 0
            client = SchemaRegistryClient.new_client(conf)
        # Its answer, or its silence past TIMEOUT_S, is this section: the router's
        # event=registry_slow line is not shown as well (reread 55-r F-4).
        with slow_lookups_shown(lambda line: None):
            subjects = SchemaIds(settings, client).subjects()
            lacking = _lacking(config, client)
    except (RegistryError, ValueError, TypeError) as error:
        outage = getattr(error, "exit_code", None) == EXIT_RESTART
        text = f"{error}; {CONSEQUENCE}" if outage else str(error)
        return RegistryState(error=text, answered=not outage, url=url)
    return RegistryState(answered=True, url=url, subjects=len(subjects), lacking=lacking)


def _lacking(config: RouterConfig, client: SchemaRegistryClient) -> tuple[str, ...]:
    """A line for each subject known before any event whose lookup, the one the router's
    start makes (SchemaIds.id_for), finds the route's schema missing or refused: that start
    exits 1 on it (QA 66-a F-3: after the subject was deleted, `status` said ok). A subject
    that an event's data names cannot be checked here; with auto_register, a missing schema
    is one the start registers."""
    from cdc_router.serde.avro import AvroSerializer

    try:
        serializer = AvroSerializer(config.routes, config.schema_registry,
                                    registry_client=client, looks_only=True)
    except ConfigError as error:  # an .avsc that cannot be read: the start's ConfigError
        return (f"{error}; the router's next start exits 1 on it",)
    ids, found = serializer.registry, []
    for planned in serializer.planned_subjects():
        if ids is None or planned.subject is None:
            continue
        try:
            ids.id_for(planned.subject, planned.schema)
        except RegistryError as error:
            if getattr(error, "exit_code", None) == EXIT_RESTART:
                raise
            found.append(f"routes[{planned.route}]: {error}; the router's next start exits 1 "
                         "on it")
    return tuple(found)
