"""Plan a connector file against the cluster: create, update (with the keys that differ, and
what a change moves beyond the connector), or leave unchanged."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from cdc_router.connect.checks import prefix_move
from cdc_router.connect.client import ConnectClient
from cdc_router.connect.spec import ConnectorSpec
from cdc_router.errors import UnknownConnectorError

# Keys that Connect adds to a stored config itself; a file need not (and usually does not) say.
CONNECT_MANAGED_KEYS = frozenset({"name"})
_MASKED = re.compile(r"\*+|\[hidden\]")


class ConnectorAction(StrEnum):
    """What applying a connector file would do."""

    CREATE = "create"
    UPDATE = "update"
    UNCHANGED = "unchanged"


@dataclass(frozen=True)
class ConfigChange:
    """One key that differs: `deployed` None means added by the file, `desired` None removed."""

    key: str
    deployed: str | None
    desired: str | None


@dataclass(frozen=True)
class ConnectorPlan:
    """What applying a spec would do to the cluster."""

    spec: ConnectorSpec
    action: ConnectorAction
    changes: tuple[ConfigChange, ...]
    notes: tuple[str, ...] = ()  # what a change does beyond the connector (a moved topic)


def diff_config(desired: Mapping[str, str],
                deployed: Mapping[str, str]) -> tuple[ConfigChange, ...]:
    """Keys that differ, ignoring keys Connect manages and secrets it shows masked."""
    changes = []
    for key in sorted((set(desired) | set(deployed)) - CONNECT_MANAGED_KEYS):
        new, old = desired.get(key), deployed.get(key)
        if new == old or (new is not None and old is not None and _MASKED.fullmatch(old)):
            continue
        changes.append(ConfigChange(key, old, new))
    return tuple(changes)


def plan(client: ConnectClient, spec: ConnectorSpec) -> ConnectorPlan:
    """Compare a spec with the deployed connector of the same name."""
    try:
        deployed = client.get_config(spec.name)
    except UnknownConnectorError:
        return ConnectorPlan(spec, ConnectorAction.CREATE, diff_config(spec.config, {}))
    changes = diff_config(spec.config, deployed)
    action = ConnectorAction.UPDATE if changes else ConnectorAction.UNCHANGED
    moved = prefix_move(deployed, spec.config)
    return ConnectorPlan(spec, action, changes, (moved,) if moved else ())


def slot_of(config: Mapping[str, str]) -> tuple[str, str, str, str] | None:
    """A Postgres connector's replication slot (host, port, database, slot.name), or None."""
    if "postgres" not in config.get("connector.class", "").lower():
        return None
    return (config.get("database.hostname", ""), config.get("database.port", "5432"),
            config.get("database.dbname", ""), config.get("slot.name", "debezium"))


def slot_users(deployed: Mapping[str, Mapping[str, str]],
               slot: tuple[str, str, str, str]) -> list[str]:
    """The deployed connectors that stream from `slot`."""
    return [name for name, config in deployed.items() if slot_of(config) == slot]


def slot_conflicts(specs: list[ConnectorSpec],
                   deployed: Mapping[str, Mapping[str, str]]) -> list[str]:
    """One line per spec whose replication slot another connector (deployed, or in the same
    files) already uses: two connectors on one slot take turns failing with "replication slot
    is active" and each misses what the other consumed."""
    problems = []
    claimed: dict[tuple[str, str, str, str], str] = {}
    for spec in specs:
        slot = slot_of(spec.config)
        if slot is None:
            continue
        others = [name for name in slot_users(deployed, slot) if name != spec.name]
        if slot in claimed:
            others.append(claimed[slot])
        claimed.setdefault(slot, spec.name)
        if others:
            problems.append(f"{spec.source}: {spec.name}: slot.name {slot[3]!r} on "
                            f"{slot[0]}:{slot[1]}/{slot[2]} is already used by connector "
                            f"{', '.join(sorted(others))}")
    return problems
