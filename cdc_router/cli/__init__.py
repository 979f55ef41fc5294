"""The `cdc-router` command: one click group, one module per command group."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import traceback
from typing import Any

import click

from cdc_router import __version__
from cdc_router.config.utf8 import utf8_encodable
from cdc_router.errors import CdcRouterError

# Each module defines a click command or group named `cli`; add a line to register a new one.
COMMAND_MODULES: dict[str, str] = {
    "connectors": "cdc_router.cli.connectors",
    "dedup": "cdc_router.cli.dedup",
    "demo": "cdc_router.cli.demo",
    "dlq": "cdc_router.cli.dlq",
    "local": "cdc_router.cli.local",
    "outbox": "cdc_router.cli.outbox",
    "relay": "cdc_router.cli.relay",
    "run": "cdc_router.cli.run",
    "rules": "cdc_router.cli.rules",
    "schemas": "cdc_router.cli.schemas",
    "status": "cdc_router.cli.status",
    "streams": "cdc_router.cli.streams",
    "topics": "cdc_router.cli.topics",
}


# The HTTP clients under the schema registry's and Connect's clients log one INFO line per
# request, which buried the router's one-line start-up refusals (QA 36-c); their warnings
# still show, and --verbose shows all.
HTTP_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2")
# Their librdkafka lines are their log, read as it goes; every other command's Kafka failure is
# its one error line, and --verbose shows librdkafka's lines (kafka/logs.py quiet_librdkafka).
_LONG_RUNNING = ("run", "relay", "demo")
# Their SIGTERM is a stop from the start: held until the process stops on it (signals.py).
_HOLDS_STOP = ("run", "relay")


class _Root(click.Group):
    """Loads command modules lazily, so `--help` and unrelated commands stay fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = COMMAND_MODULES.get(cmd_name)
        if module_name is None:
            return None
        if cmd_name in _HOLDS_STOP:  # before the import, seconds long (signals.py)
            from cdc_router.signals import hold_stop_signals

            hold_stop_signals()
        command: click.Command = importlib.import_module(module_name).cli
        return command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for position, argument in enumerate(args, start=1):
            if not utf8_encodable(argument):
                # Python keeps such bytes as lone surrogates, which every encode (psycopg's,
                # librdkafka's) refuses later, as a traceback.
                _fail(ctx, f"argument {position} ({argument!a}) is not valid UTF-8: pass text "
                      "in UTF-8", 2)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CdcRouterError as error:
            _fail(ctx, str(error), error.exit_code)
        except Exception as error:
            line = _kafka_failure(error)
            if line is None:
                raise
            _fail(ctx, line, 1)


def _fail(ctx: click.Context, line: str, exit_code: int) -> None:
    if ctx.obj and ctx.obj.get("verbose"):
        traceback.print_exc()
    from cdc_router.kafka.logs import with_kafka_refusal  # no confluent_kafka import

    click.echo(f"error: {with_kafka_refusal(line)}", err=True)
    sys.exit(exit_code)


def _kafka_failure(error: Exception) -> str | None:
    """One line for a Kafka call's error that no command turned into its own (a cluster that
    does not answer a read command's metadata request, say), or None for any other error."""
    kafka = sys.modules.get("confluent_kafka")  # not imported: no Kafka call was made
    if kafka is None or not isinstance(error, kafka.KafkaException):
        return None
    from cdc_router.kafka.errors import describe, kafka_error_of  # loads confluent_kafka only
    from cdc_router.kafka.logs import noted_cluster
    from cdc_router.kafka.tls import KEY_PASSWORD_ADVICE, key_refusal, tls_property, unloaded

    cluster = noted_cluster()
    failed = f"a Kafka call to {cluster} failed" if cluster else "a Kafka call failed"
    found = kafka_error_of(error)
    if found is None:
        return f"{failed}: {error}"
    codes = kafka.KafkaError
    unreachable = found.code() in (codes._TRANSPORT, codes._ALL_BROKERS_DOWN, codes._TIMED_OUT,
                                   codes._RESOLVE, codes._AUTHENTICATION, codes._SSL,
                                   codes.SASL_AUTHENTICATION_FAILED)
    hint = ("; check kafka.bootstrap_servers and the security settings, and that the cluster "
            "is up") if unreachable else ""
    if found.code() == codes._INVALID_ARG and found.str().startswith("Failed to create"):
        # QA 32-d: a certificate file it cannot read, a key, a bad property; the key's two
        # cases (another certificate's, one it cannot read) and the file it names are told as
        # `run` tells them (kafka/tls.py; fixer 57-y N-1, N-2).
        advice = key_refusal(found.str())
        unloadable = tls_property(found.str())
        hint = "; check kafka.config's file paths (ssl.*.location) and the property names"
        if advice == KEY_PASSWORD_ADVICE:  # QA 56-d F-5: name the variable
            hint = f"; librdkafka could not read the private key of ssl.key.location: {advice}"
        elif advice is not None:
            hint = f"; {advice}"
        elif unloadable is not None:
            hint = f"; {unloaded(f'kafka.config.{unloadable}')}"
    return f"{failed}: {describe(found)}{hint}"


@click.group(cls=_Root)
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks and debug logs.")
@click.version_option(__version__, prog_name="cdc-router")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Route Debezium outbox events to Kafka topics, exactly once."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    if not verbose and ctx.invoked_subcommand not in _LONG_RUNNING:
        from cdc_router.kafka.logs import quiet_librdkafka  # no confluent_kafka import

        ctx.call_on_close(quiet_librdkafka())
    if ctx.invoked_subcommand not in _LONG_RUNNING:
        from cdc_router.serde.registry_answers import slow_lookups_shown

        ctx.with_resource(slow_lookups_shown(lambda line: click.echo(line, err=True)))
    for name in HTTP_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)


def entry() -> None:
    """The `cdc-router` program: main(), which always ends by SystemExit (click's standalone
    mode). While a librdkafka call given up past its timeout is still blocked on its thread
    (kafka/watchdog.py), its client's threads still run: the exit then runs no finalizer and no
    C atexit handler (OpenSSL's cleanup under a broker thread inside SSL is the classic exit-time
    crash, review 38 F4), as the watchdog's own exit does."""
    try:
        main()
    except BaseException as done:  # SystemExit, or an error no command turned into one
        watchdog = sys.modules.get("cdc_router.kafka.watchdog")
        if watchdog is None or not watchdog.blocked_calls():
            raise
        code = done.code if isinstance(done, SystemExit) else 1
        if not isinstance(code, int) and code is not None:
            print(code, file=sys.stderr)  # as sys.exit("text") would
        elif not isinstance(done, SystemExit):
            traceback.print_exc()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe, a closed file
                stream.flush()
        os._exit(code if isinstance(code, int) else 0 if code is None else 1)
