"""What this process's Kafka principal may do on a topic, as the broker says it (KIP-430).

A destination topic the principal may describe but not write to (a read-only principal, a
grant forgotten) is listed like any other, and its refusal comes in AddPartitionsToTxn, not in
a record's delivery report: the transaction could then only be aborted with INVALID_TXN_STATE,
the producer was renewed, and the router stopped at every restart, every route with it (QA
31-c). Asked first, such a topic's events are dead letters naming the grant, and a dead-letter
or changelog topic the router may not write to stops it at start with one line.

Without an authorizer the broker grants every operation; a broker that does not say (an
answer without operations, or no answer) leaves the topic to the other checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaException, TopicCollection

from cdc_router.kafka.lookups import AdminConnection

# operations(topic, timeout_s): the operations the principal may do on the topic (AclOperation
# names: READ, WRITE, DESCRIBE, ...), or None when the broker does not say.
Operations = Callable[[str, float], frozenset[str] | None]
OperationsFactory = Callable[[Mapping[str, Any]], Operations | None]


def admin_operations(admin_config: Mapping[str, Any]) -> Operations:
    """operations() by an AdminConnection (DescribeTopics with the topic's authorized
    operations), made anew after a failed lookup."""
    admin = AdminConnection(admin_config)

    def operations(topic: str, timeout_s: float) -> frozenset[str] | None:
        try:
            granted = admin.answer(lambda client: client.describe_topics(
                TopicCollection([topic]), include_authorized_operations=True,
                request_timeout=timeout_s)[topic], timeout_s).authorized_operations
        except (KafkaException, TimeoutError):
            return None  # the cluster's trouble, or a missing topic: the other checks say
        return None if granted is None else frozenset(operation.name for operation in granted)

    return operations


def refused(topic: str, granted: frozenset[str] | None, *needed: str) -> str | None:
    """Why the principal may not do `needed` on `topic`, or None (also when unknown)."""
    if granted is None or "ALL" in granted:
        return None
    lacking = [operation for operation in needed if operation not in granted]
    if not lacking:
        return None
    return (f"this process's Kafka principal may not {' or '.join(lacking).lower()} topic "
            f"{topic} (the broker grants it {', '.join(sorted(granted)).lower() or 'nothing'} "
            f"there): grant it {' and '.join(o.capitalize() for o in lacking)} on the topic")
