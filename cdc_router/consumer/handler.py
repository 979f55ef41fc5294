"""What a consumer takes for its handler and its store, and how it calls the handler.

Both consumers (Kafka and JetStream) check their wiring at construction, in one line naming the
argument: a store without run_once, a handler that is not callable, that cannot take
(event, context), or whose body would never run (an `async def`, a generator function: calling
it returns a coroutine or a generator, and the event would be marked done without its effect).
The handler is then called through guarded(), which makes what only run time shows that
record's failure (retried, then dead-lettered), never a done mark nor the process's end:
- a returned awaitable or generator (a callable whose signature hid an `async def`);
- a BaseException that is no request to stop the process (asyncio.CancelledError from an
  asyncio.run() inside the handler, GeneratorExit, a BaseException subclass of its own),
  turned into HandlerAborted: the store then sees an ordinary failure (rolled back, claim
  released) and so does the loop. KeyboardInterrupt and SystemExit still end run(): they ask
  the process to stop, and a record must not swallow a Ctrl-C or a sys.exit();
- a psycopg error that is no record's fault (store_checks.not_the_records): EffectRefused,
  which stops run(), or RetriableError, retried without limit (QA 57-c F-3).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TypeVar

import psycopg

from cdc_router.consumer.dedup.store import run_effect
from cdc_router.consumer.event import STOPS_PROCESS, ConsumedEvent
from cdc_router.consumer.store_checks import not_the_records
from cdc_router.dead_letter import shown_error
from cdc_router.errors import ConfigError

Context = TypeVar("Context")
Handler = Callable[[ConsumedEvent, Context], None]


class HandlerAborted(Exception):
    """A handler raised a BaseException that is not an Exception (asyncio.CancelledError, say)
    and that asks no stop of the process: that record's failure."""


def check_wiring(source: str, settings: object, settings_type: type, store: object,
                 handler: object, decoder: object) -> None:
    """Raise a ConfigError naming `source` and the argument a consumer cannot run with."""
    if not isinstance(settings, settings_type):
        raise ConfigError(f"must be a {settings_type.__name__}", source=source,
                          field="settings", value=settings)
    if not callable(getattr(store, "run_once", None)):
        raise ConfigError("must be a dedup store (PostgresDedupStore, RedisDedupStore, "
                          "MemoryDedupStore, or an object with run_once(key, effect))",
                          source=source, field="store", value=store)
    if decoder is not None and not callable(decoder):
        raise ConfigError("must be None or a function of the record's value (bytes or None)",
                          source=source, field="decoder", value=decoder)
    problem = handler_problem(handler)
    if problem is not None:
        raise ConfigError(problem, source=source, field="handler", value=handler)


def handler_problem(handler: object) -> str | None:
    """Why `handler` cannot be the handler, or None. A callable whose signature cannot be read
    (some built-ins and C extensions) is taken as it is."""
    if not callable(handler):
        return "must be a function handler(event, context)"
    call = inspect.getattr_static(type(handler), "__call__", None)  # an object's, maybe async
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call):
        return ("must be a plain function: an `async def` handler is never awaited, so its "
                "effect would never run; write a def (run async code inside it with "
                "asyncio.run())")
    if inspect.isasyncgenfunction(handler) or inspect.isgeneratorfunction(handler) or \
            inspect.isasyncgenfunction(call) or inspect.isgeneratorfunction(call):
        return ("must be a plain function, not a generator function (a `yield` in its body): "
                "calling it runs none of its body, so its effect would never run")
    try:
        # The outermost signature: a decorator's wrapper that supplies an argument takes
        # (event, context) although the function it wraps does not (reread 52-l F1).
        signature = inspect.signature(handler, follow_wrapped=False)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(None, None)
    except TypeError as error:
        return f"must take two arguments, (event, context): {error}"
    return None


def guarded(handler: Handler[Context]) -> Handler[Context]:
    """`handler` called so that what only run time shows is the record's failure (see the
    module doc)."""

    def call(event: ConsumedEvent, context: Context) -> None:
        try:
            run_effect(functools.partial(handler, event), context)
        except psycopg.Error as error:
            instead = not_the_records(error)
            if instead is None:
                raise
            raise instead from error
        except (*STOPS_PROCESS, Exception):
            raise
        except BaseException as error:
            raise HandlerAborted(f"the handler raised {type(error).__name__} (a BaseException, "
                                 f"not an Exception): {shown_error(error)}") from error

    return call
