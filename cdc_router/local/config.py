"""The local stack's settings and the configuration files rendered from them (pure functions)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cdc_router.errors import ConfigError
from cdc_router.local.versions import APICURIO_REGISTRY_VERSION, DEBEZIUM_VERSION, KAFKA_VERSION

Part = Literal["postgres", "kafka", "connect", "nats", "registry"]
PARTS: tuple[Part, ...] = ("postgres", "kafka", "connect", "nats", "registry")
# Parts `up` starts only when asked (`local up --with nats`); the others always.
OPTIONAL_PARTS: tuple[Part, ...] = ("nats", "registry")
STACK_FILE_MODE = 0o600  # stack.json holds passwords

# Settings the router and Connect rely on; docker/ must set the same (the drift test reads these).
BROKER_CONTRACT: dict[str, str] = {
    "auto.create.topics.enable": "false",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
}
CONNECT_CONTRACT: dict[str, str] = {
    "exactly.once.source.support": "enabled",
    "config.providers": "env,file,dir",
    "config.providers.env.class": "org.apache.kafka.common.config.provider.EnvVarConfigProvider",
    "config.providers.file.class": "org.apache.kafka.common.config.provider.FileConfigProvider",
    "config.providers.dir.class": "org.apache.kafka.common.config.provider.DirectoryConfigProvider",
    "key.converter": "org.apache.kafka.connect.json.JsonConverter",
    "value.converter": "org.apache.kafka.connect.json.JsonConverter",
    "key.converter.schemas.enable": "false",
    "value.converter.schemas.enable": "false",
    "config.storage.topic": "connect-configs",
    "offset.storage.topic": "connect-offsets",
    "status.storage.topic": "connect-status",
}


class StackConfig(BaseModel):
    """Where the stack lives and how it listens; saved to `<home>/stack.json` by `up`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    home: Path
    jar_cache: Path
    host: str = "127.0.0.1"
    postgres_port: int = Field(default=15432, ge=1, le=65535)
    kafka_port: int = Field(default=19092, ge=1, le=65535)
    controller_port: int = Field(default=19093, ge=1, le=65535)
    connect_port: int = Field(default=18083, ge=1, le=65535)
    nats_port: int = Field(default=14222, ge=1, le=65535)
    registry_port: int = Field(default=18081, ge=1, le=65535)
    kafka_heap_mb: int = Field(default=512, ge=128)
    connect_heap_mb: int = Field(default=768, ge=256)
    registry_heap_mb: int = Field(default=256, ge=128)
    postgres_password: str = "postgres"
    # The Debezium role's password, handed to Connect's environment for `${env:...}`.
    replication_password: str = "debezium"
    # How often Connect commits source offsets outside exactly-once transactions.
    connect_offset_flush_interval_ms: int = Field(default=10_000, ge=100)

    # Paths -------------------------------------------------------------------------------
    def part_dir(self, part: Part) -> Path:
        return self.home / part

    def has(self, part: Part) -> bool:
        """Whether `part` is this stack's: Postgres, Kafka and Connect always; an optional part
        once `local up --with PART` started it under this home (its directory exists). Before
        that its port is only the default, maybe another stack's (QA 56-e F-3)."""
        return part not in OPTIONAL_PARTS or self.part_dir(part).is_dir()

    def log_path(self, part: Part) -> Path:
        return self.part_dir(part) / f"{part}.log"

    def pid_path(self, part: Part) -> Path:
        return self.part_dir(part) / f"{part}.pid"

    @property
    def postgres_data(self) -> Path:
        return self.part_dir("postgres") / "data"

    @property
    def postgres_socket_dir(self) -> Path:
        return self.part_dir("postgres") / "run"

    @property
    def kafka_data(self) -> Path:
        return self.part_dir("kafka") / "data"

    @property
    def nats_data(self) -> Path:
        return self.part_dir("nats") / "data"

    @property
    def registry_data(self) -> Path:
        return self.part_dir("registry") / "data"

    @property
    def kafka_libs(self) -> Path:
        return self.jar_cache / f"kafka-{KAFKA_VERSION}" / "libs"

    @property
    def plugin_path(self) -> Path:
        return self.jar_cache / f"debezium-{DEBEZIUM_VERSION}" / "plugins"

    @property
    def registry_app(self) -> Path:
        return self.jar_cache / f"apicurio-registry-{APICURIO_REGISTRY_VERSION}"

    # Addresses -----------------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.kafka_port}"

    @property
    def connect_url(self) -> str:
        return f"http://{self.host}:{self.connect_port}"

    @property
    def nats_url(self) -> str:
        return f"nats://{self.host}:{self.nats_port}"

    @property
    def registry_url(self) -> str:
        """The registry's Confluent-compatible API (what schema_registry.url names)."""
        return f"http://{self.host}:{self.registry_port}/apis/ccompat/v7"

    @property
    def postgres_dsn(self) -> str:
        return (f"postgresql://postgres:{self.postgres_password}@{self.host}:"
                f"{self.postgres_port}/postgres")

    def ports(self) -> dict[str, int]:
        """Every port the stack listens on, named for error messages."""
        return {
            "postgres": self.postgres_port,
            "kafka": self.kafka_port,
            "kafka controller": self.controller_port,
            "connect": self.connect_port,
            "nats": self.nats_port,
            "registry": self.registry_port,
        }

    def check_ports_distinct(self) -> None:
        seen: dict[int, str] = {}
        for name, port in self.ports().items():
            if port in seen:
                raise ConfigError(f"{name} and {seen[port]} both use port {port}",
                                  hint="give each part its own port")
            seen[port] = name


def save(config: StackConfig) -> None:
    """Record the effective settings so that status and down find what up started."""
    config.home.mkdir(parents=True, exist_ok=True)
    # It holds the Postgres and replication passwords: owner-only from its creation (the umask
    # can only take bits away from 0o600), and an existing file that an older version wrote
    # world-readable is tightened before the new content goes in.
    descriptor = os.open(config.home / "stack.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         STACK_FILE_MODE)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        os.fchmod(file.fileno(), STACK_FILE_MODE)
        file.write(config.model_dump_json(indent=2) + "\n")


def load_saved(home: Path) -> StackConfig | None:
    """The settings `up` saved in `home`, or None if no stack was ever started there."""
    path = home / "stack.json"
    if not path.exists():
        return None
    try:
        return StackConfig.model_validate(json.loads(path.read_text()))
    except OSError as error:  # review 48-b F3: a traceback
        raise ConfigError(f"the saved stack settings cannot be read: {error.strerror}",
                          source=str(path), hint="pick another --home, or give this user "
                          "access to it") from error
    except ValueError as error:
        # Review 48-b F13: the cause was not said, and `down --purge`, advised, failed alike.
        if isinstance(error, ValidationError):
            first = error.errors()[0]
            what = (f"{'.'.join(map(str, first['loc'])) or 'the document'}: {first['msg']} "
                    f"(got {first.get('input')!r:.80})")
        else:
            what = str(error).splitlines()[0][:200]
        raise ConfigError(f"the saved stack settings are unreadable: {what}", source=str(path),
                          hint=f"remove {path}: `cdc-router local down --home {home}` then "
                          "stops the parts by their pid files, and `local up` saves it anew "
                          "(with its --<part>-port options)") from error


def to_properties(values: dict[str, str]) -> str:
    """Java properties text; values here never need escaping beyond backslashes."""
    lines = [f"{key}={value.replace(chr(92), chr(92) * 2)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def kafka_properties(config: StackConfig) -> dict[str, str]:
    """server.properties of a one-node KRaft cluster (broker and controller in one process)."""
    host = config.host
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{host}:{config.controller_port}",
        "listeners": f"PLAINTEXT://{host}:{config.kafka_port},CONTROLLER://{host}:{config.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{config.kafka_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(config.kafka_data),
        "num.partitions": "1",
        **BROKER_CONTRACT,
        # One node: nobody to wait for before the first rebalance.
        "group.initial.rebalance.delay.ms": "0",
    }


def connect_properties(config: StackConfig) -> dict[str, str]:
    """connect-distributed.properties of a one-worker Connect cluster with Debezium."""
    return {
        "bootstrap.servers": config.bootstrap_servers,
        "group.id": "cdc-router-connect",
        **CONNECT_CONTRACT,
        "config.storage.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "offset.flush.interval.ms": str(config.connect_offset_flush_interval_ms),
        "listeners": f"http://{config.host}:{config.connect_port}",
        "rest.advertised.host.name": config.host,
        "rest.advertised.port": str(config.connect_port),
        "plugin.path": str(config.plugin_path),
        # One worker: when it restarts there is nobody to wait for before reassigning its
        # connectors (the default waits five minutes for a departed worker to come back).
        "scheduled.rebalance.max.delay.ms": "0",
        # Every plugin here ships ServiceLoader manifests: skip the slow reflective scan.
        "plugin.discovery": "service_load",
    }


def postgres_conf(config: StackConfig) -> str:
    """Settings appended to postgresql.conf: logical decoding for Debezium, loopback only."""
    return "".join(f"{key} = {value}\n" for key, value in postgres_settings(config).items())


def postgres_settings(config: StackConfig) -> dict[str, str]:
    """postgres_conf's settings, as its file writes them (a string's in quotes)."""
    return {
        "listen_addresses": f"'{config.host}'",
        "port": str(config.postgres_port),
        "unix_socket_directories": f"'{config.postgres_socket_dir}'",
        "wal_level": "logical",
        "max_wal_senders": "20",
        "max_replication_slots": "20",
        # Flush WAL often so that Debezium sees commits within milliseconds (latency).
        "wal_writer_delay": "10ms",
        # A forgotten slot must not fill the disk of a developer's machine.
        "max_slot_wal_keep_size": "'2GB'",
        # Two-phase commit (PREPARE TRANSACTION) allowed, as many applications' databases do:
        # status warns of a prepared transaction left pending, which the tests need to make.
        "max_prepared_transactions": "10",
        "fsync": "on",
        "log_min_messages": "warning",
    }


def pg_hba_conf() -> str:
    """Passwords over TCP (the Debezium role's included), trust only on the private socket."""
    return (
        "local   all          all                    trust\n"
        "host    all          all    127.0.0.1/32    scram-sha-256\n"
        "host    replication  all    127.0.0.1/32    scram-sha-256\n"
    )


def nats_server_conf(config: StackConfig) -> str:
    """nats-server.conf: one server with JetStream, on loopback, its store under the home."""
    # JSON strings are valid NATS config strings (its format is a superset of JSON).
    return (
        f"server_name: cdc-router-local\n"
        f"listen: {json.dumps(f'{config.host}:{config.nats_port}')}\n"
        "jetstream {\n"
        f"  store_dir: {json.dumps(str(config.nats_data))}\n"
        # A developer's machine: bounded, so that a runaway test cannot fill memory or disk.
        "  max_memory_store: 256MB\n"
        "  max_file_store: 4GB\n"
        "}\n"
    )


def nats_command(config: StackConfig, executable: str) -> list[str]:
    """The nats-server command line; its config path names the home (the pid check's marker)."""
    return [executable, "-c", str(config.part_dir("nats") / "nats-server.conf")]


def log4j2_properties() -> str:
    """Logging for the JVMs: one line per event on stdout, which goes to the part's log file."""
    return (
        "status = warn\n"
        "appender.out.type = Console\n"
        "appender.out.name = OUT\n"
        "appender.out.layout.type = PatternLayout\n"
        "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
        "rootLogger.level = INFO\n"
        "rootLogger.appenderRef.out.ref = OUT\n"
        "logger.statechange.name = state.change.logger\n"
        "logger.statechange.level = WARN\n"
        "logger.reflections.name = org.reflections\n"
        "logger.reflections.level = ERROR\n"
        # The Java clients' INFO lines: config dumps, and during a broker outage about 4,000
        # "Rebootstrapping" lines a second from Connect's admin client (QA session 27-b).
        "logger.clients.name = org.apache.kafka.clients\n"
        "logger.clients.level = WARN\n"
    )
