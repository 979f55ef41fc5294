"""`cdc-router dlq`: what went to the dead-letter topic, and why; replaying it once fixed."""

from __future__ import annotations

import heapq
import os
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from confluent_kafka import KafkaException, Message, TopicPartition

from cdc_router.cli._durations import parse_since
from cdc_router.cli._options import config_option
from cdc_router.cli._output import emit, output_option, table
from cdc_router.cli._plan import confirm
from cdc_router.config.load import load_config
from cdc_router.dead_letter import dead_letter_origin, of_pipeline
from cdc_router.errors import FatalKafkaError, grant_refusal
from cdc_router.kafka.consumer import record_headers
from cdc_router.kafka.reader import TopicReader
from cdc_router.ops.offsets import admin_client
from cdc_router.ops.topics import replayed_positions
from cdc_router.router import clients
from cdc_router.router.dlq_letters import (
    ROUTER_STAGES,
    Planned,
    Selection,
    sources_of,
    written_by_router,
)
from cdc_router.router.dlq_replay import DeadLetterReplay, ReplayPlan, replay_group
from cdc_router.router.step import Routed

# Reading the dead-letter topic to its end: seconds on a cluster that answers. Run after an
# alert, `list` says so within a minute rather than hang (a replay, which also reads the
# changelog, waits longer: dlq_replay.READ_TIMEOUT_S).
_LIST_TIMEOUT_S = 60.0


@click.group(name="dlq")
def cli() -> None:
    """Inspect the dead-letter topic of a router config, and replay it."""


@cli.command(name="list")
@config_option()
# Letters are held in memory to be listed; past the machine's size deque() raised (review 48-e F11).
@click.option("-n", "--limit", default=50, show_default=True,
              type=click.IntRange(min=1, max=1_000_000),
              help="At most this many, oldest first (with --newest: the newest ones), by "
              "when each was written, across partitions.")
@click.option("--newest", is_flag=True, help="The newest --limit letters, not the oldest.")
@click.option("--since", metavar="TIME", help="Only letters written at or after TIME: "
              "ISO-8601 (UTC unless it says) or a duration back from now (2h).")
@click.option("--all", "everyone", is_flag=True,
              help="Also the letters of other pipelines sharing the topic (another "
              "source.group_id, or a source none of this config's) and of idempotent "
              "consumers.")
@output_option
def list_letters(config_path: Path, limit: int, newest: bool, since: str | None,
                 everyone: bool, output: str) -> None:
    """Dead letters with where they came from, the stage that failed, and why.

    Only this pipeline's (those `dlq replay` would consider), unless --all. After an alert,
    `--newest` or `--since 1h` shows the letters that raised it (QA 43-a F8: the first 50
    were the oldest)."""
    config = load_config(config_path, env=os.environ).config
    since_ms = None if since is None else parse_since(since, option="--since",
                                                      now_ms=int(time.time() * 1000))
    ours = sources_of(config)
    others = consumers = earlier = matched = 0
    # Up to the last stable offset as of now: a router's open transaction is not waited for.
    reader = TopicReader(clients.logged_config(config), config.dead_letter.topic,
                         group_id=f"dlq-list-{uuid.uuid4()}", what="dead-letter")
    kept = _Kept(limit, newest=newest)
    try:
        # Read to the end, so that a list cut by --limit says of how many (review 53-c F1).
        for message in reader.read_to_end(end="stable", timeout_s=_LIST_TIMEOUT_S):
            if since_ms is not None and message.timestamp()[1] < since_ms:
                earlier += 1
                continue
            headers = record_headers(message)
            if not everyone and not of_pipeline(headers, ours):
                # QA 63-b: an idempotent consumer's letters were said other pipelines'.
                if written_by_router({name: raw.decode(errors="replace")
                                      for name, raw in headers}):
                    others += 1
                else:
                    consumers += 1
                continue
            matched += 1
            kept.add(message)
    finally:
        reader.close()
    letters = kept.letters()
    topic = config.dead_letter.topic
    pipeline = "of this pipeline " if others or consumers else ""
    emit(list(letters), output, lambda rows: table(
        ["letter", "stage", "source", "event id", "error", "reason"],
        [[f"{r['partition']}@{r['offset']}", r["stage"], r["source"], r["event_id"] or "-",
          r["error"], _cut(r["reason"] or "")] for r in rows]) if rows
        else f"no dead letters {pipeline}since {_utc(since_ms)} "
             f"({earlier + others + consumers} on {topic})"
        if since_ms is not None and earlier
        else f"no dead letters {pipeline}on {topic}")
    if matched > len(letters):
        # By when each was written, not as read (review 62: it said "the first" of letters
        # that are no longer those read first).
        click.echo(f"{len(letters)} of {matched} shown "
                   f"({'the newest' if newest else 'the oldest'}; -n sets how many)", err=True)
    if (said := _replayed_line(config)) is not None:
        click.echo(said, err=True)
    if others or consumers:
        click.echo(f"{_of_others(others, consumers)} (--all lists them)", err=True)


def _of_others(others: int, consumers: int) -> str:
    """'N letters of other pipelines and M of idempotent consumers left out'."""
    def letters(count: int) -> str:
        return f"{count} letter{'' if count == 1 else 's'}"
    parts = ([f"{letters(others)} of other pipelines"] if others else []) + (
        [f"{consumers if others else letters(consumers)} of idempotent consumers"]
        if consumers else [])
    return " and ".join(parts) + " left out"


class _Kept:
    """The `limit` oldest letters, or with `newest` the `limit` newest, by when each was
    written (then partition and offset), listed oldest first.

    The reader hands the letters partition after partition, not in the order they were
    written: on a topic of 3 partitions `--newest -n 200` showed 65 of the 200 newest (QA
    62-b). A heap whose top is the kept letter to give up first: the oldest (newest), else
    the newest, its key negated."""

    def __init__(self, limit: int, *, newest: bool) -> None:
        self._limit, self._newest = limit, newest
        self._heap: list[tuple[tuple[int, int, int], dict[str, Any]]] = []

    def add(self, message: Message) -> None:
        """Keep the letter if it is among the limit (its timestamp, partition and offset,
        unique, rank it); its row is made only then."""
        # A consumed record has all three (the types allow None for a produced one).
        written = (message.timestamp()[1], message.partition() or 0, message.offset() or 0)
        key = written if self._newest else (-written[0], -written[1], -written[2])
        if len(self._heap) < self._limit:
            heapq.heappush(self._heap, (key, _row(message)))
        elif key > self._heap[0][0]:
            heapq.heapreplace(self._heap, (key, _row(message)))

    def letters(self) -> list[dict[str, Any]]:
        """The kept letters, oldest first."""
        return [row for _, row in sorted(self._heap, key=lambda item: item[0],
                                         reverse=not self._newest)]


def _row(message: Message) -> dict[str, Any]:
    """A letter as `list` shows it. The partition too: on a dead-letter topic of several
    partitions an offset alone names a letter on each (QA 62-b); `dlq replay` shows P@O."""
    return {"partition": message.partition(), "offset": message.offset(),
            **dead_letter_origin(record_headers(message))}


def _utc(epoch_ms: int) -> str:
    """`epoch_ms` as an ISO-8601 UTC time to the minute, or to the second when it has them."""
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ" if moment.second else "%Y-%m-%dT%H:%MZ")


@cli.command()
@config_option()
@click.option("--stage", "stages", multiple=True, type=click.Choice(sorted(ROUTER_STAGES)),
              help="Only letters that failed at this stage; repeatable.")
@click.option("--id", "ids", multiple=True, metavar="EVENT_ID",
              help="Only the letters of this event id; repeatable.")
@click.option("--since", metavar="TIME", help="Only letters written at or after TIME: "
              "ISO-8601 (UTC unless it says) or a duration back from now (2h).")
@click.option("--include-expired", is_flag=True, help="Also letters older than "
              "dedup.window_ms (by default `expired`: the changelog no longer says whether an "
              "earlier replay delivered them); only if none did.")
@click.option("--dry-run", is_flag=True, help="Only show where each letter would go.")
@click.option("--yes", is_flag=True, help="Do not ask.")
@output_option
def replay(config_path: Path, stages: tuple[str, ...], ids: tuple[str, ...],
           since: str | None, include_expired: bool, dry_run: bool, yes: bool,
           output: str) -> None:
    """Route dead letters again with the current rules, exactly once.

    Every replay reads the dead-letter topic from its beginning; ids already delivered (by
    the router or an earlier replay) are skipped, a letter that fails again for a new reason
    is dead-lettered again with it; one that fails as before stays as it is (still_failing).
    Offsets are committed under the group <source.group_id>.dlq-replay.
    """
    compiled = load_config(config_path, env=os.environ)
    selection = Selection(
        frozenset(stages), frozenset(ids),
        None if since is None else parse_since(since, option="--since",
                                               now_ms=int(time.time() * 1000)),
        include_expired)
    # Asked first, the plan shown is a dry run's (it registers no schema: review 48-d F8); once
    # confirmed, the replay plans again, registering, and applies that plan.
    replayer = DeadLetterReplay(compiled, dry_run=dry_run or not yes)
    try:
        plan = replayer.plan(selection)
        todo = sum(1 for item in plan.planned if item.action in ("deliver", "dead_letter"))
        if output == "text":
            click.echo(_plan_text(plan, compiled.config.dead_letter.topic))
        # With --yes, a replay with nothing to deliver still commits how many letters are
        # left undelivered, which `status` counts by (QA 52-b M1).
        if dry_run or (todo == 0 and not yes):
            if output == "json":
                emit(_plan_json(plan, compiled.config, None), output, str)
            return
        if not yes:
            confirm(f"replay {todo} dead letters?", yes)
            replayer.close()
            replayer = DeadLetterReplay(compiled, dry_run=False)
            plan = replayer.plan(selection)
        result = replayer.apply(plan)
    except FatalKafkaError as failure:
        refusal = grant_refusal(failure, group=replay_group(compiled.config),
                                transactional_prefix=clients.transactional_prefix(compiled.config))
        if refusal is None:
            raise
        raise refusal from failure
    finally:
        replayer.close()
    if output == "json":
        emit(_plan_json(plan, compiled.config, result.committed), output, str)
    else:
        click.echo("committed: " + _counts(result.committed)
                   + f" (group {replay_group(compiled.config)})")


def _replayed_line(config: Any) -> str | None:
    """What the last complete `dlq replay` left undelivered (kafka/commit_stamp.py), from its
    group's offsets: no changelog read (QA 52-b M1); None when none says (or not readable)."""
    kafka = clients.logged_config(config)
    topic = config.dead_letter.topic
    try:
        found = admin_client(kafka).list_topics(topic, timeout=10).topics.get(topic)
        positions = replayed_positions(admin_client(kafka), replay_group(config), [
            TopicPartition(topic, p) for p in sorted(found.partitions)]) if found else None
    except KafkaException:
        return None
    noted = {p: at for p, at in (positions or {}).items() if at[1] is not None}
    if not noted:
        return None
    where = ", ".join(f"{p}:{offset}" for p, (offset, _) in sorted(noted.items()))
    left = sum(count or 0 for _, count in noted.values())
    return (f"the last complete `dlq replay` read to offset {where}: {left} of this "
            "pipeline's letters before it are not delivered (`dlq replay --dry-run` says "
            "which); those after it are not delivered yet")


def _destination(item: Planned) -> str:
    if isinstance(item.result, Routed):
        record = item.result.record
        if record.nats:
            return f"NATS subject {record.topic} Nats-Msg-Id={record.event_id}"
        key = (record.key or b"").decode(errors="replace")
        to = f"{record.topic}[{record.partition}] key={key}"
        return f"{to}; {item.note}" if item.note else to
    return item.note


def _plan_rows(plan: ReplayPlan) -> list[dict[str, Any]]:
    return [{"partition": item.letter.partition, "offset": item.letter.offset,
             "event_id": item.letter.event_id, "stage": item.letter.stage,
             "action": item.action, "to": _destination(item)} for item in plan.planned]


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{count} {action}" for action, count in sorted(counts.items())) or "none"


def _plan_text(plan: ReplayPlan, topic: str) -> str:
    others = (f"\n{_of_others(plan.others, plan.consumers)} (`dlq list --all` lists them)"
              if plan.others or plan.consumers else "")
    if not plan.planned:
        return f"no dead letters selected ({plan.read} on {topic}){others}"
    rows = [[f"{row['partition']}@{row['offset']}", row["event_id"] or "-", row["stage"],
             row["action"], _cut(row["to"])] for row in _plan_rows(plan)]
    return (table(["letter", "event id", "stage", "action", "to / why"], rows)
            + f"\n{len(plan.planned)} of {plan.read} letters selected: "
            f"{_counts(plan.counts())}{others}")


def _plan_json(plan: ReplayPlan, config: Any, committed: dict[str, int] | None
               ) -> dict[str, Any]:
    return {"group": replay_group(config), "read": plan.read, "letters": _plan_rows(plan),
            "planned": plan.counts(), "committed": committed, "others": plan.others,
            "consumers": plan.consumers}


def _cut(text: str, limit: int = 120) -> str:
    """`text` for a table cell: whole, or cut with a marker (QA 47-d F1: cut mid-word, the
    what-to-do lost without a sign; `-o json` has it whole)."""
    return text if len(text) <= limit else text[:limit - 26] + " ... (whole in -o json)"
