"""Which connectors name one replication slot (connect/slots.py), and how `connectors apply`
and `connectors delete` use it: review 48-b F5."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from cdc_router.connect.slots import Slot, same_host, slot_move, slot_users
from tests.unit.test_connect_client import ScriptedConnect, connector_file, run_cli

_PG = {"connector.class": "io.debezium.connector.postgresql.PostgresConnector",
       "database.port": "5432", "database.dbname": "shop", "slot.name": "s"}
# What the names of these tests resolve to from here; `postgres` only in Connect's network.
_DNS = {"db.example": frozenset({"10.0.0.5"}), "db-alias.example": frozenset({"10.0.0.5"}),
        "other.example": frozenset({"10.0.0.6"}), "myhost": frozenset({"127.0.1.1"})}


def _resolve(host: str) -> frozenset[str] | None:
    return _DNS.get(host)


@pytest.mark.parametrize(("first", "second", "verdict"), [
    ("localhost", "127.0.0.1", True), ("LOCALHOST.", "::1", True), ("[::1]", "127.0.0.2", True),
    ("::ffff:127.0.0.1", "localhost", True), ("myhost", "localhost", True),
    ("db.example", "db-alias.example", True), ("db.example", "DB.example", True),
    ("db.example", "other.example", False), ("db.example", "127.0.0.1", False),
    ("postgres", "127.0.0.1", None), ("postgres", "db.example", None),
    ("postgres", "postgres", True)])
def test_hosts_are_one_when_loopback_aliases_or_resolving_to_one_address(
        first: str, second: str, verdict: bool | None) -> None:
    assert same_host(first, second, _resolve) is verdict


def test_slot_users_tell_the_same_host_from_one_that_may_be() -> None:
    deployed = {"a": {**_PG, "database.hostname": "127.0.0.1"},
                "b": {**_PG, "database.hostname": "postgres"},
                "c": {**_PG, "database.hostname": "localhost", "database.port": "5433"},
                "d": {**_PG, "database.hostname": "localhost", "slot.name": "t"},
                # QA 48-g F2: a slot's name is the cluster's, whatever database it streams
                "e": {**_PG, "database.hostname": "localhost", "database.dbname": "tenant2"}}
    users = slot_users(deployed, Slot("localhost", "5432", "shop", "s"), resolver=_resolve)
    assert [name for name, _ in users.same] == ["a", "e"]
    assert [name for name, _ in users.maybe] == ["b"]


@pytest.fixture
def no_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """getaddrinfo answers from _DNS: `connectors apply` and `delete` resolve hosts."""
    def getaddrinfo(host: str, port: object) -> list[tuple[Any, ...]]:
        if host not in _DNS:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, 0))
                for address in _DNS[host]]
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def _apply_next_to(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, deployed_host: str,
                   file_host: str) -> tuple[Any, ScriptedConnect, str]:
    """`connectors apply` of connector c, file_host's slot s, next to outbox on deployed_host."""
    connect = ScriptedConnect({"outbox": {"name": "outbox", **_PG,
                                          "database.hostname": deployed_host}})
    path = connector_file(tmp_path, **_PG, **{"database.hostname": file_host})
    return run_cli(monkeypatch, connect, "apply", "--yes", "--wait", "0", "-f", path), \
        connect, path


@pytest.mark.usefixtures("no_dns")
def test_apply_refuses_the_live_slot_under_another_spelling_of_its_host(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Review 48-b F5: DB_HOST=localhost passed the guard of a connector on 127.0.0.1, and the
    # second one fought the first for the slot (RUNNING, exit 0).
    result, connect, _ = _apply_next_to(monkeypatch, tmp_path, "127.0.0.1", "localhost")
    assert result.exit_code == 1, result.output
    assert ("c: slot.name 's' on localhost:5432/shop is already used by connector outbox "
            "(on 127.0.0.1:5432/shop)") in result.stderr
    assert connect.puts == []
    result, connect, _ = _apply_next_to(monkeypatch, tmp_path, "db-alias.example", "db.example")
    assert result.exit_code == 1, result.output  # two names of one address
    assert connect.puts == []


@pytest.mark.usefixtures("no_dns")
def test_apply_warns_of_a_slot_on_a_host_it_cannot_resolve(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result, connect, path = _apply_next_to(monkeypatch, tmp_path, "postgres", "127.0.0.1")
    assert result.exit_code == 0, result.output  # `postgres` may be another server
    assert (f"warning: {path}: c: slot.name 's' on 127.0.0.1:5432/shop is named by connector "
            "outbox (on postgres:5432/shop) too, on a host that may be the same") in result.stderr
    assert connect.puts == ["c"]
    result, connect, _ = _apply_next_to(monkeypatch, tmp_path, "other.example", "db.example")
    assert (result.exit_code, connect.puts) == (0, ["c"])
    assert "slot.name" not in result.stderr  # two addresses: two servers


@pytest.mark.usefixtures("no_dns")
def test_delete_does_not_advise_dropping_the_slot_another_spelling_streams_from(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 48-b F5: the hint gave the drop statement for the slot outbox streamed from.
    live = {"name": "outbox", **_PG, "database.hostname": "127.0.0.1"}
    same = ScriptedConnect({"outbox": live, "c": {"name": "c", **_PG,
                                                  "database.hostname": "localhost"}})
    result = run_cli(monkeypatch, same, "delete", "c", "--yes")
    assert result.exit_code == 0, result.output
    assert ("hint: replication slot 's' stays: connector outbox (on 127.0.0.1:5432/shop) "
            "streams from it") in result.stderr
    assert "pg_drop_replication_slot" not in result.stderr
    maybe = ScriptedConnect({"outbox": {**live, "database.hostname": "postgres"},
                             "c": {"name": "c", **_PG, "database.hostname": "localhost"}})
    result = run_cli(monkeypatch, maybe, "delete", "c", "--yes")
    assert ("names it too, on a host that may be the same (it does not resolve from here): "
            "if it is, that connector streams from it, keep the slot; only if it is not: "
            "SELECT pg_drop_replication_slot") in result.stderr
    assert result.stderr.rstrip().endswith("AND NOT active;")


def test_a_slot_change_names_the_slot_left_behind_and_how_to_drop_it() -> None:
    # QA 62-a: `~ slot.name: a -> b` and nothing else; `status --connector` then showed only
    # the new slot, and the old one kept its WAL unseen.
    old = {**_PG, "database.hostname": "127.0.0.1"}
    note = slot_move(old, {**old, "slot.name": "s2"}, resolver=_resolve)
    assert note is not None
    assert note.startswith("replication slot 's' on 127.0.0.1:5432/shop -> 's2' on "
                           "127.0.0.1:5432/shop: Debezium creates 's2'")
    assert "'s' stays and retains WAL until dropped" in note
    assert note.endswith("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                         "WHERE slot_name = 's' AND NOT active;")
    moved = slot_move(old, {**old, "database.hostname": "other.example"}, resolver=_resolve)
    assert moved is not None and "-> 's' on other.example:5432/shop" in moved
    assert slot_move(old, {**old, "database.dbname": "tenant2"}, resolver=_resolve) is not None
    for same in ({**old}, {**old, "database.hostname": "localhost"},
                 {**old, "database.hostname": "postgres"}, {**old, "poll.interval.ms": "100"}):
        assert slot_move(old, same, resolver=_resolve) is None, same
    assert slot_move({}, old, resolver=_resolve) is None  # created: no slot left behind
    assert slot_move({"connector.class": "C"}, {"connector.class": "C"}) is None


def test_apply_and_diff_plan_the_old_slot_left_behind(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    deployed = {**_PG, "database.hostname": "127.0.0.1", "name": "c"}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "c", "config": {**_PG, "database.hostname": "127.0.0.1",
                                                        "slot.name": "s2"}}))

    applied = run_cli(monkeypatch, ScriptedConnect({"c": deployed}), "apply", "--yes", "--wait",
                      "0", "-f", str(path))
    diff = run_cli(monkeypatch, ScriptedConnect({"c": deployed}), "diff", "-o", "json", "-f",
                   str(path))

    assert applied.exit_code == 0, applied.output
    assert "  ~ slot.name: s -> s2\n  ! replication slot 's' on 127.0.0.1:5432/shop -> 's2'" \
        in applied.stdout
    [planned] = json.loads(diff.stdout)
    [note] = planned["notes"]
    assert "WHERE slot_name = 's' AND NOT active;" in note


def test_a_database_change_under_the_same_slot_name_says_the_task_cannot_make_it() -> None:
    # Review 62: a slot's name is one per server (QA 48-g F2: the task FAILED on "already
    # exists"), yet the note said Debezium creates 's' and, once it streams from it, to drop
    # the slot named 's'.
    old = {**_PG, "database.hostname": "127.0.0.1"}
    note = slot_move(old, {**old, "database.dbname": "tenant2"}, resolver=_resolve)
    assert note is not None
    assert "Debezium creates" not in note
    assert note.startswith("replication slot 's' on 127.0.0.1:5432/shop -> 's' on "
                           "127.0.0.1:5432/tenant2: a slot's name is one per server, so "
                           "Debezium cannot create 's' for database 'tenant2' while the old "
                           "one is there")
    assert "give the connector another slot.name (SLOT_NAME), or drop the old one on " \
        "127.0.0.1:5432/shop once the connector has stopped: SELECT" in note


def test_the_slot_left_on_another_server_is_dropped_there() -> None:
    # Review 62: the same slot.name on a new host; the drop SQL, run on the new server (where
    # CDC_ROUTER_PG_DSN points), names the new connector's slot.
    old = {**_PG, "database.hostname": "127.0.0.1"}
    note = slot_move(old, {**old, "database.hostname": "other.example"}, resolver=_resolve)
    assert note is not None
    assert "drop the old one on 127.0.0.1:5432/shop: SELECT" in note
