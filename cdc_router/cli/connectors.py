"""`cdc-router connectors`: Kafka Connect connectors managed from files (plan, then apply)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click

from cdc_router.cli._connector_text import plan_json, plan_text, status_text, tasks_text
from cdc_router.cli._durations import Seconds
from cdc_router.cli._options import EnvOption, FilePath
from cdc_router.cli._output import UsageExitGroup, emit, output_option, table
from cdc_router.cli._plan import confirm
from cdc_router.config.redact import redact
from cdc_router.connect.checks import (
    after_reset,
    login_hint,
    prefix_conflicts,
    reading_problems,
)
from cdc_router.connect.client import NAME_GRACE_S, ConnectClient, UnresolvedHostError
from cdc_router.connect.plan import ConnectorAction, plan
from cdc_router.connect.slots import drop_hint, slot_conflicts, slot_of, slot_users
from cdc_router.connect.spec import ConnectorSpec, load_spec, plain_secrets
from cdc_router.connect.status import ConnectorStatus
from cdc_router.errors import ConfigError, ConnectError, UnknownConnectorError
from cdc_router.ops.connector_failure import failed_line, failed_start

DEFAULT_CONNECT_URL = "http://127.0.0.1:18083"
# `diff` exit codes follow `terraform plan -detailed-exitcode`: 1 stays "error" as for every
# other command, so a script can tell "differs" (2) from "could not compare" (1). `status`
# exits 2 the same way when the connector or a task FAILED: a cron or probe can alert on it.
EXIT_DIFFERS = 2
EXIT_FAILED = 2
STATES = ("RUNNING", "PAUSED", "STOPPED")


@dataclass
class _State:
    """The group's options; the client is built on first use."""

    url: str
    auth: tuple[str, str] | None
    _client: ConnectClient | None = field(default=None, init=False)

    @property
    def client(self) -> ConnectClient:
        if self._client is None:
            self._client = ConnectClient(self.url, auth=self.auth)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


pass_state = click.make_pass_decorator(_State)
_FILES = click.option("-f", "--file", "files", multiple=True, required=True,
                      type=FilePath(dir_okay=False),
                      help="Connector file (JSON, ${VAR} placeholders); repeatable.")
_NAME = click.argument("name")


def _shows_one_connector(function: Callable[..., None]) -> click.Command:
    """A command about one connector, by name, with -o text|json."""
    command: click.Command = cli.command()(_NAME(output_option(pass_state(function))))
    return command


@click.group("connectors", cls=UsageExitGroup)
@click.option("--url", envvar="CDC_ROUTER_CONNECT_URL", default=DEFAULT_CONNECT_URL, cls=EnvOption,
              show_default=True, help="Kafka Connect REST URL [env CDC_ROUTER_CONNECT_URL].")
@click.option("--user", envvar="CDC_ROUTER_CONNECT_USER",
              help="Basic auth user [env CDC_ROUTER_CONNECT_USER].")
@click.option("--password", envvar="CDC_ROUTER_CONNECT_PASSWORD",
              help="Basic auth password [env CDC_ROUTER_CONNECT_PASSWORD].")
@click.pass_context
def cli(ctx: click.Context, url: str, user: str | None, password: str | None) -> None:
    """Manage Kafka Connect connectors from files."""
    if (user is None) != (password is None):
        raise ConfigError("basic auth needs both --user and --password",
                          hint="or CDC_ROUTER_CONNECT_USER and CDC_ROUTER_CONNECT_PASSWORD")
    state = _State(url, (user, password) if user is not None and password is not None else None)
    ctx.call_on_close(state.close)
    ctx.obj = state


def _load(files: tuple[Path, ...]) -> list[ConnectorSpec]:
    specs = [load_spec(path, os.environ) for path in files]
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.name in seen:
            raise ConfigError(f"connector {spec.name!r} is also declared in {seen[spec.name]}",
                              source=spec.source)
        seen[spec.name] = spec.source
    return specs


def _validate(client: ConnectClient, specs: list[ConnectorSpec]) -> None:
    """Print Connect's per-field errors; ConfigError (exit 1) if any spec is invalid."""
    invalid = []
    for spec in specs:
        verdict = client.validate(spec.connector_class, {**spec.config, "name": spec.name})
        for key, messages in sorted(verdict.errors.items()):
            for message in messages:
                click.echo(f"{spec.source}: {spec.name}: {key}: {message}", err=True)
        # QA 43-a: "password authentication failed" from another Postgres, on its port; QA
        # 47-d F8: not when the fields are missing (the lines above say so).
        hint = login_hint(spec.config)
        if any(key.startswith("database.") for key in verdict.errors) and hint is not None:
            click.echo(f"{spec.source}: {spec.name}: {hint}", err=True)
        if not verdict.ok:
            invalid.append(f"{spec.name} ({len(verdict.errors)} field(s))")
    if invalid:
        raise ConfigError(f"Kafka Connect rejects {', '.join(invalid)}",
                          hint="see the per-field errors above")


@cli.command()
@_FILES
@click.option("--dry-run", is_flag=True, help="Plan and validate only; exit 1 if invalid.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask before applying.")
@click.option("--wait", "wait_s", type=Seconds(min=0), default=15.0, show_default=True,
              help="Seconds to watch each applied connector start: a connector or task that "
                   "FAILS meanwhile (a missing publication, say) fails the command; it is done "
                   "when it has run for a third of them; 0: return right after the PUT.")
@pass_state
def apply(state: _State, files: tuple[Path, ...], dry_run: bool, yes: bool,
          wait_s: float) -> None:
    """Create or update connectors from files: plan, validate, confirm, PUT, watch them start."""
    specs = _warned(_load(files))
    plans = [plan(state.client, spec) for spec in specs]
    click.echo(plan_text(plans, all_keys=False))
    conflicts, doubts = slot_conflicts(specs, deployed := state.client.list_configs())
    conflicts += prefix_conflicts(specs, deployed)
    for line in doubts:
        click.echo(f"warning: {line}", err=True)
    if conflicts:
        for line in conflicts:
            click.echo(line, err=True)
        raise ConfigError(f"{len(conflicts)} connector(s) would share a replication slot or "
                          "a topic.prefix (the lines above)", hint="give each connector its own "
                          "slot.name (SLOT_NAME) and topic.prefix (TOPIC_PREFIX)")
    pending = [item for item in plans if item.action is not ConnectorAction.UNCHANGED]
    if dry_run:
        _validate(state.client, specs)
        click.echo(f"dry run: {len(pending)} to change, configuration valid")
        return
    for item in plans:  # QA 46-c: "nothing to apply" said nothing of a FAILED task
        if item.action is not ConnectorAction.UNCHANGED:
            continue
        if (failure := _failure(state.client, item.spec.name)) is not None:
            click.echo(f"warning: {item.spec.name} is unchanged but {failure}: `cdc-router "
                       f"connectors status {item.spec.name}`", err=True)
        elif (current := _status(state.client, item.spec.name)) is not None:
            _say_held(current)
    if not pending:
        click.echo("nothing to apply")
        return
    _validate(state.client, [item.spec for item in pending])
    confirm(f"Apply {len(pending)} change(s)?", yes)
    failed_before = {item.spec.name: _failure(state.client, item.spec.name) for item in pending
                     if item.action is not ConnectorAction.CREATE}
    for item in pending:
        created = state.client.put_config(item.spec.name, item.spec.config)
        click.echo(f"{item.spec.name}: {'created' if created else 'updated'}")
    for item in pending:
        _watch_start(state.client, item.spec, wait_s, failed_before.get(item.spec.name))
    # Review 48-b F10: a table that does not exist, or is outside the publication, captures
    # nothing while the task runs; `status` checks both, against the router's own database.
    for name in [item.spec.name for item in pending if slot_of(item.spec.config)]:
        click.echo(f"hint: Connect checked {name}'s config, not its table: `cdc-router status -c "
                   f"router.yaml --connector {name}` checks its slot, publication and table",
                   err=True)


def _status(client: ConnectClient, name: str) -> ConnectorStatus | None:
    """The connector's status; None while Connect does not list it (the status topic catching
    up with a PUT)."""
    try:
        return client.get_status(name)
    except UnknownConnectorError:
        return None


def _failure(client: ConnectClient, name: str) -> str | None:
    current = _status(client, name)
    return current.failure() if current is not None else None


def _watch_start(client: ConnectClient, spec: ConnectorSpec, wait_s: float,
                 before: str | None) -> None:
    """Up to `wait_s`, until `spec` and its tasks have run for a third of it (5 s by default):
    a FAILED one is a ConnectError (exit 1). Connect validates the config, not the database:
    a publication that does not exist (with publication.autocreate.mode disabled) fails the
    task seconds after `created` (QA 46-a). A first RUNNING proves nothing after an update:
    the old task runs on until Connect restarts it (QA 46-c). The failure `before` the update
    is the restart's to clear: it fails the command only if it is still there at the end
    (review 46-3: the fix's apply read the old FAILED trace)."""
    name, deadline, running_since = spec.name, time.monotonic() + wait_s, None
    while wait_s > 0:
        current = _status(client, name)
        now = time.monotonic()
        failure = current.failure() if current is not None else None
        if failure is not None and (failure != before or now >= deadline):
            raise failed_start(name, spec.config, failure)
        running = current is not None and current.reached("RUNNING")
        running_since = (running_since or now) if running else None
        if current is not None and (current.state in ("PAUSED", "STOPPED") or (
                running_since is not None and now - running_since >= wait_s / 3)):
            click.echo(f"{name}: {current.state} ({len(current.tasks)} task(s))")
            _say_held(current)
            return
        if now >= deadline:
            if current is not None and running:
                click.echo(f"{name}: RUNNING ({len(current.tasks)} task(s))")
            else:
                click.echo(f"{name}: not RUNNING after {wait_s:g}s (connector "
                           f"{current.state if current else 'not listed yet'}): see "
                           f"`cdc-router connectors wait {name}`", err=True)
            return
        time.sleep(0.5 if wait_s >= 3 else wait_s / 6)


def _say_held(current: ConnectorStatus) -> None:
    """A hint when `current` is PAUSED or STOPPED: Connect keeps that state through a config
    update, so the connector captures nothing until resumed (QA 64-a F-7: `apply` said only
    'updated', then 'STOPPED (0 task(s))')."""
    if current.state in ("PAUSED", "STOPPED"):
        click.echo(f"hint: {current.name} is {current.state} and captures nothing until "
                   f"`cdc-router connectors resume {current.name}`", err=True)


@cli.command()
@_FILES
@output_option
@pass_state
@click.pass_context
def diff(ctx: click.Context, state: _State, files: tuple[Path, ...], output: str) -> None:
    """Files against the deployed configs; exit 0 if equal, 2 if they differ, 1 on error."""
    plans = [plan(state.client, spec) for spec in _warned(_load(files))]  # review 54-k F-7
    emit(plan_json(plans) if output == "json" else plans, output,
         lambda items: plan_text(items, all_keys=True))
    if any(item.action is not ConnectorAction.UNCHANGED for item in plans):
        ctx.exit(EXIT_DIFFERS)


def _warned(specs: list[ConnectorSpec]) -> list[ConnectorSpec]:
    """`specs`, once their warnings are said on stderr (`apply`, `diff`)."""
    for spec in specs:
        for key in plain_secrets(spec.config):
            click.echo(f"warning: {spec.source}: {key} is plain text; use a config provider "
                       "such as ${env:NAME}", err=True)
        for problem in reading_problems(spec.config):
            click.echo(f"warning: {spec.source}: {spec.name}: {problem}", err=True)
    return specs


@cli.command("list")
@output_option
@pass_state
def list_(state: _State, output: str) -> None:
    """Connectors with their states."""
    statuses = state.client.list_statuses()
    emit(statuses, output, lambda items: table(
        ["NAME", "STATE", "TASKS"],
        [[item.name, item.state, tasks_text(item)] for item in items]) if items
        else "no connectors")


@_shows_one_connector
def get(state: _State, name: str, output: str) -> None:
    """A connector's deployed config (secrets masked unless they are provider references)."""
    info = state.client.get(name)
    info["config"] = {key: redact(key, value) for key, value in info["config"].items()}
    emit(info, output, lambda data: "\n".join(
        f"{key} = {value}" for key, value in sorted(data["config"].items())))


@_shows_one_connector
def status(state: _State, name: str, output: str) -> None:
    """Connector and task states, with the trace of whatever FAILED; exit 2 if one FAILED."""
    current = state.client.get_status(name)
    emit(current, output, status_text)
    if (failure := current.failure()) is not None:
        if output == "text":  # stop 58: the trace's cause and what to do, as apply says them
            click.echo(f"\n{failed_line(name, state.client.get_config(name), failure)}")
        click.get_current_context().exit(EXIT_FAILED)


@cli.command()
@_NAME
@click.option("--tasks", type=click.Choice(["failed", "all"]), default=None,
              help="Also restart tasks: only the failed ones, or all. Default: connector only.")
@pass_state
def restart(state: _State, name: str, tasks: str | None) -> None:
    """Restart a connector (and, with --tasks, its tasks)."""
    # QA 64-a F-4: Connect answers 202 RESTARTING for a STOPPED connector, which stays STOPPED
    # with no task, and a PAUSED one restarts PAUSED: only `resume` starts either.
    current = state.client.get_status(name).state
    if current == "STOPPED":
        raise ConnectError(f"connector {name!r} is STOPPED: a restart leaves it STOPPED, with "
                           f"no task; `cdc-router connectors resume {name}` starts it")
    state.client.restart(name, include_tasks=tasks is not None, only_failed=tasks == "failed")
    click.echo(f"{name}: restart requested")
    if current == "PAUSED":
        click.echo(f"hint: {name} is PAUSED and restarts PAUSED: `cdc-router connectors resume "
                   f"{name}` starts it", err=True)


def _lifecycle_command(verb: str, summary: str) -> None:
    """`pause NAME` / `resume NAME`: one REST call, asynchronous on Connect's side."""

    @cli.command(verb, help=f"{summary} (then `wait --state ...` to see it done).")
    @_NAME
    @pass_state
    def command(state: _State, name: str) -> None:
        getattr(state.client, verb)(name)
        click.echo(f"{name}: {verb} requested")


_lifecycle_command("pause", "Pause a connector and its tasks")
_lifecycle_command("resume", "Resume a paused or stopped connector")
_lifecycle_command("stop", "Stop a connector: its tasks shut down, its config stays")


@cli.command(name="reset-offsets")
@_NAME
@click.option("-y", "--yes", is_flag=True, help="Do not ask first.")
@pass_state
def reset_offsets(state: _State, name: str, yes: bool) -> None:
    """Forget a STOPPED connector's source offsets (after its slot was lost); it stays
    STOPPED until `connectors resume`."""
    # Review 48-b F9: Connect's own 400 told of a 'PUT' to its /stop endpoint.
    current = state.client.get_status(name).state
    if current != "STOPPED":
        raise ConnectError(f"connector {name!r} is {current}; only a STOPPED connector's offsets "
                           f"can be reset: `cdc-router connectors stop {name}`, `cdc-router "
                           f"connectors wait {name} --state STOPPED`, then reset-offsets again")
    if "postgres" in (config := state.client.get_config(name)).get("connector.class", "").lower():
        click.echo(after_reset(config))
    confirm(f"Forget the offsets of connector {name}?", yes)
    state.client.reset_offsets(name)
    click.echo(f"{name}: offsets reset; it stays STOPPED: `cdc-router connectors resume {name}`")


@cli.command()
@_NAME
@click.option("-y", "--yes", is_flag=True, help="Do not ask first.")
@pass_state
def delete(state: _State, name: str, yes: bool) -> None:
    """Delete a connector (its replication slot stays in Postgres: see the hint)."""
    config = state.client.get_config(name)
    confirm(f"Delete connector {name}?", yes)
    state.client.delete(name)
    click.echo(f"{name}: deleted")
    slot = slot_of(config)
    if slot is None:
        return
    # The deleted one may still be listed for a moment (its removal travels the config topic).
    others = {user: config for user, config in state.client.list_configs().items()
              if user != name}
    click.echo(drop_hint(name, slot, slot_users(others, slot)), err=True)


@cli.command()
@_NAME
@click.option("--state", "wanted", type=click.Choice(STATES), default="RUNNING",
              show_default=True, help="State the connector and all its tasks must reach.")
@click.option("--timeout", type=Seconds(min=0), default=60.0, show_default=True,
              help="Seconds to wait before failing.")
@click.option("--name-grace", type=Seconds(min=0), default=NAME_GRACE_S, show_default=True,
              help="Seconds a --url host name that does not resolve is asked again (a worker "
                   "pod's name is gone while it restarts).")
@pass_state
def wait(state: _State, name: str, wanted: str, timeout: float, name_grace: float) -> None:
    """Wait until a connector and all its tasks reach a state (fails fast on FAILED)."""
    def unanswered(error: ConnectError) -> None:
        if isinstance(error, UnresolvedHostError):  # review 65: Docker's DNS, a StatefulSet
            click.echo(f"waiting: {error}; asked again for {min(timeout, name_grace):g}s (a "
                       "worker's name is gone while its container or pod restarts: "
                       "--name-grace; check --url if it is not one)", err=True)
            return
        click.echo(f"waiting: {error}; asked again until --timeout {timeout:g}s (a worker "
                   "starting answers so for a while; check --url if it is not one)", err=True)

    reached = state.client.wait_for_state(name, wanted, timeout, unanswered=unanswered,
                                          name_grace_s=name_grace)
    click.echo(f"{name}: {reached.state} ({len(reached.tasks)} task(s))")
