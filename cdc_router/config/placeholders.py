"""`${NAME}` / `${NAME:-default}` expansion for connector files, leaving Connect's own references.

Two syntaxes share the `${...}` brackets in a connector file:

- ours, expanded here from an environment mapping before the config is sent:
  `${NAME}` and `${NAME:-default}`, NAME matching `[A-Z_][A-Z0-9_]*`;
- Kafka Connect config-provider references such as `${env:CDC_ROUTER_DB_PASSWORD}` or
  `${file:/etc/secrets.properties:password}`, which must reach Connect verbatim so that the
  secret is resolved inside the worker and never travels through (or is stored by) our client.

Anything else inside `${...}` belongs to someone else and is sent verbatim too: Debezium's
EventRouter SMT, for one, puts `${routedByValue}` in `route.topic.replacement` and resolves it
per record, so refusing (or expanding) it would make a user's EventRouter connector unusable.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from cdc_router.errors import ConfigError

_REFERENCE = re.compile(r"\$\{([^}]*)\}")
_UNCLOSED = re.compile(r"\$\{[^}]*$")
_OURS = re.compile(r"(?P<name>[A-Z_][A-Z0-9_]*)(?::-(?P<default>.*))?", re.DOTALL)
# Connect's ConfigTransformer pattern is `${provider:[path:]key}`, provider a word.
_PROVIDER = re.compile(r"[A-Za-z0-9_.-]+:.+", re.DOTALL)


def expand(text: str, env: Mapping[str, str], *, source: str, field: str | None = None) -> str:
    """Return `text` with our placeholders replaced by values from `env`.

    Config-provider references and any other `${...}` (e.g. `${routedByValue}`) are left
    untouched. An unset `${NAME}` without a default raises ConfigError naming `source` (the
    file) and `field`.
    An empty default (`${NAME:-}`) expands to the empty string; a variable set to the empty
    string counts as set (as in POSIX `${NAME-default}` it is not replaced by the default).
    """

    def replace(match: re.Match[str]) -> str:
        inner = match.group(1)
        ours = _OURS.fullmatch(inner)
        if ours is not None:
            name, default = ours.group("name"), ours.group("default")
            if default is not None and "${" in default:
                raise ConfigError(
                    f"nested placeholder in the default of ${{{name}}}", source=source,
                    field=field, hint="defaults are literal text",
                )
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(
                f"${{{name}}} is not set and has no default", source=source, field=field,
                hint=f"export {name}=... or write ${{{name}:-default}}",
            )
        return match.group(0)  # a provider reference, or another tool's: not ours to touch

    return _REFERENCE.sub(replace, text)


def expand_tree(value: Any, env: Mapping[str, str], *, source: str, path: str = "") -> Any:
    """Expand placeholders in every string (keys and values) of a JSON-like tree.

    Expanding parsed values rather than raw file text means a value containing quotes or
    backslashes can never break the JSON structure.
    """
    if isinstance(value, str):
        return expand(value, env, source=source, field=path or None)
    if isinstance(value, dict):
        expanded: dict[str, Any] = {}
        for key, item in value.items():
            new_key = expand(key, env, source=source, field=path or None)
            child = f"{path}.{new_key}" if path else new_key
            expanded[new_key] = expand_tree(item, env, source=source, path=child)
        return expanded
    if isinstance(value, list):
        return [expand_tree(item, env, source=source, path=f"{path}[{index}]")
                for index, item in enumerate(value)]
    return value


def unclosed(text: str) -> bool:
    """Whether `text` has a `${` that no `}` closes (sent as it is, it reached Connect)."""
    return _UNCLOSED.search(_REFERENCE.sub("", text)) is not None


def provider_references(text: str) -> list[str]:
    """List the Connect config-provider references (`${provider:...}`) in `text`."""
    return [match.group(0) for match in _REFERENCE.finditer(text)
            if _OURS.fullmatch(match.group(1)) is None and _PROVIDER.fullmatch(match.group(1))]


# What envsubst or a compose file would have replaced: `${NAME}`, `${NAME:-default}` (also `-`,
# `:?`, `?`), NAME a shell variable's name. Only that exact shape: a `$` or `${` elsewhere in a
# value (a password `pa$$word`, a regex `x${2}`) is text.
_SHELL_PLACEHOLDER = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::?[-?][^}]*)?\}")


def unexpanded(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[
        tuple[tuple[str | int, ...], str, str, str]]:
    """(path, text, placeholder, NAME) for each string of a parsed YAML tree holding a `${NAME}`
    that was meant to be expanded before the file was read (router.yaml is read as it is)."""
    if isinstance(value, str):
        found = _SHELL_PLACEHOLDER.search(value)
        if found is not None:
            yield path, value, found.group(0), found.group("name")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from unexpanded(item, (*path, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from unexpanded(item, (*path, index))
