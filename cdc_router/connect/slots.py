"""Which connectors stream from one replication slot: for `connectors apply` (a second
connector on a used slot) and `connectors delete` (whether its slot may be dropped).

A slot is (host, port, slot.name): its name is unique in the cluster, whatever database it
streams. A host has many spellings: `localhost` and `127.0.0.1` are one Postgres (review 48-b
F5: a second connector on the live slot passed the guard, and `delete` advised dropping the
slot the first one streamed from). Loopback aliases
are one host; other names are resolved here, and compared by address, only when both resolve
(`postgres` may be a name only Connect's network knows), else by their text.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cdc_router.connect.spec import ConnectorSpec

# Host name -> its addresses, None when it does not resolve from here.
Resolver = Callable[[str], frozenset[str] | None]


@dataclass(frozen=True)
class Slot:
    """A Postgres connector's replication slot, as its config names it."""

    host: str
    port: str
    database: str
    name: str

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}/{self.database}"


@dataclass(frozen=True)
class SlotUsers:
    """Connectors whose config names the slot, with the slot as each names it: on the same
    host (`same`), or on a host that may be the same (`maybe`: the texts differ and one of
    the two names does not resolve from here)."""

    same: tuple[tuple[str, Slot], ...] = ()
    maybe: tuple[tuple[str, Slot], ...] = ()


def slot_of(config: Mapping[str, str]) -> Slot | None:
    """A Postgres connector's replication slot, or None for another connector."""
    if "postgres" not in config.get("connector.class", "").lower():
        return None
    return Slot(config.get("database.hostname", "").strip(),
                config.get("database.port", "5432").strip(),
                config.get("database.dbname", ""), config.get("slot.name", "debezium"))


def resolve(host: str) -> frozenset[str] | None:
    """The addresses `host` resolves to from here; None when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):  # gaierror is an OSError
        return None
    return frozenset(str(info[4][0]) for info in infos) or None


def same_host(first: str, second: str, resolver: Resolver = resolve) -> bool | None:
    """True when both name one host, False when they do not, None when that cannot be told
    from here (the texts differ and one name does not resolve)."""
    a, b = _plain(first), _plain(second)
    if a == b or (_loopback(a) and _loopback(b)):
        return True
    found_a, found_b = _addresses(a, resolver), _addresses(b, resolver)
    if found_a is None or found_b is None:
        return None
    if all(_loopback(address) for address in found_a | found_b):
        return True
    return bool(found_a & found_b)


def slot_users(deployed: Mapping[str, Mapping[str, str]], slot: Slot, *,
               resolver: Resolver = resolve) -> SlotUsers:
    """The connectors whose config names `slot`."""
    same: list[tuple[str, Slot]] = []
    maybe: list[tuple[str, Slot]] = []
    for name, config in sorted(deployed.items()):
        other = slot_of(config)
        # A slot's name is unique in its cluster, whatever database it streams (QA 48-g F2:
        # DB_NAME=tenant2 with the same slot.name passed, and its task FAILED on "already exists").
        if other is None or (other.port, other.name) != (slot.port, slot.name):
            continue
        verdict = same_host(slot.host, other.host, resolver)
        if verdict is not False:
            (same if verdict else maybe).append((name, other))
    return SlotUsers(tuple(same), tuple(maybe))


def slot_conflicts(specs: list[ConnectorSpec], deployed: Mapping[str, Mapping[str, str]], *,
                   resolver: Resolver = resolve) -> tuple[list[str], list[str]]:
    """Specs whose replication slot another connector (deployed, or in the same files) names
    too: one line each on the same host (two connectors on one slot take turns failing with
    "replication slot is active" and each misses what the other consumed), and one line each
    on a host that may be the same."""
    lookup = functools.cache(resolver)  # each host once, however many connectors name it
    after = {**deployed, **{spec.name: spec.config for spec in specs}}
    conflicts: list[str] = []
    doubts: list[str] = []
    for spec in specs:
        slot = slot_of(spec.config)
        if slot is None:
            continue
        users = slot_users({name: config for name, config in after.items()
                            if name != spec.name}, slot, resolver=lookup)
        head = f"{spec.source}: {spec.name}: slot.name {slot.name!r} on {slot.where}"
        if users.same:
            conflicts.append(f"{head} is already used by {_named(users.same, slot)}: the "
                             "two would take turns, each missing what the other consumed")
        if users.maybe:
            doubts.append(f"{head} is named by {_named(users.maybe, slot)} too, on a host "
                          "that may be the same (it does not resolve from here): if it is, "
                          "the two take turns failing and each misses what the other "
                          "consumed; give each connector its own slot.name (SLOT_NAME)")
    return conflicts, doubts


def drop_hint(name: str, slot: Slot, users: SlotUsers) -> str:
    """What `connectors delete` says of the deleted connector's slot, which stays."""
    if users.same:
        return (f"hint: replication slot {slot.name!r} stays: "
                f"{_named(users.same, slot)} streams from it")
    # `AND NOT active`: never a slot a connection streams from (the deleted task's until it
    # has stopped, or another connector's); the slot may never have been made (a task that
    # failed first, QA 46-a F3): this drops it only if it is there.
    drop = _drop(slot)
    if users.maybe:
        return (f"hint: replication slot {slot.name!r} on {slot.where} stays; "
                f"{_named(users.maybe, slot)} names it too, on a host that may be the same "
                "(it does not resolve from here): if it is, that connector streams from it, "
                f"keep the slot; only if it is not: {drop}")
    # QA 64-a F-6: deleted to be applied again under its name, it resumes from this slot at
    # the offsets Connect keeps for that name; the hint read as if the slot were waste.
    return (f"hint: replication slot {slot.name!r}, if connector {name} made it, stays and "
            f"retains WAL until dropped: keep it if you apply {name} again (it resumes there, "
            "from the offsets Connect keeps for the name; without the slot, snapshot.mode "
            "initial fails and when_needed snapshots the outbox again); else, once its task "
            f"has stopped: {drop}")


def slot_move(deployed: Mapping[str, str], desired: Mapping[str, str], *,
              resolver: Resolver = resolve) -> str | None:
    """What a change of the connector's slot (slot.name, or its database) leaves behind: the
    old slot, which keeps its WAL until dropped; None when the slot is kept."""
    old, new = slot_of(deployed), slot_of(desired)
    if old is None or new is None:
        return None
    same = same_host(old.host, new.host, resolver)
    if (old.port, old.name) == (new.port, new.name) and same is not False:
        if old.database == new.database:
            return None
        # A slot's name is one per server, whatever database it streams (QA 48-g F2): the
        # new database's slot cannot be made while the old one is there; the note said
        # Debezium creates it, then to drop the slot of that very name (review 62).
        return (f"replication slot {old.name!r} on {old.where} -> {new.name!r} on "
                f"{new.where}: a slot's name is one per server, so Debezium cannot create "
                f"{new.name!r} for database {new.database!r} while the old one is there (the "
                "task fails: 'replication slot ... already exists'); give the connector "
                f"another slot.name (SLOT_NAME), or drop the old one on {old.where} once the "
                f"connector has stopped: {_drop(old)}")
    # QA 62-a: the plan said only "~ slot.name: a -> b", and `status --connector` shows the
    # connector's new slot only, so the old one held its WAL unseen (with
    # max_slot_wal_keep_size -1, until the disk filled). Where to drop it is said: with the
    # same name on another server, the new server's slot answers the same SQL.
    return (f"replication slot {old.name!r} on {old.where} -> {new.name!r} on {new.where}: "
            f"Debezium creates {new.name!r} (the shipped snapshot.mode when_needed snapshots "
            f"the table to fill the gap); {old.name!r} stays and retains WAL until dropped, "
            f"and `status --connector` shows only the new slot: once the connector streams "
            f"from {new.name!r}, drop the old one on {old.where}: {_drop(old)}")


def _drop(slot: Slot) -> str:
    """The SQL that drops `slot` if it is there and no connection streams from it."""
    return ("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE "
            f"slot_name = '{slot.name}' AND NOT active;")


def _named(users: tuple[tuple[str, Slot], ...], slot: Slot) -> str:
    """'connector a, b (on localhost:5432/shop)': where each names the slot, when spelt
    otherwise than `slot`."""
    return "connector " + ", ".join(
        name if other.where == slot.where else f"{name} (on {other.where})"
        for name, other in users)


def _plain(host: str) -> str:
    return host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")


def _addresses(host: str, resolver: Resolver) -> frozenset[str] | None:
    """An address or a loopback name stands for itself; a name, for what it resolves to."""
    return frozenset({host}) if _loopback(host) or _literal(host) else resolver(host)


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return True


def _loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):  # RFC 6761
        return True
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback
