"""A static member fenced because another process took its group.instance.id: the newer wins.

KIP-345: a consumer that joins with a group.instance.id the group already has replaces the old
member (a new member id for the instance), and the old member's next request is refused with
FENCED_INSTANCE_ID. Renewing the old consumer (as after a coordinator move, QA 36-a) joins again
and fences the new one: two processes given one --instance-id fenced each other back and forth
until a renewal budget ran out, and the loser was not necessarily the old one (QA 65-a F-3).
So at such a fence the group is asked who holds the instance id now: a member id other than this
consumer's own is a rival, and this process stops for good (a ConfigError, exit 1, which
README's supervisor advice does not restart); its own member id (librdkafka rejoined after a
coordinator move and its request in flight was fenced), no member of that id, or no answer:
renewed as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from cdc_router.errors import ConfigError
from cdc_router.kafka.lookups import AdminConnection

log = logging.getLogger("cdc_router.kafka")

# One DescribeGroups at a fence: its coordinator answers in milliseconds; a lookup that does
# not come is no evidence, and the fence is renewed as before.
LOOKUP_TIMEOUT_S = 5.0

# holder(group, instance_id) -> (member id, client id, host) of the member that holds it now,
# or None when the group lists no member with that instance id. Raises when it cannot ask.
Holder = Callable[[str, str], "tuple[str, str, str] | None"]


def admin_holder(admin_config: Mapping[str, Any]) -> Holder:
    """holder() by DescribeGroups over an AdminClient of `admin_config`."""
    admin = AdminConnection(admin_config)

    def holder(group: str, instance_id: str) -> tuple[str, str, str] | None:
        described = admin.answer(lambda client: client.describe_consumer_groups(
            [group], request_timeout=LOOKUP_TIMEOUT_S)[group], LOOKUP_TIMEOUT_S)
        return next(((m.member_id, m.client_id, m.host) for m in described.members
                     if m.group_instance_id == instance_id), None)

    return holder


def check_rival(holder: Holder, consumer: Any, group: str, instance_id: str | None,
                named: str) -> None:
    """Raise ConfigError when another process's member holds `instance_id` (a group.instance.id
    made of --instance-id `named`) in `group`, not `consumer`'s own member id; return (renew)
    when it is this one's, none, or unknown."""
    if not instance_id:
        return
    try:
        own = consumer.memberid() or None
        held = holder(group, instance_id)
    except Exception as error:  # no evidence: renewed, as before (the budget still bounds it)
        log.info("event=instance_holder_unknown group=%s instance=%s error=%r", group,
                 instance_id, str(error) or type(error).__name__)
        return
    if held is None or own is None or held[0] == own:
        return
    member, client, host = held
    raise ConfigError(
        f"another process took this instance's group.instance.id {instance_id!r} in group "
        f"{group!r} (now member {member} of client {client!r} on {host}): Kafka fences the "
        "older of two static members with one id, so this one stops for good and the newer "
        "runs on; give each instance its own --instance-id (the pod's name), or stop the old "
        "one before starting the new", field="--instance-id", value=named)
