"""Options that several commands share, defined once."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

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
    return click.option("-c", "--config", "config_path", type=FilePath(), cls=EnvOption,
                        envvar="CDC_ROUTER_CONFIG", help=help, **kwargs)


# What Kafka takes as a group.instance.id (JoinGroupRequest.validateGroupInstanceId: ASCII
# alphanumerics, '.', '_', '-', at most 249), which the router's is with '.' and an 8-digit
# digest appended (router/clients.py static_member_id).
_KAFKA_ID = re.compile(r"[A-Za-z0-9._-]{1,240}")


class InstanceId(click.ParamType[str]):
    """A name unique per running instance: never empty (review 46-2 F9: `--instance-id
    "$POD_NAME"` with the variable unset gave every replica the transactional id
    `<prefix>-`, and they fenced each other in turn); for the router, one Kafka takes in a
    group.instance.id; for the relay, a log name without blanks."""

    name = "text"

    def __init__(self, *, kafka: bool) -> None:
        self.kafka = kafka

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        value = str(value)
        if not value.strip():
            self.fail("is empty: give a name unique per instance (the pod name), or leave the "
                      "option out for the host name", param, ctx)
        if self.kafka and (not _KAFKA_ID.fullmatch(value) or value in (".", "..")):
            self.fail(f"{value!r} is not a Kafka group.instance.id: use ASCII letters, digits, "
                      "'.', '_' and '-', at most 240 of them", param, ctx)
        if (not self.kafka and not value.isprintable()) or " " in value:
            self.fail(f"{value!r} holds a blank or a control character: give a name without",
                      param, ctx)
        return value


INSTANCE_ID_ENV = "CDC_ROUTER_INSTANCE_ID"


class EnvOption(click.Option):
    """An option whose environment variable, set but empty or blank, is refused naming it:
    click takes an empty variable for unset, so `CDC_ROUTER_CONNECT_URL="$URL"` with URL unset
    used the default, another stack's address, without a word (review 53-c F18; review 50-b
    F11: `CDC_ROUTER_INSTANCE_ID="$POD_NAME"` started as the host name)."""

    empty_hint = "give a value, or unset it for the default"
    _helping = False  # --help among the arguments left: refuse nothing (reread 53-k F-3)

    def handle_parse_result(self, ctx: click.Context, opts: Mapping[str, Any],
                            args: list[str]) -> tuple[Any, list[str]]:
        self._helping = any(arg in ctx.help_option_names for arg in args)
        return super().handle_parse_result(ctx, opts, args)

    def consume_value(self, ctx: click.Context,
                      opts: Mapping[str, click.Parameter]) -> tuple[Any, ParameterSource]:
        value, source = super().consume_value(ctx, opts)
        names = [self.envvar] if isinstance(self.envvar, str) else list(self.envvar or ())
        hint = self.empty_hint if not self.required else \
            f"give a value, or unset it and give {self.opts[-1]}"  # 53-k F-2: required
        for name in names if not self._helping else ():
            variable = os.environ.get(name)
            if source in (ParameterSource.ENVIRONMENT, ParameterSource.DEFAULT) and \
                    variable is not None and not variable.strip():
                raise click.BadParameter(f"{name} is set but {'blank' if variable else 'empty'}"
                                         f": {hint}", ctx=ctx, param=self)
        return value, source


class _InstanceIdOption(EnvOption):
    """An empty or blank CDC_ROUTER_INSTANCE_ID is refused as an empty --instance-id is: in a
    container the host name is new at each re-create, so a successor never fenced its
    predecessor."""

    empty_hint = "give a name unique per instance (the pod name), or unset it for the host name"


def instance_id_option(help: str, *, kafka: bool) -> Callable[[Any], Any]:
    """`--instance-id` [env CDC_ROUTER_INSTANCE_ID], by default the host name."""
    return click.option("--instance-id", envvar=INSTANCE_ID_ENV, cls=_InstanceIdOption,
                        type=InstanceId(kafka=kafka), default=socket.gethostname,
                        show_default="the host name", help=help)
