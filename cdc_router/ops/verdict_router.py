"""The verdict on the router group: no instance, unassigned partitions, lag, stalls, and a
raw partition an open transaction holds (README, Operations: `status`)."""

from __future__ import annotations

from collections.abc import Iterator

from cdc_router.config.status import StatusSettings
from cdc_router.ops.problem import Problem, reached
from cdc_router.ops.report import RouterState

HANGING_RUNBOOK = "README runbook 'a raw partition held by an open transaction'"


def router_problems(router: RouterState, settings: StatusSettings) -> Iterator[Problem]:
    if router.error is not None or router.lag is None:
        return
    group = f"router group {router.group}"
    if router.lag > 0 and not router.members and router.offsets_in_transaction:
        # QA 52-b L2: every start exited 75 on a transaction Kafka left hanging, and this
        # line said to start the router.
        yield Problem(settings.no_router, "router", f"{group} has no running instance, "
                      f"{router.lag} records wait on the raw topic, and a transaction holds "
                      "the group's committed offsets of "
                      f"{', '.join(router.offsets_in_transaction)} open: a router's start "
                      "waits for it (exit 75, `could not read the group's committed "
                      "offsets`); one that lasts longer than delivery.transaction_timeout_ms "
                      "was left hanging by Kafka: find and abort it (README, Operations: "
                      "every start of the router exits 75)")
    elif router.lag > 0 and not router.members:
        # QA 58-b F-5: a router frozen (SIGSTOP) past its session timeout leaves the group
        # too, its process alive: a second `run` beside it is not the fix.
        yield Problem(settings.no_router, "router", f"{group} has no running instance "
                      f"(down, or hung past its session timeout) and {router.lag} records "
                      "wait on the raw topic: start it (`cdc-router run`), or restart a hung "
                      "one")
    assigned = {name for member in router.members for name in member.partitions}
    unread = [f"{p.topic}[{p.partition}]" for p in router.partitions
              if p.lag > 0 and f"{p.topic}[{p.partition}]" not in assigned]
    if router.members and router.group_state == "stable" and unread:
        # QA 44-a: a static member restarted with a topic more kept its old assignment; the
        # group's last commit was recent, so the stall check said nothing.
        yield Problem(settings.no_router, "router", f"{group} has instances, but none is "
                      f"assigned {', '.join(unread)}, where records wait: stop every "
                      "instance for longer than the group's session timeout (kafka.consumer "
                      "session.timeout.ms, 10 s), then start them: the group assigns every "
                      "partition anew")
    over = reached(router.lag, settings.lag_critical, settings.lag_warning)
    if over is not None:
        yield Problem(over[0], "router", f"{group} lags {router.lag} records behind the raw "
                      f"topic ({over[0]} at {over[1]:g}); check its /metrics "
                      "(cdc_router_consecutive_aborts), or add instances (up to the raw "
                      "topic's partitions)")
    # Stalled, partition by partition: records wait there and nothing was committed there
    # for a while (the age of its oldest waiting record stands in when it never was). Review
    # 47-b F4: judged on the group's newest commit, one frozen instance's partition went
    # unsaid while another instance committed.
    stalls = []
    # With no instance at all, "no running instance" says it (review 47-b L1: no log to read
    # for batch_aborted); an unassigned one of a stable group, "none is assigned". While the
    # group rebalances, its assignments are not known: every partition is judged (review
    # 47-f: the group-wide line said a stall there, the per-partition one skipped them all).
    said = set(unread) if router.group_state == "stable" else set()
    for p in router.partitions if router.members else ():
        ages = [a for a in (p.last_commit_age_s, p.oldest_pending_age_s) if a is not None]
        if p.lag > 0 and ages and f"{p.topic}[{p.partition}]" not in said:
            stalls.append((min(ages), p))
    yield from _held_open(router, settings)
    if not stalls:
        return
    stalled, _ = max(stalls, key=lambda stall: stall[0])
    over = reached(stalled, settings.stalled_critical_s, settings.stalled_warning_s)
    if over is None:
        return
    names = [f"{p.topic}[{p.partition}]" for age, p in stalls if age >= over[1]]
    held = [name for name in names if name in router.offsets_in_transaction]
    said_stall = f"{group} has not committed {', '.join(names)} for {stalled:.0f}s while " \
        f"{router.lag} records wait ({over[0]} at {over[1]:g}s)"
    if held:
        # Review 52-j F6: under a supervisor the restarted router is a member while its start
        # waits for the transaction, so the no-instance line above never said it. Only beside
        # a stall: a running batch holds its offsets open too.
        yield Problem(over[0], "router", f"{said_stall}, and a transaction holds the group's "
                      f"committed offsets of {', '.join(held)} open: an instance's start "
                      "waits for it (exit 75, `could not read the group's committed "
                      "offsets`), so a restarted one stays stuck; one that lasts longer than "
                      "delivery.transaction_timeout_ms was left hanging by Kafka: find and "
                      "abort it (README, Operations: every start of the router exits 75)"
                      + ("" if len(held) == len(names) else "; for the others, read the "
                         "instances' logs for event=batch_aborted"))
        return
    yield Problem(over[0], "router", f"{said_stall}: the instance holding it is stuck, down "
                  "or slowed by a Kafka quota, or none holds it; read the instances' logs for "
                  "event=batch_aborted or event=throttled (their /metrics count the aborts by "
                  "cause: cdc_router_batches_aborted_total{cause})")


def _held_open(router: RouterState, settings: StatusSettings) -> Iterator[Problem]:
    """QA 54-b F-1: a transaction left open on a raw partition holds its last stable offset,
    so the router reads nothing past it while the lag (read_committed) says 0. Judged as a
    stall: on the smaller of the transaction's age and the partition's last commit's, so the
    short gap of a transaction in flight is no problem."""
    for p in router.partitions:
        high, age = p.high_watermark, p.open_transaction_age_s
        if high is None or high <= p.end or age is None:
            continue
        ages = [a for a in (age, p.last_commit_age_s) if a is not None]
        found = reached(min(ages), settings.stalled_critical_s, settings.stalled_warning_s)
        if found is None:
            continue
        name, commit = f"{p.topic}[{p.partition}]", p.last_commit_age_s
        since = "never committed" if commit is None else f"not committed for {commit:.0f}s"
        yield Problem(found[0], "router", f"a transaction open for {age:.0f}s holds raw "
                      f"partition {name} at its last stable offset {p.end}, {high - p.end} "
                      f"offsets behind it up to the high watermark {high}: router group "
                      f"{router.group} reads nothing past it ({since}; {found[0]} at "
                      f"{found[1]:g}s); one that outlasts its producer's transaction.timeout.ms "
                      f"was left hanging by Kafka: find and abort it ({HANGING_RUNBOOK}: "
                      f"`kafka-transactions.sh describe-producers --topic {p.topic} --partition "
                      f"{p.partition}`, then `abort --topic {p.topic} --partition {p.partition} "
                      f"--start-offset {p.end}`)")
