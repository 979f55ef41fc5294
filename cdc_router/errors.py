"""One root exception for everything a user may see; each str() is one readable line."""

from __future__ import annotations


def show(value: object, limit: int = 80) -> str:
    """repr() of a value for a one-line message: escapes CR/LF, cuts long values."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


class CdcRouterError(Exception):
    """Root of the project's errors: the CLI prints str(error) and exits 1."""


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
        if value is not None:
            text += f" (got {value!r})"
        if hint:
            text += f"; {hint}"
        super().__init__(text)


class StackError(CdcRouterError):
    """The local stack could not start, stop or be inspected."""


class ConnectError(CdcRouterError):
    """Kafka Connect's REST API failed or answered with an error."""


class DecodeError(CdcRouterError):
    """A raw change record is not a Debezium event we can read (stage: decode)."""


class RouteError(CdcRouterError):
    """No valid destination for an event (stage: route)."""


class SerializeError(CdcRouterError):
    """The payload could not be encoded for its destination (stage: serialize)."""


class DeliveryError(CdcRouterError):
    """Kafka refused or lost a record, or the transaction could not commit (stage: produce)."""

    def __init__(self, message: str, *, kafka_error: object = None,
                 source: tuple[str, int, int] | None = None) -> None:
        super().__init__(message)
        self.kafka_error = kafka_error
        self.source = source  # the input record (topic, partition, offset) it came from


class FatalKafkaError(CdcRouterError):
    """This process can't go on (fenced, unauthorised, misconfigured): it exits non-zero."""
