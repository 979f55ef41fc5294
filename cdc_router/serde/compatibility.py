"""Backward compatibility of Avro schemas: can the new schema read data written with the old?

Used by `cdc-router schemas check` (check_schemas), against older files and the registry.

The verdict is Apache Avro's own (avro.compatibility, the port of Java's SchemaCompatibility,
the rules registries apply). Its report says where things break as a JSON pointer that is not
always kept ('/' for a whole record), so this module walks both schemas field by field, asks
the same checker about each pair, and names the deepest field that breaks, with why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from avro.compatibility import (
    ReaderWriterCompatibilityChecker,
    SchemaCompatibilityResult,
    SchemaCompatibilityType,
)
from avro.schema import (
    ArraySchema,
    EnumSchema,
    FixedSchema,
    MapSchema,
    NamedSchema,
    RecordSchema,
    Schema,
    UnionSchema,
)

from cdc_router.errors import ConfigError
from cdc_router.serde.avro import AvroSerializer, PlannedSubject
from cdc_router.serde.avro_schema import AvroSchema, apache_parse, load_schema
from cdc_router.serde.avro_subjects import shared_subjects
from cdc_router.serde.registry import RegistryError, SchemaIds


@dataclass(frozen=True)
class Incompatibility:
    """One reason the new schema cannot read old data: the field path and what breaks."""

    field: str  # dotted path from the top-level record; "(top level)" for the schema itself
    problem: str

    def __str__(self) -> str:
        return f"field {self.field!r}: {self.problem}"


def backward_incompatibilities(new: AvroSchema, old_text: str) -> list[Incompatibility]:
    """Why `new` cannot read data written with the schema `old_text`; [] when it can."""
    reader = apache_parse(new.text)
    writer = apache_parse(old_text)
    if _compatible(reader, writer):
        return []
    found = _locate(reader, writer, "")
    if not found:  # the checker says no, but no single field explains it
        result = _verdict(reader, writer)
        found = [Incompatibility("(top level)", "; ".join(sorted(result.messages)))]
    return found


def other_type(new: AvroSchema, old_text: str) -> str | None:
    """What the subject holds when its schema `old_text` is of another top-level type than
    `new`, which cannot read it (a string where `new` is a record: no default mends that, QA
    60-b F-2); else None."""
    reader, writer = apache_parse(new.text), apache_parse(old_text)
    if _kinds(reader) & _kinds(writer) or _compatible(reader, writer):
        return None  # a union holding the other side's type: its fields may be what differs
    return f"a schema of type {_describe(writer)}, and this one is of type {_describe(reader)}"


def _kinds(schema: Schema) -> set[str]:
    """The top-level types `schema` can hold: a union's branches' (review 61-v S-1: a route's
    ["null", record] against a subject's record is no other type), else its own."""
    branches = schema.schemas if isinstance(schema, UnionSchema) else [schema]
    return {branch.type for branch in branches}


def _verdict(reader: Schema, writer: Schema) -> SchemaCompatibilityResult:
    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    return checker.get_compatibility(reader, writer)


def _compatible(reader: Schema, writer: Schema) -> bool:
    return _verdict(reader, writer).compatibility is SchemaCompatibilityType.compatible


def _at(path: str) -> str:
    return path or "(top level)"


def _describe(schema: Schema) -> str:
    if isinstance(schema, NamedSchema):
        return f"{schema.type} {schema.fullname}"
    if isinstance(schema, ArraySchema):
        return f"array of {_describe(schema.items)}"
    if isinstance(schema, MapSchema):
        return f"map of {_describe(schema.values)}"
    if isinstance(schema, UnionSchema):
        return " | ".join(_describe(branch) for branch in schema.schemas)
    return str(schema.type)


def _locate(reader: Schema, writer: Schema,
            path: str) -> list[Incompatibility]:
    """The deepest places under `path` where `reader` cannot read `writer`'s data."""
    if _compatible(reader, writer):
        return []
    if isinstance(writer, UnionSchema):
        # Every value of the old union must be readable: name the branches that are not.
        found = []
        for branch in writer.schemas:
            if not _compatible(reader, branch):
                deeper = _locate(_same_named(reader, branch) or reader, branch, path)
                found += deeper or [Incompatibility(
                    _at(path), f"old values of type {_describe(branch)} cannot be read as "
                    f"{_describe(reader)}")]
        return found
    if isinstance(reader, UnionSchema):
        target = _same_named(reader, writer)
        if target is not None:
            return _locate(target, writer, path)
        return [Incompatibility(_at(path), f"no branch of the new union {_describe(reader)} "
                                f"reads the old type {_describe(writer)}")]
    if isinstance(reader, RecordSchema) and isinstance(writer, RecordSchema):
        return _locate_record(reader, writer, path)
    if isinstance(reader, ArraySchema) and isinstance(writer, ArraySchema):
        return _locate(reader.items, writer.items, f"{path}[]")
    if isinstance(reader, MapSchema) and isinstance(writer, MapSchema):
        return _locate(reader.values, writer.values, f"{path}{{}}")
    if isinstance(reader, EnumSchema) and isinstance(writer, EnumSchema):
        missing = [symbol for symbol in writer.symbols if symbol not in reader.symbols]
        if missing and reader.props.get("default") is None:
            return [Incompatibility(_at(path), f"enum {reader.fullname} lost the symbols "
                                    f"{', '.join(missing)} (and has no default symbol)")]
    if isinstance(reader, FixedSchema) and isinstance(writer, FixedSchema) and \
            reader.size != writer.size:
        return [Incompatibility(_at(path), f"fixed {reader.fullname} is {reader.size} "
                                    f"bytes, was {writer.size}")]
    if isinstance(reader, NamedSchema) and isinstance(writer, NamedSchema) and \
            not _same_name(reader, writer):
        return [Incompatibility(_at(path), f"the name changed from {writer.fullname} to "
                                f"{reader.fullname} (keep it, or list the old one in aliases)")]
    return [Incompatibility(_at(path), f"the new type {_describe(reader)} cannot read the old "
                            f"type {_describe(writer)}")]


def _locate_record(reader: RecordSchema, writer: RecordSchema,
                   path: str) -> list[Incompatibility]:
    if not _same_name(reader, writer):
        return [Incompatibility(_at(path), f"the record name changed from {writer.fullname} "
                                f"to {reader.fullname} (keep it, or list the old one in "
                                "aliases)")]
    found = []
    old_fields = {field.name: field for field in writer.fields}
    for field in reader.fields:
        where = f"{path}.{field.name}" if path else field.name
        old = old_fields.get(field.name) or next(
            (old_fields[alias] for alias in _aliases(field.props) if alias in old_fields), None)
        if old is None:
            if not field.has_default:
                found.append(Incompatibility(where, "added without a default, so data "
                                             "written with the old schema has no value for it"))
            continue
        found += _locate(field.type, old.type, where)
    return found


def _aliases(props: Mapping[str, object]) -> list[str]:
    aliases = props.get("aliases")
    return [str(alias) for alias in aliases] if isinstance(aliases, list) else []


def _same_name(reader: NamedSchema, writer: NamedSchema) -> bool:
    aliases = _aliases(reader.props)
    return reader.fullname == writer.fullname or reader.name == writer.name or \
        writer.fullname in aliases


def _same_named(reader: Schema,
                writer: Schema) -> Schema | None:
    """The branch of a reader union that resolution would pick for a named writer type."""
    if not isinstance(reader, UnionSchema) or \
            not isinstance(writer, NamedSchema):
        return None
    for branch in reader.schemas:
        if isinstance(branch, NamedSchema) and branch.type == writer.type and \
                _same_name(branch, writer):
            return branch
    return None


@dataclass(frozen=True)
class SchemaCheck:
    """What `schemas check` found for one schema of one route."""

    route: int
    event_type: str | None
    file: str
    name: str | None
    fingerprint: str  # hex, as in the single-object header
    subject: str | None
    previous: str  # the older file it was checked against, or why none
    registry: str  # what the registry holds for it, or why it was not asked
    problems: tuple[str, ...]


def check_schemas(serializer: AvroSerializer, previous_dir: Path | None = None,
                  use_registry: bool = True,
                  by_data: Sequence[PlannedSubject] = ()) -> list[SchemaCheck]:
    """Check every schema of `serializer`'s routes against its older versions.

    Older versions: the file of the same name in `previous_dir`, and the latest version of
    its subject in the registry (the registry's verdict, under the subject's compatibility
    level). Also a problem: with auto_register off, a schema its subject lacks (the router
    would stop at start-up), and several schemas sharing one subject. A schema whose subject
    depends on each event's topic is checked so under each of `by_data`, the registry's
    subjects its route's template renders (AvroSerializer.existing_subjects), one row each:
    where the router would dead-letter its events (QA 52-a F2). Registry failures raise
    RegistryError.
    """
    planned = serializer.planned_subjects()
    ids = serializer.registry if use_registry else None
    shared = shared_subjects(planned)
    checks = []
    for entry in planned:
        problems: list[str] = []
        schema = entry.schema
        previous = "not given (--previous)"
        if previous_dir is not None:
            older = previous_dir / Path(schema.path).name
            previous = str(older) if older.is_file() else "none"
            problems += _against_file(schema, older)
        if ids is None:
            registry = ("not configured: single-object encoding" if serializer.registry is None
                        else "not asked")
        elif entry.subject is None:
            rendered = [other for other in by_data if (other.route, other.event_type,
                        other.schema) == (entry.route, entry.event_type, schema)]
            registry = "subject depends on each event's topic: " + (
                f"checked under the {len(rendered)} existing one(s) it renders (below); "
                "others looked up when first met" if rendered else "the registry holds none "
                "it renders yet: looked up when first met")
            checks.append(SchemaCheck(entry.route, entry.event_type, schema.path, schema.name,
                                      schema.fingerprint.hex(), None, previous, registry,
                                      tuple(problems)))
            for other in rendered:
                assert other.subject is not None
                held, refused = _against_registry(ids, other.subject, schema,
                                                  "its events would be dead-lettered")
                checks.append(SchemaCheck(entry.route, entry.event_type, schema.path,
                                          schema.name, schema.fingerprint.hex(), other.subject,
                                          "-", held, tuple(refused)))
            continue
        else:
            registry, found = _against_registry(ids, entry.subject, schema)
            # Shared, its advice to register is moot: no registration can fix it.
            problems += [shared[entry.subject]] if entry.subject in shared else found
        checks.append(SchemaCheck(entry.route, entry.event_type, schema.path, schema.name,
                                  schema.fingerprint.hex(), entry.subject, previous, registry,
                                  tuple(problems)))
    return checks


def breaking_version(ids: SchemaIds, subject: str, schema: AvroSchema,
                     latest: tuple[int, str]) -> tuple[int, list[Incompatibility]]:
    """The newest version of `subject` whose data `schema` cannot read, and why; the latest
    first, the older ones (a *_TRANSITIVE level's) only when it reads the latest's (QA 66-a
    F-1); (latest version, []) when it reads them all."""
    found = backward_incompatibilities(schema, latest[1])
    if found:
        return latest[0], found
    for version, text in ids.versions(subject):
        if version != latest[0] and (found := backward_incompatibilities(schema, text)):
            return version, found
    return latest[0], []


def _against_file(schema: AvroSchema, previous: Path) -> list[str]:
    if not previous.is_file():
        return []
    try:
        old = load_schema(previous)
    except ConfigError as error:
        return [f"previous version unreadable: {error}"]
    return [f"cannot read data written with {previous}: {found}"
            for found in backward_incompatibilities(schema, old.text)]


def _against_registry(ids: SchemaIds, subject: str, schema: AvroSchema,
                      outcome: str = "the router would stop") -> tuple[str, list[str]]:
    latest = ids.latest(subject)
    if latest is None:
        if ids.auto_register:
            return "subject empty: registered on first use (auto_register)", []
        return "subject empty", [f"subject {subject} has no version and auto_register is off: "
                                 f"{outcome}; run `cdc-router schemas register`"]
    version = latest[0]
    try:
        registered = ids.lookup(subject, schema)
    except RegistryError as error:
        if not error.missing:
            raise
        registered = None
    if registered is not None:
        return f"registered as id {registered} (latest version {version})", []
    problems = []
    if not ids.compatible(subject, schema):
        version, found = breaking_version(ids, subject, schema, latest)
        problems += [f"cannot read data written with {subject} version {version}: {item}"
                     for item in found] or [
            f"the registry finds it incompatible with {subject}'s versions (the "
            "subject's compatibility level may be stricter than backward: FORWARD or FULL "
            "also ask that the old schema read the new one's data)"]
    elif not ids.auto_register:
        problems.append(f"not registered under {subject} and auto_register is off: "
                        f"{outcome}; run `cdc-router schemas register`")
    return f"not registered (latest version {version})", problems
