"""Kafka errors classified once: retry, abort the transaction and rewind, or stop."""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from cdc_router.kafka.tls import KEY_MISMATCH_ADVICE, key_refusal, tls_property, unloaded


class ErrorAction(enum.Enum):
    """What the router does about a Kafka error."""

    RETRY = "retry"  # transient: the same call again, after a backoff
    ABORT = "abort"  # the transaction is lost: abort it, rewind to the committed offsets
    FATAL = "fatal"  # this producer can never work again (fenced, misconfigured): exit non-zero


# Fenced by a newer instance with our transactional.id or group.instance.id: carrying on would
# break exactly-once, so these stop the process even when librdkafka doesn't flag them fatal.
_FENCED = frozenset({
    # librdkafka's generic fatal error; a consumer hands it over as a message error that is
    # not flagged fatal() (its one cause there: a fenced static member), and a consumer that
    # had it never delivers again: polling on would wait for ever.
    KafkaError._FATAL,
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.FENCED_INSTANCE_ID,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
})


# Refusals of what a whole process uses (its group, its transactional ids, the cluster): a grant
# to add, never a fence, although they stop the process like one (_FENCED).
GRANT_REFUSED = frozenset({
    KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
})


def refused_grant(code: int | None, *, group: str | None,
                  transactional_prefix: str | None) -> str | None:
    """What to grant this process's principal for an authorization refusal of its consumer
    group (`group`, None: it has none), its transactional ids (`<transactional_prefix>-...`)
    or the cluster, in README's words (Kafka ACLs); None for any other error (QA 35-e F1, F3,
    F4: librdkafka's line named neither the group nor the id, nor the grant)."""
    if code == KafkaError.GROUP_AUTHORIZATION_FAILED and group is not None:
        return (f"this process's Kafka principal may not use consumer group {group}: grant it "
                f"Read on Group {group}")
    if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED and \
            transactional_prefix is not None:
        return (f"this process's Kafka principal may not use the transactional ids "
                f"{transactional_prefix}-*: grant it Write on TransactionalId "
                f"{transactional_prefix}- (prefixed; the prefix is delivery.transactional_id, "
                "by default source.group_id)")
    if code == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
        return ("this process's Kafka principal may not do a cluster operation it needs: grant "
                "it IdempotentWrite on the Cluster (brokers before Kafka 3.0), and Write on the "
                "topics it produces to")
    return None


def rival_hint(transactional_id: str | None, group: str | None,
               in_use: str | None = None) -> str:
    """Who else takes a router's transactional id, `<prefix>-<instance id>` (the prefix
    delivery.transactional_id, else source.group_id `group`; `in_use`: the whole id, when
    known). QA 63-b F-3: two pipelines left on the default source.group_id on one host (one
    default instance id, the host name) fenced each other within a second of load, and the
    line named no setting; QA 66-b F-5: it named `<instance id>`, not the rival's id."""
    prefix = transactional_id or group
    if prefix is None:
        return "another instance may use the same instance id"
    named = in_use or f"{prefix}-<instance id>"
    # The setting that names it: a set delivery.transactional_id is not changed by another
    # source.group_id (review 63: the advice named that one all the same).
    field = "delivery.transactional_id" if transactional_id else "source.group_id"
    default = "" if transactional_id else " (the default of delivery.transactional_id)"
    return (f"another process uses its transactional id {named}: an instance "
            f"with the same --instance-id (default: the host name), or another pipeline "
            f"whose {field}{default} is {prefix!r} too; give each pipeline its own {field}")


def likely_cause(error: KafkaError, fenced_hint: str) -> str:
    """Why Kafka refused a producer for good: `fenced_hint` (who else may take its
    transactional id), unless the refusal is a missing grant (GRANT_REFUSED)."""
    if error.code() in GRANT_REFUSED:
        return "a grant is missing, not a fence (README, Kafka ACLs)"
    return fenced_hint


# The cluster answers, but its transaction coordinator is not ready: a broker that has just
# started loads the transaction state (QA 46-a: a start then exited 75 asking whether the
# cluster was reachable).
_COORDINATOR_NOT_READY = frozenset({
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
})


def still_failing_hint(error: KafkaError | None, bootstrap: str) -> str:
    """What to check when a call to the cluster still fails after its retries."""
    if error is not None and error.code() in _COORDINATOR_NOT_READY:
        return ("the cluster answers, but its transaction coordinator is not ready yet (loading "
                "after a broker's start): the next start goes on once it is")
    return f"is the cluster at {bootstrap} (kafka.bootstrap_servers) reachable?"


# A consumer's errors that say the credentials cannot read what the process must (its source
# topics): the operator's to fix, so the process stops with the reason, never polls on.
# LOGIN_REFUSED: those of the login itself (its line names the credentials to check).
LOGIN_REFUSED = frozenset({KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._AUTHENTICATION})
REFUSED_CREDENTIALS = LOGIN_REFUSED | {KafkaError.TOPIC_AUTHORIZATION_FAILED}


# Delivery errors that no retry can fix: the broker refuses the record itself, for something in
# it (size, timestamp, format) or about its one topic (policy, ACL, deleted under us). A refusal
# hits a whole produce request (measured: one INVALID_TIMESTAMP fails all 11 records of its
# request to that partition), so the records it names are only suspects until one fails alone.
# Not here: errors about the request or the cluster (INVALID_REQUIRED_ACKS, NOT_ENOUGH_REPLICAS,
# timeouts), which say nothing about any one record.
# A topic or partition unknown: to librdkafka's metadata (_UNKNOWN_*), or to the broker.
UNKNOWN_TOPIC = frozenset({
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION,
})
RECORD_REFUSED = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE, KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_RECORD, KafkaError.INVALID_MSG,  # INVALID_MSG is Kafka's CORRUPT_MESSAGE
    KafkaError.INVALID_TIMESTAMP, KafkaError.POLICY_VIOLATION,
    KafkaError.TOPIC_AUTHORIZATION_FAILED, *UNKNOWN_TOPIC,
})
# Reports of records the producer dropped itself when their transaction was aborted.
PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})


def kafka_error_of(error: BaseException) -> KafkaError | None:
    """The KafkaError inside a KafkaException, or the one our own errors carry (`kafka_error`
    of DeliveryError and BatchFailed), or None for anything else."""
    carried = getattr(error, "kafka_error", None)
    if isinstance(carried, KafkaError):
        return carried
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        return error.args[0]
    return None


def classify(error: KafkaError) -> ErrorAction:
    """The one place that decides: fatal, then abortable, then retriable; otherwise abort."""
    if error.fatal() or error.code() in _FENCED:
        return ErrorAction.FATAL
    if error.txn_requires_abort():
        return ErrorAction.ABORT
    if error.retriable():
        return ErrorAction.RETRY
    return ErrorAction.ABORT


def stops_consumer(error: KafkaError) -> bool:
    """Whether a consumer's error must stop the process: fatal or fenced (classify), or
    credentials that may not read its topics (REFUSED_CREDENTIALS); not an OAUTHBEARER token
    librdkafka could not fetch (its endpoint away: it tries again in 10 s and keeps a token
    still valid; review 51-j F1: an OIDC consumer stopped on a blip of its identity provider)."""
    if error.code() == KafkaError._AUTHENTICATION and "OAUTHBEARER token" in error.str():
        return False
    return classify(error) is ErrorAction.FATAL or error.code() in REFUSED_CREDENTIALS


def describe(error: KafkaError) -> str:
    """One line: the error's name and librdkafka's text."""
    return f"{error.name()}: {error.str()}"


def size_refusal(error: KafkaError, key: bytes | None, value: bytes | None,
                 headers: Sequence[tuple[str, bytes | None]]) -> str | None:
    """What librdkafka's own refusal of a record's size means, for the dead letter: its text
    says "Broker" though no broker saw the record (QA, session 29: a payload under
    max_payload_bytes, over the producer's limit with its key and headers). None for other
    errors."""
    if error.code() != KafkaError.MSG_SIZE_TOO_LARGE:
        return None
    size = len(key or b"") + len(value or b"") + sum(
        len(name.encode()) + len(data or b"") for name, data in headers)
    return (f"refused by the router's producer before sending, not by a broker: the record is "
            f"{size} bytes with its key and headers (and librdkafka's framing), over the "
            "producer's message.max.bytes "
            "(raise kafka.producer.message.max.bytes, within the topic's max.message.bytes)")


def refused_config(error: KafkaException, config: Mapping[str, Any],
                   settings: str = "") -> str:
    """Why librdkafka refused to build a client with `config` (a certificate file it cannot
    read, a wrong key password, an unknown property), naming the missing files (QA 32-d: an
    OpenSSL code and a traceback). `settings`: "kafka.config" when `config` comes from a
    router.yaml, whose TLS advice is `run`'s (reread 58-r F-4); else a library's config."""
    found = kafka_error_of(error)
    unset = [key for key in ("sasl.username", "sasl.password") if not config.get(key)]
    if unset and "sasl.username and sasl.password must be set" in str(found or error):
        # fixer 51-f: the consumer's twin of review 51-d F4 (a secret not mounted)
        return (f"librdkafka refused the client config: {' and '.join(unset)} "
                f"{'is' if len(unset) == 1 else 'are'} not set, and a SASL PLAIN or SCRAM "
                "login needs both; give the missing one (is its secret in this process's "
                "environment?)")
    text = (found.str() if found else str(error)).strip()
    # The advice `run` gives (kafka/tls.py), in words for any client's config, for a file that
    # exists (fixer 57-y: a key of another certificate, an encrypted key, a CA file that is no
    # PEM were told "the file paths, the key password and the property names").
    missing = missing_files(config)
    if not missing and (advice := key_refusal(text)) is not None:
        if advice != KEY_MISMATCH_ADVICE and config.get("ssl.key.password"):
            advice = ("ssl.key.password is set: check that it is the passphrase of the key in "
                      "ssl.key.location, and that the file is a PEM private key")  # QA 58-d F-3
        elif advice != KEY_MISMATCH_ADVICE and settings != "kafka.config":
            advice = ("if the key in ssl.key.location is encrypted, set ssl.key.password to "
                      "its passphrase; else check that the file is a PEM private key")
        return f"librdkafka refused the client config: {text}; {advice}"
    if not missing and (unloadable := tls_property(text)):
        field = f"{settings}.{unloadable}" if settings else unloadable
        return f"librdkafka refused the client config: {text}; {unloaded(field)}"
    if text.startswith("No such configuration property"):
        # QA 61-b F6: a typo'd key was sent to the file paths and the key password.
        return (f"librdkafka refused the client config: {text}; "
                + "".join(f"{line}; " for line in missing)
                + "check the property's name (librdkafka's CONFIGURATION.md lists them)")
    named = named_values(text, config)
    if named:  # review 52-c F-low-3: a refused value was sent to files and passwords
        return (f"librdkafka refused the client config: {text}; check {named} "
                "(librdkafka's CONFIGURATION.md gives each property's range)")
    return (f"librdkafka refused the client config: {text}; "
            + "".join(f"{line}; " for line in missing)
            + "check the file paths, the key password and the property names")


# A property librdkafka's refusal names: "session.timeout.ms" or `max.poll.interval.ms`.
_NAMED_PROPERTY = re.compile(r'[`"]([A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)+)[`"]')
_SECRET_PARTS = ("password", "secret", "pem", "jaas", "token")


def named_values(text: str, config: Mapping[str, Any]) -> str:
    """'a.b=1 and c.d (not set: librdkafka's default)' for the properties `text` names, by
    the names `config` gives them (an alias: linger.ms for queue.buffering.max.ms); secrets
    are not shown; '' when it names none."""
    shown = []
    for name in dict.fromkeys(_NAMED_PROPERTY.findall(text)):
        key = next((key for key in (name, *PROPERTY_ALIASES.get(name, ())) if key in config),
                   None)
        if key is None:
            shown.append(f"{name} (not set: librdkafka's default)")
        elif any(part in key for part in _SECRET_PARTS):
            shown.append(f"{key} (set)")
        else:
            shown.append(f"{key}={config[key]}")
    return " and ".join(shown)


def missing_files(config: Mapping[str, Any]) -> list[str]:
    """'<key> <path> does not exist' for each file property (ssl.*.location) naming none
    ('probe': librdkafka's search of the system's CA paths, no file)."""
    return [f"{key} {value} does not exist" for key, value in config.items()
            if key.endswith(".location") and value and value != "probe"
            and not os.path.exists(str(value))]


# librdkafka names an aliased property by its canonical name when it refuses the value: the
# user's `linger.ms` comes back as queue.buffering.max.ms (CONFIGURATION.md, "Alias for").
PROPERTY_ALIASES: Mapping[str, tuple[str, ...]] = {
    "metadata.broker.list": ("bootstrap.servers",),
    "max.in.flight.requests.per.connection": ("max.in.flight",),
    "sasl.mechanisms": ("sasl.mechanism",),
    "sasl.oauthbearer.client.id": ("sasl.oauthbearer.client.credentials.client.id",),
    "sasl.oauthbearer.client.secret": ("sasl.oauthbearer.client.credentials.client.secret",),
    "fetch.message.max.bytes": ("max.partition.fetch.bytes",),
    "queue.buffering.max.ms": ("linger.ms",),
    "message.send.max.retries": ("retries",),
    "compression.codec": ("compression.type",),
    "request.required.acks": ("acks",),
    "message.timeout.ms": ("delivery.timeout.ms",),
}


def property_names(name: str) -> tuple[str, ...]:
    """The names a user may have written for the property librdkafka calls `name`."""
    return (name, *PROPERTY_ALIASES.get(name, ()))
