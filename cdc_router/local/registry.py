"""The stack's optional schema registry: Apicurio Registry (`local up --with registry`).

Apicurio is the Confluent-compatible registry that Maven Central serves as a runnable bundle
(Confluent's own is not there). The router and the CLI speak the Confluent API, which it
serves under /apis/ccompat/v7. Its schemas live in an H2 file under the stack's home, so they
outlive a restart, as Kafka's topics do (and the ids in their records).
"""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request

from cdc_router.local import process
from cdc_router.local.config import StackConfig
from cdc_router.local.versions import APICURIO_REGISTRY_VERSION


def registry_command(config: StackConfig) -> list[str]:
    """The registry's java command line; its temporary directory under the home is also
    what the pid check finds in it (a pid may be reused)."""
    java = shutil.which("java") or "java"
    runner = config.registry_app / f"apicurio-registry-app-{APICURIO_REGISTRY_VERSION}-runner.jar"
    return [java, f"-Xmx{config.registry_heap_mb}m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Djava.io.tmpdir={config.part_dir('registry') / 'tmp'}", "-jar", str(runner)]


def registry_environment(config: StackConfig) -> dict[str, str]:
    """Apicurio's settings (Quarkus reads them from the environment)."""
    return {
        "QUARKUS_HTTP_HOST": config.host,
        "QUARKUS_HTTP_PORT": str(config.registry_port),
        # Confluent's default level; Apicurio's own is NONE, which would accept any change.
        "APICURIO_RULES_GLOBAL_COMPATIBILITY": "BACKWARD",
        # Look-ups and re-registrations ignore formatting, as Confluent's do: without it a
        # schema file re-indented is a new version, and its look-up a 40403.
        "APICURIO_CCOMPAT_USE_CANONICAL_HASH": "true",
        # On disk, not the default in-memory H2: ids in Kafka's records must outlive a restart.
        "APICURIO_DATASOURCE_URL": f"jdbc:h2:file:{config.registry_data / 'registry'}",
        # Apicurio opens 20 connections at start, each within Agroal's 5 s: after a kill -9,
        # on a loaded host, H2's recovery of the file outlasted that and the registry never
        # came up again (QA 36-d). One local user needs few; recovery may take its time.
        "APICURIO_DATASOURCE_JDBC_INITIAL_SIZE": "2",
        "APICURIO_DATASOURCE_JDBC_MIN_SIZE": "2",
        "QUARKUS_DATASOURCE_H2_JDBC_ACQUISITION_TIMEOUT": "120S",
    }


def start_registry(config: StackConfig) -> int:
    """Spawn the registry (its bundle already fetched); its pid."""
    base = config.part_dir("registry")
    for directory in (base / "tmp", config.registry_data):
        directory.mkdir(parents=True, exist_ok=True)
    return process.spawn(registry_command(config), log_path=config.log_path("registry"),
                         pid_path=config.pid_path("registry"),
                         env={**_inherited(), **registry_environment(config)}, cwd=base)


def registry_healthy(config: StackConfig) -> bool:
    """The Confluent API answers (the storage is initialised before the HTTP server starts)."""
    try:
        with urllib.request.urlopen(f"{config.registry_url}/subjects", timeout=3) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _inherited() -> dict[str, str]:
    # PATH, HOME, locale and the like; never another stack's APICURIO_* or QUARKUS_* settings.
    return {key: value for key, value in os.environ.items()
            if not key.startswith(("APICURIO_", "QUARKUS_"))}
