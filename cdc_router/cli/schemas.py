"""`cdc-router schemas`: check the Avro schemas of a router config, and register them."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from cdc_router.cli._options import config_option
from cdc_router.cli._output import output_option, table
from cdc_router.cli._plan import confirm
from cdc_router.config.compiled import CompiledConfig
from cdc_router.config.load import load_config
from cdc_router.config.redact import shown_url
from cdc_router.errors import EXIT_RESTART, ConfigError
from cdc_router.serde.avro import AvroSerializer, PlannedSubject
from cdc_router.serde.avro_schema import AvroSchema
from cdc_router.serde.compatibility import (
    SchemaCheck,
    breaking_version,
    check_schemas,
    other_type,
)
from cdc_router.serde.registry import RegistryError, SchemaIds


@contextmanager
def _exit_1_when_down() -> Iterator[None]:
    """A registry that does not answer exits 1, as every one-shot command with a dependency
    down does (review 53-c F7: 75, the code for a supervisor to restart `run`, came along
    with RegistryError, made for the router)."""
    try:
        yield
    except RegistryError as error:
        error.exit_code = 1
        raise


@click.group(name="schemas")
def cli() -> None:
    """Check the Avro schemas of a router config; register them with the schema registry."""


def _serializer(compiled: CompiledConfig) -> AvroSerializer:
    """The router's own Avro serializer, compiled at load; an empty one when no route is Avro."""
    serializer = compiled.serializers.get("avro")
    if isinstance(serializer, AvroSerializer):
        return serializer
    return AvroSerializer([], compiled.config.schema_registry)


@cli.command()
@config_option()
@click.option("--previous", "previous_dir", type=click.Path(exists=True, file_okay=False,
              path_type=Path), help="Folder of the older versions of the .avsc files, by "
              "file name (e.g. the schemas folder of the last release).")
@click.option("--no-registry", is_flag=True,
              help="Do not ask the schema registry, even if the config has one.")
@output_option
@_exit_1_when_down()
def check(config_path: Path, previous_dir: Path | None, no_registry: bool, output: str) -> None:
    """Every schema parses; each reads data written with its older version, if any.

    Older versions: the file of the same name under --previous, and the latest version of the
    schema's subject in the registry (which judges by the subject's compatibility level; the
    breaking field is named here); for a subject an event's data names, of each subject the
    registry holds that the route's topic template renders. With auto_register off, a schema
    missing from its subject is a problem too: the router would stop at start-up (or
    dead-letter that subject's events). Exits 1 on any problem.
    """
    compiled = load_config(config_path, env=os.environ)
    serializer = _serializer(compiled)
    by_data = _named_by_data(compiled, serializer) \
        if serializer.registry is not None and not no_registry else []
    checks = check_schemas(serializer, previous_dir, use_registry=not no_registry,
                           by_data=by_data)
    registry = compiled.config.schema_registry
    # Which registry was asked: a config's url is not the local stack's unless overridden
    # (CDC_ROUTER__SCHEMA_REGISTRY__URL).
    asked = shown_url(registry.url) if registry is not None and not no_registry else None
    if output == "json":
        click.echo(json.dumps({"file": str(config_path), "ok": not _failed(checks),
                               "registry_url": asked,
                               "schemas": [dataclasses.asdict(item) for item in checks]},
                              indent=2))
    else:
        if asked is not None and checks:
            click.echo(f"schema registry: {asked}")
        click.echo(_report(config_path, checks))
    if _failed(checks):
        sys.exit(1)


def _named_by_data(compiled: CompiledConfig, serializer: AvroSerializer,
                   subjects: tuple[str, ...] = ()) -> list[PlannedSubject]:
    """The registry's subjects (and `subjects`) that a route's topic template renders from
    event data: what `schemas register` registers a new version under, and `schemas check`
    checks each schema under (QA 52-a F2: it said ok for one the registry then refused)."""
    ids = serializer.registry
    planned = [entry for entry in serializer.planned_subjects() if entry.subject is not None]
    if ids is None or len(planned) == len(serializer.planned_subjects()):
        return []
    by_data = serializer.existing_subjects(dict.fromkeys([*ids.subjects(), *subjects]))
    # Only subjects of topics the route may produce to (the guard: legal names, not a source,
    # protected or the router's own, within allowed_topics), and none another route names.
    guard, known = compiled.config.topic_guard(), {entry.subject for entry in planned}
    return [entry for entry in by_data if entry.subject not in known and entry.topic and (
        compiled.config.routes[entry.route].nats is not None or guard.problem(entry.topic) is None)]


def _failed(checks: list[SchemaCheck]) -> bool:
    return any(item.problems for item in checks)


def _report(path: Path, checks: list[SchemaCheck]) -> str:
    if not checks:
        return f"{path}: no route has format avro"
    rows = [[f"[{item.route}]", item.event_type or "*", _relative(item.file), item.name or "-",
             item.fingerprint, _relative(item.previous), item.subject or "-", item.registry]
            for item in checks]
    lines = table(["route", "type", "file", "name", "fingerprint", "previous", "subject",
                   "registry"], rows).splitlines()
    problems = [f"  routes[{item.route}] {_relative(item.file)}: {problem}"
                for item in checks for problem in item.problems]
    if problems:
        verdict = f"{len(problems)} problem(s):"
    else:
        compared = sum(1 for item in checks if Path(item.previous).is_file())
        compared += sum(1 for item in checks if "latest version" in item.registry)
        parsed = len({(item.route, item.event_type) for item in checks})  # a row a subject
        verdict = f"ok: {parsed} schema(s) parse; {compared} older version(s) checked"
    return "\n".join([*lines, "", verdict, *problems])


def _refusal(ids: SchemaIds, subject: str, schema: AvroSchema) -> tuple[str | None, str | None]:
    """Why the registry would refuse `schema` under `subject` (its compatibility test, under
    the subject's level), and what the subject holds when it is a schema of another type
    (compatibility.other_type); (None, None) when it takes it (a subject without versions
    takes any)."""
    latest = ids.latest(subject)
    if latest is None or ids.compatible(subject, schema):
        return None, None
    version, found = breaking_version(ids, subject, schema, latest)
    return "; ".join(f"version {version}: {item}" if version != latest[0] else str(item)
                     for item in found) or \
        "with the subject's versions, under its compatibility level", \
        other_type(schema, latest[1])


def _refused_hint(subject: str, held: str | None) -> str:
    """What to do about a schema the registry refuses under `subject`; `held`: the other
    type of schema the subject holds, if so (QA 60-b F-2: no default makes a record read a
    string, yet the hint said to add them)."""
    if held is not None:
        return (f"{subject} holds {held}: no field's default makes this schema read its "
                "data; route to another subject (another topic, or schema_registry."
                "subject_name_strategy), or give the route a schema that reads the subject's")
    return ("change the schema so that it reads the subject's data (a default for each new "
            "field); `schemas check` names each field")


def _relative(file: str) -> str:
    try:
        return str(Path(file).relative_to(Path.cwd()))
    except ValueError:
        return file


@cli.command()
@config_option()
@click.option("--dry-run", is_flag=True, help="Only show the plan.")
@click.option("--yes", is_flag=True, help="Register without asking.")
@click.option("--subject", "subjects", multiple=True, metavar="SUBJECT",
              help="Also this subject, one a route's template renders from event data but "
                   "the registry does not hold yet (a dead letter's reason names it); "
                   "repeatable.")
@output_option
@_exit_1_when_down()
def register(config_path: Path, dry_run: bool, yes: bool, subjects: tuple[str, ...],
             output: str) -> None:
    """Register each route's schema under its subject, for routers with auto_register off.

    The subjects known before any event (a plain topic name, a topic template over {type}
    with a schema per type, or the record strategy), and the registry's existing subjects
    that a route's template renders from event data (e.g. `pay.{aggregate_type}`: a new
    version of its schema goes under each). The registry refuses a schema incompatible with
    its subject's versions: an error for a known subject, `incompatible` (skipped) for one
    named by data, which may be another producer's. `--subject` adds subjects named by data
    that the registry does not hold yet.
    """
    compiled = load_config(config_path, env=os.environ)
    serializer = _serializer(compiled)
    ids = serializer.registry
    if ids is None:
        raise ConfigError("the config has no schema_registry: Avro routes use single-object "
                          "encoding, with nothing to register", source=str(config_path))
    # Before registering any: the second would be refused after the first (QA 53-b F1).
    serializer.check_subjects(str(config_path))
    plan = []
    planned = [entry for entry in serializer.planned_subjects() if entry.subject is not None]
    by_data = _named_by_data(compiled, serializer, subjects)
    unknown = sorted(set(subjects) - {entry.subject for entry in planned + by_data})
    if unknown:
        raise ConfigError(f"no route of this config renders subject {unknown[0]!r} from event "
                          "data", field="--subject", hint="name a subject a dead letter's "
                          "reason gives, or check the route's topic template")
    held: dict[str, str | None] = {}  # each subject's other type of schema, if refused so
    for position, entry in enumerate(planned + by_data):
        assert entry.subject is not None
        try:
            current: int | None = ids.lookup(entry.subject, entry.schema)
        except RegistryError as error:
            if not error.missing:
                raise
            current = None
        # Review 53-c F6: the plan asks the registry's compatibility test (no write), so a
        # dry run says what `--yes` would be refused.
        refusal, held[entry.subject] = (None, None) if current is not None else \
            _refusal(ids, entry.subject, entry.schema)
        by_event = position >= len(planned)
        plan.append({"subject": entry.subject, "file": entry.schema.path,
                     "action": "unchanged" if current is not None else "register"
                     if refusal is None else "incompatible" if by_event else "refused",
                     "id": current, "named_by_data": by_event,
                     **({"reason": refusal} if refusal is not None else {})})
    pending = [step for step in plan if step["action"] == "register"]
    refused = [step for step in plan if step["action"] == "refused"]
    if output == "text":
        for step in plan:
            suffix = f" (id {step['id']})" if step["id"] is not None else \
                f": incompatible ({step['reason']})" if step["action"] == "refused" else \
                f" (skipped: {step['reason']})" if "reason" in step else ""
            click.echo(f"{step['action']:<9} {step['subject']} <- "
                       f"{_relative(str(step['file']))}{suffix}")
        if not plan:
            click.echo("no subject is known before events arrive: nothing to register")
    if refused:
        if output == "json":
            click.echo(json.dumps(plan, indent=2))
        raise ConfigError(f"the registry refuses the schema of {refused[0]['subject']} "
                          f"({_relative(str(refused[0]['file']))}) as incompatible: nothing "
                          "registered", source=str(config_path),
                          hint=_refused_hint(str(refused[0]["subject"]),
                                             held[str(refused[0]["subject"])]))
    if pending and not dry_run:
        confirm("register these schemas?", yes)
        schemas = {entry.schema.path: entry.schema for entry in serializer.planned_subjects()}
        for step in pending:
            try:
                step["id"] = ids.register(str(step["subject"]), schemas[str(step["file"])])
            except RegistryError as error:
                if error.exit_code == EXIT_RESTART:
                    # A write without an answer may have been done all the same (QA 36-c:
                    # a ReadTimeout, and the subject was there).
                    raise RegistryError(f"{error}; the registry may have registered it all "
                                        "the same: run this command again, which is safe (a "
                                        "registered schema shows as `unchanged`)",
                                        outage=True) from error
                if not (error.incompatible and step["named_by_data"]):
                    raise
                step["action"] = "incompatible"
                if output == "text":
                    click.echo(f"skipped   {step['subject']}: {error}")
                continue
            step["action"] = "registered"
            if output == "text":
                click.echo(f"registered {step['subject']} as id {step['id']}")
    if output == "json":
        click.echo(json.dumps(plan, indent=2))
