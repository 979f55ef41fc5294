"""The verdict on the JetStream section: a declared stream missing, one the router's start
refuses, one full or nearly (README, Operations: `status`). NATS not answering is the
section's `error`, judged with every other part's (verdict.py)."""

from __future__ import annotations

from collections.abc import Iterator

from cdc_router.config.status import StatusSettings
from cdc_router.ops.problem import Problem
from cdc_router.ops.report import JetStreamState, StreamState

_APPLY = "`cdc-router streams apply -c <config>`"
# What a stream that takes no publish does to the router: its batch fails and is retried, and
# the Kafka transaction with it, so no route moves.
_STALL = ("every batch with an event for it fails and is retried, holding back every route "
          "(Kafka routes too)")


def jetstream_problems(state: JetStreamState | None,
                       settings: StatusSettings) -> Iterator[Problem]:
    if state is None or state.error is not None:
        return
    for stream in state.streams:
        yield from _stream(stream, state.url, settings)


def _stream(stream: StreamState, url: str | None,
            settings: StatusSettings) -> Iterator[Problem]:
    if not stream.exists:
        # QA 54-d F-8: said only as the router's stall, a minute later.
        refused = f"; as things are it would be refused: {stream.overlap}" if stream.overlap \
            else ""
        yield Problem("critical", "jetstream", f"stream {stream.name} "
                      f"({', '.join(stream.subjects)}) does not exist on NATS at {url}: "
                      f"nothing stores those subjects' events, so {_STALL}, and the router's "
                      f"start refuses the config; run {_APPLY}{refused}")
        return
    if stream.refused is not None:
        yield Problem("critical", "jetstream", f"the router's start refuses stream "
                      f"{stream.name} as the server has it: {stream.refused}")
    if stream.start_warning is not None:
        yield Problem("warning", "jetstream", stream.start_warning)
    yield from _usage(stream, settings)


def _usage(stream: StreamState, settings: StatusSettings) -> Iterator[Problem]:
    """The stream's fuller limit against stream_usage_warning_percent; a full stream that
    discards new messages is critical whatever the threshold, as it refuses every publish."""
    used = [(100.0 * count / most, key, count, most) for key, count, most in (
        ("max_msgs", stream.messages, stream.max_msgs),
        ("max_bytes", stream.bytes, stream.max_bytes))
        if count is not None and most is not None and most > 0]
    if not used:
        return
    percent, key, count, most = max(used)
    where = f"stream {stream.name} holds {count} of its {key} {most} ({percent:.0f}%)"
    raise_it = f"raise its {key} in nats.streams and run {_APPLY}"
    if stream.discard == "new" and count >= most:
        yield Problem("critical", "jetstream", f"{where} and discards new messages (set "
                      f"outside the config): JetStream refuses every publish to it, so "
                      f"{_STALL}; {_APPLY} sets it back to discard old ones, or {raise_it}")
        return
    limit = settings.stream_usage_warning_percent
    if limit is None or percent < limit:
        return
    if stream.discard == "new":
        what = f"once full JetStream refuses every publish to it (discard new), and {_STALL}"
    else:
        what = ("at the limit JetStream deletes its oldest message for each new one, "
                "consumed or not: a consumer that far behind loses events")
    yield Problem("warning", "jetstream", f"{where}, warning at {limit:g}%: {what}; "
                  f"{raise_it} (status.stream_usage_warning_percent: none when the limit is "
                  "the stream's retention)")
