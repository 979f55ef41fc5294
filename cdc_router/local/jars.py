"""Resolve the stack's jars from Maven Central once, into a cache outside the repository."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from cdc_router.errors import StackError
from cdc_router.local.config import StackConfig

_POMS = Path(__file__).parent / "maven"
_COMPLETE = ".complete"


def ensure_jars(config: StackConfig, say: Callable[[str], None]) -> None:
    """Make the Kafka runtime and the Debezium plugin available; no network once cached."""
    _resolve("kafka", config.kafka_libs, config.jar_cache, say, excludes=())
    # Connect gives plugins its own Kafka and SLF4J classes; copies inside the plugin conflict.
    _resolve("debezium", config.plugin_path / "debezium-connector-postgres", config.jar_cache,
             say, excludes=("-DexcludeGroupIds=org.apache.kafka", "-DexcludeArtifactIds=slf4j-api"))


def _resolve(name: str, target: Path, cache: Path, say: Callable[[str], None],
             excludes: tuple[str, ...]) -> None:
    if (target / _COMPLETE).exists():
        return
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError("Maven (mvn) is not installed; it fetches the Kafka and Debezium jars: "
                         "run `apt-get install -y maven`, then `cdc-router local up` again")
    say(f"jars      resolving {name} from Maven Central into {target.parent}")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=f".{name}-") as work:
        # Maven writes target/ beside the POM, so run it on a copy, never in the package.
        pom = Path(work) / "pom.xml"
        shutil.copyfile(_POMS / name / "pom.xml", pom)
        staging = Path(work) / "libs"
        command = [mvn, "-B", "-q", "-f", str(pom), f"-Dmaven.repo.local={cache / 'm2'}",
                   "dependency:copy-dependencies", f"-DoutputDirectory={staging}",
                   "-DincludeScope=runtime", *excludes]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            errors = [line for line in result.stdout.splitlines() if "ERROR" in line]
            detail = errors[0] if errors else (result.stderr.strip().splitlines() or ["?"])[-1]
            raise StackError(f"downloading the {name} jars from Maven Central failed: "
                             f"{detail.replace('[ERROR] ', '').strip()} "
                             "(check that Maven Central is reachable, then run `up` again)")
        (staging / _COMPLETE).write_text("")
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(target)
