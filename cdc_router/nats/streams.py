"""Plan and apply the JetStream streams a router config declares (`cdc-router streams apply`).

The plan compares each declared stream with the server's: missing ones are created; subjects
and limits (duplicate window, age, bytes, messages) are updated in place; storage cannot change
on a live stream, and the replica count is left to `nats stream edit` (a clustered JetStream's
choice), so a difference there is a warning, never a recreate. Settings made by hand that lose
events or stall every batch (nats/drift.py) are set back, or, when only a new stream mends
them, named: `apply` leaves such a stream as it is, and the router's start refuses it.
Planning is pure (plan_streams over the server's current configs); only StreamAdmin talks to
the server, with asyncio.run, as a CLI command is synchronous and short.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from cdc_router.config.nats import StreamSpec
from cdc_router.config.nats_subjects import subject_covers, subjects_collide
from cdc_router.config.redact import shown_url
from cdc_router.errors import ConfigError, JetStreamError, NatsUnreachable
from cdc_router.nats import drift
from cdc_router.nats.connection import config_failure, require_tls, servers

StreamAction = Literal["create", "update", "unchanged"]
# One JetStream API call: stream creation on a loaded server takes a second at most.
_API_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class StreamPlan:
    """What `apply` would do to one stream, and why."""

    name: str
    action: StreamAction
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    # (setting, value, why) of the server's settings only a new stream mends (nats/drift.py).
    recreate: Sequence[tuple[str, Any, str]] = ()
    # Of `warnings`: the server's settings that store acked events elsewhere (drift.elsewhere).
    elsewhere: tuple[str, ...] = ()


def wanted(spec: StreamSpec) -> dict[str, Any]:
    """The stream's settings as JetStream's StreamConfig names them (durations in seconds)."""
    return {"subjects": sorted(spec.subjects),
            "duplicate_window": spec.duplicate_window_ms / 1000,
            "max_age": spec.max_age_ms / 1000, "max_bytes": spec.max_bytes,
            "max_msgs": spec.max_msgs, "storage": spec.storage, "num_replicas": spec.replicas,
            # Always old: with `discard: new` a full stream refuses every publish, and the
            # router, which cannot tell that from an outage, stalls every route (README).
            "discard": "old"}


_LEFT_AS_IS = {  # left as they are on a live stream; why, per key
    "storage": " (JetStream cannot change it on a live stream)",
    # Review 53-c F9: a clustered JetStream (2.9+) does change it; one server has no peers.
    "num_replicas": ": `streams apply` does not change a live stream's replicas; `nats stream "
                    "edit {name} --replicas {value}` does (a clustered JetStream)"}
_DURATIONS = ("duplicate_window", "max_age")
# The config's names of the settings JetStream names otherwise (QA 62-b F-6: the plan said
# `duplicate_window: 120.0 -> 3600.0`, in seconds, of a config that says duplicate_window_ms).
_CONFIG_NAMES = {"duplicate_window": "duplicate_window_ms", "max_age": "max_age_ms",
                 "num_replicas": "replicas"}


def config_named(key: str, value: Any) -> tuple[str, Any]:
    """A JetStream setting as the config names it, durations in its milliseconds; a setting
    the config has no name for (drift's, set outside it) as JetStream names it."""
    return _CONFIG_NAMES.get(key, key), _comparable(key, value)


def config_changes(changes: Mapping[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """A plan's changes as the config names them (config_named), for people to read."""
    shown = {}
    for key, (have, want) in changes.items():
        name, have = config_named(key, have)
        shown[name] = (have, config_named(key, want)[1])
    return shown


def _comparable(key: str, value: Any) -> Any:
    """Durations in whole milliseconds, the config's unit: nats-py sends int(seconds * 1e9),
    so 1.003 s is stored as 1002999999 ns and reads back a nanosecond short of the config."""
    if key in _DURATIONS and isinstance(value, (int, float)):
        return round(value * 1000)
    return value


def plan_streams(specs: Sequence[StreamSpec],
                 existing: Mapping[str, Mapping[str, Any]]) -> list[StreamPlan]:
    """The plan for `specs` given the server's streams (name -> settings as wanted() names)."""
    plans = []
    for spec in specs:
        want = wanted(spec)
        have = existing.get(spec.name)
        if have is None:
            plans.append(StreamPlan(spec.name, "create", {k: (None, v) for k, v in want.items()}))
            continue
        broken = drift.recreate(have)
        if broken:  # QA 54-d F-9: an update of a sealed stream printed `applied`, changed nothing
            plans.append(StreamPlan(spec.name, "unchanged", {}, tuple(
                f"{key} is {value} (set outside the config): {why}; "
                + drift.recreate_hint(spec.name) for key, value, why in broken), broken))
            continue
        changes = {key: (have.get(key), value) for key, value in want.items()
                   if key not in _LEFT_AS_IS
                   and _comparable(key, have.get(key)) != _comparable(key, value)}
        changes |= drift.set_back(have)
        warnings = tuple(f"{_CONFIG_NAMES.get(key, key)} is {have.get(key)}, the config says "
                         f"{value}: left as is"
                         + _LEFT_AS_IS[key].format(name=spec.name, value=value)
                         for key, value in want.items()
                         if key in _LEFT_AS_IS and have.get(key) != value)
        size = have.get("max_msg_size")
        if isinstance(size, int) and size >= 0:
            warnings += (f"max_msg_size is {size} (set outside the config): a bigger event "
                         "is dead-lettered (stage produce)",)
        warnings += (*_evictions(have, changes), *drift.outside(have))
        plans.append(StreamPlan(spec.name, "update" if changes else "unchanged", changes,
                                warnings, elsewhere=tuple(drift.elsewhere(have))))
    return plans


def _limit(value: Any) -> float:
    """A limit as a number, no limit (JetStream's -1 or 0) as infinity."""
    return value if isinstance(value, (int, float)) and value > 0 else float("inf")


def _evictions(have: Mapping[str, Any], changes: Mapping[str, tuple[Any, Any]]
               ) -> tuple[str, ...]:
    """What lowering a limit deletes at once (QA 49-a F9: `max_msgs: 50 -> 10` deleted 40
    stored events, consumed or not, behind a one-line diff); `have` holds the stream's state,
    `messages` and `bytes`."""
    messages, stored_bytes = have.get("messages"), have.get("bytes")
    found = []
    for key, stored, unit in (("max_msgs", messages, "messages"),
                              ("max_bytes", stored_bytes, "bytes")):
        old, new = changes.get(key, (None, None))
        if _limit(new) < _limit(old) and isinstance(stored, int) and stored > _limit(new):
            found.append(f"lowers {key} {old} -> {new}: JetStream deletes the oldest messages "
                         f"beyond it at once, consumed or not ({stored} {unit} stored now)"
                         + (_unread(have.get("unacked", ()), new) if key == "max_msgs" else ""))
    old, new = changes.get("max_age", (None, None))
    if _limit(new) < _limit(old) and isinstance(messages, int) and messages > 0:
        found.append(f"lowers max_age_ms {_comparable('max_age', old)} -> "
                     f"{_comparable('max_age', new)}: JetStream deletes the messages older "
                     f"than that at once, consumed or not ({messages} messages stored now)")
    return tuple(found)


def _unread(unacked: Sequence[tuple[str, int]], most: int) -> str:
    """QA 65-b F-7: the consumers the lowered max_msgs cuts, as JetStream keeps the newest
    `most` messages: each one with more not yet acked loses at least the difference unread."""
    cut = [f"{name} {count - most} of its {count}" for name, count in unacked if count > most]
    return f"; consumers that lose messages not yet acked: {', '.join(cut)}" if cut else ""


_APPLY = "`cdc-router streams apply -c <config>`"
# JSStreamSubjectOverlapErr: subjects another stream of the server holds already.
_SUBJECTS_OVERLAP = 10065


def start_problem(index: int, plan: StreamPlan) -> ConfigError | None:
    """Why the router must not start on the server's stream as `plan` found it, the stream
    being `nats.streams[index]`; None when it may. Each problem would fail or double every
    batch from then on, and `streams apply` mends it."""
    if plan.action == "create":  # QA 47-c F2: every batch retried for ever
        return ConfigError(f"the JetStream stream {plan.name} does not exist on the server, "
                           "so nothing would store its subjects' events",
                           field=f"nats.streams[{index}]", value=plan.name,
                           hint=f"create it with {_APPLY}")
    if plan.recreate:  # QA 54-d F-2: events lost, or every batch stalled, with no word
        key, value, why = plan.recreate[0]
        return ConfigError(f"stream {plan.name} on the server has {key} {value}: {why}",
                           field=f"nats.streams[{index}]", hint=drift.recreate_hint(plan.name))
    if plan.changes.get("no_ack", (None, None))[0]:
        return ConfigError(f"stream {plan.name} on the server has no_ack true: JetStream "
                           "acknowledges no publish to it, so every batch would time out",
                           field=f"nats.streams[{index}]", hint=f"set it back with {_APPLY}")
    have, want = plan.changes.get("duplicate_window", (None, None))
    if isinstance(have, (int, float)) and _comparable("duplicate_window", have) < \
            _comparable("duplicate_window", want):
        # QA 49-a F5: a batch re-published after the server's window (acks in, the Kafka
        # commit lost to a crash) was stored twice: 1,000 ids.
        return ConfigError(
            f"stream {plan.name} detects duplicates for "
            f"{_comparable('duplicate_window', have)} ms on the server, shorter than the "
            f"config's {_comparable('duplicate_window', want)} ms: a batch re-published after "
            "a crash would be stored twice once the server's window has passed",
            field=f"nats.streams[{index}].duplicate_window_ms",
            hint=f"set the server's window with {_APPLY} (a longer one there is fine)")
    have, want = plan.changes.get("subjects", (None, None))
    if isinstance(have, list) and isinstance(want, list):
        lost = [subject for subject in want
                if not any(subject_covers(held, subject) for held in have)]
        if lost:  # QA 49-a F7: every batch failed for ever, Kafka routes held with them
            return ConfigError(
                f"stream {plan.name} on the server captures {', '.join(have) or 'nothing'}, "
                f"not the config's {', '.join(lost)}: no stream would store those events",
                field=f"nats.streams[{index}].subjects",
                hint=f"give it the config's subjects with {_APPLY}")
    return None


def start_warning(index: int, plan: StreamPlan) -> str | None:
    """What the router's start warns about the server's stream that does not stop it."""
    found = [f"stream {plan.name} on the server has {text}" for text in plan.elsewhere]
    if plan.changes.get("discard", (None, None))[0] == "new":  # QA 54-d F-6: no word at start
        found.insert(0, f"stream {plan.name} on the server discards new messages when full "
                        "(set outside the config): once it is full, every batch waits, Kafka "
                        f"routes included; {_APPLY} sets it back to discard old ones")
    return f"nats.streams[{index}]: " + "; ".join(found) if found else None


def _transform(transform: Any) -> str | None:
    """A stream's subject_transform as `src -> dest` (no src: the stream's subjects)."""
    if transform is None or not transform.dest:
        return None
    return f"{transform.src or '>'} -> {transform.dest}"


class StreamAdmin:
    """Reads and writes streams on the server at `url`; each call connects and disconnects."""

    def __init__(self, url: str, options: Mapping[str, Any] | None = None, *,
                 timeout_s: float = _API_TIMEOUT_S) -> None:
        """`options`: nats.connect() keywords for credentials and TLS (nats/connection.py);
        `timeout_s` bounds the connection and each API call."""
        self._url = url
        self._options = dict(options or {})
        self._timeout_s = timeout_s

    def plan(self, specs: Sequence[StreamSpec]) -> list[StreamPlan]:
        """What apply() would do; ConfigError for a stream whose subjects overlap those of a
        server stream outside `specs`, which JetStream would refuse (review 53-c F8: a dry
        run planned it, exit 0)."""
        existing, held = self.read(specs)
        for index, spec in enumerate(specs):
            if (clash := overlap_error(index, spec, held)) is not None:
                raise clash
        return plan_streams(specs, existing)

    def read(self, specs: Sequence[StreamSpec]) -> tuple[dict[str, dict[str, Any]],
                                                        list[tuple[str, str]]]:
        """The server's streams of `specs` that exist (name -> settings and state, as
        plan_streams takes them), and the (stream, subject) pairs of its other streams.
        NatsUnreachable when no server answers; ConfigError when one refuses our credentials
        or TLS; JetStreamError when its JetStream API refuses or does not answer."""
        result: tuple[dict[str, dict[str, Any]], list[tuple[str, str]]] = asyncio.run(
            self._call(self._read, [spec.name for spec in specs]))
        return result

    def apply(self, specs: Sequence[StreamSpec], plans: Sequence[StreamPlan]) -> None:
        by_name = {spec.name: (index, spec) for index, spec in enumerate(specs)}
        asyncio.run(self._call(self._write, [(*by_name[p.name], p) for p in plans]))

    async def _call(self, work: Any, argument: Any) -> Any:
        import nats
        from nats.errors import Error as NatsError

        timeout_s = self._timeout_s
        await require_tls(self._url, self._options, timeout_s)
        try:
            client = await asyncio.wait_for(nats.connect(
                servers(self._url), connect_timeout=timeout_s, allow_reconnect=False,
                error_cb=_quiet, **self._options), timeout=timeout_s)
        except (NatsError, OSError, TimeoutError) as error:
            failure = config_failure(self._url, [error])
            if failure is not None:
                raise failure from None
            raise NatsUnreachable(f"cannot connect to NATS at {shown_url(self._url)} "
                                 f"({type(error).__name__}); is nats-server running?") from None
        try:
            return await work(client.jetstream(timeout=timeout_s), argument)
        except NatsError as error:
            raise JetStreamError(f"JetStream at {shown_url(self._url)} refused: {error}") from None
        finally:
            await client.close()

    @staticmethod
    async def _read(js: Any, names: list[str]) -> tuple[dict[str, dict[str, Any]],
                                                       list[tuple[str, str]]]:
        """The streams `names` as the server has them, and the (stream, subject) pairs of
        the server's other streams."""
        from nats.js.errors import NotFoundError

        found = {}
        for name in names:
            try:
                info = await js.stream_info(name)
            except NotFoundError:
                continue
            config = info.config
            found[name] = {
                "subjects": sorted(config.subjects or []),
                "duplicate_window": config.duplicate_window, "max_age": config.max_age,
                "max_bytes": config.max_bytes, "max_msgs": config.max_msgs,
                "storage": getattr(config.storage, "value", config.storage),
                "num_replicas": config.num_replicas,
                "discard": getattr(config.discard, "value", config.discard) or "old",
                "max_msg_size": config.max_msg_size,
                "retention": getattr(config.retention, "value", config.retention) or "limits",
                "no_ack": bool(config.no_ack), "sealed": bool(config.sealed),
                "mirror": config.mirror.name if config.mirror else None,
                "sources": [source.name for source in config.sources or ()],
                "max_msgs_per_subject": config.max_msgs_per_subject,
                "discard_new_per_subject": bool(config.discard_new_per_subject),
                "subject_transform": _transform(config.subject_transform),
                "persist_mode": getattr(config.persist_mode, "value", config.persist_mode)
                or "default",
                # The state, not settings: what lowering a limit would delete (_evictions).
                "messages": info.state.messages, "bytes": info.state.bytes,
                "unacked": await _unacked(js, name)}
        return found, await _held(js, names)

    @staticmethod
    async def _write(js: Any, work: list[tuple[int, StreamSpec, StreamPlan]]) -> None:
        from nats.js.api import DiscardPolicy, StorageType, StreamConfig
        from nats.js.errors import BadRequestError

        for index, spec, plan in work:
            settings = wanted(spec)
            try:
                if plan.action == "create":
                    await js.add_stream(StreamConfig(
                        name=spec.name, **{**settings, "storage": StorageType(spec.storage),
                                           "discard": DiscardPolicy.OLD}))
                elif plan.action == "update":
                    current = (await js.stream_info(spec.name)).config
                    for key, (_, value) in plan.changes.items():
                        setattr(current, key,
                                DiscardPolicy(value) if key == "discard" else value)
                    await js.update_stream(current)
            except BadRequestError as error:
                if error.err_code != _SUBJECTS_OVERLAP:
                    raise
                raise await _overlap(js, index, spec) from None


async def _unacked(js: Any, stream: str) -> list[tuple[str, int]]:
    """Each consumer's messages not yet acked (not delivered, or delivered and not acked):
    none where the JetStream API does not list them, as the stored count is said anyway."""
    from nats.errors import Error as NatsError

    try:
        consumers = await js.consumers_info(stream)
    except NatsError:  # a user allowed STREAM.INFO but not CONSUMER.LIST
        return []
    return [(consumer.name, (consumer.num_pending or 0) + (consumer.num_ack_pending or 0))
            for consumer in consumers]


async def _overlap(js: Any, index: int, spec: StreamSpec) -> ConfigError:
    """JetStream's 10065 names neither stream (QA 49-a F4): find the server's stream that
    holds subjects of `spec`."""
    found = overlap_error(index, spec, await _held(js, [spec.name]))
    return found or _overlap_error(index, spec, "its subjects overlap those of a stream on the "
                                               "server")


async def _held(js: Any, names: list[str]) -> list[tuple[str, str]]:
    """The (stream, subject) pairs of the server's streams not named in `names`."""
    return [(info.config.name, subject) for info in await js.streams_info()
            if info.config.name not in names for subject in info.config.subjects or ()]


def overlap_error(index: int, spec: StreamSpec,
                  held: Sequence[tuple[str, str]]) -> ConfigError | None:
    """The error naming the (stream, subject) pairs of `held` that overlap `spec`'s subjects,
    or None when none does."""
    clashes = [f"{mine!r} overlaps {theirs!r} of stream {name}" for name, theirs in held
               for mine in spec.subjects if subjects_collide(mine, theirs)]
    return _overlap_error(index, spec, "; ".join(clashes)) if clashes else None


def _overlap_error(index: int, spec: StreamSpec, said: str) -> ConfigError:
    return ConfigError(
        f"JetStream refused stream {spec.name}: {said}, and a subject is stored in one stream "
        "only",
        field=f"nats.streams[{index}].subjects",
        hint="take those subjects out of the other stream, or route to that stream's subjects "
             "and declare it in nats.streams instead")


async def _quiet(error: Exception) -> None:
    """nats-py prints a traceback per connection error by default; _call reports one line."""
