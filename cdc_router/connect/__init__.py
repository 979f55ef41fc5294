"""Kafka Connect: the REST client, connector files (spec) and their plan against a cluster.

Every failure is a ConnectError whose str() is one line: Connect unreachable (with the URL),
an unknown connector (with its name), or Connect's status code and `message`.
"""

from __future__ import annotations

from cdc_router.connect.client import DEFAULT_TIMEOUT, READ_TIMEOUT, ConnectClient, Validation
from cdc_router.connect.plan import (
    CONNECT_MANAGED_KEYS,
    ConfigChange,
    ConnectorAction,
    ConnectorPlan,
    diff_config,
    plan,
)
from cdc_router.connect.spec import ConnectorSpec, load_spec, parse_spec, plain_secrets
from cdc_router.connect.status import ConnectorStatus, TaskStatus
from cdc_router.errors import UnknownConnectorError

__all__ = [
    "CONNECT_MANAGED_KEYS",
    "DEFAULT_TIMEOUT",
    "READ_TIMEOUT",
    "ConfigChange",
    "ConnectClient",
    "ConnectorAction",
    "ConnectorPlan",
    "ConnectorSpec",
    "ConnectorStatus",
    "TaskStatus",
    "UnknownConnectorError",
    "Validation",
    "diff_config",
    "load_spec",
    "parse_spec",
    "plain_secrets",
    "plan",
]
