"""A real schema registry (Apicurio, the local stack's) for the tests that stop and restart it:
its own process on a free port under a home of the test's, its schemas in an H2 file there,
so a restart keeps them."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

from cdc_router.local.config import StackConfig
from tests.integration.optional_part import OptionalPart, running
from tests.integration.support import free_port


class RegistryServer(OptionalPart):
    """Apicurio under `home`, on a free port; start() again serves the same schemas."""

    def __init__(self, home: Path, jar_cache: Path) -> None:
        super().__init__(StackConfig(home=home.resolve(), jar_cache=jar_cache,
                                     registry_port=free_port()), "registry")
        self.url = self.config.registry_url


def registry_server(home: Path, jar_cache: Path) -> AbstractContextManager[RegistryServer]:
    """A started RegistryServer under `home`, stopped at the end."""
    return running(RegistryServer(home, jar_cache))
