"""CDC_ROUTER__ environment overrides: applied to router.yaml's parsed tree before it is
validated, each value read as the field it sets takes it (text, or JSON for a list or mapping).
Split from cdc_router.config.load, which calls apply_env."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr

from cdc_router.config.model import RouterConfig
from cdc_router.config.redact import is_secret_key
from cdc_router.config.utf8 import LONE_SURROGATE, utf8_encodable
from cdc_router.errors import ConfigError

ENV_PREFIX = "CDC_ROUTER__"
# Maps whose keys are Kafka properties (dots).
_PROPERTY_MAPS = frozenset({"config", "changelog_config", "position_config", "producer",
                            "consumer"})


def apply_env(raw: dict[str, Any], env: Mapping[str, str], source: str) -> dict[str, str]:
    """Write each CDC_ROUTER__ override into `raw`; return {field path: variable name}, with
    the path of each key a variable adds to the file's."""
    applied: dict[str, str] = {}
    for name in sorted(env):
        _near_miss(name)
        if not name.startswith(ENV_PREFIX):
            continue
        where = f"{source} via environment variable {name}"
        if not utf8_encodable(name):  # a byte Python keeps as a lone surrogate
            raise ConfigError("its name is not valid UTF-8", source=f"environment variable "
                              f"{name!a}", hint="name the field in ASCII")
        path: list[str | int] = []
        for segment in name[len(ENV_PREFIX):].split("__"):
            if path and path[-1] in _PROPERTY_MAPS:
                path.append(segment.lower().replace("_", "."))
            else:
                path.append(int(segment) if segment.isdigit() else segment.lower())
        node: Any = raw
        for depth, part in enumerate(path):
            final = depth == len(path) - 1
            if isinstance(node, list) and isinstance(part, int) and part < len(node):
                if final:
                    node[part] = _env_value(env[name], where, path)
                node = node[part]
            elif isinstance(node, dict) and isinstance(part, str):
                if part not in node:  # a key the variable brings: its errors are the variable's
                    applied.setdefault(dotted(path[: depth + 1]), name)
                if final:
                    node[part] = _env_value(env[name], where, path)
                elif node.get(part) is None:  # absent, or a section left empty (null): review 31
                    node[part] = {}
                node = node[part]
            else:
                raise ConfigError("this path does not exist in the file", source=where,
                                  field=dotted(path[: depth + 1]),
                                  hint=_path_hint(node, part, path[:depth]))
        applied[dotted(path)] = name
    return applied


def _near_miss(name: str) -> None:
    """ConfigError for a variable meant as an override that would be ignored: one underscore
    short (QA, session 29: a secret override looked applied and the file's value was used), the
    prefix in another case (QA 57-d F-5: names are case-sensitive), or the prefix alone."""
    upper = name.upper()
    if name.startswith("CDC_ROUTER_") and not name.startswith(ENV_PREFIX) and "__" in name:
        raise ConfigError("looks like an override, but overrides start with CDC_ROUTER__ "
                          "(two underscores), so it would be ignored",
                          source=f"environment variable {name}",
                          hint=f"rename it {ENV_PREFIX}{name[len('CDC_ROUTER_'):]}")
    if upper.startswith("CDC_ROUTER_") and "__" in name and not name.startswith("CDC_ROUTER_"):
        rest = name[len(ENV_PREFIX if upper.startswith(ENV_PREFIX) else "CDC_ROUTER_"):]
        raise ConfigError("looks like an override, but variable names are case-sensitive and "
                          "overrides start with CDC_ROUTER__ in capitals, so it would be "
                          "ignored", source=f"environment variable {name}",
                          hint=f"rename it {ENV_PREFIX}{rest.upper()}")
    if name == ENV_PREFIX:
        raise ConfigError("names no field, so it would be ignored", source=f"environment "
                          f"variable {name}", hint="an override names the field's path after "
                          "it, e.g. CDC_ROUTER__DELIVERY__GUARANTEE; else unset it")


def variable_of(path: Sequence[str | int]) -> str:
    """The CDC_ROUTER__ variable that overrides the field at `path`, as apply_env reads it:
    ('kafka', 'config', 'linger.ms') -> CDC_ROUTER__KAFKA__CONFIG__LINGER_MS (a property's dots
    are underscores)."""
    return ENV_PREFIX + "__".join(str(segment).upper().replace(".", "_") for segment in path)


def _path_hint(node: Any, part: str | int, above: Sequence[str | int]) -> str:
    """What to write instead, for a variable's path segment `part` that `node` (at `above`)
    cannot take (review 31-2: a number under a section was told the section holds a value)."""
    parent = dotted(above)
    if isinstance(node, list) and isinstance(part, int):
        return "a list item must exist in the file to be overridden"
    if isinstance(node, list):
        return (f"{parent} is a list: name an item by its index, e.g. "
                f"{variable_of(above)}__0__...")
    if isinstance(node, dict):
        return f"{parent or 'the file'} is a section: name one of its keys, not a number"
    return f"{parent or 'the file'} holds a value, not keys"


def _env_value(value: str, where: str, path: Sequence[str | int]) -> Any:
    """A variable's value for the field at `path`: text as it is (pydantic turns "100" or
    "true" into numbers and booleans as needed), JSON for a list or mapping (`[...]`, `{...}`).

    Where the field takes text, a value is JSON only when it parses as such: a topic template
    `{aggregate_type}.events` or a glob `[OP]rder*` stays text, where it can only be text (a
    password `[s3cr3t`, a template) it always does. A secret is never shown.
    """
    secret = bool(path) and is_secret_key(str(path[-1]))
    if not utf8_encodable(value):  # review 48-e F4: it crashed librdkafka's subscribe
        raise ConfigError("its value is not valid UTF-8 (Python keeps such a byte as a lone "
                          "surrogate, which no client can encode)", source=where,
                          hint="set it to UTF-8 text")
    kinds = _kinds(_annotations_at(path))
    if secret or kinds == {"text"} or not value.lstrip().startswith(("[", "{")):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        # A glob `[Oo]rder*` is text; one with a quote or a comma was meant as a list (QA 57-d
        # F-3: '["Order*",' or `[Order*, Paid*]` became one glob that matched nothing). Only for
        # a known pattern field (text or a list of it) and a value starting with '[' (review
        # 57-b F-2: an unknown key is pydantic's "unknown key", a `{` template stays text).
        if kinds == {"text", "list"} and value.lstrip().startswith("[") and any(
                mark in value for mark in "\"',"):
            raise ConfigError(f"it reads as a list that is not valid JSON ({error}), not as "
                              "one pattern", source=where, field=dotted(path), value=value,
                              hint='write the list as JSON (\'["Order*", "Payment*"]\'); a '
                                   "pattern that starts with '[' and holds a quote or a comma, "
                                   "as a JSON list of one (\'[\"[,;]x\"]\')") from None
        if "text" in kinds:
            return value
        # Not the value: a mapping's text may hold a secret (`{"sasl.password": ...`).
        raise ConfigError(f"invalid JSON: {error}", source=where,
                          hint="give the list or mapping as JSON, or set its items one by "
                               "one") from None
    if not utf8_encodable(json.dumps(parsed, ensure_ascii=False)):  # an escape "\ud800"
        raise ConfigError(f"its JSON holds {LONE_SURROGATE}", source=where,
                          hint="write the character itself, or both halves of its pair")
    return parsed


def known_field(path: Sequence[str | int]) -> bool:
    """True when the config's models have a field at `path` (a misspelt key has none)."""
    return bool(_annotations_at(path))


def _annotations_at(path: Sequence[str | int]) -> list[Any]:
    """The type annotations the config's models give the field at `path` ([] if unknown)."""
    found: list[Any] = [RouterConfig]
    for part in path:
        found = [child for annotation in found for child in _children(annotation, part)]
    return found


def _children(annotation: Any, part: str | int) -> list[Any]:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _children(args[0], part)
    if origin is Union or origin is UnionType:
        return [child for arg in args for child in _children(arg, part)]
    if origin in (list, tuple) and isinstance(part, int):
        return [args[0]]
    if origin is dict and isinstance(part, str):
        return [args[1]]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) and \
            isinstance(part, str):
        fields = {field.alias or name: field for name, field in annotation.model_fields.items()}
        fields.update(annotation.model_fields)  # populate_by_name: `schema_path` for `schema`
        return [fields[part].annotation] if part in fields else []
    return []


def _kinds(annotations: list[Any]) -> set[str]:
    """"text" for each annotation that takes a string, "list" for a list, "other" for one that
    takes anything else but None; an unknown field (no annotation) takes anything."""
    kinds: set[str] = set() if annotations else {"text", "other"}
    for annotation in annotations:
        origin, args = get_origin(annotation), get_args(annotation)
        if origin is Annotated:
            kinds |= _kinds([args[0]])
        elif origin is Union or origin is UnionType:
            kinds |= _kinds(list(args))
        elif annotation in (str, SecretStr) or (
                origin is Literal and all(isinstance(arg, str) for arg in args)):
            kinds.add("text")
        elif origin in (list, tuple):
            kinds.add("list")
        elif annotation is not type(None):
            kinds.add("other")
    return kinds


def dotted(loc: Sequence[str | int]) -> str:
    """('routes', 1, 'topic') -> 'routes[1].topic'; keys with dots are quoted."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out
