"""Resolve the stack's jars from Maven Central once, into a cache outside the repository."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from cdc_router.errors import StackError
from cdc_router.local.config import StackConfig
from cdc_router.local.versions import APICURIO_REGISTRY_VERSION

_POMS = Path(__file__).parent / "maven"
_COMPLETE = ".complete"
_REGISTRY_ARCHIVE = (Path("io/apicurio/apicurio-registry-app") / APICURIO_REGISTRY_VERSION /
                     f"apicurio-registry-app-{APICURIO_REGISTRY_VERSION}-all.tar.gz")


def ensure_jars(config: StackConfig, say: Callable[[str], None]) -> None:
    """Make the Kafka runtime and the Debezium plugin available; no network once cached."""
    _resolve("kafka", config.kafka_libs, config.jar_cache, say, excludes=())
    # Connect gives plugins its own Kafka and SLF4J classes; copies inside the plugin conflict.
    _resolve("debezium", config.plugin_path / "debezium-connector-postgres", config.jar_cache,
             say, excludes=("-DexcludeGroupIds=org.apache.kafka", "-DexcludeArtifactIds=slf4j-api"))


def _resolve(name: str, target: Path, cache: Path, say: Callable[[str], None],
             excludes: tuple[str, ...]) -> None:
    pom = _POMS / name / "pom.xml"
    if _is_complete(target, pom):
        return
    say(f"jars      resolving {name} from Maven Central into {target.parent}")
    with tempfile.TemporaryDirectory(dir=_mkdir(cache), prefix=f".{name}-") as work:
        staging = Path(work) / "libs"
        _maven(name, cache, Path(work), ["dependency:copy-dependencies",
                                         f"-DoutputDirectory={staging}",
                                         "-DincludeScope=runtime", *excludes])
        _install(staging, target, pom)


def ensure_registry(config: StackConfig, say: Callable[[str], None]) -> None:
    """Make Apicurio Registry's bundle available: one tar.gz (runner jar and lib/), fetched by
    the POM's `dependency:get` into the cache's Maven repository, then unpacked; no network
    once cached."""
    target, cache = config.registry_app, config.jar_cache
    pom = _POMS / "registry" / "pom.xml"
    if _is_complete(target, pom):
        return
    say(f"jars      resolving the schema registry from Maven Central into {target.parent}")
    with tempfile.TemporaryDirectory(dir=_mkdir(cache), prefix=".registry-") as work:
        _maven("registry", cache, Path(work), ["dependency:get"])
        staging = Path(work) / "app"
        with tarfile.open(cache / "m2" / _REGISTRY_ARCHIVE) as archive:
            # The "data" filter (no links out, no device files) exists from Python 3.11.4;
            # Debian bookworm's own python3 is 3.11.2.
            if hasattr(tarfile, "data_filter"):
                archive.extractall(staging, filter="data")
            else:
                archive.extractall(staging)
        _install(staging, target, pom)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


# Maven's own limit is 30 min per read (aether.connector.requestTimeout of Maven 3.9; Maven
# 3.8's wagon ignores it and reads maven.wagon.rto): a mirror that accepted connections and
# never answered hung `up` silently (review 48-b F4). Central answers in well under a second
# and a jar's bytes keep flowing, so 30 s without one is a repository that does not answer.
# Maven's three retries stay: a first install on a flaky link should not fail for one blip.
_MAVEN_NETWORK = ("-Daether.connector.connectTimeout=20000",
                  "-Daether.connector.requestTimeout=30000", "-Dmaven.wagon.rto=30000")
# The whole download, a bound over Maven's: Kafka's runtime is about 55 MB, the registry's
# bundle 115 MB: minutes on a slow link.
_MAVEN_TOTAL_S = 1200


def _maven(name: str, cache: Path, work: Path, goal: list[str]) -> None:
    """Run Maven on a copy of the POM `name` in `work` (it writes target/ beside the POM, so
    never in the package), its local repository under `cache`."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError("Maven (mvn) is not installed; it fetches the Kafka, Debezium and "
                         "schema registry jars: run `apt-get install -y maven`, then "
                         "`cdc-router local up` again")
    pom = work / "pom.xml"
    shutil.copyfile(_POMS / name / "pom.xml", pom)
    command = [mvn, "-B", "-q", "-f", str(pom), f"-Dmaven.repo.local={cache / 'm2'}",
               *_MAVEN_NETWORK, *goal]
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False,
                                timeout=_MAVEN_TOTAL_S)
    except subprocess.TimeoutExpired:
        raise StackError(f"Maven did not finish downloading the {name} jars within "
                         f"{_MAVEN_TOTAL_S // 60} min: a repository it uses (Maven Central, or a "
                         "mirror or proxy of ~/.m2/settings.xml) accepts connections but does "
                         "not answer; check it (`mvn -X` names the URLs), then run `up` "
                         "again") from None
    if result.returncode != 0:
        errors = [line for line in result.stdout.splitlines() if "ERROR" in line]
        detail = errors[0] if errors else (result.stderr.strip().splitlines() or ["?"])[-1]
        raise StackError(f"downloading the {name} jars from Maven Central failed: "
                         f"{detail.replace('[ERROR] ', '').strip()} "
                         "(check that Maven Central is reachable, then run `up` again)")


def _is_complete(target: Path, pom: Path) -> bool:
    """Whether `target` holds a whole download of this very POM: one of an earlier POM (a
    dependency added since), or one whose jars were removed since, is resolved again."""
    marker = target / _COMPLETE
    return (marker.exists() and marker.read_text().strip() == _digest(pom)
            # Review 48-b F11: a cache cleaned of its jars kept the marker, and Connect ran
            # without Debezium.
            and any(target.glob("*.jar")))


def _digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def _install(staging: Path, target: Path, pom: Path) -> None:
    """Move a complete download into place, marked complete (with its POM's digest) only once
    whole."""
    (staging / _COMPLETE).write_text(_digest(pom) + "\n")
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(target)
