"""How the Postgres dedup store (dedup/postgres.py) judges its transaction and the errors in it:
whether the effect left it committable, and which errors are the effect's, contention, or
text the database cannot store."""

from __future__ import annotations

import psycopg
from psycopg.pq import TransactionStatus

from cdc_router.consumer.dedup.store import DedupKey, DedupStoreError, EffectAborted


def check_committable(conn: psycopg.Connection[tuple[object, ...]], key: DedupKey) -> None:
    """Raise EffectAborted unless the dedup transaction can still commit what it holds.

    An effect that catches a database error (`except UniqueViolation: pass`) leaves the
    transaction aborted; Postgres answers the COMMIT with ROLLBACK and psycopg does not
    raise, so without this check the record would be acknowledged with neither its effect
    nor its dedup row.
    """
    if conn.broken:  # the effect caught the error of a lost connection: an outage
        raise DedupStoreError(f"dedup transaction failed for event {key.event_id}: the "
                              "connection to Postgres was lost while the effect ran")
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise EffectAborted(
            f"the effect of event {key.event_id} caught a database error and returned, so "
            "Postgres rolled back its writes and the dedup row; let the error propagate, or "
            "wrap the statement that may fail in a savepoint (`with conn.transaction():`)")
    if status != TransactionStatus.INTRANS:
        raise EffectAborted(
            f"the effect of event {key.event_id} ended the dedup transaction itself "
            f"(status {status.name}); it must not commit or roll back, so that its writes "
            "and the dedup row commit together")


# SQLSTATE classes of an error at COMMIT that the effect's writes caused (a deferred foreign
# key or unique constraint, a constraint trigger that raises): the handler's failure, retried
# then dead-lettered (review 33: retried as an outage, for ever, the partition stuck).
EFFECT_CLASSES = ("22", "23", "P0")


IDLE_IN_TRANSACTION_TIMEOUT = "25P03"
UNSTORABLE_TEXT = frozenset({"22P05", "22021"})  # untranslatable, not in the encoding


def effects_fault(error: psycopg.Error) -> bool:
    return (error.sqlstate or "")[:2] in EFFECT_CLASSES or \
        error.sqlstate == IDLE_IN_TRANSACTION_TIMEOUT


def contention(error: psycopg.Error) -> bool:
    """Class 40, transaction rollback: a deadlock or a serialization failure, which the same
    transaction retried later does not meet again."""
    return (error.sqlstate or "").startswith("40")
