"""`cdc-router relay`: the polling relay process, for databases without logical decoding."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import psycopg

from cdc_router.cli._options import config_option, instance_id_option
from cdc_router.cli.run import (
    check_cleanup,
    check_streams,
    cleaner_of,
    naming_file,
    run_until_stopped,
    warn_of_config,
)
from cdc_router.config.load import load_config
from cdc_router.config.model import RouterConfig
from cdc_router.errors import ConfigError
from cdc_router.postgres import (
    column_types,
    missing_table,
    one_line,
    require_outbox_grants,
    session_options,
)
from cdc_router.relay.loop import OutboxRelay
from cdc_router.relay.same_database import check_cleanup_database
from cdc_router.router import clients
from cdc_router.router.metrics import RouterMetrics
from cdc_router.router.process_info import process_info
from cdc_router.signals import refuse_reload


@click.command(name="relay")
@config_option("router.yaml with a relay: section [env CDC_ROUTER_CONFIG].")
@instance_id_option("Names this relay in its logs [env CDC_ROUTER_INSTANCE_ID].", kafka=False)
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=9103,
              show_default=True,
              envvar="CDC_ROUTER_METRICS_PORT", help="Port of /metrics and /healthz; 0: none.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info")
def cli(config_path: Path, instance_id: str, metrics_port: int, log_level: str) -> None:
    """Relay outbox rows from the table itself to their destinations until stopped.

    One relay per table is active (a Postgres advisory lock); start a second one anywhere and it
    waits, and takes over when the first one dies.
    """
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s")
    refuse_reload(logging.getLogger("cdc_router.relay"))  # before the start's slow steps
    compiled = load_config(config_path, env=os.environ)
    config = compiled.config
    warn_of_config(config, "relay")  # `run`'s (QA 63-b L-3: only the Kafka settings' were)
    settings = config.relay_settings()
    dsn = settings.dsn or config.cleanup.dsn
    if not dsn:
        raise ConfigError("the relay needs the Postgres DSN", source=str(config_path),
                          field="cleanup.dsn", hint="set CDC_ROUTER__CLEANUP__DSN (the relay "
                          "cleans the table it reads; relay.dsn, if set, is its own)")
    check_streams(config)
    metrics = RouterMetrics(process_info(
        config, "relay", instance_id=instance_id, table=settings.qualified_table,
        transactional_id=clients.transactional_id(config, settings.producer_instance)))
    cleaner = cleaner_of(config, metrics)
    # QA 61-a F-3: it deleted in another database. First: the cleanup's own check would send
    # the operator to `outbox init` there (review 61-w W-1).
    check_cleanup_database(config, str(config_path))
    check_table(config, dsn, str(config_path))
    check_cleanup(cleaner, str(config_path))  # as `run`'s (review 51-d F9: a role that may
    # not DELETE was only said later)
    # The cleanup starts with the relay's start, not before: its sweep's failure on a missing
    # topic came before the relay's own line naming it (QA 61-a F-5); a standby leaves the
    # sweep to the active relay.
    relay = OutboxRelay(compiled, dsn=dsn, instance_id=instance_id, metrics=metrics,
                        on_delivered=cleaner.delivered, on_started=cleaner.start)
    run_until_stopped(relay, cleaner, metrics, metrics_port, "relay", config, str(config_path))


def check_table(config: RouterConfig, dsn: str, source: str,
                connect: Callable[..., psycopg.Connection[Any]] | None = None) -> None:
    """The relay's check that its table exists and its role may read it, before the cleanup's
    check of the same table, so that the error names relay.table (QA 61-a F-5: it named
    cleanup.table); the rest (its columns, indexes) the relay's start checks. Postgres not
    answering is left to the relay, which waits for it."""
    table = config.relay_settings().table
    with naming_file(source):
        try:
            with (connect or psycopg.connect)(dsn, autocommit=True, **session_options(
                    dsn, "cdc-router-relay-check")) as conn:
                if not column_types(conn, table, "relay.table"):
                    raise missing_table(table, "relay.table")
                require_outbox_grants(conn, table, "relay.table", delete=False)
        except psycopg.errors.InsufficientPrivilege as error:  # its schema's USAGE (review
            # rv62b: the cleanup's check said "field 'cleanup.dsn': not a Postgres connection
            # string")
            raise ConfigError(f"the connection's role may not read the outbox table: "
                              f"{one_line(error)}", field="relay.table", value=table,
                              source=source, hint="GRANT USAGE ON SCHEMA <its schema>, and "
                              "SELECT ON the table, TO the role of relay.dsn") from None
        except psycopg.Error:
            return
