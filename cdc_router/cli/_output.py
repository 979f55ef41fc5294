"""`-o text|json` for read commands: one option, one function that prints either way."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from cdc_router.config.utf8 import utf8_encodable
from cdc_router.errors import printable

F = TypeVar("F", bound=Callable[..., Any])


def output_option(command: F) -> F:
    """Add `-o/--output text|json` (passed to the command as `output`)."""
    return click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text",
                        show_default=True, help="Output format; json is stable for scripts.",
                        )(command)


def json_text(document: Any) -> str:
    """`document` as indented JSON, non-ASCII as is, unless a value holds a lone surrogate (a
    header's "\\ud800", QA 60-c F-3: UTF-8 cannot write it, and the whole document was lost to a
    stack trace): then every non-ASCII character escaped."""
    text = json.dumps(document, indent=2, ensure_ascii=False)
    return text if utf8_encodable(text) else json.dumps(document, indent=2)


class UsageExitCommand(click.Command):
    """A command whose own exit codes give 2 a meaning (`status`: critical; `connectors
    diff`: differs): a usage error exits `usage_exit_code` instead of click's 2."""

    usage_exit_code = 1

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with _usage_exit(self.usage_exit_code):
            return super().parse_args(ctx, args)


class UsageExitGroup(click.Group):
    """A group whose usage errors, its own options, an unknown command and its commands'
    options, exit 1 (`connectors`: review 31-2, `connectors --bogus diff` read as "differs")."""

    command_class = UsageExitCommand

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with _usage_exit(UsageExitCommand.usage_exit_code):
            return super().parse_args(ctx, args)

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        with _usage_exit(UsageExitCommand.usage_exit_code):
            return super().resolve_command(ctx, args)


@contextmanager
def _usage_exit(code: int) -> Iterator[None]:
    try:
        yield
    except click.UsageError as error:
        error.exit_code = code
        raise


def emit(value: Any, output: str, text: Callable[[Any], str]) -> None:
    """Print `value` as indented JSON, or as `text(value)` for people."""
    if output == "json":
        click.echo(json.dumps(value, indent=2, default=_jsonable))
    else:
        click.echo(text(value))


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces, headers first."""
    cells = [[printable(str(cell)) for cell in row] for row in [headers, *rows]]
    widths = [max(len(row[index]) for row in cells) for index in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                     .rstrip() for row in cells)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def age_text(seconds: float | None) -> str:
    """An age for people: seconds, then minutes, hours, days (QA 43-a F9: a row dated 1900
    read "4005416242.9s ago")."""
    if seconds is None:
        return "-"
    for unit, size_s in (("days", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size_s:
            return f"{seconds / size_s:,.1f} {unit} ago"
    return f"{seconds:.1f}s ago"
