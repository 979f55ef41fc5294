"""Plan a connector file against the cluster: create, update (with the keys that differ, and
what a change moves beyond the connector), or leave unchanged."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from cdc_router.connect.checks import include_move, prefix_move, skipped_rows
from cdc_router.connect.client import ConnectClient
from cdc_router.connect.slots import slot_move
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
        skipped = skipped_rows(spec.config)
        return ConnectorPlan(spec, ConnectorAction.CREATE, diff_config(spec.config, {}),
                             (skipped,) if skipped else ())
    changes = diff_config(spec.config, deployed)
    action = ConnectorAction.UPDATE if changes else ConnectorAction.UNCHANGED
    notes = (prefix_move(deployed, spec.config), slot_move(deployed, spec.config),
             include_move(deployed, spec.config))
    return ConnectorPlan(spec, action, changes, tuple(note for note in notes if note))

