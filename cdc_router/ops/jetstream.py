"""`status`'s JetStream section: the NATS server of nats.url and the streams the config's
JetStream routes publish into (QA 54-d F-8: a missing stream or NATS down showed only as the
router's stall, a minute later).

The server is read as `streams apply` and the router's start read it (nats/streams.py), with
the same connect options (nats/connection.py), so that `status` says what the start would
refuse, in its words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cdc_router.config.model import RouterConfig
from cdc_router.config.nats import NatsSettings
from cdc_router.config.redact import shown_url
from cdc_router.errors import CdcRouterError, NatsUnreachable
from cdc_router.nats.connection import connect_options
from cdc_router.nats.streams import (
    StreamAdmin,
    overlap_error,
    plan_streams,
    start_problem,
    start_warning,
)
from cdc_router.ops.report import JetStreamState, StreamState

# As the router's start: a user that may publish but not call the JetStream API gets no
# answer at all, and each stream's info would wait the API's 10 s (review 47-f F3).
TIMEOUT_S = 3.0


def jetstream_state(config: RouterConfig, *,
                    timeout_s: float = TIMEOUT_S) -> JetStreamState | None:
    """The JetStream section of `config`'s Report; None when no route publishes to JetStream.
    Never raises for a server that is down or refuses us: that is the section's error."""
    nats = config.jetstream()
    if nats is None:
        return None
    url = shown_url(nats.url)
    try:
        options = connect_options(nats)  # a credentials file gone since `status` started
    except CdcRouterError as error:
        return JetStreamState(error=str(error), url=url)
    try:
        existing, held = StreamAdmin(nats.url, options, timeout_s=timeout_s).read(nats.streams)
    except NatsUnreachable as error:
        return JetStreamState(error=str(error), url=url)
    except CdcRouterError as error:  # our credentials or TLS, or the JetStream API, refused
        return JetStreamState(error=str(error), answered=True, url=url)
    return streams_state(nats, existing, held)


def streams_state(nats: NatsSettings, existing: Mapping[str, Mapping[str, Any]],
                  held: Sequence[tuple[str, str]]) -> JetStreamState:
    """The section from what the server has (StreamAdmin.read: `existing` streams of the
    config, `held` subjects of the others): each declared stream, what it stores against its
    limits, and what the router's start would refuse or warn about it."""
    found = []
    plans = plan_streams(nats.streams, existing)
    for index, (spec, plan) in enumerate(zip(nats.streams, plans, strict=True)):
        have = existing.get(spec.name)
        if have is None:
            overlap = overlap_error(index, spec, held)
            found.append(StreamState(spec.name, tuple(spec.subjects), exists=False,
                                     overlap=None if overlap is None else str(overlap)))
            continue
        refused = start_problem(index, plan)
        found.append(StreamState(
            spec.name, tuple(spec.subjects), exists=True, messages=have.get("messages"),
            bytes=have.get("bytes"), max_msgs=have.get("max_msgs"),
            max_bytes=have.get("max_bytes"), discard=have.get("discard"),
            changes=dict(plan.changes), refused=None if refused is None else str(refused),
            start_warning=start_warning(index, plan)))
    return JetStreamState(answered=True, url=shown_url(nats.url), streams=tuple(found))
