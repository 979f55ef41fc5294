"""The cleanup's cleanup_failed reason for a DELETE refused inside a function Postgres ran."""

from __future__ import annotations

from typing import Any

import psycopg

from cdc_router.router.cleanup_failures import failure_reason


def test_a_cleanup_delete_failing_in_a_trigger_says_so_with_its_context() -> None:
    # QA 57-b F-5: an AFTER DELETE trigger's error gave a bare `column "id" is of type uuid but
    # expression is of type text`, no reason, read as the router's own cast.
    class Diag:
        context = "PL/pgSQL function qa_audit() line 3 at SQL statement"

    class InTrigger(psycopg.errors.DatatypeMismatch):
        @property
        def diag(self) -> Any:  # type: ignore[override]
            return Diag()

    reason = failure_reason(InTrigger('column "id" is of type uuid'), connected=True,
                            table="public.outbox")
    assert reason == (
        "raised inside a function Postgres ran for the DELETE on public.outbox (a trigger on "
        "it?): PL/pgSQL function qa_audit() line 3 at SQL statement: fix or drop that "
        "function; tried again meanwhile, routing goes on, the rows wait")
    assert failure_reason(psycopg.errors.DatatypeMismatch("x"), connected=True,
                          table="public.outbox") == ""
