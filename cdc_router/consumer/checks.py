"""The idempotent consumer's argument checks, shared by its settings and its dedup stores
(without confluent_kafka's import that settings.py makes): the first check that fails is a
ConfigError naming the class and the field."""

from __future__ import annotations

from cdc_router.errors import ConfigError

# (passes, field, what it must be, its value)
Check = tuple[bool, str, str, object]


def check_all(source: str, checks: list[Check]) -> None:
    """Raise a ConfigError naming `source` and the field of the first failed check."""
    for ok, name, message, value in checks:
        if not ok:
            raise ConfigError(message, source=source, field=name, value=value)
