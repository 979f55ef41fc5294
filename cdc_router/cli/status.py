"""`cdc-router status`: the whole pipeline in one view, with an exit code for cron and probes."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from types import FrameType

import click
from pydantic import ValidationError

from cdc_router.cli._durations import Seconds
from cdc_router.cli._options import EnvOption, config_option
from cdc_router.cli._output import UsageExitCommand, output_option
from cdc_router.cli._ports import serve_on
from cdc_router.cli._postgres import DEFAULT_DSN, dsn_named
from cdc_router.cli._status_text import as_json, as_text
from cdc_router.cli.connectors import DEFAULT_CONNECT_URL
from cdc_router.config.connections import bootstrap_problem
from cdc_router.config.dsn import dsn_problem
from cdc_router.config.load import load_config
from cdc_router.config.model import RouterConfig
from cdc_router.config.status import StatusSettings
from cdc_router.connect.client import url_problem
from cdc_router.errors import CdcRouterError, ConfigError
from cdc_router.nats.connection import connect_options
from cdc_router.ops.exporter import StatusCollector, serve
from cdc_router.ops.isolated import IsolatedChecks
from cdc_router.ops.offsets import client_config_problem
from cdc_router.ops.probe import Endpoints, check
from cdc_router.ops.problem import Problem
from cdc_router.ops.report import Report, carry_inactive_since
from cdc_router.ops.verdict import EXIT_CODES, EXIT_UNKNOWN, judge, verdict
from cdc_router.router import clients
from cdc_router.router.process_info import process_info
from cdc_router.signals import refuse_reload

# --serve without --watch: Prometheus scrapes every 15 to 60 s; a check costs a few queries.
DEFAULT_SERVE_INTERVAL_S = 30.0


class _StatusCommand(UsageExitCommand):
    """Bad arguments exit EXIT_UNKNOWN, not click's 2, which is `status`'s critical; with
    `-o json` anywhere on the command line a refused argument is also a document: an empty
    variable, an unknown option, a bad value, before or after `-o json`."""

    usage_exit_code = EXIT_UNKNOWN

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        asked = _output_asked(args)  # before click, which consumes `args`
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as error:
            # Review 54: `CDC_ROUTER_BOOTSTRAP_SERVERS= status -o json` printed no document.
            if ctx.params.get("output", asked) == "json":
                _unknown("arguments", error.format_message())
            raise


def _output_asked(args: list[str]) -> str | None:
    """The last -o/--output value on the command line (click takes the last), read from the
    words themselves: an unknown option, or a bad value before `-o json`, fails click's parse
    before it has set `output` (review 54-k F-5: no document)."""
    asked = None
    words = iter(args)
    for word in words:
        if word == "--":
            break
        if word in ("-o", "--output"):
            asked = next(words, None)
        elif word.startswith("--output="):
            asked = word.removeprefix("--output=")
        elif word.startswith("-o") and not word.startswith("--"):
            asked = word.removeprefix("-o")
    return asked


class _CheckImpossible(CdcRouterError):
    exit_code = EXIT_UNKNOWN

    def __init__(self, message: str, component: str = "config") -> None:
        super().__init__(message)
        self.component = component


@click.command(name="status", cls=_StatusCommand)
@config_option()
@click.option("--connector", help="The Debezium connector [default: status.connector, "
              "outbox-connector].")
@click.option("--dsn", envvar="CDC_ROUTER_PG_DSN", cls=EnvOption, help="Postgres [env "
              "CDC_ROUTER_PG_DSN; default: cleanup.dsn, else relay.dsn, else the local stack].")
@click.option("--connect-url", envvar="CDC_ROUTER_CONNECT_URL", default=DEFAULT_CONNECT_URL,
              cls=EnvOption,
              show_default=True, help="Kafka Connect REST URL [env CDC_ROUTER_CONNECT_URL].")
@click.option("--bootstrap-servers", envvar="CDC_ROUTER_BOOTSTRAP_SERVERS", cls=EnvOption,
              help="Kafka [env CDC_ROUTER_BOOTSTRAP_SERVERS; default: kafka.bootstrap_servers].")
@click.option("--threshold", "thresholds", multiple=True, metavar="KEY=VALUE",
              help="Override a key of the status section for this run, e.g. lag_warning=500; "
                   "'none' turns a check off. Repeatable.")
@click.option("--watch", "watch_s", type=Seconds(min=1), metavar="SECONDS",
              help="Check again every SECONDS until Ctrl-C or SIGTERM; new dead "
                   "letters warn.")
@click.option("--serve", "port", type=click.IntRange(1, 65535), metavar="PORT",
              help="Serve the gauges on http://0.0.0.0:PORT/metrics, checking every --watch "
                   f"seconds (default {DEFAULT_SERVE_INTERVAL_S:g}).")
@output_option
def cli(config_path: Path, connector: str | None, dsn: str | None, connect_url: str,
        bootstrap_servers: str | None, thresholds: tuple[str, ...], watch_s: float | None,
        port: int | None, output: str) -> None:
    """Slots and WAL, publication, outbox, connector, router lag, dead letters, JetStream
    streams, schema registry; exit 0 ok, 1 warning, 2 critical, 3 when it cannot check (bad
    config or arguments)."""
    try:
        _status(config_path, connector, dsn, connect_url, bootstrap_servers, thresholds,
                watch_s, port, output)
    except _CheckImpossible as error:
        if output == "json":  # review 53-c F19: a script read no document at all
            _unknown(error.component, str(error))
        raise


def _unknown(component: str, message: str) -> None:
    """The document of a status that could not be checked, for `-o json`."""
    click.echo(json.dumps({"status": "unknown", "exit_code": EXIT_UNKNOWN, "problems": [
        {"level": "critical", "component": component, "message": message}]}, indent=2))


def _status(config_path: Path, connector: str | None, dsn: str | None, connect_url: str,
            bootstrap_servers: str | None, thresholds: tuple[str, ...], watch_s: float | None,
            port: int | None, output: str) -> None:
    try:
        config = with_thresholds(load_config(config_path, env=os.environ).config, thresholds)
        kafka = clients.logged_config(config)  # a missing certificate file: a bad config
        if (nats := config.jetstream()) is not None:
            connect_options(nats)  # nats.tls or nats.credentials_file naming no file: too
    except CdcRouterError as error:
        raise _CheckImpossible(str(error)) from error
    if dsn and (problem := dsn_problem(dsn)):
        raise _CheckImpossible(f"{dsn_named()}: {problem}", "arguments")
    # A wrong argument cannot be checked, like a wrong --dsn (review 49-b F3: exited 2).
    if (problem := url_problem(connect_url)) is not None:
        raise _CheckImpossible(f"--connect-url: {problem}", "arguments")
    if bootstrap_servers:
        # QA 64-b: `u:p@host:9092` read as a broker nobody reaches, "transport failure"
        if bad := bootstrap_problem(bootstrap_servers, config.kafka.security_protocol,
                                    "kafka.security_protocol"):
            raise _CheckImpossible(f"--bootstrap-servers: {bad[0]} (got {bad[1]!r})", "arguments")
        kafka["bootstrap.servers"] = bootstrap_servers
    if (problem := client_config_problem(kafka)) is not None:  # QA 32-d: it exited 1
        raise _CheckImpossible(f"kafka: {problem}")
    status_dsn, dsn_source = _status_dsn(dsn, config)
    endpoints = Endpoints(status_dsn, connect_url, kafka, dsn_source)
    collector = StatusCollector() if port is not None else None
    if collector is not None and port is not None:
        try:  # review 53-c: a port in use exited 1, as a warning; bad arguments exit 3
            serve_on("--serve", port, lambda: serve(collector, port, process_info(
                config, "status", connector=connector)),
                     hint="pick a free port for the exporter")
        except ConfigError as error:
            raise _CheckImpossible(str(error), "arguments") from error
        watch_s = watch_s or DEFAULT_SERVE_INTERVAL_S
    previous: Report | None = None
    code = 0
    if watch_s is not None:
        # A watching exporter is stopped as a service is (docker stop, systemd): SIGTERM ends
        # it like Ctrl-C, with the last verdict's exit code; SIGHUP is logged and ignored.
        signal.signal(signal.SIGTERM, _interrupt)
        refuse_reload(logging.getLogger("cdc_router.status"))
    # Each check runs in a worker process that a librdkafka crash cannot take the watch (or
    # the exporter) down with (ops/isolated.py); one check's crash exits 3, not 139 (QA 33-a).
    checks = IsolatedChecks(check)
    try:
        while True:
            report = checks(config, endpoints, connector=connector)
            if isinstance(report, str):
                if watch_s is None:
                    raise _CheckImpossible(f"{report.split(';')[0]}: run it again", "status")
                if collector is not None:
                    collector.failed()
                click.echo(f"critical: cannot check: {report}", err=True)
                code = EXIT_CODES["critical"]
                time.sleep(watch_s)
                continue
            report = carry_inactive_since(report, previous)
            problems = judge(report, config.status, previous)
            code = EXIT_CODES[verdict(problems)]
            if collector is not None:
                collector.update(report, problems)
            _show(report, problems, output, watching=watch_s is not None)
            if watch_s is None:
                break
            previous = report
            time.sleep(watch_s)
    except KeyboardInterrupt:
        if watch_s is None:  # review 33-3: a check cut short exited 0, read as ok
            code = EXIT_UNKNOWN
    finally:
        checks.close()
    raise SystemExit(code)


def _status_dsn(option: str | None, config: RouterConfig) -> tuple[str, str]:
    """The DSN status checks, and where it came from, in the order it picks one."""
    if option:
        return option, "--dsn or CDC_ROUTER_PG_DSN"
    if config.cleanup.dsn:
        return config.cleanup.dsn, "cleanup.dsn of the config, or CDC_ROUTER__CLEANUP__DSN"
    if config.relay is not None and config.relay.dsn:
        return config.relay.dsn, "relay.dsn of the config, or CDC_ROUTER__RELAY__DSN"
    return DEFAULT_DSN, f"the default {DEFAULT_DSN}: set --dsn or CDC_ROUTER_PG_DSN"


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _show(report: Report, problems: list[Problem], output: str, *, watching: bool) -> None:
    if output == "json":
        # Watching: one document per line (JSON Lines), so a script can read them one by one.
        click.echo(json.dumps(as_json(report, problems), indent=None if watching else 2))
    else:
        click.echo(as_text(report, problems) + ("\n" if watching else ""))


def with_thresholds(config: RouterConfig, overrides: tuple[str, ...]) -> RouterConfig:
    """`config` with --threshold KEY=VALUE applied to its status section, validated."""
    if not overrides:
        return config
    values = config.status.model_dump()
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in StatusSettings.model_fields:
            raise ConfigError("expected KEY=VALUE with a key of the status section",
                              source="command line", field="--threshold", value=item,
                              hint=f"keys: {', '.join(StatusSettings.model_fields)}")
        values[key] = None if value.lower() == "none" else value
    try:
        status = StatusSettings.model_validate(values)
    except ValidationError as error:
        first = error.errors()[0]
        ctx = first.get("ctx") or {}
        field = str(ctx.get("field") or ".".join(str(part) for part in first["loc"]))
        raise ConfigError(str(ctx.get("message", first["msg"])), source="command line",
                          field=f"--threshold {field}", value=values.get(field)) from None
    return config.model_copy(update={"status": status})
