"""`cdc-router run`: the router process."""

from __future__ import annotations

import gc
import logging
import os
import re
import signal
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Protocol

import click
from confluent_kafka import KafkaError, KafkaException, Producer

from cdc_router.cli._options import config_option, instance_id_option
from cdc_router.cli._ports import serve_on
from cdc_router.config.config_warnings import ProcessName, config_warnings
from cdc_router.config.load import load_config
from cdc_router.config.model import RouterConfig
from cdc_router.config.overrides import variable_of
from cdc_router.config.redact import is_secret_key
from cdc_router.errors import (
    ConfigError,
    DeliveryError,
    FatalKafkaError,
    JetStreamError,
    grant_refusal,
)
from cdc_router.kafka.changelog_reader import ChangelogReader
from cdc_router.kafka.errors import kafka_error_of, missing_files, property_names
from cdc_router.kafka.tls import (
    KEY_MISMATCH_ADVICE,
    KEY_PASSWORD_ADVICE,
    KEY_PASSWORD_VARIABLE,
    key_refusal,
    tls_property,
    unloaded,
)
from cdc_router.nats.connection import connect_options
from cdc_router.nats.streams import StreamAdmin, start_problem, start_warning
from cdc_router.router import clients
from cdc_router.router.cleanup import OutboxCleaner
from cdc_router.router.committed_ids import CommittedIds
from cdc_router.router.dlq_letters import sources_of
from cdc_router.router.liveness import RestoreProgress
from cdc_router.router.loop import OutboxRouter
from cdc_router.router.metrics import RouterMetrics, poll_is_recent, serve
from cdc_router.router.process_info import process_info
from cdc_router.signals import refuse_reload, stopped_early

# /healthz fails when the loop has not polled for this long: far above a batch's commit time,
# below the consumer's max.poll.interval.ms (300 s), after which the group evicts us anyway.
# The relay serves it too: its idle wait, relay.poll_interval_ms, is bounded to half of this
# (config/relay.py, MAX_POLL_INTERVAL_MS), which leaves a minute for the batch after a wait.
_STALL_S = 120.0
# The SASL mechanisms librdkafka implements (its CONFIGURATION.md, sasl.mechanisms).
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")
# Generation-0 collections every this many allocations once started (tune_gc; Python's: 700).
GC_GEN0 = 5000
# The property librdkafka 2.x names as it refuses a name or a value: 'property "NAME"',
# 'property: "NAME"', and for a boolean 'Expected bool value for "NAME"' (review 46-2 F3).
_REFUSED_NAME = re.compile(r'property "([^"]+)"|property: "([^"]+)"|bool value for "([^"]+)"')


def check_streams(config: RouterConfig) -> None:
    """At start: a declared JetStream stream the server lacks, or holds on terms that break
    the routes (nats/streams.py start_problem), is a ConfigError naming it; NATS not
    answering is an outage, which the router tries as it runs."""
    nats = config.jetstream()
    if nats is None:
        return
    try:
        # 3 s: a user that may publish but not call the JetStream API gets no answer at all,
        # and its start waited the API's 10 s (review 47-f F3).
        plans = StreamAdmin(nats.url, connect_options(nats), timeout_s=3.0).plan(nats.streams)
    except JetStreamError as error:
        logging.getLogger("cdc_router.router").warning(
            "event=streams_check_skipped error=%r: nats.streams could not be checked (NATS "
            "down, or this user may not call $JS.API.STREAM.INFO); the process goes on",
            str(error))
        return
    for index, plan in enumerate(plans):
        problem = start_problem(index, plan)
        if problem is not None:
            raise problem
        if (warning := start_warning(index, plan)) is not None:
            logging.getLogger("cdc_router.router").warning("event=config_warning detail=%r",
                                                             warning)


def warn_of_config(config: RouterConfig, process: ProcessName) -> None:
    """The config's warnings (config_warnings, as `rules check` shows them), worded for
    `process` (run, relay), one event=config_warning line each on its logger at its start."""
    logger = logging.getLogger("cdc_router.relay" if process == "relay" else "cdc_router.router")
    for warning in config_warnings(config, process):
        logger.warning("event=config_warning detail=%r", warning)


def sweep_of(config: RouterConfig) -> CommittedIds | None:
    """The cleanup's sweep over the dedup changelog, where its marks prove a delivery."""
    if not config.cleanup_sweeps():
        return None
    return CommittedIds(clients.common_config(config),
                        changelog_topic=config.dedup.changelog_topic,
                        group=config.source.group_id,
                        dead_letter_topic=config.dead_letter.topic,
                        window_ms=config.changelog_keep_ms(), ours=sources_of(config))


@click.command(name="run")
@config_option()
@instance_id_option("Unique per running instance: it names the transactional id and the static "
                    "group member [env CDC_ROUTER_INSTANCE_ID].", kafka=True)
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=9102,
              show_default=True,
              envvar="CDC_ROUTER_METRICS_PORT", help="Port of /metrics and /healthz; 0: none.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info")
def cli(config_path: Path, instance_id: str, metrics_port: int, log_level: str) -> None:
    """Route outbox events from the raw change topic to their destinations until stopped."""
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s")
    refuse_reload(logging.getLogger("cdc_router.router"))  # before the start's slow steps
    compiled = load_config(config_path, env=os.environ)
    config = compiled.config
    warn_of_config(config, "run")
    check_streams(config)
    metrics = RouterMetrics(process_info(
        config, "router", instance_id=instance_id, topics=",".join(config.source.topics),
        transactional_id=clients.transactional_id(config, instance_id)))
    cleaner = cleaner_of(config, metrics)
    check_cleanup(cleaner, str(config_path))  # its table, columns and grants (the relay's too)
    # The cleanup starts with the router's start, not before: its sweep's failure on a missing
    # topic came before the router's own line naming it (QA 61-a F-5).
    restore = RestoreProgress()
    router = OutboxRouter(compiled, instance_id=instance_id, metrics=metrics,
                          on_delivered=cleaner.delivered, on_started=cleaner.start,
                          changelog_factory=restore.reader(ChangelogReader))
    run_until_stopped(router, cleaner, metrics, metrics_port, "router", config, str(config_path),
                      restore=restore, ready=lambda: metrics.joined)


class Process(Protocol):
    """The router or the relay: runs until stopped, and says when its loop last went round."""

    last_poll: float

    def run(self) -> None: ...

    def stop(self) -> None: ...


def cleaner_of(config: RouterConfig, metrics: RouterMetrics) -> OutboxCleaner:
    """The cleanup of delivered outbox rows, with its sweep when the changelog proves delivery.
    ConfigError when it is on without its DSN."""
    missing = config.cleanup.missing_dsn()
    if missing is not None:
        raise ConfigError(missing, field="cleanup.dsn")
    first = config.source.outbox.first  # until the cleanup reads the table's (names)
    return OutboxCleaner(config.cleanup, id_column=first.id, created_at_column=first.created_at,
                         created_at_unit=config.source.created_at_unit,
                         registry=metrics.registry, sweep=sweep_of(config),
                         names=config.source.outbox)


@contextmanager
def naming_file(source: str) -> Iterator[None]:
    """A ConfigError raised within names the config file `source` as the others do (QA 61-a
    F-5: "field 'cleanup.table': the outbox table does not exist", which file unsaid)."""
    try:
        yield
    except ConfigError as error:
        if error.source is None:
            error.source, error.args = source, (f"{source}: {error}",)
        raise


def check_cleanup(cleaner: OutboxCleaner, source: str) -> None:
    """cleaner.check(), its ConfigError naming the config file."""
    with naming_file(source):
        cleaner.check()


def tune_gc() -> None:
    """Freeze what start-up built (modules, config, compiled rules: never garbage, never walked
    again) and collect generation 0 every GC_GEN0 allocations instead of 700: the collector's
    time per event halved (3-8 -> 2-4 us, issue 14). Process-wide, so done here, at the edge
    of the `run` and `relay` processes, never inside the library's run()."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0, *gc.get_threshold()[1:])


def alive_while(process: Process, restore: RestoreProgress | None) -> Callable[[], bool]:
    """Liveness: `process` polled, or `restore` read the dedup changelog, within _STALL_S."""
    polled = poll_is_recent(lambda: process.last_poll, _STALL_S)
    if restore is None:
        return polled
    return lambda: polled() or restore.recent(_STALL_S)


def run_until_stopped(process: Process, cleaner: OutboxCleaner, metrics: RouterMetrics,
                      metrics_port: int, what: str, config: RouterConfig,
                      source: str | None = None, restore: RestoreProgress | None = None,
                      ready: Callable[[], bool] | None = None) -> None:
    """Run `process` with its cleanup and metrics; SIGTERM or SIGINT asks it to finish its batch,
    commit and return (SIGHUP is logged and ignored from the command's start: signals.py).
    `source` is the config file, for the errors that name it. The process starts the cleanup
    (its on_started) once its start's checks passed, and this stops it. /healthz: the loop
    polled, or a `restore` read changelog records, within _STALL_S; /readyz also `ready()`."""

    def request_stop(signum: int, frame: FrameType | None) -> None:
        process.stop()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    if (held := stopped_early()) is not None:  # during the start's checks: nothing began
        logging.getLogger(f"cdc_router.{what}").info(
            "event=stopped_before_start signal=%s", held)
        cleaner.stop()
        return
    if metrics_port:
        # In use: a second instance on the host.
        serve_on("--metrics-port", metrics_port,
                 lambda: serve(metrics, metrics_port,
                               alive_while(process, restore), ready=ready),
                 hint="give each instance on a host its own port [env CDC_ROUTER_METRICS_PORT], "
                      "or 0 for none")
    tune_gc()
    try:
        process.run()
    except FatalKafkaError as failure:
        # A group only the router has (the relay reads none); both have transactional ids.
        group = config.source.group_id if what == "router" else None
        refusal = grant_refusal(failure, group=group,
                                transactional_prefix=clients.transactional_prefix(config))
        if refusal is None:
            raise
        raise refusal from failure
    except (KafkaException, DeliveryError) as failure:
        refused = property_refused(failure, config, source, os.environ)
        if refused is not None:
            raise refused from failure
        if isinstance(failure, DeliveryError):
            raise
        # The last net at the edge: whatever Kafka error got this far is one line, not a trace.
        raise DeliveryError(f"the {what} stopped on a Kafka error: {failure}") from failure
    finally:
        cleaner.stop()


def property_refused(failure: BaseException, config: RouterConfig, source: str | None = None,
                     env: Mapping[str, str] | None = None) -> ConfigError | None:
    """A ConfigError naming the kafka.* property (else section) when librdkafka refused a client
    property (unknown, a bad value, a file it could not load, a key not the certificate's) as
    it built a client; None for any other failure. `source` is
    the config file, `env` the overrides it was loaded with: the error names the variable
    that set the property, if one did."""
    error = kafka_error_of(failure) or kafka_error_of(failure.__cause__ or failure)
    if error is None or error.code() != KafkaError._INVALID_ARG:
        return None
    if "SASL mechanism" in error.str():  # QA 35-e F6: it was blamed on kafka.config
        return ConfigError(f"librdkafka refused the SASL mechanism: {error.str()}",
                           field=_sasl_field(config),
                           hint=f"librdkafka knows {', '.join(SASL_MECHANISMS)} (GSSAPI only "
                                "when built with libsasl2); use one the broker's listener "
                                "enables (sasl.enabled.mechanisms)")
    # librdkafka's text ends in a newline for a value out of range (review 46-2 F4).
    text = error.str().strip()
    advice = key_refusal(text)
    if advice == KEY_PASSWORD_ADVICE and "ssl.key.location" in config.kafka.config:
        return _key_unread(text, config, source)
    named = _REFUSED_NAME.search(text)
    # Else an ssl.* file (or PEM) librdkafka could not load, which its text names: the field
    # is that property, not kafka.config (fixer 57-y N-1).
    unloadable = None if named else tls_property(text)
    name = next((group for group in named.groups() if group), "") if named else \
        unloadable or ""
    # The user's key and section, also for an alias librdkafka names by its canonical name;
    # of several sections setting it, the one whose value librdkafka refuses (review 48-e F9:
    # a valid producer value was blamed for kafka.config's bad one).
    found = [(section, key, getattr(config.kafka, section)[key])
             for section in ("producer", "consumer", "config") for key in property_names(name)
             if name and key in getattr(config.kafka, section)]
    section, key, value = next((one for one in found if not _takes(one[1], one[2])),
                               found[0] if found else ("config", name, None))
    field = f"kafka.{section}" + (f".{key}" if key else "")
    # Review 53-c F4: the value may be the environment's, not the file's.
    path = ("kafka", section, key) if key else ("kafka", section)
    variable = next((name for name in (variable_of(path), variable_of(path[:2]))
                     if name in (env or {})), None)
    if variable is not None:
        source = f"{source} via environment variable {variable}" if source else \
            f"environment variable {variable}"
    return ConfigError(f"librdkafka refused a client property: {text}", field=field,
                       source=source,
                       value=None if value is None or is_secret_key(key) else value,
                       hint="".join(f"{missing}; " for missing in
                                    missing_files(config.kafka.config))
                       + (KEY_MISMATCH_ADVICE if advice == KEY_MISMATCH_ADVICE else
                          unloaded(field) if unloadable else
                          "see librdkafka's CONFIGURATION.md for the names and values"))


def _key_unread(text: str, config: RouterConfig, source: str | None) -> ConfigError:
    """librdkafka could not read the client's private key: most often an encrypted key with
    no passphrase or a wrong one, which the line names with its variable (QA 56-d F-5: the
    line sent to CONFIGURATION.md for property names that were right)."""
    key = config.kafka.config["ssl.key.location"]
    if "ssl.key.password" not in config.kafka.config:
        return ConfigError(
            f"librdkafka could not read the private key ssl.key.location {key}: {text}",
            source=source, field="kafka.config.ssl.key.password",
            hint=f"ssl.key.password is not set: {KEY_PASSWORD_ADVICE}")
    return ConfigError(
        f"librdkafka could not read the private key ssl.key.location {key} with the "
        f"ssl.key.password given: {text}", source=source, field="kafka.config.ssl.key.password",
        hint=f"set {KEY_PASSWORD_VARIABLE} to the key's passphrase, and check that the file "
             "is the PEM private key of ssl.certificate.location")


def _takes(key: str, value: str) -> bool:
    """Whether librdkafka takes `value` for the property `key` (a client built with it
    alone: no connection is made without bootstrap.servers)."""
    try:
        Producer({key: value, "log_level": 0})
    except KafkaException:
        return False
    return True


def _sasl_field(config: RouterConfig) -> str:
    """Where the config sets the SASL mechanism: kafka.sasl_mechanism, else the librdkafka key
    (sasl.mechanism or sasl.mechanisms) of the section that has it (review 35-2)."""
    if config.kafka.sasl_mechanism:
        return "kafka.sasl_mechanism"
    return next((f"kafka.{section}.{key}" for section in ("config", "producer", "consumer")
                 for key in ("sasl.mechanism", "sasl.mechanisms")
                 if key in getattr(config.kafka, section)), "kafka.sasl_mechanism")
