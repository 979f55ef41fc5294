"""Loading router.yaml: YAML file + environment overrides -> CompiledConfig, or one ConfigError.

`load_config()` reads the YAML file strictly (no duplicate keys), applies `CDC_ROUTER__...`
environment overrides passed in by the CLI (the library never reads the environment itself), and
turns every problem into a single line ConfigError naming the file (or variable), the field path,
the bad value and what to do. The models themselves live in
cdc_router.config.model and its sections.
"""

from __future__ import annotations

import difflib
import json
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr, ValidationError

from cdc_router.config.compiled import CompiledConfig, compile_config
from cdc_router.config.model import RouterConfig
from cdc_router.config.placeholders import unexpanded
from cdc_router.config.redact import MASK, is_secret_key, redact, shown_url
from cdc_router.config.utf8 import LONE_SURROGATE, utf8_encodable
from cdc_router.config.yaml_text import parsed_yaml
from cdc_router.errors import ConfigError, show

ENV_PREFIX = "CDC_ROUTER__"
# Maps whose keys are Kafka properties (dots).
_PROPERTY_MAPS = frozenset({"config", "changelog_config", "position_config", "producer",
                            "consumer"})
_UNION_TAG = re.compile(r"^(str|int|float|bool|none)$|[\[(]")




def require_file(path: str | Path, *, hint: str, field: str | None = None) -> None:
    """ConfigError for a directory or a device at `path`, which reading whole never ends for
    (QA 33-b, review 48-e F17: /dev/zero filled the memory); a pipe (`<(envsubst ...)`) is a
    file here, and a path that cannot be stat'ed is left for the read to say why."""
    try:
        mode = Path(path).stat().st_mode
    except OSError:
        return
    if stat.S_ISDIR(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise ConfigError("not a file (a directory or a device)", source=str(path),
                          field=field, hint=hint)


def _text_before(error: UnicodeDecodeError) -> bytes:
    """The bytes of the file before the one that is not UTF-8."""
    return bytes(error.object[: error.start])


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> CompiledConfig:
    """Read router.yaml at `path`, apply overrides from `env`, validate and compile it.

    Raises ConfigError. The result holds the RouterConfig (`.config`) and its compiled routes
    and serializers, which the router reuses: nothing is compiled twice.

    An override is a variable `CDC_ROUTER__<PATH>` where PATH walks the YAML with `__`
    (case-insensitive; list items by index): `CDC_ROUTER__DELIVERY__GUARANTEE=at_least_once`,
    `CDC_ROUTER__ROUTES__0__TOPIC=orders`. Under `config`/`changelog_config`, `_` stands for
    `.`: `CDC_ROUTER__KAFKA__CONFIG__LINGER_MS=5`. A value starting with `[` or `{` is JSON
    where the field takes a list or a mapping (see _env_value).
    """
    source = str(path)
    require_file(path, hint="pass -c with the path of a router.yaml")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", source=source,
                          hint="pass -c with the path of a router.yaml "
                          "(cdc_router/examples/router.yaml is a commented one)") from None
    except UnicodeDecodeError as error:
        line = _text_before(error).count(b"\n") + 1
        raise ConfigError(f"line {line}: the file is not UTF-8 (byte {error.start})",
                          source=source, hint="save it as UTF-8") from None
    except OSError as error:
        raise ConfigError(f"cannot read the file: {error}", source=source) from None
    raw = parsed_yaml(text, source)
    if raw is None:
        raise ConfigError("the file is empty", source=source,
                          hint="it needs at least source.topics and routes")
    if not isinstance(raw, dict):
        raise ConfigError("the top level must be a mapping of settings", source=source,
                          value=type(raw).__name__)
    # Top-level `x-` keys hold YAML anchors (`x-base: &base {...}`, then `<<: *base`), as
    # docker-compose's extension fields do; they are no setting.
    raw = {key: value for key, value in raw.items()
           if not (isinstance(key, str) and key.startswith("x-"))}
    overridden = _apply_env(raw, env or {}, source)
    _refuse_unexpanded(raw, overridden, source)
    try:
        # Relative schema paths are relative to the config file, not to the working directory.
        config = RouterConfig.model_validate(
            raw, context={"config_dir": Path(path).resolve().parent})
    except ValidationError as error:
        raise _config_error(error, source, overridden) from None
    try:
        return compile_config(config)  # what only compiling finds: key columns, serializers
    except ConfigError as error:
        raise ConfigError(str(error), source=source) from None


def _apply_env(raw: dict[str, Any], env: Mapping[str, str], source: str) -> dict[str, str]:
    """Write each CDC_ROUTER__ override into `raw`; return {field path: variable name}, with
    the path of each key a variable adds to the file's."""
    applied: dict[str, str] = {}
    for name in sorted(env):
        if name.startswith("CDC_ROUTER_") and not name.startswith(ENV_PREFIX) and "__" in name:
            # QA, session 29: one underscore short, a secret override looked applied and the
            # file's value was used.
            raise ConfigError("looks like an override, but overrides start with CDC_ROUTER__ "
                              "(two underscores), so it would be ignored",
                              source=f"environment variable {name}",
                              hint=f"rename it {ENV_PREFIX}{name[len('CDC_ROUTER_'):]}")
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX:
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
                    applied.setdefault(_dotted(path[: depth + 1]), name)
                if final:
                    node[part] = _env_value(env[name], where, path)
                elif node.get(part) is None:  # absent, or a section left empty (null): review 31
                    node[part] = {}
                node = node[part]
            else:
                raise ConfigError("this path does not exist in the file", source=where,
                                  field=_dotted(path[: depth + 1]),
                                  hint=_path_hint(node, part, path[:depth]))
        applied[_dotted(path)] = name
    return applied


def _refuse_unexpanded(raw: dict[str, Any], overridden: dict[str, str], source: str) -> None:
    """ConfigError for a `${NAME}` left in a value of the file (QA 57-d F-1: a forgotten
    envsubst passed as a match pattern, a group id, a password); a value a variable sets is
    taken as it is, so that a password may hold one."""
    for path, text, placeholder, name in unexpanded(raw):
        dotted = _dotted(path)
        if any(dotted == prefix or dotted.startswith((prefix + ".", prefix + "["))
               for prefix in overridden):
            continue
        key = str(path[-1])
        if len(path) == 3 and path[0] == "routes" and key == "topic" and not name.isupper():
            # review 49-f F6: the SMT's route.topic.replacement, copied over
            raise ConfigError(f"{show(text)} is written as the EventRouter SMT's "
                              "route.topic.replacement: here a field is {aggregate_type} (the "
                              "SMT's ${routedByValue}), without the '$'", source=source,
                              field=dotted)
        raise ConfigError(f"{placeholder} is not expanded: router.yaml is read as it is",
                          source=source, field=dotted, value=redact(key, text),
                          hint=f"run the file through envsubst (-c <(envsubst < {source})), or set "
                               f"{variable_of(path)} instead")


def variable_of(path: Sequence[str | int]) -> str:
    """The CDC_ROUTER__ variable that overrides the field at `path`, as _apply_env reads it:
    ('kafka', 'config', 'linger.ms') -> CDC_ROUTER__KAFKA__CONFIG__LINGER_MS (a property's dots
    are underscores)."""
    return ENV_PREFIX + "__".join(str(segment).upper().replace(".", "_") for segment in path)


def _path_hint(node: Any, part: str | int, above: Sequence[str | int]) -> str:
    """What to write instead, for a variable's path segment `part` that `node` (at `above`)
    cannot take (review 31-2: a number under a section was told the section holds a value)."""
    parent = _dotted(above)
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
        # F-3: '["Order*",' or `[Order*, Paid*]` became one glob that matched nothing).
        if "text" in kinds and not any(mark in value for mark in "\"',"):
            return value
        if "text" in kinds:
            raise ConfigError(f"it reads as a list that is not valid JSON ({error}), not as "
                              "one pattern", source=where, field=_dotted(path), value=value,
                              hint='write the list as JSON (\'["Order*", "Payment*"]\'); a '
                                   "pattern that starts with '[' and holds a quote or a comma, "
                                   "as a JSON list of one (\'[\"[,;]x\"]\')") from None
        # Not the value: a mapping's text may hold a secret (`{"sasl.password": ...`).
        raise ConfigError(f"invalid JSON: {error}", source=where,
                          hint="give the list or mapping as JSON, or set its items one by "
                               "one") from None
    if not utf8_encodable(json.dumps(parsed, ensure_ascii=False)):  # an escape "\ud800"
        raise ConfigError(f"its JSON holds {LONE_SURROGATE}", source=where,
                          hint="write the character itself, or both halves of its pair")
    return parsed


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
        return [fields[part].annotation] if part in fields else []
    return []


def _kinds(annotations: list[Any]) -> set[str]:
    """"text" for each annotation that takes a string, "other" for one that takes anything
    else but None; an unknown field (no annotation) takes anything."""
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
        elif annotation is not type(None):
            kinds.add("other")
    return kinds


def _dotted(loc: Sequence[str | int]) -> str:
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


def _keys_at(loc: Sequence[str | int]) -> list[str]:
    """The keys the model allows at `loc`, for suggestions; [] when not a model there."""
    model: Any = RouterConfig
    for part in loc:
        if isinstance(part, int):
            continue
        fields = {f.alias or n: f for n, f in model.model_fields.items()}
        if part not in fields:
            return []
        model = _model_in(fields[part].annotation)
        if model is None:
            return []
    return [f.alias or n for n, f in model.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


_PYDANTIC_CLASS = re.compile(r" or instance of \w+")


# pydantic's errors of a scalar field given a value of another type.
_SCALAR_ERRORS = frozenset({"string_type", "int_type", "int_parsing", "float_type",
                            "float_parsing", "bool_type", "bool_parsing", "literal_error",
                            "enum", "int_from_float", "url_type"})


class _Flow:
    """A value as YAML's flow style writes it (`[1, 2]`, `{}`, `null`), for ConfigError."""

    def __init__(self, value: object) -> None:
        self._text = json.dumps(value, default=str, ensure_ascii=False)

    def __repr__(self) -> str:
        return self._text


def _config_error(error: ValidationError, source: str, overridden: dict[str, str]) -> ConfigError:
    # An unknown key usually is a misspelt one, which pydantic also reports as missing: the
    # unknown key is the better clue.
    # An unknown key first; else the deepest: of a union's members (a pattern or a list of
    # them), the one naming the bad item (QA, session 30: "Input should be a valid string").
    first = min(error.errors(), key=lambda e: (e["type"] != "extra_forbidden", -len(e["loc"])))
    loc = [part for part in first["loc"] if isinstance(part, int) or not _UNION_TAG.search(part)]
    ctx = first.get("ctx") or {}
    path = _dotted(loc)
    if "field" in ctx:
        path = f"{path}.{ctx['field']}" if path else str(ctx["field"])
    value = ctx.get("value") if "field" in ctx else first.get("input")
    message = str(ctx.get("message", first["msg"])).removeprefix("Value error, ")
    # pydantic's wording names our classes ("a valid dictionary or instance of RouteMatch"),
    # and counts "items" of a text: say it as YAML does.
    message = _PYDANTIC_CLASS.sub("", message).replace(
        "List should have at least 1 item after validation, not 0",
        "must not be empty: give at least one").replace(
        "Input should be a valid list", "must be a list (YAML lines starting with '- ')")
    # A list, a mapping or a null where a scalar goes is shown as YAML writes it (QA 36-b F7).
    misplaced = "field" not in ctx and first["type"] in _SCALAR_ERRORS and (
        value is None or isinstance(value, dict | list))
    if misplaced or isinstance(value, bool):  # YAML's `true`, not Python's True
        value = _Flow(value)
    elif isinstance(value, dict | list) or (isinstance(value, str) and repr(value) in message):
        value = None  # a whole section would not fit on one line; the path says where
    key = str(ctx.get("field", loc[-1] if loc else ""))
    if value is not None and is_secret_key(key):
        value = MASK  # a password of the wrong type is still a password
    elif isinstance(value, str) and key == "url":
        value = shown_url(value)  # a server URL may carry a password (user:password@host)
    hint = "see cdc_router/examples/router.yaml"
    if first["type"] == "extra_forbidden":
        key, value = str(loc[-1]), None
        message = f"unknown key {key!r}"
        allowed = _keys_at(loc[:-1])
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"allowed here: {', '.join(allowed)}"
    elif first["type"] == "missing":
        message, value, hint = "is required", None, "add it to the file"
    elif isinstance(first.get("input"), bool) and first["type"] in ("string_type",
                                                                     "literal_error"):
        hint = "YAML reads yes/no/on/off/true/false as booleans: quote the value"
    more = error.error_count() - 1
    if more:
        hint += f" ({more} more problem{'s' if more > 1 else ''} after this one)"
    # The variable of the longest path that holds the error's (a section a variable brought,
    # or the field it set), named once.
    covering = [prefix for prefix in overridden
                if path == prefix or path.startswith((prefix + ".", prefix + "["))]
    if covering:
        source = f"{source} via environment variable {overridden[max(covering, key=len)]}"
    else:  # a check across fields may fail on a value a variable set (QA 43-a F3): the
        # variables of the fields the message names (review 43-2: not every one of a section)
        # Word edges by lookaround: `\b` after a list item's `]` never matched (review 53-c F4).
        named = sorted(name for prefix, name in overridden.items() if re.search(
            rf"(?<!\w){re.escape(prefix.rsplit('.', 1)[-1])}(?!\w)", message))
        if named:
            hint += f"; the environment sets {', '.join(named)}"
    return ConfigError(message, source=source, field=path or None, value=value, hint=hint)
