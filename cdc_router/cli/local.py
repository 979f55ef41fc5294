"""`cdc-router local`: the stack without Docker (Postgres, Kafka, Connect + Debezium, and
nats-server with `--with nats`, the schema registry with `--with registry`)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import cast

import click

from cdc_router.cli._options import EnvOption
from cdc_router.errors import StackError
from cdc_router.local import stack
from cdc_router.local.config import OPTIONAL_PARTS, PARTS, Part, StackConfig, load_saved

PORT = click.IntRange(1, 65535)


def default_jar_cache() -> Path:
    """~/.cache/cdc-router/jars, or under XDG_CACHE_HOME."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cdc-router" / "jars"


home_option = click.option(
    "--home", type=click.Path(path_type=Path, file_okay=False), default=Path(".cdc-router"),
    show_default=True, envvar="CDC_ROUTER_HOME", cls=EnvOption,
    help="Directory holding all of the stack's state [env CDC_ROUTER_HOME].")


def _saved_or_default(home: Path) -> StackConfig:
    home = home.resolve()
    return load_saved(home) or StackConfig(home=home, jar_cache=default_jar_cache())


def _saved(home: Path) -> StackConfig:
    """The stack started under `home`; StackError (exit 1) when none was: its default addresses
    may be another stack's (review 53-c F3: `eval "$(local env --home typo)"` pointed every
    command at it, exit 0)."""
    saved = load_saved(home.resolve())
    if saved is None:
        raise StackError(f"no local stack under {home.resolve()}; start one with "
                         f"`cdc-router local up --home {home}`")
    return saved


def _say(line: str) -> None:
    click.echo(line)


@click.group(name="local")
def cli() -> None:
    """Run the real stack as local processes: no Docker needed."""


@cli.command()
@home_option
@click.option("--jar-cache", type=click.Path(path_type=Path), envvar="CDC_ROUTER_JAR_CACHE",
              help="Where the Kafka, Debezium and registry jars are cached "
                   "[env CDC_ROUTER_JAR_CACHE; default ~/.cache/cdc-router/jars].")
@click.option("--postgres-port", type=PORT, help="Default 15432.")
@click.option("--kafka-port", type=PORT, help="Default 19092.")
@click.option("--kafka-controller-port", "controller_port", type=PORT, help="Default 19093.")
@click.option("--connect-port", type=PORT, help="Default 18083.")
@click.option("--nats-port", type=PORT,
              help="Default 14222 (with `--with nats`); to be given when other ports are moved.")
@click.option("--registry-port", type=PORT,
              help="Default 18081 (with `--with registry`); to be given when other ports are "
                   "moved.")
@click.option("--connect-offset-flush-interval-ms", type=click.IntRange(min=100),
              help="Connect's offset.flush.interval.ms (default 10000, at least 100).")
@click.option("--with", "with_parts", type=click.Choice(OPTIONAL_PARTS), multiple=True,
              help="Also start an optional part: nats (nats-server with JetStream), "
                   "registry (Apicurio Registry, Confluent API at /apis/ccompat/v7).")
def up(home: Path, jar_cache: Path | None, with_parts: tuple[str, ...],
       **ports: int | None) -> None:
    """Start what is not running and wait until each part is healthy (idempotent)."""
    current = _saved_or_default(home)
    changes: dict[str, object] = {key: value for key, value in ports.items() if value is not None}
    _refuse_moving_running_parts(current, changes)
    if jar_cache is not None:
        changes["jar_cache"] = jar_cache.resolve()
    config = StackConfig.model_validate({**current.model_dump(), **changes})
    _refuse_a_default_port_beside_moved_ones(config, changes, with_parts)
    started = time.monotonic()
    stack.up(config, _say, optional=cast("tuple[Part, ...]", with_parts))
    click.echo(f"stack ready in {time.monotonic() - started:.1f}s (state under {config.home})")


# What a running part was started with: its own settings (review 31: `up --kafka-port N` on a
# running stack saved N, and `env`, `status` and later starts used a port nothing listened on).
_PART_SETTINGS: dict[str, tuple[str, ...]] = {
    "postgres": ("postgres_port",), "kafka": ("kafka_port", "controller_port"),
    # Connect's worker dials Kafka (review 31-2: Kafka moved while Connect ran on the old port).
    "connect": ("connect_port", "connect_offset_flush_interval_ms", "kafka_port"),
    "nats": ("nats_port",), "registry": ("registry_port",)}


def _refuse_moving_running_parts(current: StackConfig, changes: dict[str, object]) -> None:
    running = {s.part for s in stack.status(current) if s.state == "running"}
    for part in PARTS:
        for name in _PART_SETTINGS[part]:
            was = getattr(current, name)
            if part in running and name in changes and changes[name] != was:
                option = "--kafka-controller-port" if name == "controller_port" else \
                    "--" + name.replace("_", "-")
                raise click.BadParameter(
                    f"{part} is running with {was}: stop the stack first "
                    f"(`cdc-router local down`), then `up` with the new value",
                    param_hint=f"'{option}'")


# The ports of the parts every stack has; the optional parts' defaults are the default stack's.
_STACK_PORTS = {"postgres_port": "postgres", "kafka_port": "kafka",
                "controller_port": "kafka controller", "connect_port": "connect"}


def _moved(config: StackConfig) -> list[str]:
    """'kafka 29092', ... for each port of the parts every stack has that is not the default."""
    fields = StackConfig.model_fields
    return [f"{part} {getattr(config, name)}" for name, part in _STACK_PORTS.items()
            if getattr(config, name) != fields[name].default]


def _wants_port(config: StackConfig, part: Part) -> bool:
    """True when `up --with part` must be given --PART-port: the stack never started the
    part, its saved port is the default stack's, and the stack's other ports were moved. The
    one rule of `up`'s refusal and of the hint of `status` and `env` (review 57-b F-6)."""
    name = f"{part}_port"
    return bool(_moved(config)) and not config.has(part) and \
        getattr(config, name) == StackConfig.model_fields[name].default


def _refuse_a_default_port_beside_moved_ones(config: StackConfig, changes: dict[str, object],
                                             with_parts: tuple[str, ...]) -> None:
    """An optional part started for the first time on its default port, in a stack whose other
    ports were moved: refused, naming its option (low 57: a second stack's registry took
    18081, the default stack's, and one of the two could not start). A port given, or the
    one this home started the part with before, is kept."""
    for part in with_parts:
        if f"{part}_port" in changes or not _wants_port(config, cast("Part", part)):
            continue
        default = StackConfig.model_fields[f"{part}_port"].default
        raise click.BadParameter(
            f"`--with {part}` would listen on {default}, the default stack's port, while this "
            f"stack's other ports were moved ({', '.join(_moved(config))}): give it its own with "
            f"--{part}-port N (--{part}-port {default} to take the default anyway)",
            param_hint=f"'--{part}-port'")


@cli.command()
@home_option
@click.option("--purge", is_flag=True, help="Also remove the data (topics, tables, offsets).")
def down(home: Path, purge: bool) -> None:
    """Stop the processes `up` started (by pid file, never by name)."""
    stack.down(_saved_or_default(home), _say, purge=purge)


@cli.command()
@home_option
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text")
def status(home: Path, output: str) -> None:
    """Show each part's state, pid and address; exit 1 when no stack was started under --home.
    An optional part the stack never started has no address (null in JSON): its default port
    is the default stack's (low 57, as `env`)."""
    config = _saved(home)
    parts = stack.status(config)
    if output == "json":
        click.echo(json.dumps([p.__dict__ for p in parts], indent=2))
        return
    if all(p.state != "running" for p in parts):
        click.echo(f"nothing is running (stack home {config.home})")
    for p in parts:
        pid = f"pid {p.pid}" if p.pid else ""
        address = p.address or f"no address, not part of this stack: {_start(config, p.part)}"
        click.echo(f"{p.part:<9} {p.state:<8} {pid:<11} {address}")


def _start(config: StackConfig, part: Part) -> str:
    """How to start `part` in this stack, with --PART-port where `up` wants one."""
    port = f" --{part}-port PORT" if _wants_port(config, part) else ""
    return f"`cdc-router local up --home {config.home} --with {part}{port}` starts it"


@cli.command()
@home_option
@click.argument("part", type=click.Choice(PARTS))
@click.option("-n", "--lines", default=50, show_default=True)
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the log grows.")
def logs(home: Path, part: str, lines: int, follow: bool) -> None:
    """Print the last lines of a part's log."""
    config = _saved_or_default(home)
    path = config.log_path(part)  # type: ignore[arg-type]
    if not path.exists():
        click.echo(f"no log yet at {path}")
        return
    command = ["tail", "-n", str(lines), *(["-F"] if follow else []), str(path)]
    subprocess.run(command, check=False)


@cli.command()
@home_option
def env(home: Path) -> None:
    """Print `export` lines naming the stack's addresses, for scripts and tests: the options'
    variables (status, connectors, outbox), the connector file's DB_HOST and DB_PORT, and the
    router.yaml overrides of kafka and nats (run, relay, topics, dlq, rules, streams), so that
    every command talks to this stack. Not schema_registry.url: a config without one encodes
    Avro single-object; set CDC_ROUTER__SCHEMA_REGISTRY__URL=$CDC_ROUTER_REGISTRY_URL for one
    that has it. NATS' and the registry's lines only for a stack that has the part (started it
    once under --home): another's default port is not this stack's. Exits 1 when no stack was
    started under --home."""
    config = _saved(home)
    # QA 56-e F-3: a stack on other ports without a registry exported 18081, the default
    # stack's; the optional parts' ports are this stack's only once `up --with` started them.
    has = {part for part in OPTIONAL_PARTS if config.has(part)}
    click.echo(f"export CDC_ROUTER_BOOTSTRAP_SERVERS={config.bootstrap_servers}")
    click.echo(f"export CDC_ROUTER_CONNECT_URL={config.connect_url}")
    click.echo(f"export CDC_ROUTER_PG_DSN={config.postgres_dsn}")
    if "nats" in has:
        click.echo(f"export CDC_ROUTER_NATS_URL={config.nats_url}")
    if "registry" in has:
        click.echo(f"export CDC_ROUTER_REGISTRY_URL={config.registry_url}")
    # The placeholders of connectors/outbox-connector.json (connectors apply).
    click.echo("export DB_HOST=127.0.0.1")
    click.echo(f"export DB_PORT={config.postgres_port}")
    click.echo(f"export CDC_ROUTER__KAFKA__BOOTSTRAP_SERVERS={config.bootstrap_servers}")
    if "nats" in has:
        click.echo(f"export CDC_ROUTER__NATS__URL={config.nats_url}")
    # On stderr, which `eval "$(local env)"` leaves alone (review 46-2 F7).
    running = {part.part for part in stack.status(config) if part.state == "running"}
    if stopped := [part for part in PARTS if part not in OPTIONAL_PARTS and part not in running]:
        click.echo(f"# {', '.join(stopped)} not running in {config.home}: `cdc-router local up "
                   f"--home {config.home}` starts {'them' if len(stopped) > 1 else 'it'}",
                   err=True)
    for part in (part for part in OPTIONAL_PARTS if part not in running):  # QA 44-a
        said = "is not running" if part in has else "is not part of this stack (no address given)"
        click.echo(f"# {part} {said}: {_start(config, part)}", err=True)
