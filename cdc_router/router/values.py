"""The values a batch's commit hands on, and `quick_init`: frozen dataclasses built at the speed
of plain ones, for the values made once per record.

A frozen dataclass's generated __init__ sets each field through object.__setattr__, about
0.3 us a field: an OutboxEvent (12 fields) cost 4.7 us, a sixth of the per-record step (#14).
`quick_init` gives such a class an __init__ that stores the fields straight into the instance's
__dict__: the same parameters and defaults, and nothing else changes (assigning a field still
raises FrozenInstanceError; equality, hash, repr and dataclasses.replace work as before).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

if TYPE_CHECKING:
    from cdc_router.kafka.producer import RecordCoordinates
    from cdc_router.nats.publisher import NatsMessage

T = TypeVar("T")


def quick_init(cls: type[T]) -> type[T]:
    """Replace a frozen dataclass's __init__ (see the module doc); TypeError for any other class
    or for a field with a default_factory."""
    params = getattr(cls, "__dataclass_params__", None)
    if not is_dataclass(cls) or params is None or not params.frozen:
        raise TypeError(f"quick_init takes a frozen dataclass, not {cls.__name__}")
    arguments, stores = [], []
    defaults: dict[str, Any] = {}
    for spec in fields(cls):
        if spec.default_factory is not MISSING or not spec.init or spec.kw_only is True:
            raise TypeError(f"quick_init: {cls.__name__}.{spec.name} needs dataclass's own "
                            "__init__ (default_factory, init=False or kw_only)")
        if spec.default is MISSING:
            arguments.append(spec.name)
        else:
            defaults[f"_default_{spec.name}"] = spec.default
            arguments.append(f"{spec.name}=_default_{spec.name}")
        stores.append(f"    values[{spec.name!r}] = {spec.name}")
    # Generated from the field list, as dataclasses generates its own __init__.
    source = (f"def __init__(self, {', '.join(arguments)}):\n    values = self.__dict__\n"
              + "\n".join(stores) + "\n")
    namespace: dict[str, Any] = dict(defaults)
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


@quick_init
@dataclass(frozen=True)
class Delivered:
    """An event whose record is committed on its destination topic ('': before, a replay)."""

    event_id: str
    topic: str
    created_at_ms: int | None


class Committed(NamedTuple):
    """A committed batch: its delivered events, the stages of its dead letters, its records
    that delivered nothing (why each was skipped; None: a replay dropped), and the offsets it
    committed ((topic, partition) → the next offset to read)."""

    delivered: list[Delivered]
    dead_letter_stages: list[str]
    passed_over: list[str | None]
    offsets: dict[tuple[str, int], int] = {}  # noqa: RUF012 (never mutated: read only)

    def with_replays(self, replayed: list[str]) -> list[Delivered]:
        """The delivered events, and the ids whose replays the batch dropped (their rows go
        too: an id reused)."""
        return [*self.delivered, *(Delivered(event_id, "", None) for event_id in replayed)]


@dataclass
class Batch:
    """What the open batch of a Transaction (router/transaction.py) holds so far."""

    started: float = 0.0
    records: int = 0
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    undelivered: dict[tuple[str, int], int | None] = field(default_factory=dict)  # consumed()
    delivered: list[Delivered] = field(default_factory=list)
    dead_letter_stages: list[str] = field(default_factory=list)
    passed_over: list[str | None] = field(default_factory=list)  # see passed_over()
    sources: list[RecordCoordinates] = field(default_factory=list)
    marks: list[str] = field(default_factory=list)  # ids delivered, sent at commit
    dead_marks: list[str] = field(default_factory=list)  # ids dead-lettered, sent at commit
    marked_ms: int = 0
    progress: list[tuple[str, bytes, bytes]] = field(default_factory=list)  # the relay's
    nats: list[NatsMessage] = field(default_factory=list)  # published at commit
    nats_sources: list[RecordCoordinates] = field(default_factory=list)  # one a message
