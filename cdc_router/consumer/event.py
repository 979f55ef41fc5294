"""The record as the handler sees it, and how its event id is read."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cdc_router.consumer.settings import EventIdSource
from cdc_router.dead_letter import MAX_EVENT_ID_BYTES, shown_error
from cdc_router.errors import (
    EXIT_RESTART,
    CdcRouterError,
    MalformedRecord,
    PayloadDecodeError,
    RegistryError,
    UnreadableHeaders,
    printable,
    show,
)
from cdc_router.kafka.consumer import readable_headers
from cdc_router.serde.json import NULL_VALUE

log = logging.getLogger(__name__)


class KafkaMessage(Protocol):
    """The part of confluent_kafka.Message the loop reads."""

    def topic(self) -> str: ...
    def partition(self) -> int: ...
    def offset(self) -> int: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> list[tuple[str, bytes | None]] | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def error(self) -> Any: ...


@dataclass(frozen=True)
class ConsumedEvent:
    """One consumed record with its event id; `payload` is the decoded value.

    `attempt` counts this consumer's tries of this record (1 on the first), so a handler can
    tell a retry from a first delivery; it restarts at 1 after a rebalance or a restart.
    """

    event_id: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    payload: Any
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int | None
    attempt: int

    @property
    def shown_id(self) -> str:
        """The event id for a log line: unprintable characters escaped (errors.printable)."""
        return printable(self.event_id)

    def header(self, name: str) -> bytes | None:
        """The last value of header `name`, or None when absent."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found


Decoder = Callable[[bytes | None], Any]
# What a handler or a decoder may raise that ends run() instead of failing its record: a request
# to stop the process (Ctrl-C, sys.exit()), which no record may swallow (consumer/handler.py).
STOPS_PROCESS = (KeyboardInterrupt, SystemExit)


class RegistryRefused(CdcRouterError):
    """The schema registry refused the decoder for a reason no retry mends: the credentials
    (401), an address that is no registry's, a client config it cannot build. It ends run(),
    exit 1, as refused Kafka credentials and a dedup store's do (QA 66-a F-4: a wrong
    basic_auth_user_info was retried without end, the consumer stalled on its first Avro
    record). Not an outage (exit 75 in the error: retried), nor a 403 (a per-subject grant)."""


def _avro_hint(value: bytes, error: BaseException) -> str:
    """What a decoder of another format failing on an Avro value should be told (QA 66-a
    F-6: a JSON decoder on an Avro topic dead-lettered each record as a UnicodeDecodeError,
    the reason naming neither Avro nor the decoder to use)."""
    if isinstance(error, PayloadDecodeError):
        return ""  # PayloadDecoder's own: it reads Avro, and says why it could not
    if value[:1] == b"\x00" and len(value) >= 5:
        # Confluent's Protobuf and JSON Schema serializers frame alike (review 66).
        framing = f"in the schema registry's wire format, schema id " \
            f"{int.from_bytes(value[1:5], 'big')}, as the router writes its Avro"
    elif value[:2] == b"\xc3\x01":
        framing = "in Avro single-object encoding"
    else:
        return ""
    return (f" (the value is {framing}: decode this topic with "
            "cdc_router.serde.decode.PayloadDecoder, not a JSON decoder)")


def _registry_refusal(error: RegistryError) -> RegistryRefused | None:
    """The RegistryRefused that `error` of a decoder is, or None: retry it."""
    if error.exit_code == EXIT_RESTART or error.refused:
        return None
    return RegistryRefused(f"the schema registry refused this consumer's decoder: {error}")


def _event_id_text(raw: bytes | None, where: str, lacking: str = "") -> str:
    """The id in `raw` (read from `where`); `lacking` opens the no-id message (review 52-c
    F-low-1: in auto mode it named the key alone, read as a key problem, when the producer
    forgot the id header)."""
    if raw is None or raw == b"":
        raise MalformedRecord(f"no event id: {lacking}{where} is missing or empty")
    if len(raw) > MAX_EVENT_ID_BYTES:
        raise MalformedRecord(f"event id in {where} is {len(raw):,} bytes, over the "
                              f"{MAX_EVENT_ID_BYTES:,} an id may have: {show(raw, 60)}")
    if b"\x00" in raw:
        # Postgres text cannot hold NUL: the store would refuse the id on every retry.
        raise MalformedRecord(f"event id in {where} holds a NUL byte: {show(raw)}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise MalformedRecord(f"event id in {where} is not UTF-8: {error}") from error
    if not text.strip():
        raise MalformedRecord(f"no event id: {lacking}{where} is blank")
    return text


def read_event(message: KafkaMessage, *, source: EventIdSource, header: str,
               decoder: Decoder | None, attempt: int,
               key_name: str = "the record key",
               keyed_topics: set[str] | None = None) -> ConsumedEvent:
    """Build the handler's view of `message`; raises MalformedRecord when it has none.

    `key_name` names the key in that error (the JetStream consumer's key is Nats-Msg-Id).
    `keyed_topics`: the topics already warned about taking the key for want of the header
    (the Kafka consumer's; None: no warning).

    A RegistryError of the decoder (the schema registry unreachable, failing, timing out)
    passes through unchanged (RegistryRefused: refused credentials, no registry's address):
    the record is not at fault and must be retried, not
    dead-lettered.
    """
    readable = readable_headers(message)
    if readable is None:
        raise UnreadableHeaders("a header name is not UTF-8: the record's headers cannot be "
                                "read, nor its event id trusted")
    headers = tuple(readable or ())
    values = [value for name, value in headers if name == header]
    if source == "key" or (source == "auto" and not values):
        event_id = _event_id_text(message.key(), key_name,
                                  f"no {header!r} header, and " if source == "auto" else "")
        if source == "auto" and keyed_topics is not None:
            _warn_key_fallback(message.topic(), header, keyed_topics)
    else:
        # A present but empty header is malformed, never replaced by the key: the key may be
        # an aggregate id, shared by many events. Two that differ are too: either could be
        # the forged one, and dedup on the wrong id skips or repeats an effect.
        if len(values) > 1 and any(value != values[0] for value in values[1:]):
            raise MalformedRecord(
                f"{len(values)} {header!r} headers with different values "
                f"({', '.join(show(value, 40) for value in values[:4])}): the event id is "
                "ambiguous; the producer (or a proxy on the way) must write one")
        event_id = _event_id_text(values[-1] if values else None, f"header {header!r}")
    value = message.value()
    if decoder is None:
        payload: Any = value
    else:
        try:
            payload = decoder(value)
        except RegistryError as error:
            if not error.missing:  # the registry is down or refuses us: the record is fine
                refusal = _registry_refusal(error)
                if refusal is not None:
                    raise refusal from None  # the end of run()
                raise  # retried
            raise _with_id(MalformedRecord(f"value cannot be decoded: {error}"),
                           event_id) from error
        except STOPS_PROCESS:
            raise
        except BaseException as error:  # asyncio.CancelledError too: the record's (52-c F-med-14)
            # A tombstone: the decoder's own words were a TypeError's (QA 54-c F-5).
            reason = NULL_VALUE if value is None else \
                f"{type(error).__name__}: {shown_error(error)}{_avro_hint(value, error)}"
            raise _with_id(MalformedRecord(f"value cannot be decoded: {reason}"),
                           event_id) from error
    timestamp_type, timestamp = message.timestamp()
    return ConsumedEvent(
        event_id=event_id, topic=message.topic(), partition=message.partition(),
        offset=message.offset(), key=message.key(), value=value, payload=payload,
        headers=headers, timestamp_ms=timestamp if timestamp_type else None, attempt=attempt)


def _warn_key_fallback(topic: str, header: str, keyed_topics: set[str]) -> None:
    """Warn once per topic that its records' keys are taken as event ids (review 52-c F-med-8:
    records sharing an entity key were skipped as duplicates with a DEBUG line only)."""
    if topic in keyed_topics:
        return
    keyed_topics.add(topic)
    log.warning("event=event_id_from_key topic=%s: a record has no %r header, so its key is "
                "its event id (event_id_source='auto'), and records sharing a key (an entity "
                "id) are skipped as duplicates of the first; set event_id_source='header' to "
                "dead-letter records without the header, or 'key' if every key is one event's "
                "id (told once a topic)", printable(topic), header)


def _with_id(error: MalformedRecord, event_id: str) -> MalformedRecord:
    """`error` naming the event id it was read with (QA 47-c F4: the letter had none)."""
    error.event_id = event_id
    return error
