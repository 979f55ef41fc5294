"""Options that several commands share, defined once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

_CONFIG_HELP = "router.yaml [env CDC_ROUTER_CONFIG]."


class FilePath(click.Path):
    """A path that refuses the empty string, which pathlib reads as `.` (QA 33-b: `-c ''` named
    the working directory instead of the empty value)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(path_type=Path, **kwargs)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "":
            self.fail("is empty: give the path of a file", param, ctx)
        return super().convert(value, param, ctx)


def config_option(help: str = _CONFIG_HELP, **kwargs: Any) -> Callable[[Any], Any]:
    """`-c/--config`, the router.yaml every command reads; required unless given a default."""
    kwargs.setdefault("required", "default" not in kwargs)
    return click.option("-c", "--config", "config_path", type=FilePath(),
                        envvar="CDC_ROUTER_CONFIG", help=help, **kwargs)
