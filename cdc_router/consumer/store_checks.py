"""What both consumers (Kafka, JetStream) ask of their dedup store and make of a handler's
database errors, so that a deploy's fault stops them at once rather than per record.

- check_store(): at run()'s start (QA 57-c F-2), as the dead-letter topic is checked. A store
  with a check_usable() (PostgresDedupStore: connect, and an INSERT of no row into its table;
  RedisDedupStore: PING) that refuses us for good (a wrong DSN or password, the table missing,
  no grant) stops run() with DedupStoreRefused; one that does not answer is an outage, no
  verdict: a warning, and run() starts and retries the store at each record. A store of the
  user's without check_usable() is taken as it is: the name is ours, so that a store's own
  check(), say, meaning something else, is not called (reread 57-a F-9: a TypeError traceback
  at run()'s start).
- not_the_records(): a handler's psycopg error that no retry mends and no record causes
  (deploy_fault: a table, schema or column missing, a database or login refused) becomes
  EffectRefused, which stops run(), as the same error in the dedup table's statements
  does (QA 57-c F-3: every event was dead-lettered); one that says the handler's server is not
  there (server_unreachable: connection lost, class 08, shutting down) becomes RetriableError,
  retried without limit like the store's outages. Judged by the SQLSTATE whatever connection
  raised it (the store's or one of the handler's): the library cannot tell them apart, and on
  either it is the same fault, met by every record. Not SQLSTATE 42501 (a privilege): it is
  also a row-level-security policy's refusal, which depends on the row (reread 57-a F-2: one
  event stopped the stream for good), so it stays the record's failure, retried then
  dead-lettered (a missing GRANT shows as every event's letter naming it). A handler for
  which such an error is one record's fault (a table named by the payload) raises an
  exception of its own instead.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from cdc_router.errors import CdcRouterError, DedupStoreError, DedupStoreRefused, RetriableError
from cdc_router.postgres import deploy_fault, one_line, server_unreachable

log = logging.getLogger(__name__)


class EffectRefused(DedupStoreRefused):
    """A handler's Postgres statement met an error no retry mends and no record causes (a
    table, schema or column missing, a database or login refused): the consumer
    stops with it, as for the same error in the dedup store's statements, rather than
    dead-letter every event (QA 57-c F-3). A DedupStoreRefused, so what stops for one stops
    for the other."""


def check_store(store: Any) -> None:
    """store.check_usable() when the store has one (dedup/store.py, DedupStore):
    DedupStoreRefused raised, an outage logged."""
    check = getattr(store, "check_usable", None)
    if not callable(check):
        return
    try:
        check()
    except DedupStoreError as error:
        log.warning("event=dedup_store_unchecked store=%s error=%r: it did not answer at start; "
                    "the consumer starts and retries it at each record: if this lasts, check "
                    "the store's address (the DSN's host and port, the Redis URL)",
                    type(store).__name__, str(error))


def not_the_records(error: psycopg.Error) -> CdcRouterError | None:
    """What a handler's `error` is instead of its record's failure, or None (see the module
    doc)."""
    state = f" (SQLSTATE {error.sqlstate})" if error.sqlstate else ""
    if deploy_fault(error, row_security=True):
        return EffectRefused(
            f"the handler's database statement failed: {one_line(error)}{state}; no retry "
            "mends it and every event would meet it, so the consumer stops rather than "
            "dead-letter each one: create what is missing (run the service's migration) or "
            "fix its DSN, then start it again")
    if server_unreachable(error):
        return RetriableError(f"the handler's database did not answer: {one_line(error)}"
                              f"{state}")
    return None
