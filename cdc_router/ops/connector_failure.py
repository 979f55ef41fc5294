"""What a FAILED connector or task needs, by the cause its trace names, told as `status` tells
the same cause elsewhere: for `status`'s connector line and `connectors apply`.

Stop 58: with the outbox's publication missing, the FAILED line said only "fix the cause, then
restart", and the cause Debezium gives ("Publication autocreation is disabled, please create
one and restart the connector.") names no publication. A cause not known here keeps Connect's
words and the restart.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from cdc_router.errors import ConnectError
from cdc_router.ops.connector import capture_of
from cdc_router.postgres import unquoted

LOST_SLOT_RUNBOOK = "README runbook 'the slot was dropped or its WAL removed'"

# Debezium's PostgresReplicationConnection.initPublication with publication.autocreate.mode
# disabled, at the task's start (the trace's first line, or the root cause of "An exception
# occurred in the change event producer" once the publication is dropped under a running
# task); and pgoutput's refusal of a change written while the publication was missing, which
# Debezium retries, so it is FAILED only when its retries are bounded (errors.max.retries).
_AUTOCREATE_DISABLED = "Publication autocreation is disabled"
_NO_PUBLICATION = re.compile(r'publication "((?:[^"]|"")+)" does not exist')


def init_publication(publication: str, table: str | None) -> str:
    """The command that creates `publication` for the outbox `table` (None: public.outbox)."""
    on = f" --table {table}" if table and unquoted(table) != "public.outbox" else ""
    return (f"`cdc-router outbox init --publication {publication}{on}` (with this database's "
            "--dsn)")


def failed_fix(failure: str, connector: str, *, publication: str | None, table: str | None,
               slot_exists: bool | None = None) -> str:
    """What to do about `failure` (a FAILED trace in one line: client.failure_of) of
    `connector`, which reads `publication` (its publication.name; None: not known) and the
    outbox `table`; `slot_exists`: whether its replication slot exists (None: not known)."""
    restart = f"`cdc-router connectors restart {connector} --tasks failed`"
    named = _NO_PUBLICATION.search(failure)
    if named is None and _AUTOCREATE_DISABLED not in failure:
        return f"fix the cause, then {restart}"
    missing = named[1].replace('""', '"') if named else publication or "<publication.name>"
    # Created again, it does not serve an existing slot past a change written while it was
    # missing (QA 58-b F-2): pgoutput decodes the slot's WAL with the catalog of each change.
    runbook = f"follow {LOST_SLOT_RUNBOOK} from its step 2"
    then = runbook if slot_exists else restart if slot_exists is False else (
        f"{restart}; if its slot existed already (the publication was dropped), {runbook} "
        "instead")
    return (f"publication {missing} does not exist and the connector does not create it "
            f"(publication.autocreate.mode disabled): create it with "
            f"{init_publication(missing, table)}, then {then}")


def failed_line(connector: str, config: Mapping[str, str], failure: str) -> str:
    """`connector` (of `config`) FAILED (`failure`: ConnectorStatus.failure), and what to do:
    the line of `connectors status` and `connectors apply`."""
    capture = capture_of(config)
    return f"connector {connector!r} {failure}; " + failed_fix(
        failure, connector, publication=capture.publication, table=capture.table)


def failed_start(connector: str, config: Mapping[str, str], failure: str) -> ConnectError:
    """`connectors apply`'s error for `connector` (of `config`), FAILED as it started."""
    return ConnectError(f"{failed_line(connector, config, failure)} (the whole trace: "
                        f"`cdc-router connectors status {connector}`)")
