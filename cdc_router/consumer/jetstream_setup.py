"""Setting up the JetStream consumer's durable, and checking it stays there.

At start the stream must exist, the dead-letter subject must be stored by a stream (a plain
publish nobody hears would lose poison) that the durable does not read, and an existing durable
must keep the guarantees (pull, explicit ack, MaxDeliver unlimited, our filters): each failure
is one line (JetStreamConsumerError), never a consumer that runs on wrong terms. A durable the
server created on other terms than asked (nats-server < 2.10 ignores several filter subjects
and reads the whole stream) is deleted again before it delivers anything.
"""

from __future__ import annotations

import logging
from typing import Any

from cdc_router.config.nats_subjects import subjects_collide
from cdc_router.config.redact import shown_url
from cdc_router.consumer.jetstream_settings import JetStreamSettings, consumer_problem
from cdc_router.errors import EXIT_RESTART, JetStreamConsumerError
from cdc_router.nats.connection import error_text

log = logging.getLogger("cdc_router.consumer.jetstream")
# JSConsumerFilterNotSubsetErr: a filter subject outside the stream's subjects.
FILTER_NOT_IN_STREAM = 10093
# ConsumerConfig.filter_subjects (several filters on one consumer) came with nats-server 2.10;
# older servers drop the field and filter nothing (QA 49-a F8).
MULTI_FILTER_SINCE = (2, 10)


async def subscribe(js: Any, settings: JetStreamSettings,
                    server_version: Any = None) -> tuple[str, float]:
    """Check the streams, create the durable or check the existing one; the name of the
    dead-letter subject's stream, and the durable's AckWait in seconds (the pull requests
    are jetstream_pull's).

    `server_version`: nats-py's connected_server_version, when known."""
    from nats.errors import Error as NatsError
    from nats.js.api import AckPolicy, ConsumerConfig
    from nats.js.errors import NotFoundError

    where = f"NATS at {shown_url(settings.url)}"
    version = _version(server_version)
    if len(settings.filter_subjects) > 1 and version and version[:2] < MULTI_FILTER_SINCE:
        raise JetStreamConsumerError(_multi_filter_problem(settings, version))
    stream_subjects: list[str] = []
    try:
        try:
            stream = await js.stream_info(settings.stream)
        except NotFoundError:
            raise JetStreamConsumerError(
                f"no JetStream stream {settings.stream!r} at {where}: create it first "
                "(cdc-router streams apply -c router.yaml)") from None
        stream_subjects = _checked_filters(stream.config, settings)
        dead_letter_stream = await _dead_letter_stream_name(js, settings)
        ack_wait_s = settings.ack_wait_s
        try:
            info = await js.consumer_info(settings.stream, settings.durable)
        except NotFoundError:
            filters = settings.filter_subjects
            created = await js.add_consumer(settings.stream, ConsumerConfig(
                durable_name=settings.durable, ack_policy=AckPolicy.EXPLICIT,
                ack_wait=settings.ack_wait_s,
                # Unlimited: the server would stop redelivering after MaxDeliver even
                # the naks of a store outage; the consumer counts attempts itself.
                max_deliver=-1, max_ack_pending=settings.max_ack_pending,
                filter_subject=filters[0] if len(filters) == 1 else None,
                filter_subjects=list(filters) if len(filters) > 1 else None))
            await _check_created(js, created, settings, version)
            log.info("event=jetstream_consumer_created stream=%s durable=%s",
                     settings.stream, settings.durable)
        else:
            problem = consumer_problem(info.config, settings)
            if problem is not None:
                raise JetStreamConsumerError(
                    f"durable consumer {settings.durable!r} of stream {settings.stream!r} "
                    f"{problem}; delete it (nats consumer rm {settings.stream} "
                    f"{settings.durable}) or use another durable name") from None
            ack_wait_s = _durable_ack_wait(info.config, settings)
        return dead_letter_stream, ack_wait_s
    except NatsError as error:
        raise JetStreamConsumerError(
            f"JetStream at {where} refused to set up consumer {settings.durable!r} on "
            f"stream {settings.stream!r}: {error_text(error)}; "
            f"{_refusal_hint(error, settings, stream_subjects)}") from None


async def _check_created(js: Any, created: Any, settings: JetStreamSettings,
                         version: tuple[int, ...] | None) -> None:
    """Raises, after deleting the durable it just made, when the server made it on other terms
    than asked: a consumer of the whole stream would run the handler on every message."""
    from nats.errors import Error as NatsError

    config = getattr(created, "config", None)
    problem = None if config is None else consumer_problem(config, settings)
    if problem is None:
        return
    try:
        await js.delete_consumer(settings.stream, settings.durable)
        undone = "it was deleted again"
    except (NatsError, TimeoutError) as error:
        undone = (f"deleting it failed ({error_text(error)}): nats consumer rm "
                  f"{settings.stream} {settings.durable}")
    if len(settings.filter_subjects) > 1:
        raise JetStreamConsumerError(f"{_multi_filter_problem(settings, version)}; the "
                                     f"server created durable {settings.durable!r} that "
                                     f"{problem}, and {undone}")
    raise JetStreamConsumerError(
        f"JetStream created durable consumer {settings.durable!r} of stream "
        f"{settings.stream!r} that {problem}; {undone}")


def _multi_filter_problem(settings: JetStreamSettings, version: tuple[int, ...] | None) -> str:
    shown = ".".join(map(str, version)) if version else "unknown"
    return (f"JetStreamSettings: field 'filter_subjects': {len(settings.filter_subjects)} "
            f"subjects ({', '.join(settings.filter_subjects)}) need nats-server 2.10 or later, "
            f"and the server's version is {shown} (it ignores them and would deliver the whole "
            f"stream {settings.stream!r}): give one subject per consumer (one subject with "
            "wildcards, or one consumer per subject), or upgrade nats-server")


def _version(server_version: Any) -> tuple[int, ...] | None:
    """(major, minor, patch) of nats-py's ServerVersion; None when unknown."""
    try:
        version = (int(server_version.major), int(server_version.minor),
                   int(server_version.patch))
    except (AttributeError, TypeError, ValueError):
        return None
    return version if version[0] > 0 else None  # nats-py's "0.0.0-unknown"


def _checked_filters(stream: Any, settings: JetStreamSettings) -> list[str]:
    """The stream's subjects; raises when a filter subject can match none of them, which
    JetStream would refuse (err 10093) in words that name no setting (QA 49-a F3)."""
    subjects = list(getattr(stream, "subjects", None) or ())
    if not subjects or getattr(stream, "mirror", None) or getattr(stream, "sources", None):
        return subjects  # a mirror's or a source's subjects are another stream's
    for filter_ in settings.filter_subjects:
        if not any(subjects_collide(filter_, subject) for subject in subjects):
            raise JetStreamConsumerError(
                f"JetStreamSettings: field 'filter_subjects': {filter_!r} is not captured by "
                f"stream {settings.stream!r} (its subjects: {', '.join(subjects)}): give "
                "subjects of that stream, or another stream")
    return subjects


def _refusal_hint(error: Exception, settings: JetStreamSettings, subjects: list[str]) -> str:
    """What to look at for a refusal: an answer with a 4xx code came from JetStream itself."""
    if getattr(error, "err_code", None) == FILTER_NOT_IN_STREAM:
        return (f"JetStreamSettings field 'filter_subjects' ({', '.join(settings.filter_subjects)}"
                f") must lie within stream {settings.stream!r}'s subjects "
                f"({', '.join(subjects) or 'unknown'})")
    code = getattr(error, "code", None)
    if isinstance(code, int) and 400 <= code < 500:
        return "JetStream answered, so its reason concerns JetStreamSettings or the stream"
    return "is JetStream enabled?"


def _durable_ack_wait(existing: Any, settings: JetStreamSettings) -> float:
    """The AckWait the server holds the durable to, which the keep-alive must beat (review
    33: a durable made with 5 s, settings of 30 s: in-progress acks every 10 s, and messages
    waiting in a batch were redelivered)."""
    held = float(existing.ack_wait or settings.ack_wait_s)
    if held != settings.ack_wait_s:
        log.warning("event=durable_ack_wait_differs stream=%s durable=%s ack_wait_s=%g "
                    "settings_ack_wait_s=%g note=the keep-alive follows the durable's; change "
                    "it with nats consumer edit, or delete the durable", settings.stream,
                    settings.durable, held, settings.ack_wait_s)
    return held


async def check_durable(js: Any, settings: JetStreamSettings) -> None:
    """Stop when the durable is gone: a pull from a deleted consumer only times out, so
    an idle stream would hide it for ever."""
    from nats.errors import Error as NatsError
    from nats.js.errors import NotFoundError

    try:
        await js.consumer_info(settings.stream, settings.durable)
    except NotFoundError:
        deleted = JetStreamConsumerError(
            f"durable consumer {settings.durable!r} of stream {settings.stream!r} was "
            "deleted while this consumer ran: start it again to create it (it then "
            "delivers from the stream's start; the dedup store skips what was done)")
        # QA 65-b: a start cures it, so exit 75 as every other stop a restart mends (exit 1
        # left the service down under a supervisor that restarts on 75, as QA 61-b F4 did).
        deleted.exit_code = EXIT_RESTART
        raise deleted from None
    except (NatsError, TimeoutError) as error:  # reconnecting: look again later
        log.info("event=durable_check_failed error=%s", error_text(error))


async def _dead_letter_stream_name(js: Any, settings: JetStreamSettings) -> str:
    from nats.js.errors import NotFoundError

    subject = settings.dead_letter_subject
    try:
        name: str = await js.find_stream_name_by_subject(subject)
    except NotFoundError:
        # A plain NATS publish would be lost when nobody listens: poison must be stored.
        raise JetStreamConsumerError(
            f"dead-letter subject {subject!r} is in no JetStream stream at NATS "
            f"{shown_url(settings.url)}: add it to a stream (nats.streams in router.yaml, then "
            "cdc-router streams apply), or poison messages would be lost") from None
    if name == settings.stream and (not settings.filter_subjects or settings.consumes(subject)):
        raise JetStreamConsumerError(
            f"dead-letter subject {subject!r} is in stream {name!r}, and durable "
            f"{settings.durable!r} would read its own dead letters: put them in another "
            "stream, or give filter_subjects that exclude it")
    return name
