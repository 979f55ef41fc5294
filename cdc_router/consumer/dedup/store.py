"""The one small protocol every dedup store implements, and the values it speaks in."""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

from cdc_router.errors import EXIT_RESTART

# Re-exported: the stores and users import them from here and from cdc_router.consumer.dedup.
from cdc_router.errors import DedupStoreError as DedupStoreError
from cdc_router.errors import DedupStoreRefused as DedupStoreRefused
from cdc_router.errors import EffectAborted as EffectAborted
from cdc_router.errors import NestedEventBusy as NestedEventBusy


class DedupStoreUnreachable(DedupStoreError):
    """The dedup store's server did not answer (down, restarting, a failover): the consumer
    retries it; where it stops a service (ensure_schema() at start) a restart may cure it, so
    exit code 75 (QA 61-b F4: it was 1, and a supervisor restarting on 75 left the service down
    after a database restart)."""

    exit_code = EXIT_RESTART


Context = TypeVar("Context")
Context_co = TypeVar("Context_co", covariant=True)

# An effect receives the store's context: the open Postgres connection inside the dedup
# transaction, the Redis client, or None for the in-memory store.
Effect = Callable[[Context], None]


class Outcome(enum.Enum):
    """What `DedupStore.run_once` did with one event id."""

    DONE = "done"
    """The effect ran and is recorded: acknowledge the record."""
    DUPLICATE = "duplicate"
    """The event id was already done: the effect was skipped; acknowledge the record."""
    BUSY = "busy"
    """Another worker holds a live claim on the event id: retry later, do not acknowledge."""


@dataclass(frozen=True)
class DedupKey:
    """Who processed what: the consumer group scopes the event id, so two services both act."""

    consumer_group: str
    event_id: str

    def __post_init__(self) -> None:
        if not self.consumer_group:
            raise ValueError("consumer_group must not be empty")
        if not self.event_id:
            raise ValueError("event_id must not be empty")


class DedupStore(Protocol[Context_co]):
    """Runs an effect at most once per key, as far as the store can promise (see each store).

    Contract of run_once:
    - returns DONE after the effect ran and its key was recorded as done;
    - returns DUPLICATE, without calling the effect, when the key is already done;
    - returns BUSY, without calling the effect, when another worker holds a live claim;
    - when the effect raises, the key is left not done (and unclaimed) and the exception
      propagates unchanged, so the caller can retry it;
    - when the store itself fails it raises DedupStoreError; the key may then be in any
      state the store's documentation allows, never "done without its effect".

    Optional: check_usable(), called once when run() starts (consumer/store_checks.py):
    raise DedupStoreRefused when the store refuses us for good (run() stops), DedupStoreError
    when it does not answer (a warning; run() starts).
    """

    def run_once(self, key: DedupKey, effect: Callable[[Context_co], None]) -> Outcome:
        """Run `effect` unless `key` is already done; see the class docstring."""
        ...

    def close(self) -> None:
        """Release connections; the store may be used again (it reconnects lazily)."""
        ...


def run_effect(effect: Callable[[Context], None], context: Context) -> None:
    """effect(context); TypeError when it returned a coroutine or a generator (an `async def`,
    a stray `yield`): its body never ran, so the key must not be marked done (review 52-c
    F-HIGH-11: every store recorded such an event done, its effect silently lost)."""
    result = cast(Callable[[Context], object], effect)(context)
    if inspect.isawaitable(result) or inspect.isgenerator(result) or inspect.isasyncgen(result):
        if inspect.iscoroutine(result):
            result.close()  # no "never awaited" warning: the error says it
        name = getattr(result, "__qualname__", None)
        raise TypeError(f"the effect returned {type(result).__name__}"
                        f"{f' {name!r}' if isinstance(name, str) else ''}, whose body never "
                        "runs here, so the event's effect did not happen: the handler must be a "
                        "plain function that does its work before it returns (run async code "
                        "inside it with asyncio.run())")
