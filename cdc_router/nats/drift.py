"""Stream settings the config does not declare, made by hand (`nats stream add/edit`), that
lose events or stall every batch (QA 54-d F-2): which ones `streams apply` sets back, which
ones only a new stream mends, which ones it warns about.

`have` is a stream as StreamAdmin reads it (nats/streams.py); a key it lacks is JetStream's
default, so a stream read by older code, or a test's, is fine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Set back in place by `streams apply` when the server's stream differs: JetStream updates
# them on a live stream. no_ack: no ack ever comes, every batch times out (QA 54-d F-2);
# discard_new_per_subject: only valid with discard new, which apply sets back to old, so the
# server refused the update while it stayed true (QA 54-d F-3).
SET_BACK: Mapping[str, Any] = {"no_ack": False, "discard_new_per_subject": False}


def set_back(have: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The SET_BACK keys of `have` that differ from the config's, as plan changes."""
    return {key: (have[key], value) for key, value in SET_BACK.items()
            if key in have and have[key] != value}


def recreate(have: Mapping[str, Any]) -> list[tuple[str, Any, str]]:
    """(setting, value, what it does) of each setting JetStream cannot change on a live
    stream and that breaks the routes: only a new stream mends them."""
    found = []
    retention = have.get("retention", "limits")
    if retention != "limits":
        found.append(("retention", retention,
                      "JetStream drops each message once the consumers it has (interest) or "
                      "one of them (workqueue) took it, right after storing it when none "
                      "exists: events acked and lost"))
    if have.get("sealed"):
        found.append(("sealed", True, "a sealed stream refuses every publish for ever: every "
                                      "batch would fail"))
    if have.get("mirror"):
        found.append(("mirror", have["mirror"], "a mirror takes no publish of its own: every "
                                                "batch would fail"))
    return found


def recreate_hint(name: str) -> str:
    return (f"JetStream cannot change it on a live stream: delete the stream (`nats stream rm "
            f"{name}`, its stored messages go with it; copy them first if they matter) and "
            "create it with `cdc-router streams apply -c <config>`")


def elsewhere(have: Mapping[str, Any]) -> list[str]:
    """Settings outside the config under which JetStream acks the router's publish, and the
    router commits it as delivered, while the event is stored elsewhere than the config says,
    or may yet be lost (reread 54-m F-3). Warned of by `streams apply`, the router's start and
    `status`; left as they are: a transform may shard on purpose, and the config cannot
    declare either (nats-server 2.9 knows neither, and drops them from a stream's config)."""
    found = []
    transform = have.get("subject_transform")
    if transform:
        found.append(f"subject_transform {transform} (set outside the config): JetStream "
                     "stores the router's events under the transformed subjects, so a "
                     "consumer filtering on the config's subjects (filter_subjects) never "
                     "sees them; filter on the transformed subjects, or remove the transform "
                     "(`nats stream edit`)")
    if have.get("persist_mode") == "async":
        found.append("persist_mode async (set outside the config): JetStream acks a publish "
                     "before writing it, so a nats-server crash may lose events the router "
                     "has committed as delivered; use the default persist mode")
    return found


def outside(have: Mapping[str, Any]) -> list[str]:
    """Warnings for settings outside the config that `streams apply` leaves as they are."""
    found = elsewhere(have)
    per_subject = have.get("max_msgs_per_subject")
    if isinstance(per_subject, int) and per_subject > 0:
        found.append(f"max_msgs_per_subject is {per_subject} (set outside the config): "
                     "JetStream keeps that many messages per subject and deletes older ones "
                     "at once, consumed or not (an event type is one subject); `nats stream "
                     "edit <name> --max-msgs-per-subject=-1` lifts it")
    if have.get("sources"):
        found.append(f"sources {', '.join(have['sources'])} (set outside the config): other "
                     "streams' messages are stored beside the router's events")
    return found
