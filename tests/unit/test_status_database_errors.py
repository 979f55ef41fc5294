"""status's Postgres sections: which errors say Postgres did not answer, which a query failed."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from cdc_router.ops.database import _guarded
from cdc_router.ops.report import OutboxState, WalState


def _failing(error: psycopg.Error) -> WalState:
    raise error


@pytest.mark.parametrize("error", [
    errors.DeadlockDetected("deadlock detected"),
    errors.DiskFull('could not extend file "base/5/16384": No space left on device'),
    errors.OutOfMemory("out of memory"),
    errors.UndefinedColumn('column "created_at" does not exist'),
])
def test_a_failed_query_of_a_server_that_answered_leaves_it_up(error: psycopg.Error) -> None:
    # Review 54-m F-6: OperationalErrors of an answering server (a deadlock, a full disk) set
    # cdc_router_status_up to 0, as though Postgres were down.
    state = _guarded(lambda: _failing(error), WalState)
    assert state.answered is True
    assert state.error is not None and state.error.startswith("Postgres: ")


@pytest.mark.parametrize("error", [
    psycopg.OperationalError("consuming input failed: server closed the connection "
                             "unexpectedly"),
    errors.ConnectionFailure("connection failure"),
    errors.AdminShutdown("terminating connection due to administrator command"),
    errors.CrashShutdown("terminating connection because of crash of another server process"),
    errors.CannotConnectNow("the database system is starting up"),
])
def test_a_lost_connection_or_a_server_going_away_did_not_answer(error: psycopg.Error) -> None:
    state = _guarded(lambda: _failing(error), OutboxState)
    assert state.answered is False and state.error is not None
