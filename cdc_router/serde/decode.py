"""The consumer's side: decode a destination record's value, whichever encoding its route used.

- Confluent wire format (byte 0, a 4-byte schema id, the Avro body): read by confluent-kafka's
  AvroDeserializer; the writer's schema comes from the schema registry by id, once per id.
- Avro single-object encoding (0xC3 0x01, an 8-byte fingerprint, the body): the writer's schema
  comes from a store of known schemas keyed by CRC-64-AVRO fingerprint.
- Anything else is taken as JSON, the router's other format.

With a reader schema, Avro schema resolution turns the writer's data into the reader's shape
(a consumer on an older or newer version of the schema).

    decoder = PayloadDecoder.for_config(load_config("router.yaml").config)
    event = decoder.decode(message.value()).value
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import fastavro
from confluent_kafka.schema_registry import Schema, dual_schema_id_deserializer
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import SerializationContext, SerializationError

from cdc_router.config.redact import shown_url
from cdc_router.errors import PayloadDecodeError as PayloadDecodeError
from cdc_router.serde.avro import CONFLUENT_MAGIC
from cdc_router.serde.avro_bounds import empty_items_problem, varint_problem
from cdc_router.serde.avro_schema import (
    SINGLE_OBJECT_HEADER,
    SINGLE_OBJECT_MAGIC,
    AvroSchema,
    load_schema,
)
from cdc_router.serde.json import NULL_VALUE, parse_json
from cdc_router.serde.registry import RegistryError, SchemaIds, writer_schema
from cdc_router.serde.registry_failures import CLIENT_SETTINGS, CONFIG_SETTINGS

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from cdc_router.config.compiled import CompiledConfig
    from cdc_router.config.model import RouterConfig

Encoding = Literal["confluent", "single_object", "json"]

# What fastavro's reader raises for a body that is not what its writer schema says;
# ArithmeticError: OverflowError for a timestamp beyond a datetime, from another writer.
_BODY_ERRORS = (EOFError, ValueError, TypeError, IndexError, KeyError, ArithmeticError,
                fastavro.read.SchemaResolutionError)


@dataclass(frozen=True)
class Decoded:
    """A decoded record value and how it was encoded."""

    value: Any
    encoding: Encoding
    schema_id: int | None = None  # confluent: the registry's id of the writer's schema
    fingerprint: bytes | None = None  # single_object: CRC-64-AVRO of the writer's schema
    writer: str | None = None  # the writer schema's full name, when it has one


def encoding_of(value: bytes) -> Encoding:
    """Which encoding `value` carries, by its first bytes (JSON never starts with 0x00 or 0xC3)."""
    if value[:2] == SINGLE_OBJECT_MAGIC:
        return "single_object"
    if value[:1] == CONFLUENT_MAGIC:
        return "confluent"
    return "json"


class PayloadDecoder:
    """Decodes record values of every route format; schemas are looked up once each."""

    def __init__(self, *, schemas: Iterable[AvroSchema | str | Path] = (),
                 registry: SchemaRegistryClient | None = None,
                 reader_schema: AvroSchema | None = None,
                 registry_url: str | None = None) -> None:
        """`schemas` fill the single-object store; `registry` serves Confluent ids, and its
        `registry_url` (a router config's schema_registry.url) is what an error about it
        names; without one, the url the client was built with, as the client's own."""
        self._by_fingerprint: dict[bytes, AvroSchema] = {}
        self._by_id: dict[int, AvroSchema] = {}
        self._registry = registry
        self._registry_url = registry_url or _client_url(registry)
        self._settings = CONFIG_SETTINGS if registry_url else CLIENT_SETTINGS
        self._reader = reader_schema
        self._wire: AvroDeserializer | None = None  # built on the first wire-format value
        # What the library's header reading saw for the value being decoded (see _header).
        self._writer: tuple[int, AvroSchema, io.BytesIO] | None = None
        for schema in schemas:
            self.add_schema(schema)

    @classmethod
    def for_config(cls, config: RouterConfig | CompiledConfig,
                   registry: SchemaRegistryClient | None = None) -> PayloadDecoder:
        """A decoder that knows every schema of `config`'s routes and, if it has one, its
        registry (`registry` overrides the client built from config.schema_registry).
        `config`: the router's, or what load_config() returns."""
        # CompiledConfig holds the RouterConfig as .config; a RouterConfig has no such field.
        settings = cast("RouterConfig", getattr(config, "config", config))
        files = []
        for route in settings.routes:
            spec = route.schema_path
            files += [spec] if isinstance(spec, str) else list((spec or {}).values())
        if settings.schema_registry is None or registry is not None:
            return cls(schemas=files, registry=registry)  # the caller's client, its url
        return cls(schemas=files, registry=SchemaIds(settings.schema_registry).client,
                   registry_url=settings.schema_registry.url)

    def add_schema(self, schema: AvroSchema | str | Path) -> AvroSchema:
        """Add a writer schema (or an .avsc file) to the single-object store."""
        parsed = schema if isinstance(schema, AvroSchema) else load_schema(schema)
        self._by_fingerprint[parsed.fingerprint] = parsed
        return parsed

    def decode(self, value: bytes | None) -> Decoded:
        """Decode one record value; PayloadDecodeError when its writer schema is unknown or
        the bytes do not decode with it (the record's fault), RegistryError when the registry
        cannot be asked (unreachable, 5xx, timeout, refused credentials: try again later)."""
        if value is None:
            raise PayloadDecodeError(NULL_VALUE)
        encoding = encoding_of(value)
        if encoding == "json":
            try:
                return Decoded(parse_json(value), "json")
            except (ValueError, UnicodeDecodeError) as error:
                raise PayloadDecodeError(f"neither Avro (no 0x00 or 0xC3 0x01 header) nor JSON: "
                                         f"{error}") from None
        if encoding == "single_object":
            if len(value) < SINGLE_OBJECT_HEADER:
                raise PayloadDecodeError(f"single-object header cut short ({len(value)} bytes)")
            fingerprint = value[2:SINGLE_OBJECT_HEADER]
            writer = self._by_fingerprint.get(fingerprint)
            if writer is None:
                raise PayloadDecodeError(f"no known schema has fingerprint {fingerprint.hex()}; "
                                         "add the writer's .avsc to the decoder's schemas")
            body = value[SINGLE_OBJECT_HEADER:]
            return Decoded(self._read(body, writer), encoding, fingerprint=fingerprint,
                           writer=writer.name)
        return self._wire_format(value)

    def _wire_format(self, value: bytes) -> Decoded:
        """A value in the registry's wire format, read by confluent-kafka's AvroDeserializer."""
        if self._registry is None:
            raise PayloadDecodeError("a value in the registry's wire format needs a schema "
                                     "registry, and this decoder has none")
        if self._wire is None:
            reader = Schema(self._reader.text, "AVRO") if self._reader is not None else None
            self._wire = AvroDeserializer(self._registry, reader,
                                          conf={"schema.id.deserializer": self._header})
        self._writer = None
        try:
            datum = self._wire(value, None)
        except (PayloadDecodeError, RegistryError):
            raise
        except SerializationError as error:  # the framing itself: too short, bad magic byte
            raise PayloadDecodeError(f"not in the registry's wire format: {error}") from None
        except _BODY_ERRORS as error:
            assert self._writer is not None  # the library reads the header before the body
            raise _undecodable(self._writer[1], error) from None
        assert self._writer is not None
        schema_id, writer, body = self._writer
        _check_consumed(body, writer)
        return Decoded(datum, "confluent", schema_id=schema_id, writer=writer.name)

    def _header(self, data: bytes, ctx: SerializationContext | None,
                schema_id: Any) -> io.BytesIO:
        """The library's own reading of the header (its schema.id.deserializer), which also
        fetches the writer schema here first, so that a registry failure is classified as
        ours: the record's fault (unknown id) or an outage."""
        body: io.BytesIO = dual_schema_id_deserializer(data, ctx, schema_id)
        if schema_id.id is None:
            raise PayloadDecodeError("the value names its schema by GUID, which this decoder "
                                     "does not look up")
        writer = self._writer_by_id(schema_id.id)
        self._writer = (schema_id.id, writer, body)
        _refuse_empty_items(body.getvalue()[body.tell():], writer)  # review 48-d F5: as _read
        return body

    def _writer_by_id(self, schema_id: int) -> AvroSchema:
        cached = self._by_id.get(schema_id)
        if cached is not None:
            return cached
        if self._registry is None:
            raise PayloadDecodeError(f"schema id {schema_id} needs a schema registry, and this "
                                     "decoder has none")
        try:
            writer = writer_schema(self._registry, schema_id, self._registry_url,
                                   self._settings)
        except RegistryError as error:
            if not error.missing:
                raise  # unreachable, failing, refusing us: retried, no record's fault
            # The registry answered and has no such id: the record's fault, for good. Not the
            # error's own advice, the router's about its .avsc files (QA 55-c F-5).
            raise PayloadDecodeError(f"schema id {schema_id} is unknown to the registry at "
                                     f"{shown_url(self._registry_url)}: it holds no such id, "
                                     "so the producer wrote one of another registry, or of a "
                                     "schema deleted since") from None
        self._by_id[schema_id] = writer
        return writer

    def _read(self, body: bytes, writer: AvroSchema) -> Any:
        reader = self._reader.parsed if self._reader is not None else None
        _refuse_empty_items(body, writer)
        stream = io.BytesIO(body)
        try:
            datum = fastavro.schemaless_reader(stream, writer.parsed, reader)
        except _BODY_ERRORS as error:
            raise _undecodable(writer, error) from None
        _check_consumed(stream, writer)
        return datum


def _refuse_empty_items(body: bytes, writer: AvroSchema) -> None:
    """A body claiming more items that take no bytes than the bound is refused before
    fastavro builds them, and one with a varint wider than its type, which fastavro reads as
    another number than other readers (serde/avro_bounds.py)."""
    claimed = empty_items_problem(body, writer) or varint_problem(body, writer)
    if claimed is not None:
        raise _undecodable(writer, ValueError(claimed))


def _undecodable(writer: AvroSchema, error: Exception) -> PayloadDecodeError:
    return PayloadDecodeError(f"the Avro body does not decode with schema "
                              f"{writer.name or writer.path}: {error!r}")


def _check_consumed(body: io.BytesIO, writer: AvroSchema) -> None:
    """PayloadDecodeError when bytes are left after the datum: not what the schema wrote."""
    left = len(body.getbuffer()) - body.tell()
    if left:
        raise PayloadDecodeError(f"{left} bytes left over after decoding with schema "
                                 f"{writer.name or writer.path}")


def _client_url(client: SchemaRegistryClient | None) -> str:
    """The url a SchemaRegistryClient was built with (its `url` setting, as the client keeps
    it; credentials are hidden where it is shown), or a description when it does not say."""
    conf = getattr(client, "_conf", None)  # confluent-kafka keeps the dict it was given
    url = conf.get("url") if isinstance(conf, dict) else None
    return url if isinstance(url, str) and url else "(the SchemaRegistryClient's url)"
