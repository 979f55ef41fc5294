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
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from cdc_router.config.compiled import CompiledConfig, compile_config
from cdc_router.config.model import RouterConfig
from cdc_router.config.overrides import apply_env, known_field, variable_of
from cdc_router.config.overrides import dotted as _dotted
from cdc_router.config.placeholders import unexpanded
from cdc_router.config.redact import MASK, is_secret_key, redact, shown_url
from cdc_router.config.yaml_text import parsed_yaml
from cdc_router.errors import ConfigError, show

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
    where the field takes a list or a mapping (see config/overrides).
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
    overridden = apply_env(raw, env or {}, source)
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


def _refuse_unexpanded(raw: dict[str, Any], overridden: dict[str, str], source: str) -> None:
    """ConfigError for a `${NAME}` left in a value of the file (QA 57-d F-1: a forgotten
    envsubst passed as a match pattern, a group id, a password); a value a variable sets is
    taken as it is, so that a password may hold one. A key the model does not know is left to
    pydantic, whose "unknown key ...; did you mean" is the better clue (review 57-b F-1)."""
    for path, text, placeholder, name in unexpanded(raw):
        dotted = _dotted(path)
        if not known_field(path) or any(
                dotted == prefix or dotted.startswith((prefix + ".", prefix + "["))
                for prefix in overridden):
            continue
        key = str(path[-1])
        if len(path) == 3 and path[0] == "routes" and key == "topic" and not name.isupper():
            # review 49-f F6: the SMT's route.topic.replacement, copied over
            raise ConfigError(f"{show(text)} is written as the EventRouter SMT's "
                              "route.topic.replacement: here a field is {aggregate_type} (the "
                              "SMT's ${routedByValue} with its default route.by.field; {type}, "
                              "{aggregate_id} or {id} for those columns), without the '$'",
                              source=source, field=dotted)
        key = next((str(part) for part in reversed(path) if isinstance(part, str)), "")
        shown = redact(key, text) or ""
        # review 57-b F-4: a placeholder inside a masked secret ('Tr0ub${a}dor') is a piece of
        # it; it is named only when it is the whole value or the masked text shows it.
        what = placeholder if placeholder == text or placeholder in shown else "a ${...} in it"
        # QA 57-d: GNU envsubst leaves ${NAME:-default} (and :?, -, ?) as it is.
        envsubst = (f"run the file through envsubst (-c <(envsubst < {source})), or set "
                    if placeholder == f"${{{name}}}" else
                    "envsubst expands ${NAME} only, not ${NAME:-default}: set ")
        raise ConfigError(f"{what} is not expanded: router.yaml is read as it is",
                          source=source, field=dotted, value=shown,
                          hint=f"{envsubst}{variable_of(path)} instead")


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
