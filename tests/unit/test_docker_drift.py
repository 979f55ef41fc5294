"""docker/ and the local stack (cdc_router/local/) must describe the same pipeline.

Pure (PyYAML, no Docker engine); the model of the images and the checks are in compose_drift.py.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_router.local import config as local
from tests.unit.compose_drift import (
    COMPOSE_FILE,
    DOCKER,
    ENV_EXAMPLE,
    REPLICATION_ROLE,
    REPO,
    ROUTER_CONFIG,
    broker_drift,
    connect_drift,
    connector_drift,
    environment,
    init_commands,
    interpolate,
    is_command,
    kafka_image_properties,
    load_compose,
    mounts,
    option_value,
    postgres_drift,
    read_env_file,
    version_drift,
)

# --- the compose file against the local stack ---------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


def test_images_use_the_versions_pinned_for_the_local_stack(compose):
    assert version_drift(compose) == []


def test_broker_has_the_local_brokers_settings(compose):
    assert broker_drift(compose) == []


def test_connect_worker_has_the_local_workers_settings(compose):
    assert connect_drift(compose) == []


def test_postgres_has_the_local_logical_decoding_settings(compose):
    assert postgres_drift(compose) == []


def test_init_applies_the_repository_connector_file_with_the_local_values(compose):
    assert connector_drift(compose) == []


def test_init_and_router_run_the_documented_commands_on_the_example_config(compose):
    outbox, topics, connectors, wait = init_commands(compose)
    assert is_command(outbox, "outbox", "init") and is_command(topics, "topics", "apply")
    assert is_command(connectors, "connectors", "apply")
    assert is_command(wait, "connectors", "wait") and "RUNNING" in wait
    assert option_value(outbox, "--replication-role") == REPLICATION_ROLE
    # `$$` in the YAML: the shell in the container expands it, Compose does not.
    assert option_value(outbox, "--dsn") == "$CDC_ROUTER_PG_DSN"
    assert "--yes" in topics and "--yes" in connectors
    # --url belongs to the `connectors` group, before the subcommand.
    assert connectors[2:4] == ["--url", "http://connect:8083"]
    router = compose["services"]["router"]
    assert router["command"] == ["run", "-c", "/config/router.yaml"]
    assert option_value(topics, "-c") == "/config/router.yaml"
    for service in ("init", "router"):
        assert mounts(compose["services"][service])["/config/router.yaml"] == ROUTER_CONFIG
        env = environment(compose["services"][service])
        assert env["CDC_ROUTER__KAFKA__BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert ROUTER_CONFIG.is_file()  # else Docker would bind-mount a new empty directory


def test_the_containerised_router_deletes_the_rows_it_delivered(compose):
    # QA 36-c: the mounted example says `cleanup: mode: none`, and the compose file passed a
    # DSN "used when router.yaml enables cleanup", so the outbox only grew.
    from cdc_router.config.load import load_config

    env = environment(compose["services"]["router"])
    cleanup = load_config(ROUTER_CONFIG, env=env).config.cleanup
    assert cleanup.mode == "delete" and cleanup.missing_dsn() is None
    assert cleanup.dsn is not None and "@postgres:5432/" in str(cleanup.dsn)


def test_secrets_come_only_from_the_env_file():
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    documented = read_env_file(ENV_EXAMPLE)
    for name, service in raw["services"].items():
        for key, value in environment(service).items():
            if re.search(r"PASSWORD|SECRET|TOKEN", key):
                assert re.fullmatch(r"\$\{(\w+):\?[^}]*\}", value), f"{name}: {key} is inline"
    strings = json.dumps(raw)  # every value, without the comments
    used = set(re.findall(r"(?<!\$)\$\{(\w+)", strings))
    assert used <= documented.keys(), f"undocumented in .env.example: {used - documented.keys()}"
    assert {documented["POSTGRES_PASSWORD"], documented["CDC_ROUTER_DB_PASSWORD"]} == {"change-me"}


def test_the_stack_converges_through_healthchecks_and_conditions(compose):
    services = compose["services"]
    for name, service in services.items():
        for target, condition in (service.get("depends_on") or {}).items():
            wanted = condition["condition"]
            assert wanted in ("service_healthy", "service_completed_successfully"), name
            if wanted == "service_healthy":
                assert not services[target].get("healthcheck", {}).get("disable"), target
                assert services[target].get("healthcheck", {}).get("test"), target
    assert services["init"]["depends_on"] == {
        dependency: {"condition": "service_healthy"} for dependency in ("postgres", "kafka",
                                                                        "connect")}
    assert services["router"]["depends_on"]["init"] == {
        "condition": "service_completed_successfully"}
    assert services["redis"]["profiles"] == ["redis"]
    assert services["schema-registry"]["profiles"] == ["registry"]
    assert services["nats"]["profiles"] == ["nats"]


def test_the_nats_profile_runs_jetstream_on_the_local_stacks_port(compose):
    nats = compose["services"]["nats"]
    assert "--jetstream" in nats["command"]
    host_port = interpolate(nats["ports"][0].split(":")[-2], {})
    assert host_port == str(local.StackConfig.model_fields["nats_port"].default)
    assert "js-enabled-only=true" in " ".join(nats["healthcheck"]["test"])


def test_the_redis_profile_keeps_its_done_marks(compose):
    # Review 33: an image default (no appendonly, an anonymous volume) lost the marks at a
    # re-create or a crash; the Redis store's README asks for both settings below.
    redis = compose["services"]["redis"]
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command and "--appendfsync always" in command
    assert redis["volumes"] == ["redis-data:/data"] and "redis-data" in compose["volumes"]


def test_the_router_image_installs_the_repository_and_runs_unprivileged(compose):
    for service in ("init", "router"):
        build = compose["services"][service]["build"]
        assert (DOCKER / build["context"]).resolve() == REPO
        assert (REPO / build["dockerfile"]).resolve() == DOCKER / "Dockerfile"
    dockerfile = (DOCKER / "Dockerfile").read_text()
    final_stage = dockerfile.rsplit("\nFROM ", 1)[1]
    assert final_stage.startswith("python:3.11-slim\n")
    users = re.findall(r"^USER (\S+)", final_stage, re.MULTILINE)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert 'ENTRYPOINT ["cdc-router"]' in final_stage
    assert re.search(r"HEALTHCHECK .*http://127\.0\.0\.1:9102/healthz", final_stage, re.DOTALL)
    # `pip install .` needs the metadata, the readme it names and the package itself.
    copied = " ".join(re.findall(r"^COPY (?!--from)(.+)$", dockerfile, re.MULTILINE)).split()
    assert {"pyproject.toml", "README.md", "cdc_router"} <= set(copied)


# --- the drift checks catch a change ------------------------------------------------------------

SAMPLE_CONNECTOR = json.dumps({"name": "outbox-connector", "config": {
    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
    "database.hostname": "${DB_HOST:-127.0.0.1}",
    "database.port": "${DB_PORT:-15432}",
    "database.user": "debezium",
    "database.password": "${env:CDC_ROUTER_DB_PASSWORD}",
    "database.dbname": "postgres",
}})


def _set_env(service: str, key: str, value: str | None) -> Callable[[dict[str, Any]], None]:
    def mutate(compose: dict[str, Any]) -> None:
        env = compose["services"][service].setdefault("environment", {})
        if value is None:
            env.pop(key)
        else:
            env[key] = value
    return mutate


def _set(service: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda compose: compose["services"][service].__setitem__(key, value)


MUTATIONS = {
    "kafka version": (_set("kafka", "image", "apache/kafka:4.2.0"), version_drift, "4.2.0"),
    "debezium version": (_set("connect", "image", "quay.io/debezium/connect:3.6.0.Final"),
                         version_drift, "3.6.0.Final"),
    "postgres major": (_set("postgres", "image", "postgres:16"), version_drift, "postgres:16"),
    "transaction log min isr": (_set_env("kafka", "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "2"),
                                broker_drift, "transaction.state.log.min.isr is '2'"),
    "auto create dropped": (_set_env("kafka", "KAFKA_AUTO_CREATE_TOPICS_ENABLE", None),
                            broker_drift, "auto.create.topics.enable is not set"),
    "exactly once off": (_set_env("connect", "CONNECT_EXACTLY_ONCE_SOURCE_SUPPORT", "disabled"),
                         connect_drift, "exactly.once.source.support is 'disabled'"),
    "offset topic": (_set_env("connect", "OFFSET_STORAGE_TOPIC", "offsets"), connect_drift,
                     "offset.storage.topic is 'offsets'"),
    "converter set the way the image ignores": (
        _set_env("connect", "CONNECT_VALUE_CONVERTER", "io.confluent.connect.avro.AvroConverter"),
        connect_drift, "CONNECT_VALUE_CONVERTER is overwritten"),
    "config provider missing": (_set_env("connect", "CONNECT_CONFIG_PROVIDERS", "file"),
                                connect_drift, "config.providers is 'file'"),
    "logical decoding off": (_set("postgres", "command", ["postgres"]), postgres_drift,
                             "wal_level is not set"),
    "db password not given to connect": (_set_env("connect", "CDC_ROUTER_DB_PASSWORD", None),
                                         connector_drift, "${env:CDC_ROUTER_DB_PASSWORD}"),
    "database address left at the local default": (
        _set_env("init", "DB_PORT", None), connector_drift,
        "database.port is '15432' in docker, where Postgres is '5432'"),
    "another connector file": (
        _set("init", "command", ["cdc-router connectors apply -f /connectors/x.json --yes"]),
        connector_drift, "applies '/connectors/x.json'"),
    "waiting for another connector": (
        _set("init", "command", ["cdc-router connectors apply -f /connectors/outbox-connector.json"
                                 " --yes\ncdc-router connectors wait other"]),
        connector_drift, "waits for connector 'other'"),
}


@pytest.mark.parametrize("change", MUTATIONS, ids=list(MUTATIONS))
def test_a_changed_compose_file_is_reported(compose, change):
    mutate, check, expected = MUTATIONS[change]
    changed = copy.deepcopy(compose)
    mutate(changed)

    def run(data: dict[str, Any]) -> list[str]:
        return connector_drift(data, SAMPLE_CONNECTOR) if check is connector_drift else check(data)

    assert run(compose) == []
    problems = run(changed)
    assert any(expected in problem for problem in problems), problems


def test_a_changed_local_contract_is_reported(compose):
    broker = {**local.BROKER_CONTRACT, "transaction.state.log.min.isr": "2"}
    assert broker_drift(compose, contract=broker) == [
        "kafka: transaction.state.log.min.isr is '1', the local stack has '2' "
        "(set by KAFKA_TRANSACTION_STATE_LOG_MIN_ISR)"]
    connect = {**local.CONNECT_CONTRACT, "config.providers": "env,file,dir,vault"}
    assert any("config.providers is 'env,file,dir'" in problem
               for problem in connect_drift(compose, contract=connect))
    slower = local.StackConfig(home=Path("/h"), jar_cache=Path("/j"),
                               connect_offset_flush_interval_ms=60_000)
    assert connect_drift(compose, stack=slower) == [
        "connect: offset.flush.interval.ms is '10000', the local stack has '60000' "
        "(set by OFFSET_FLUSH_INTERVAL_MS)"]


def test_a_connector_setting_that_differs_from_the_local_stack_is_reported(compose):
    text = SAMPLE_CONNECTOR.replace('"postgres"', '"${DB_NAME:-postgres}"')
    changed = copy.deepcopy(compose)
    _set_env("init", "DB_NAME", "orders")(changed)
    assert connector_drift(changed, text) == [
        "connector: database.dbname is 'orders' in docker, 'postgres' on the local stack"]
    without_default = SAMPLE_CONNECTOR.replace('"postgres"', '"${DB_NAME}"')
    assert any("${DB_NAME} is not set and has no default" in problem
               for problem in connector_drift(compose, without_default))


def test_compose_interpolation_follows_compose():
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d} $$SET $SET", env) == \
        "x d  d $SET x"
    with pytest.raises(ValueError, match="UNSET is required: say so"):
        interpolate("${UNSET:?say so}", env)
    image_env = {"KAFKA_LOG_RETENTION_MS": "1", "KAFKA_OPTS": "-X", "KAFKA_A__B___C": "2"}
    assert kafka_image_properties(image_env) == {"log.retention.ms": "1", "a_b-c": "2"}


def test_the_registry_profile_is_on_the_local_stacks_host_port(compose):
    # QA, session 28: docker's registry was on 8081, the local stack's on 18081.
    registry = compose["services"]["schema-registry"]
    host_port = interpolate(registry["ports"][0].split(":")[-2], {})
    assert host_port == str(local.StackConfig.model_fields["registry_port"].default)


def test_every_published_port_listens_on_loopback_as_the_local_stack(compose):
    # Review 44 M1: published on 0.0.0.0, Connect's REST API (no authentication, the env
    # config provider on) let anyone on the network aim a connector at their own host.
    published = {f"{name}: {port}": str(port).split(":")[0]
                 for name, service in compose["services"].items()
                 for port in service.get("ports", [])}
    assert published and set(published.values()) == {"127.0.0.1"}, published


def _make_targets() -> dict[str, tuple[list[str], str]]:
    """The Makefile's rules: target -> (prerequisites, recipe)."""
    rules: dict[str, tuple[list[str], str]] = {}
    current: list[str] | None = None
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith("\t") and current is not None:
            for target in current:
                prerequisites, recipe = rules[target]
                rules[target] = (prerequisites, recipe + line + "\n")
            continue
        match = re.match(r"^([\w./ -]+):(?!=)([^#]*)", line)
        current = None
        if match and not line.startswith((".PHONY", "#")):
            current = match.group(1).split()
            for target in current:
                rules[target] = (match.group(2).split(), "")
    return rules


def test_the_docker_readme_names_no_make_target_that_starts_the_local_stack():
    # Review 52-d F2: it said to run `make test` against this stack, and `make test` first runs
    # `local up` (target `stack`), which refuses the ports the containers publish.
    rules = _make_targets()

    def starts_local_stack(target: str) -> bool:
        prerequisites, recipe = rules[target]
        return " local up" in recipe or any(starts_local_stack(p) for p in prerequisites
                                            if p in rules)

    assert starts_local_stack("test") and not starts_local_stack("test-unit")
    named = set(re.findall(r"(?:`|^)make ([a-z][\w-]*)", (DOCKER / "README.md").read_text(),
                           re.MULTILINE))
    assert named and named <= rules.keys(), named - rules.keys()
    assert [target for target in sorted(named) if starts_local_stack(target)] == []


def _ignore_patterns(path: Path) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_every_builder_sends_only_what_pip_install_needs():
    # Review 52-d: only BuildKit reads docker/Dockerfile.dockerignore; the classic builder and
    # docker-compose v1's own (docker-py) read the root's .dockerignore, and there was none.
    patterns = _ignore_patterns(DOCKER / "Dockerfile.dockerignore")
    assert _ignore_patterns(REPO / ".dockerignore") == patterns
    build = pytest.importorskip("docker.utils.build")  # docker-py: docker-compose v1's builder
    sent = build.exclude_paths(str(REPO), patterns, dockerfile="docker/Dockerfile")
    # The Dockerfile and the .dockerignore go always (docker-py does as the docker CLI).
    assert {path.split("/")[0] for path in sent} == {
        "pyproject.toml", "README.md", "cdc_router", "docker", ".dockerignore"}
    assert [path for path in sent if path.startswith("docker")] == ["docker/Dockerfile"]


def test_the_docker_readme_names_each_services_image_and_why_two_differ(compose):
    # QA 56-f F-6/F-7: the compose file said every version matched the local stack and that
    # this file checked it; NATS (2.10 vs 2.9.10) and the registry (Confluent vs Apicurio)
    # differ, and the README's table called NATS's JetStream API "the same".
    readme = (DOCKER / "README.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in readme.splitlines()
            if line.startswith("| ") and line.count("|") > 4}
    for name, service in compose["services"].items():
        if "image" in service and "build" not in service:
            assert f"`{service['image']}`" in rows[name].split("|")[2], name
    assert "filter_subjects" in rows["nats"] and "2.9.10" in rows["nats"]
    assert "/apis/ccompat/v7" in rows["schema-registry"]
    header = COMPOSE_FILE.read_text().split("\n\n")[0]
    assert "nats:2.10" in header and "2.9.10" in header and "Apicurio" in header


def test_the_nats_profile_serves_several_filter_subjects(compose):
    # README (NATS consumers): several filter_subjects need nats-server 2.10 or later; the
    # Docker stack is where they can be tried, so its image must not go below that.
    found = re.fullmatch(r"nats:(\d+)\.(\d+)(?:\.\d+)?(?:-\w+)?",
                         compose["services"]["nats"]["image"])
    assert found is not None
    assert (int(found[1]), int(found[2])) >= (2, 10)
