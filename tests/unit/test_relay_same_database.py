"""The relay's cleanup deletes in the relay's own database (QA 61-a F-3)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from cdc_router.config.model import RouterConfig
from cdc_router.errors import ConfigError
from cdc_router.relay.same_database import check_cleanup_database

RELAY = "postgresql://relay@db:5432/postgres"
CLEANUP = "postgresql://cleaner@db:5432/qa61a_db2"


class Database:
    """A connection answering as Postgres does: current_database(), then the system
    identifier (None: the role may not read pg_control_system())."""

    def __init__(self, name: str, cluster: str | None) -> None:
        self.name, self.cluster = name, cluster
        self.answer: tuple[Any, ...] = ()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def execute(self, query: str) -> Database:
        if "current_database" in query:
            self.answer = (self.name,)
        elif self.cluster is None:
            raise psycopg.errors.InsufficientPrivilege("permission denied for pg_control_system")
        else:
            self.answer = (self.cluster,)
        return self

    def fetchone(self) -> tuple[Any, ...]:
        return self.answer


def _config(relay_dsn: str | None, cleanup_dsn: str | None, mode: str = "delete") -> RouterConfig:
    return RouterConfig.model_validate({
        "source": {"group_id": "shop"}, "routes": [{"topic": "orders"}],
        "cleanup": {"mode": mode, "dsn": cleanup_dsn},
        "relay": {"table": "public.outbox", "dsn": relay_dsn}})


def _connect(databases: dict[str, Database]) -> Any:
    def connect(dsn: str, **_: Any) -> Database:
        return databases[dsn]
    return connect


def test_a_cleanup_dsn_naming_another_database_than_the_relays_is_refused_in_one_line() -> None:
    connect = _connect({RELAY: Database("postgres", "7301"),
                        CLEANUP: Database("qa61a_db2", "7301")})
    with pytest.raises(ConfigError) as refused:
        check_cleanup_database(_config(RELAY, CLEANUP), "relay.yaml", connect)
    text = str(refused.value)
    assert "\n" not in text
    assert text.startswith("relay.yaml: field 'cleanup.dsn/relay.dsn': cleanup.dsn names "
                           "database 'qa61a_db2' of cluster 7301 and relay.dsn database "
                           "'postgres' of cluster 7301")
    assert text.endswith("point cleanup.dsn at the relay's database (or leave relay.dsn "
                         "unset, cleanup.dsn serves both)")


def test_the_same_name_in_another_cluster_is_another_database() -> None:
    connect = _connect({RELAY: Database("postgres", "7301"), CLEANUP: Database("postgres", "99")})
    with pytest.raises(ConfigError, match=r"of cluster 99 and relay\.dsn"):
        check_cleanup_database(_config(RELAY, CLEANUP), None, connect)


@pytest.mark.parametrize("cleanup_cluster", ["7301", None])
def test_one_database_through_another_role_passes(cleanup_cluster: str | None) -> None:
    # Another role, host name or option: what Postgres answers decides (a role that may not
    # read the system identifier compares by name).
    connect = _connect({RELAY: Database("postgres", "7301"),
                        CLEANUP: Database("postgres", cleanup_cluster)})
    check_cleanup_database(_config(RELAY, CLEANUP), None, connect)


@pytest.mark.parametrize(("relay_dsn", "cleanup_dsn", "mode"), [
    (RELAY, RELAY, "delete"), (None, CLEANUP, "delete"), (RELAY, CLEANUP, "none")])
def test_nothing_is_asked_when_there_is_nothing_to_compare(
        relay_dsn: str | None, cleanup_dsn: str | None, mode: str) -> None:
    def connect(dsn: str, **_: Any) -> Any:
        raise AssertionError("connected")
    check_cleanup_database(_config(relay_dsn, cleanup_dsn, mode), None, connect)


def test_postgres_not_answering_is_said_and_passed(caplog: pytest.LogCaptureFixture) -> None:
    def connect(dsn: str, **_: Any) -> Any:
        raise psycopg.OperationalError("connection refused")
    check_cleanup_database(_config(RELAY, CLEANUP), None, connect)
    assert "event=cleanup_database_check_skipped" in caplog.text
