"""Serving HTTP on a port given on the command line."""

from __future__ import annotations

from collections.abc import Callable

from cdc_router.errors import ConfigError


def serve_on(option: str, port: int, serve: Callable[[], object], hint: str) -> None:
    """Run `serve()`; a port it cannot bind (in use, privileged) is a ConfigError naming
    `option`, not a traceback."""
    try:
        serve()
    except OSError as error:
        raise ConfigError(f"cannot serve /metrics on port {port}: {error.strerror or error}",
                          source="command line", field=option, hint=hint) from None
