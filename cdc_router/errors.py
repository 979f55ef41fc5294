"""Every exception class of the package, under one root; each str() is one readable line.
The few that are not CdcRouterError are control flow inside one component (a batch to
abort, a record to dead-letter) and never reach a user."""

from __future__ import annotations

from typing import TYPE_CHECKING

# confluent_kafka (and kafka/errors.py) only where a Kafka error is handled: the dedup stores
# and the consumer's checks import this module without a Kafka client (review 54-k F-10).
if TYPE_CHECKING:
    from confluent_kafka import KafkaError


def show(value: object, limit: int = 80) -> str:
    """repr() of a value for a one-line message: escapes CR/LF, cuts long values."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def on_one_line(text: str) -> str:
    """`text`'s non-blank lines, stripped, joined with '; ' ('' if none): one line of many."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def printable(text: str) -> str:
    """`text` as is, or with its unprintable characters escaped (repr's escapes, no quotes):
    for a log field or a table cell from row data (QA 33-c: an id with CR/LF forged a second
    log line, one with ESC coloured the terminal)."""
    return text if text.isprintable() else repr(text)[1:-1]


# EX_TEMPFAIL (sysexits.h): a temporary failure, run me again. The router exits with it when
# only a new process can go on and a supervisor's restart is the cure (README, "Guarantees").
EXIT_RESTART = 75


class CdcRouterError(Exception):
    """Root of the project's errors: the CLI prints str(error) and exits with exit_code."""

    exit_code = 1


class ConfigError(CdcRouterError):
    """Bad configuration: names the source, the field path, the bad value and what to do."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None,
                 value: object = None, hint: str | None = None) -> None:
        self.source = source
        self.field = field
        self.value = value
        self.hint = hint
        parts = []
        if source:
            parts.append(source)
        if field:
            parts.append(f"field {field!r}")
        prefix = ": ".join(parts)
        text = f"{prefix}: {message}" if prefix else message
        if value is not None:  # cut: a 1 MB value was echoed whole (QA 33-b)
            text += f" (got {show(value, 200)})"
        if hint:
            text += f"; {hint}"
        super().__init__(text)


class StackError(CdcRouterError):
    """The local stack could not start, stop or be inspected."""


class ConnectError(CdcRouterError):
    """Kafka Connect's REST API failed or answered with an error."""


class DecodeError(CdcRouterError):
    """A raw change record is not a Debezium event we can read (stage: decode).

    `event_id`: the row's id when it was read before the failure, for the dead letter's
    `dlq.event.id` (`dlq list`, `dlq replay --id`).
    """

    event_id: str | None = None


class MissingColumn(DecodeError):
    """A configured outbox column the change event's row does not have: `row_columns` are
    the row's own (router/missing_columns.py tells a table from a row)."""

    def __init__(self, message: str, *, column: str, row_columns: tuple[str, ...]) -> None:
        self.column = column
        self.row_columns = row_columns
        super().__init__(f"{message}; the row has {show(', '.join(row_columns), 300)}")


class RouteError(CdcRouterError):
    """No valid destination for an event (stage: route)."""


class SerializeError(CdcRouterError):
    """The payload could not be encoded for its destination (stage: serialize)."""


class DeliveryError(CdcRouterError):
    """Kafka refused or lost a record, or the transaction could not commit (stage: produce)."""

    def __init__(self, message: str, *, kafka_error: object = None) -> None:
        super().__init__(message)
        self.kafka_error = kafka_error


class FatalKafkaError(CdcRouterError):
    """This process can't go on (fenced, unauthorised, misconfigured, a record Kafka refuses
    for good): the router exits non-zero, the idempotent consumer's run() raises it.

    The one fatal class of the router and the consumer (the consumer's `ConsumerFailed` is
    this class under its old name). `code`: the Kafka error code behind it, when there is one.
    """

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class MemberFenced(FatalKafkaError):
    """The group fenced this process's static member (FENCED_INSTANCE_ID): only a new consumer
    can rejoin. The router builds one a few times (router/renewal.py), then exits EXIT_RESTART
    for its supervisor to start it again; `detail` is the fence without that last advice.

    Seen after a broker outage longer than session.timeout.ms, and at every move of the group
    coordinator on a 3-broker cluster (QA 36-a): the coordinator expired the member, and
    librdkafka's requests still in flight with the old member id were fenced (the chaos
    campaign, seed 15). A second instance with the same --instance-id is fenced the same way.
    Also raised for a consumer its group no longer lists (kafka/membership.py, QA 39-c).
    """

    exit_code = EXIT_RESTART

    def __init__(self, message: str, *, code: int | None = None, detail: str = "") -> None:
        super().__init__(message, code=code)
        self.detail = detail or message


class OffsetsUnfetched(FatalKafkaError):
    """librdkafka could not fetch the group's committed offsets for partitions just assigned
    (a request-level NOT_COORDINATOR while the coordinator moved) and does not ask again:
    librdkafka issue #5586 leaves the partitions assigned and never fetched, for ever (QA 31-b:
    after a 90 s broker freeze the router polled an empty consumer for 5 min, lag growing, and
    /healthz healthy). A new consumer fetches them, so the process exits EXIT_RESTART (the
    idempotent consumer's run() raises it)."""

    exit_code = EXIT_RESTART


class GrantRevoked(FatalKafkaError):
    """Kafka refused a topic of the batch (TOPIC_AUTHORIZATION_FAILED in AddPartitionsToTxn)
    that no record's report names: a grant revoked while the process ran (its start checks
    every topic's grants: router/grants.py). Aborting and isolating the batch's records went
    round for ever (QA 31-c: 151 aborts in 75 s, blaming the records); the next process checks
    the grants afresh (a destination's events are then its dead letters; a dead-letter or
    changelog topic it may not write to stops it), so it exits EXIT_RESTART."""

    exit_code = EXIT_RESTART


class TransactionInDoubt(FatalKafkaError):
    """A transaction's commit (or its offsets) got no answer through every retry, and
    librdkafka refuses an abort while the call is unresolved. Only a new process settles it
    (init_transactions ends it), and the next one goes on from what Kafka holds, so the
    process (the router, the relay, `dlq replay`, `outbox republish`) exits EXIT_RESTART."""

    exit_code = EXIT_RESTART


class ProducerHung(FatalKafkaError):
    """A producer call blocked far past its own timeout (librdkafka issues #5456 and #5511:
    send_offsets_to_transaction after the group coordinator's broker went away), so the client
    was given up to the thread it blocks (no Python code interrupts a C call). Its transaction
    commits nothing; a new producer's init_transactions aborts it. The router builds one a few
    times (router/renewal.py); a process that cannot exits EXIT_RESTART, as a hang did before."""

    exit_code = EXIT_RESTART


class ProducerLost(FatalKafkaError):
    """The producer failed for good on its own (router/renewal.py RENEWABLE_ONCE: its abort
    refused with INVALID_TXN_STATE after a broker restart) in a command that does not build a
    new one (`dlq replay`): nothing outside is wrong, so it exits EXIT_RESTART, to run again."""

    exit_code = EXIT_RESTART


class RestoreFailed(CdcRouterError):
    """The replay filter could not learn the ids delivered on partitions just assigned: routing
    them with a filter short of ids would deliver replays again, so the router exits
    EXIT_RESTART and its next life restores from the start (the cluster, not a record)."""

    exit_code = EXIT_RESTART

    def __init__(self, reading: str, failure: object, hint: str = "") -> None:
        """`reading`: what could not be read, e.g. "the dedup changelog 'cdc-router.dedup'"."""
        super().__init__(f"could not read {reading} for the partitions just assigned "
                         f"({failure}); exiting with {EXIT_RESTART} for the supervisor to "
                         f"restart this router once the cluster answers{hint}")


def fatal_kafka_error(message: str, error: KafkaError | None, *,
                      consumer: bool = False) -> FatalKafkaError:
    """The fatal error for a Kafka error classified FATAL: MemberFenced for a fenced static
    member, FatalKafkaError for the rest.

    `consumer`: the error came from the consumer, where librdkafka's generic _FATAL has one
    cause, a fenced static member (librdkafka's INTRODUCTION.md, "Fatal consumer errors").
    """
    from confluent_kafka import KafkaError

    fenced = (KafkaError.FENCED_INSTANCE_ID, KafkaError._FATAL) if consumer \
        else (KafkaError.FENCED_INSTANCE_ID,)
    if error is not None and error.code() in fenced:
        return MemberFenced(f"{message}; exiting with {EXIT_RESTART} for the supervisor to "
                            "restart this router (each instance needs its own --instance-id; "
                            "a move of the group coordinator fences members too)",
                            code=error.code(), detail=message)
    return FatalKafkaError(message, code=None if error is None else error.code())


def grant_refusal(failure: FatalKafkaError, *, group: str | None,
                  transactional_prefix: str | None) -> FatalKafkaError | None:
    """`failure` led by the grant to add, when Kafka refused this process's principal its
    group, its transactional ids or the cluster (kafka.errors.refused_grant); else None. Used
    at the edges (`run`, `relay`, `dlq replay`), which know the config's names."""
    from cdc_router.kafka.errors import refused_grant

    grant = refused_grant(failure.code, group=group, transactional_prefix=transactional_prefix)
    return None if grant is None else FatalKafkaError(f"{grant} ({failure})", code=failure.code)


# Kafka and Connect ---------------------------------------------------------------------------

class ConnectNotServingError(ConnectError):
    """No Connect REST API answered (a worker down or starting): `connectors wait` polls on."""


class UnknownConnectorError(ConnectError):
    """The named connector does not exist on this Connect cluster."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        super().__init__(f"unknown connector {name!r} (Kafka Connect at {url})")


class DeadLetterRefused(DeliveryError):
    """Kafka refused the dead-letter record itself (too large, not authorised, no such topic):
    retrying it unchanged cannot succeed."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code

    @property
    def too_large(self) -> bool:
        """Whether the record was refused for its size: without its value it may pass."""
        from confluent_kafka import KafkaError

        return self.code in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE)


class JetStreamError(CdcRouterError):
    """NATS JetStream did not acknowledge a batch (server down, no stream, ack timeout)."""


class NatsUnreachable(JetStreamError):
    """No server of nats.url answered a connection (down, or not where the URL says)."""


class JetStreamRefused(JetStreamError):
    """JetStream refused some messages of a batch for what they are (too big for the stream's
    max_msg_size): `refused` maps each one's index in the batch to the reason."""

    def __init__(self, message: str, refused: dict[int, str]) -> None:
        super().__init__(message)
        self.refused = refused


class JetStreamConsumerError(CdcRouterError):
    """The JetStream consumer cannot run: NATS unreachable or refusing us, no such stream, a
    durable consumer or a dead-letter subject that would break its guarantees."""


class BatchFailed(Exception):
    """The router's open batch cannot commit: abort it and rewind to the committed offsets.
    `refused`: input records (topic, partition, offset) whose output was refused for what it
    is, each with the reason (JetStream names them exactly): dead letters on the re-read."""

    def __init__(self, reason: str, kafka_error: KafkaError | None = None, *,
                 refused: dict[tuple[str, int, int], str] | None = None) -> None:
        super().__init__(reason)
        self.kafka_error = kafka_error
        self.refused = refused or {}


class RecordRefused(Exception):
    """librdkafka refused one record before sending it (e.g. over message.max.bytes)."""

    def __init__(self, error: KafkaError, detail: str | None = None) -> None:
        from cdc_router.kafka.errors import describe

        super().__init__(f"{describe(error)}; {detail}" if detail else describe(error))
        self.kafka_error = error


# Serde ---------------------------------------------------------------------------------------

class RegistryError(CdcRouterError):
    """The schema registry refused a schema or could not be asked: the router must stop.
    `missing`: the subject, or this schema under it, is not registered; `incompatible`: the
    registry refused to register it (409); `refused`: another definite answer about the
    subject (a 4xx in the registry's words, with its 5-digit code, but 401 and the transient
    408/429: an invalid schema; any 403, a per-subject ACL's); `outage`: no answer, or a
    server error, which a restart may outlast (exit 75). serde/registry_failures.registry_failure
    decides."""

    def __init__(self, message: str, *, missing: bool = False, incompatible: bool = False,
                 refused: bool = False, outage: bool = False) -> None:
        super().__init__(message)
        self.missing = missing
        self.incompatible = incompatible
        self.refused = refused
        if outage:
            self.exit_code = EXIT_RESTART


class PayloadDecodeError(CdcRouterError):
    """A record value could not be decoded: unknown schema, truncated or not what it claims."""


class JsonTooDeep(ValueError):
    """JSON text nested deeper than the limit; str() is the reason."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"nested deeper than {limit} levels")


# The idempotent consumer and its dedup stores ------------------------------------------------

class MalformedRecord(Exception):
    """The record cannot be handled at all (no event id, undecodable): dead-letter it at once.
    `event_id`: its id when it was read before the failure, for the letter's dlq.event.id."""

    event_id: str | None = None


class UnreadableHeaders(MalformedRecord):
    """confluent-kafka could not read the record's headers (a name that is not UTF-8): its
    dead letter goes without them, and nothing may call Message.headers() on it again."""


class DedupStoreRefused(CdcRouterError):
    """The dedup store refuses us for good: its table missing, no grant on it (review 47-e
    F7: retried as an outage for ever, every partition stalled). No retry mends it and no
    record is at fault: the consumer stops with the reason."""


class DedupStoreError(CdcRouterError):
    """The dedup store itself failed (unreachable, commit refused): retry, never dead-letter."""


class NestedEventBusy(DedupStoreError):
    """A run_once inside another event's effect found its event id held by another worker's
    open transaction: raised instead of answering BUSY, so that the outer transaction rolls
    back and the outer event is retried like after an outage, not acknowledged without the
    inner effect (review 46 F2)."""


class RetriableError(CdcRouterError):
    """Raised by a consumer's handler when something it depends on is away (an HTTP service, a
    database, a broker): not the record's fault, so the record is retried with backoff without
    limit, like a store outage, and never dead-lettered. Raise it `from` the cause."""


class EffectAborted(CdcRouterError):
    """The effect returned, but left its transaction unable to commit (it swallowed a database
    error, or ended the transaction itself): nothing is done; the handler's failure, retried
    and then dead-lettered like any exception it raises."""


class DatabaseError(CdcRouterError):
    """Postgres refused or could not be reached; str() is one line naming where."""


class LockLost(DatabaseError):
    """The relay's advisory-lock connection dropped (Postgres restarted, or the connection was
    cut): another relay may take the table over, so this one exits EXIT_RESTART, for its
    supervisor to start it again, waiting for the lock (QA 31-e: it exited 1, and a supervisor
    restarting only on 75 left the table without a relay)."""

    exit_code = EXIT_RESTART


class InvalidEventError(CdcRouterError, ValueError):
    """An event handed to write_event() cannot be stored (wrong payload type, bad id, ...)."""
