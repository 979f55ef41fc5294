"""How to reach Kafka and the schema registry: the `kafka` and `schema_registry` sections."""

from __future__ import annotations

import functools
import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

# Moved from settings.py with their bodies unchanged, hence the short local names.
from cdc_router.config.fields import ConfigModel as _Model
from cdc_router.config.fields import NonBlank, StringMap
from cdc_router.config.fields import field_problem as _fail
from cdc_router.config.redact import redact, shown_url, user_info_problem

# librdkafka's broker entry, `[<protocol>://]<host>:<port>`: the protocols it takes as a
# prefix (any case; "SASL", which older docs list, it refuses as unsupported), and a host name,
# an IPv4 address or an IPv6 one in brackets. Without a port it would use 9092; Kafka's Java
# clients refuse that, and so do we: a port left out is more often a typo than a choice.
_BROKER_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_BROKER = re.compile(r"(?:(?P<protocol>[A-Za-z][A-Za-z0-9+._-]*)://)?"
                     r"(?P<host>\[[0-9A-Fa-f:.]+(?:%[\w.-]+)?\]|[A-Za-z0-9_.-]+)"
                     r"(?::(?P<port>[0-9]{1,5}))?")
_USER_INFO = re.compile(r"^(?P<head>[^/@]*://)?.*@")  # not Kafka's, maybe a password


def _broker_problem(entry: str, match: re.Match[str] | None,
                    credentials: str = "kafka.sasl_username and kafka.sasl_password"
                    ) -> str | None:
    """Why one entry of kafka.bootstrap_servers (`match`: _BROKER's of it) is no broker
    librdkafka can reach; None when it is one. librdkafka itself only logs such an entry, or
    dials port 0 for `host:abc`, and the router then reported an unreachable cluster (review
    46-2 F2)."""
    if match is None and "@" in entry:
        return f"a server's address holds no credentials: set {credentials}"
    if match is None:
        if entry.count(":") > 1 and "[" not in entry and "://" not in entry:
            return "an IPv6 address goes in brackets, [::1]:9092"
        return "it is not host:port"
    protocol, port = match["protocol"], match["port"]
    if protocol is not None and protocol.upper() in ("HTTP", "HTTPS"):
        return ("Kafka's servers speak Kafka's protocol, not HTTP: give host:port (an http:// "
                "URL is for schema_registry.url or Kafka Connect)")
    if protocol is not None and protocol.upper() not in _BROKER_PROTOCOLS:
        return (f"librdkafka knows no protocol {protocol}://; a prefix may be "
                f"{', '.join(name + '://' for name in _BROKER_PROTOCOLS)}, or none")
    if port is None:
        return "it names no port (host:port, e.g. kafka:9092)"
    if not 1 <= int(port) <= 65535:
        return "its port must be a number from 1 to 65535"
    return None


def bootstrap_problem(servers: str, security_protocol: str | None, protocol_setting: str,
                      credentials: str = "kafka.sasl_username and kafka.sasl_password"
                      ) -> tuple[str, str] | None:
    """Why `servers` (a bootstrap.servers list) is no list librdkafka can use, with the entry
    to show (its user info masked); None when it is fine. `security_protocol`: the one set
    (None: PLAINTEXT, the default) in `protocol_setting`, for the line. The router's
    kafka.bootstrap_servers and the idempotent consumer's bootstrap_servers (QA 57-c F-1)."""
    # librdkafka ignores a server whose prefix is not security.protocol ("parse error:
    # protocol SSL does not match security.protocol setting plaintext").
    protocol = (security_protocol or "PLAINTEXT").upper()
    entries = [entry.strip() for entry in servers.split(",")]
    # librdkafka skips empty entries: `kafka:9092,` from a template works (review 46-3).
    for entry in filter(None, entries):
        match = _BROKER.fullmatch(entry)
        problem = _broker_problem(entry, match, credentials)
        named = match["protocol"] if match else None
        if problem is None and named is not None and named.upper() != protocol:
            problem = (f"the prefix {named}:// is not {protocol_setting} ({protocol}"
                       f"{'' if security_protocol else ', the default'}), and "
                       "librdkafka ignores such a server: set "
                       f"{protocol_setting}: {named.upper()}, or drop the prefix")
        if problem:
            return ("each server must be host:port (a hostname, an IPv4 address or [IPv6]), "
                    f"several separated by commas: {problem}",
                    _USER_INFO.sub(r"\g<head>*****@", entry))
    if not any(entries):
        return "each server must be host:port, several separated by commas: it names no " \
            "server", servers
    return None


# Properties a field of ours sets: refused under kafka.config, .producer and .consumer.
_SHADOWED = {"bootstrap.servers": "kafka.bootstrap_servers", "client.id": "kafka.client_id",
             "security.protocol": "kafka.security_protocol",
             "sasl.mechanism": "kafka.sasl_mechanism", "sasl.username": "kafka.sasl_username",
             "sasl.password": "kafka.sasl_password",
             "group.id": "source.group_id (the raw-topic consumer's group)",
             "transactional.id": "delivery.transactional_id (the prefix of the router's "
                                 "transactional ids, <prefix>-<instance id>)",
             "transaction.timeout.ms": "delivery.transaction_timeout_ms"}
# Properties the router's clients pin (router/clients.py, producer_config, consumer_config,
# which a test holds to this table): the client, the values that mean the router's (its own
# first) and why. `config` is every client's.
_PINNED: dict[str, tuple[str, tuple[str, ...], str]] = {
    "enable.idempotence": ("producer", ("true",), "no duplicate from a retried send"),
    "acks": ("producer", ("all", "-1"), "a record counts as written once every in-sync "
             "replica has it"),
    "allow.auto.create.topics": ("config", ("false",), "a lookup of a topic name made of row "
                                 "data must never create that topic"),
    "enable.auto.commit": ("consumer", ("false",), "offsets are committed in the "
                           "transaction of the records they produced"),
    "enable.auto.offset.store": ("consumer", ("false",), "offsets are committed in the "
                                 "transaction of the records they produced"),
    "isolation.level": ("consumer", ("read_committed",), "Debezium's exactly-once source "
                        "tasks write in transactions, and an aborted record must never be "
                        "routed"),
    # Not the user's choice: a new group (or one whose committed offsets expired) reading
    # from the end would skip every event already on the raw topic, and those are lost.
    "auto.offset.reset": ("consumer", ("earliest",), "a group with no committed offset "
                          "starts at the raw topic's beginning, so that no event is lost; to "
                          "skip its history, commit the group's offsets before the first "
                          "start (kafka-consumer-groups --group <source.group_id> --topic "
                          "<raw topic> --reset-offsets --to-latest --execute)"),
    "partition.assignment.strategy": ("consumer", ("roundrobin,range",), "an eager "
                                      "assignor: every member commits or aborts before a "
                                      "partition moves; roundrobin spreads the partitions "
                                      "of all raw topics over the instances"),
    "group.instance.id": ("consumer", ("<--instance-id>.<digest of source.topics>",),
                          "static membership, one member per instance"),
}


class KafkaSettings(_Model):
    """How to reach the cluster; `config` passes any other librdkafka property through."""

    bootstrap_servers: str = Field(default="127.0.0.1:19092", min_length=1)
    client_id: NonBlank = "cdc-router"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    config: StringMap = Field(default_factory=dict)
    # Properties for one kind of client only (librdkafka warns about the others' properties).
    producer: StringMap = Field(default_factory=dict)
    consumer: StringMap = Field(default_factory=dict)

    @model_validator(mode="after")
    def _brokers(self) -> KafkaSettings:
        problem = bootstrap_problem(self.bootstrap_servers, self.security_protocol,
                                    "kafka.security_protocol")
        if problem:
            raise _fail("bootstrap_servers", *problem)
        return self

    @field_validator("config", "producer", "consumer")
    @classmethod
    def _no_shadowed_fields(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for key in value:
            if key in _SHADOWED:
                raise ValueError(f"set {_SHADOWED[key]} instead of "
                                 f"kafka.{info.field_name}[{key!r}]")
        return value

    def ignored_properties(self) -> list[str]:
        """A warning for each property of kafka.config, .producer or .consumer that the
        router's clients set to another value of their own (router/clients.py): it was taken
        and ignored without a word (review 46-2 F12)."""
        found = []
        for section, properties in (("config", self.config), ("producer", self.producer),
                                    ("consumer", self.consumer)):
            for key, value in properties.items():
                client, values, why = _PINNED.get(key, ("", (), ""))
                applies = section == "config" or client in ("config", section)
                if not values or not applies or value.strip().lower() in values:
                    continue
                uses = values[0]
                found.append(f"kafka.{section}[{key!r}] {value!r} is ignored: the router's "
                             f"{'clients use' if client == 'config' else client + ' uses'} "
                             f"{uses} ({why})")
        return found

    def unused_login(self) -> list[str]:
        """A warning when SASL settings are given and kafka.security_protocol is no SASL one:
        librdkafka then sends no login, a SASL listener only closes the connection, and the
        router ended "is the cluster reachable?" after its timeout (review 51-d F5)."""
        given = [f"kafka.{name}" for name in ("sasl_mechanism", "sasl_username", "sasl_password")
                 if getattr(self, name)]
        if not given or (self.security_protocol or "").startswith("SASL_"):
            return []
        protocol = self.security_protocol or "PLAINTEXT, the default"
        return [f"{', '.join(given)} set, and kafka.security_protocol is {protocol}: no SASL "
                "login is sent, and a SASL listener only closes the connection (taken for an "
                "unreachable cluster); set kafka.security_protocol: SASL_PLAINTEXT or SASL_SSL, "
                "or leave the SASL settings out"]

    def unset_login(self) -> tuple[str, str] | None:
        """(field, its environment variable) of the login SASL PLAIN or SCRAM needs and does
        not have: librdkafka builds no client without it, and the refusal named kafka.config
        or "the file paths" (review 51-d F4: the password's variable was not set)."""
        mechanism = (self.sasl_mechanism or "GSSAPI").upper()  # librdkafka's default
        if not (self.security_protocol or "").startswith("SASL_") or \
                mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            return None
        if not self.sasl_username:
            return "kafka.sasl_username", "CDC_ROUTER__KAFKA__SASL_USERNAME"
        if not self.sasl_password:
            return "kafka.sasl_password", "CDC_ROUTER__KAFKA__SASL_PASSWORD"
        return None

    def librdkafka(self) -> dict[str, str]:
        """The client properties every consumer, producer and admin client of ours shares."""
        conf = {"bootstrap.servers": self.bootstrap_servers, "client.id": self.client_id}
        if self.security_protocol:
            conf["security.protocol"] = self.security_protocol
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        conf.update(self.config)
        return conf


# Seconds a registry request may take (confluent-kafka's client waits for ever without one),
# and how often its client tries a request again after a failure (its default, 3, made one
# lookup of a silent registry take 44 s: QA, session 29): a registry that accepts connections
# and never answers must not hold the router's open transaction past
# delivery.transaction_timeout_ms (20 s by default). At most 5 + about 1 + 5 s this way;
# schema_registry.config `timeout` and `max.retries` override them.
REGISTRY_TIMEOUT_S = 5
REGISTRY_MAX_RETRIES = 1
# SchemaRegistryClient properties it wants as numbers; YAML and the environment give strings.
_REGISTRY_NUMBERS = frozenset({"timeout", "max.retries", "retries.wait.ms",
                               "retries.max.wait.ms", "cache.capacity", "cache.latest.ttl.sec"})
# Files the client opens as it is built: they may exist only where the router runs, not where
# `rules check` does (CI), so the check at load builds it without them.
_REGISTRY_FILES = frozenset({"ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
                             "ssl.key.password"})


def _registry_url_problem(url: str) -> str | None:
    """Why one server URL of schema_registry.url cannot be reached; None when it can."""
    if re.search(r"\s", url):
        return "it has a space"
    if (problem := user_info_problem(url)) is not None:  # QA 64-b
        return problem
    try:
        parts = urlsplit(url)
        if parts.port == 0:  # .port: a ValueError when it is no number or above 65535
            raise ValueError(url)
    except ValueError:
        return "its port must be a number from 1 to 65535"
    if parts.scheme not in ("http", "https", "mock"):
        return "it names no scheme the client knows"
    if not parts.hostname:
        return "it names no host"
    return None


@functools.lru_cache(maxsize=32)  # a build reads the CA bundle (0.1 to 0.3 s): once per config
def _client_refusal(conf: tuple[tuple[str, str | float], ...]) -> str | None:
    """Why confluent-kafka's SchemaRegistryClient refuses this configuration, its secrets
    masked; None when it takes it. Building it makes no request (the first lookup connects)."""
    # Deferred: importing the client takes about a second, for configs without a registry too.
    from confluent_kafka.schema_registry import SchemaRegistryClient

    try:
        SchemaRegistryClient.new_client(dict(conf)).close()
    except (ValueError, TypeError) as error:
        return redact("", str(error)) or type(error).__name__
    except OSError:  # SSL_CERT_FILE names a CA bundle not here: the router's host's, as files
        return None
    return None


def _names(refusal: str, key: str) -> bool:
    """Whether the client's `refusal` names the property `key` whole (not inside another)."""
    return re.search(rf"(?<![\w.]){re.escape(key)}(?![\w.])", refusal) is not None


class SchemaRegistrySettings(_Model):
    """A Confluent-compatible schema registry; with it, Avro routes use its wire format."""

    url: str = Field(min_length=1)  # several: comma-separated; mock://<name>: in-memory, tests
    basic_auth_user_info: SecretStr | None = None  # "user:password"
    # Off: the router only looks schemas up, and a schema missing from its subject stops it
    # (registering is a deployment step, e.g. `cdc-router schemas register`).
    auto_register: bool = False
    subject_name_strategy: Literal["topic", "record", "topic_record"] = "topic"
    config: StringMap = Field(default_factory=dict)  # other client properties (ssl.*, timeout)

    @field_validator("url")
    @classmethod
    def _urls(cls, value: str) -> str:
        # Review M4: `http://:8081`, `http://host:99999` passed, and the client failed on its
        # first request, which the router takes for an outage (exit 75, restarted forever).
        servers = value.split(",")
        for url in servers:
            problem = _registry_url_problem(url.strip())
            if problem:
                which = f" ({shown_url(url)!r})" if len(servers) > 1 else ""
                raise ValueError("each url must be http://host:port, https://host:port or "
                                 "mock://name (in-memory, for tests), several separated by "
                                 f"commas: {problem}{which}")
        return value

    @field_validator("config")
    @classmethod
    def _not_shadowed(cls, value: dict[str, str]) -> dict[str, str]:
        owned = {"url": "url", "basic.auth.user.info": "basic_auth_user_info",
                 "auto.register.schemas": "auto_register"}
        for key in value:
            if key in owned:
                raise ValueError(f"set schema_registry.{owned[key]} instead of "
                                 f"schema_registry.config[{key!r}]")
            if key in _REGISTRY_NUMBERS and not re.fullmatch(r"\d+(\.\d+)?", value[key]):
                raise ValueError(f"{key} must be a number, not {value[key]!r}")
        return value

    @model_validator(mode="after")
    def _client_takes_config(self) -> SchemaRegistrySettings:
        # Review M4: the client refuses a property it does not know ("Unrecognized
        # properties"), and did so only when `run` built it: an outage to the router.
        conf = {key: value for key, value in self.client_config().items()
                if key not in _REGISTRY_FILES}
        refusal = _client_refusal(tuple(sorted(conf.items())))
        if refusal is None:
            return self
        culprit = next((key for key in self.config if _names(refusal, key)), None)
        # QA 64-b: it named 'config', not this field. Review 64: a config key holding the
        # name (the Java client's schema.registry.basic.auth.user.info) is that key's fault.
        if culprit is None and _names(refusal, "basic.auth.user.info"):
            raise _fail("basic_auth_user_info", "confluent-kafka's SchemaRegistryClient "
                        f"refuses it (value not shown): {refusal}")
        # An unknown key's value is not shown: it may be a misspelt secret's.
        shown = (self.config[culprit] if culprit and "Unrecognized properties" not in refusal
                 else None)
        raise _fail(f"config.{culprit}" if culprit else "config",
                    f"confluent-kafka's SchemaRegistryClient refuses it: {refusal}; correct or "
                    "remove it (the client's documentation lists the properties it takes)", shown)

    def client_config(self) -> dict[str, str | float]:
        """The configuration of confluent-kafka's SchemaRegistryClient."""
        conf: dict[str, str | float] = {"timeout": REGISTRY_TIMEOUT_S,
                                        "max.retries": REGISTRY_MAX_RETRIES, **self.config,
                                        "url": self.url}
        for key in _REGISTRY_NUMBERS.intersection(self.config):
            text = self.config[key]
            conf[key] = float(text) if "." in text else int(text)
        if self.basic_auth_user_info is not None:
            # Alone: SchemaRegistryClient refuses basic.auth.credentials.source (the Java
            # client's and the old CachedSchemaRegistryClient's) as an unrecognized property.
            conf["basic.auth.user.info"] = self.basic_auth_user_info.get_secret_value()
        return conf
