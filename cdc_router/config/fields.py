"""What every section of router.yaml shares: the frozen base model and its field types.

Model validators that check several fields raise `field_problem(field, ...)` so that the
ConfigError it turns into (config/load.py) still names the sub-field.
"""

from __future__ import annotations

import re
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from cdc_router.config.dsn import dsn_problem
from cdc_router.config.patterns import compile_pattern
from cdc_router.config.redact import is_secret_key
from cdc_router.config.yaml_text import written_text
from cdc_router.errors import ConfigError
from cdc_router.postgres import split_table


def list_config_items(value: str) -> frozenset[str]:
    """A topic config of Kafka's LIST type (cleanup.policy) as its items: a set, without the
    blanks the broker drops (`delete, compact` is compact,delete). The one reading of it
    (reread 50-i F6: config and router read cleanup.policy four ways)."""
    return frozenset(item.strip() for item in value.split(",") if item.strip())


def field_problem(field: str, message: str, value: object = None) -> PydanticCustomError:
    """An error for a model validator that still names the exact sub-field at fault."""
    return PydanticCustomError("field_problem", "{message}",
                               {"message": message, "field": field, "value": value})


def _stringify(value: Any) -> Any:
    """YAML gives ints and bools; librdkafka and topic configs want strings ('true', '100').

    Not for a credential: YAML rewrites an unquoted one it reads as a number (0123 is the
    octal 83, 1.10 is 1.1, 0x1F is 31), and the text it gives back would fail to decrypt a
    key or to log in with no sign of why (review 46-2 F10). Other keys' numbers are taken
    as the file writes them (broker.version.fallback: 0.10 stays 0.10, not 0.1); a boolean
    is true or false, whether written yes, on or true."""
    if not isinstance(value, dict):
        return value
    out: dict[Any, Any] = {}
    for key, item in value.items():
        if isinstance(item, bool | int | float) and is_secret_key(str(key)):
            kind = "a boolean" if isinstance(item, bool) else "a number"
            raise field_problem(str(key), f"YAML read the value as {kind} (value not shown), "
                                "which may not be the text the file holds (0123 reads as 83, "
                                "1.10 as 1.1); quote it")
        if isinstance(item, bool):
            out[key] = "true" if item else "false"
        elif isinstance(item, int | float):
            out[key] = written_text(item) or str(item)
        else:
            out[key] = item
    return out


def _topic_pattern(pattern: str) -> str:
    if not pattern:
        raise ValueError("a topic pattern cannot be empty")
    compile_pattern(pattern)
    return pattern


StringMap = Annotated[dict[str, str], BeforeValidator(_stringify)]


_LONG = re.compile(r"-?[0-9]{1,19}")


def _whole_numbers(config: dict[str, str]) -> dict[str, str]:
    """A topic config's times and sizes (`*.ms`, `*.bytes`) are Kafka longs: decimal digits,
    -1 for none. Refused at load (review 48-e F14: `retention.ms: nan` passed `rules check`
    and went to the broker)."""
    for key, value in config.items():
        if key.endswith((".ms", ".bytes")) and not _LONG.fullmatch(value):
            raise field_problem(key, "must be a whole number (milliseconds or bytes; -1 for "
                                "no limit)", value)
    return config


# A topic's configs (topics[].config, dead_letter.config, dedup.changelog_config, ...).
TopicConfig = Annotated[dict[str, str], BeforeValidator(_stringify),
                        AfterValidator(_whole_numbers)]

# Bounded (QA 33-b: 2^31 partitions was a traceback in `topics apply`): ten thousand is beyond
# any topic's need; librdkafka takes a replication factor up to ten thousand. Every section that
# names a topic's partitions or replicas uses it, so that it is refused at load with the field's
# name, not later by the TopicSpec that topic_specs() builds from it (review M1).
MAX_PARTITIONS_OR_REPLICAS = 10_000
TopicCount = Annotated[int, Field(ge=1, le=MAX_PARTITIONS_OR_REPLICAS)]  # partitions, replicas


def _text_values(value: Any) -> Any:
    """Header values are data, and YAML changes unquoted ones it reads as numbers or booleans
    (1.10 is 1.1, 01234 the octal 668, on is true): refuse them rather than send another text."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, bool | int | float):
                kind = next(kind for kind in (bool, int, float) if isinstance(item, kind))
                raise ValueError(f"the value of {key!r} is YAML's {kind.__name__} "
                                 f"{item!r}, which may not be what the file says (1.10 reads as "
                                 "1.1, 01234 as 668, on as true); quote it to send it as text")
    return value


TextMap = Annotated[dict[str, str], BeforeValidator(_text_values)]  # values taken as written


def refuse_blank(value: str, advice: str = "give a value, or leave the key out for its "
                 "default") -> str:
    """The one blank rule of names: ValueError for an empty or blank `value`."""
    if not value.strip():  # QA 57-d F-6: a transactional id prefix of three spaces loaded
        raise ValueError(f"must not be empty or blank: {advice}")
    return value


def _non_blank(value: str) -> str:
    return refuse_blank(value)


def _table_name(table: str) -> str:
    _non_blank(table)
    try:
        split_table(table)
    except ConfigError as error:  # pydantic's ValueError names the file and the field
        raise ValueError(error.args[0].partition(": ")[2]) from None
    return table


def _dsn(dsn: str | None) -> str | None:
    problem = dsn_problem(dsn) if dsn else None
    if problem:
        raise ValueError(problem)
    return dsn


NonBlank = Annotated[str, AfterValidator(_non_blank)]  # a name: blank is never meant
TableName = Annotated[str, AfterValidator(_table_name)]  # schema.table or table
Dsn = Annotated[str | None, AfterValidator(_dsn)]  # a Postgres connection string, never shown
Patterns = str | list[str]
TopicPattern = Annotated[str, AfterValidator(_topic_pattern)]  # exact, glob or re:regex


def _takes_number(annotation: Any) -> bool:
    """True for a field of a count or a duration: int or float (optional or bounded, or a
    subclass such as pydantic's ByteSize: review 48-e F2), not one that takes a boolean too."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _takes_number(args[0])
    if origin is Union or origin is UnionType:
        return bool not in args and any(_takes_number(arg) for arg in args)
    return isinstance(annotation, type) and issubclass(annotation, int | float) and \
        annotation is not bool


# A number of milliseconds as text (the environment's, or YAML's quoted): what int() reads.
_DECIMAL_TEXT = re.compile(r"\s*[+-]?[0-9][0-9_]*\s*")


def _reread_number(value: Any) -> str | None:
    """Why the number YAML 1.1 read is not the one the file's text says to a reader, or
    None: 010 is the octal 8, 1:30 is 90 in base 60 (review 48-e F3; 0x10 and 1_000 keep
    their meaning)."""
    text = written_text(value)
    if text is None:
        return None
    digits = text.replace("_", "").lstrip("+-")
    if ":" in digits:
        return f"YAML reads {text} as {value} (base 60, as a time); write {value}"
    if len(digits) > 1 and digits[0] == "0" and digits.isdigit():
        sign = "-" if text.startswith("-") else ""
        return (f"YAML reads {text} as the octal number {value}; write {value}, or "
                f"{sign}{int(digits)} for that decimal")
    return None


class ConfigModel(BaseModel):
    """A section of router.yaml: frozen after load, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_number(cls, value: Any, info: ValidationInfo) -> Any:
        # Review 46-2 F1: pydantic takes True for 1 (`dedup: {max_ids: true}` read as one id);
        # the environment's "true" is refused already, YAML's boolean was not.
        field = cls.model_fields.get(info.field_name or "")
        if field is None or not _takes_number(field.annotation):
            return value
        if isinstance(value, bool):
            raise ValueError("must be a number, not a boolean (YAML reads yes/no/on/off/"
                             "true/false as booleans); write the number")
        reread = _reread_number(value)
        if reread is not None:
            raise ValueError(reread)
        if isinstance(value, str) and (info.field_name or "").endswith("_ms") and \
                not _DECIMAL_TEXT.fullmatch(value):
            # QA 55-b F-4: `retention_ms: 7d` said "unable to parse string as an integer",
            # while `outbox purge --older-than` takes 7d.
            raise ValueError("takes an integer number of milliseconds, e.g. 604800000 for 7 "
                             "days (a duration with a unit, such as 7d, is not read here)")
        return value
