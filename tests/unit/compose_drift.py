"""What docker/docker-compose.yml configures, compared with the local stack (cdc_router/local/).

Pure: reads docker/docker-compose.yml with PyYAML, interpolated with docker/.env.example as
Compose does, and models how each image turns its environment into configuration:

- apache/kafka (kafka.docker.KafkaDockerWrapper): KAFKA_FOO_BAR -> foo.bar, `__` -> `_`,
  `___` -> `-`, except a few KAFKA_*_OPTS-style variables;
- quay.io/debezium/connect (its docker-entrypoint.sh): BOOTSTRAP_SERVERS, GROUP_ID,
  *_STORAGE_TOPIC, KEY/VALUE_CONVERTER, OFFSET_FLUSH_* ... are exported over their CONNECT_*
  twins (with defaults), then every CONNECT_FOO_BAR becomes foo.bar.

Each `*_drift` function returns readable problems, empty when docker/ matches the local stack;
tests/unit/test_docker_drift.py runs them and proves that they catch a change.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from cdc_router.config.placeholders import expand_tree, provider_references
from cdc_router.errors import ConfigError
from cdc_router.local import config as local
from cdc_router.local.versions import DEBEZIUM_VERSION, KAFKA_VERSION, POSTGRES_MAJOR

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "docker-compose.yml"
ENV_EXAMPLE = DOCKER / ".env.example"
CONNECTOR_FILE = REPO / "connectors" / "outbox-connector.json"
ROUTER_CONFIG = REPO / "cdc_router" / "examples" / "router.yaml"
REPLICATION_ROLE = "debezium"

# Local settings that may differ in containers, with the reason; every other one must match.
KAFKA_LOCAL_ONLY = {
    "listeners": "addresses", "advertised.listeners": "addresses",
    "controller.quorum.voters": "addresses", "log.dirs": "a path on the host",
    "listener.security.protocol.map": "docker adds a HOST listener for clients on the host",
}
CONNECT_LOCAL_ONLY = {
    "bootstrap.servers": "addresses", "listeners": "addresses",
    "rest.advertised.host.name": "addresses", "rest.advertised.port": "addresses",
    "plugin.path": "the image has its own plugin directory",
    "plugin.discovery": "the image bundles more plugins than the local Debezium Postgres one",
}
POSTGRES_LOCAL_ONLY = {"listen_addresses", "port", "unix_socket_directories"}
# Where the connector finds Postgres in docker: the postgres service, its container port.
CONNECTOR_ADDRESS = {"database.hostname": "postgres", "database.port": "5432"}

# --- reading the compose file as Compose would --------------------------------------------------

_REFERENCE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))")
_BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|-|:\?|\?)(?P<arg>.*))?",
                     re.DOTALL)


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's substitution: $V, ${V}, ${V:-default}, ${V-default}, ${V:?err}, ${V?err}, $$."""

    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        if match["named"]:
            return env.get(match["named"], "")
        braced = _BRACED.fullmatch(match["braced"])
        if braced is None:
            raise ValueError(f"invalid interpolation {match.group(0)!r}")
        name, op, arg = braced["name"], braced["op"], braced["arg"] or ""
        value = env.get(name)
        unset = value is None or (op in (":-", ":?") and value == "")
        if unset and op in (":?", "?"):
            raise ValueError(f"{name} is required: {arg}")
        if unset and op in (":-", "-"):
            return arg
        return value or ""

    return _REFERENCE.sub(replace, text)


def read_env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines()
             if "=" in line and not line.lstrip().startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def _interpolate_tree(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, dict):
        return {key: _interpolate_tree(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [_interpolate_tree(item, env) for item in node]
    return node


def load_compose() -> dict[str, Any]:
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    return dict(_interpolate_tree(raw, read_env_file(ENV_EXAMPLE)))


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's environment as strings (mapping or KEY=VALUE list form)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return {key: ("true" if value else "false") if isinstance(value, bool) else str(value)
            for key, value in env.items() if value is not None}


def mounts(service: Mapping[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts (relative to docker/)."""
    found: dict[str, Path] = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume.get("source", ""), volume.get("target", "")
        if source.startswith((".", "/")):
            found[target] = (DOCKER / source).resolve()
    return found


def image_tag(compose: Mapping[str, Any], service: str) -> tuple[str, str]:
    name, _, tag = str(compose["services"][service]["image"]).rpartition(":")
    return name, tag


# --- how the images read their environment ------------------------------------------------------

# KafkaDockerWrapper's ExcludeServerPropsEnv, as spelled there: KAFKA_HEAP_OPTS is not in it and
# also lands in server.properties as heap.opts, which the broker ignores.
KAFKA_IMAGE_NOT_PROPERTIES = frozenset({
    "KAFKA_VERSION", "KAFKA_HEAP_OPT", "KAFKA_LOG4J_OPTS", "KAFKA_OPTS", "KAFKA_JMX_OPTS",
    "KAFKA_JVM_PERFORMANCE_OPTS", "KAFKA_GC_LOG_OPTS", "KAFKA_LOG4J_ROOT_LOGLEVEL",
    "KAFKA_LOG4J_LOGGERS", "KAFKA_TOOLS_LOG4J_LOGLEVEL", "KAFKA_JMX_HOSTNAME",
})


def kafka_image_properties(env: Mapping[str, str]) -> dict[str, str]:
    """server.properties as the apache/kafka image writes it from KAFKA_* variables."""
    return {name.replace("KAFKA_", "").lower().replace("_", ".").replace("...", "-")
            .replace("..", "_"): value
            for name, value in env.items()
            if name.startswith("KAFKA_") and name not in KAFKA_IMAGE_NOT_PROPERTIES}


_JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
# Plain variable -> (worker property, the entrypoint's default; None: set only when given).
CONNECT_IMAGE_VARIABLES: dict[str, tuple[str, str | None]] = {
    "BOOTSTRAP_SERVERS": ("bootstrap.servers", "0.0.0.0:9092"),
    "GROUP_ID": ("group.id", "1"),
    "CONFIG_STORAGE_TOPIC": ("config.storage.topic", ""),
    "OFFSET_STORAGE_TOPIC": ("offset.storage.topic", ""),
    "STATUS_STORAGE_TOPIC": ("status.storage.topic", None),
    "KEY_CONVERTER": ("key.converter", _JSON_CONVERTER),
    "VALUE_CONVERTER": ("value.converter", _JSON_CONVERTER),
    "OFFSET_FLUSH_INTERVAL_MS": ("offset.flush.interval.ms", "60000"),
    "OFFSET_FLUSH_TIMEOUT_MS": ("offset.flush.timeout.ms", "5000"),
    "SHUTDOWN_TIMEOUT": ("task.shutdown.graceful.timeout.ms", "10000"),
    "REST_PORT": ("rest.port", "8083"),
    "ADVERTISED_PORT": ("rest.advertised.port", "8083"),
    "REST_HOST_NAME": ("rest.host.name", "<container address>"),
    "ADVERTISED_HOST_NAME": ("rest.advertised.host.name", "<container address>"),
}


def _connect_property(name: str) -> str:
    return name.removeprefix("CONNECT_").lower().replace("_", ".")


def connect_image_properties(env: Mapping[str, str]) -> dict[str, str]:
    """The worker properties that the Debezium Connect image's entrypoint sets."""
    props = {_connect_property(name): value for name, value in env.items()
             if name.startswith("CONNECT_") and not name.startswith("CONNECT_LOG4J")}
    for variable, (prop, default) in CONNECT_IMAGE_VARIABLES.items():
        value = env.get(variable) or default
        if variable.endswith("_CONVERTER") and env.get("APICURIO_REGISTRY"):
            value = "io.apicurio.registry.utils.converter.AvroConverter"
        if value is not None:
            props[prop] = value
    return props


# --- the checks ---------------------------------------------------------------------------------


def _compare(what: str, expected: Mapping[str, str], actual: Mapping[str, str],
             how: Callable[[str], str]) -> list[str]:
    problems = []
    for key, value in expected.items():
        if key not in actual:
            problems.append(f"{what}: {key} is not set (expected {value!r}; set {how(key)})")
        elif actual[key] != value:
            problems.append(f"{what}: {key} is {actual[key]!r}, the local stack has {value!r} "
                            f"(set by {how(key)})")
    return problems


def version_drift(compose: Mapping[str, Any]) -> list[str]:
    expected = {"kafka": ("apache/kafka", KAFKA_VERSION),
                "connect": ("quay.io/debezium/connect", DEBEZIUM_VERSION)}
    problems = [f"{service}: image {':'.join(image_tag(compose, service))}, versions.py pins "
                f"{':'.join(pinned)}"
                for service, pinned in expected.items() if image_tag(compose, service) != pinned]
    name, tag = image_tag(compose, "postgres")
    if name != "postgres" or re.split(r"[.-]", tag)[0] != str(POSTGRES_MAJOR):
        problems.append(f"postgres: image {name}:{tag}, versions.py pins major {POSTGRES_MAJOR}")
    return problems


def _local_stack() -> local.StackConfig:
    return local.StackConfig(home=Path("/nonexistent"), jar_cache=Path("/nonexistent"))


def _expected(rendered: Mapping[str, str], local_only: Mapping[str, str],
              contract: Mapping[str, str]) -> dict[str, str]:
    """The contract, and every other local setting that is not about addresses or paths."""
    return {**{key: value for key, value in rendered.items() if key not in local_only},
            **contract}


def broker_drift(compose: Mapping[str, Any], contract: Mapping[str, str] = local.BROKER_CONTRACT,
                 stack: local.StackConfig | None = None) -> list[str]:
    expected = _expected(local.kafka_properties(stack or _local_stack()), KAFKA_LOCAL_ONLY,
                         contract)
    actual = kafka_image_properties(environment(compose["services"]["kafka"]))
    return _compare("kafka", expected, actual,
                    lambda key: "KAFKA_" + key.replace("_", "__").replace(".", "_").upper())


def connect_drift(compose: Mapping[str, Any], contract: Mapping[str, str] = local.CONNECT_CONTRACT,
                  stack: local.StackConfig | None = None) -> list[str]:
    """Also reports CONNECT_* variables that the image's entrypoint overwrites."""
    expected = _expected(local.connect_properties(stack or _local_stack()), CONNECT_LOCAL_ONLY,
                         contract)
    env = environment(compose["services"]["connect"])
    plain = {prop: variable for variable, (prop, _) in CONNECT_IMAGE_VARIABLES.items()}
    problems = [f"connect: {name} is overwritten by the image's entrypoint; set "
                f"{plain[_connect_property(name)]} instead"
                for name in env if name.startswith("CONNECT_") and _connect_property(name) in plain]
    return problems + _compare(
        "connect", expected, connect_image_properties(env),
        lambda key: plain.get(key, "CONNECT_" + key.replace(".", "_").upper()))


def postgres_drift(compose: Mapping[str, Any]) -> list[str]:
    expected = {}
    for line in local.postgres_conf(_local_stack()).splitlines():
        key, _, value = (part.strip() for part in line.partition("="))
        if key not in POSTGRES_LOCAL_ONLY:
            expected[key] = value.strip("'")
    args = [str(arg) for arg in compose["services"]["postgres"].get("command") or []]
    actual = dict(args[i + 1].split("=", 1) for i, arg in enumerate(args) if arg == "-c")
    return _compare("postgres", expected, actual, lambda key: f"`-c {key}=...` in its command")


def init_commands(compose: Mapping[str, Any]) -> list[list[str]]:
    command = compose["services"]["init"]["command"]
    script = "\n".join(command) if isinstance(command, list) else str(command)
    return [shlex.split(line) for line in script.splitlines()
            if line.strip().startswith("cdc-router ")]


def is_command(argv: list[str], group: str, command: str) -> bool:
    """`cdc-router GROUP [group options] COMMAND ...`."""
    return argv[1] == group and command in argv[2:]


def option_value(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg in names:
            return argv[i + 1]
    return None


def _expanded(parsed: Any, env: Mapping[str, str], where: str) -> dict[str, Any]:
    """The connector's name and config after `connectors apply` expanded its placeholders."""
    try:
        tree = expand_tree(parsed, env, source=where)
    except ConfigError as error:
        return {"<error>": str(error)}
    return {"name": tree.get("name"), **tree.get("config", {})}


def connector_drift(compose: Mapping[str, Any], connector_text: str | None = None) -> list[str]:
    """init applies connectors/outbox-connector.json, with local values but for addresses.

    The local stack applies the file with its defaults; in docker the init service's environment
    fills the placeholders. Both must give the same connector, except that docker's must point
    at the postgres service. Connect must have each `${env:VAR}` the file makes it resolve.
    """
    services = compose["services"]
    init_env, connect_env = environment(services["init"]), environment(services["connect"])
    commands = init_commands(compose)
    applies = [argv for argv in commands if is_command(argv, "connectors", "apply")]
    if len(applies) != 1:
        return [f"init: expected one `cdc-router connectors apply`, found {len(applies)}"]
    problems = []
    path = option_value(applies[0], "-f", "--file") or ""
    host = next((source / path.removeprefix(target).lstrip("/")
                 for target, source in mounts(services["init"]).items()
                 if path == target or path.startswith(target.rstrip("/") + "/")), None)
    if host != CONNECTOR_FILE:
        problems.append(f"init: applies {path!r} (on the host: {host}), not {CONNECTOR_FILE}")
    if connector_text is None:
        if not CONNECTOR_FILE.exists():
            return [*problems, f"{CONNECTOR_FILE} does not exist"]
        connector_text = CONNECTOR_FILE.read_text()
    for reference in provider_references(connector_text):
        name = reference.removeprefix("${env:").removesuffix("}")
        if reference.startswith("${env:") and name not in connect_env:
            problems.append(f"connect: the connector resolves {reference} but {name} is not "
                            "in the connect service's environment")
    parsed = json.loads(connector_text)
    in_docker = _expanded(parsed, init_env, "the init service")
    on_local = _expanded(parsed, {}, "the local stack (defaults)")
    problems += [f"connector: {key} is {in_docker.get(key)!r} in docker, "
                 f"{on_local.get(key)!r} on the local stack"
                 for key in sorted(in_docker.keys() | on_local.keys())
                 if key not in CONNECTOR_ADDRESS and in_docker.get(key) != on_local.get(key)]
    problems += [f"connector: {key} is {in_docker.get(key)!r} in docker, where Postgres is "
                 f"{value!r} (set its placeholder in the init service's environment)"
                 for key, value in CONNECTOR_ADDRESS.items() if in_docker.get(key) != value]
    waited = [argv[argv.index("wait") + 1] for argv in commands
              if is_command(argv, "connectors", "wait") and len(argv) > argv.index("wait") + 1]
    problems += [f"init: waits for connector {name!r}, the file names {in_docker.get('name')!r}"
                 for name in waited if name != in_docker.get("name")]
    outbox_init = [argv for argv in commands if is_command(argv, "outbox", "init")]
    role = option_value(outbox_init[0], "--replication-role") if outbox_init else None
    if in_docker.get("database.user") != role:
        problems.append(f"connector: database.user is {in_docker.get('database.user')!r} but "
                        f"init creates the replication role {role!r}")
    return problems
