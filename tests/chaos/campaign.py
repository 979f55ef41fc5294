"""The campaign: set up a pipeline, write the load, inject the faults, drain, verify, report.

    python -m tests.chaos --profile short --events 10000 --seed 7

Run it against a stack of its own: it kills Kafka, Connect and Postgres (by the pid files of
the `cdc-router local` stack under CDC_ROUTER_HOME).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from tests.chaos import faults, report, timeline, verifier
from tests.chaos.load import Load, Names, create_tables
from tests.chaos.routers import RouterFleet
from tests.chaos.stack import REPO, Connect, Endpoints, LocalStack, drop_run

PARTITIONS = {"orders": 6, "payments": 3, "events": 4, "broadcast": 2}
PAYMENT_SCHEMA = {"type": "record", "name": "PaymentConfirmed", "fields": [
    {"name": "payment_id", "type": "string"}, {"name": "amount", "type": "string"},
    {"name": "seq", "type": "long"}]}
DRAIN_TIMEOUT_S = 300


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos",
                                     description="Chaos campaign on the local stack (issue 15)")
    parser.add_argument("--profile", choices=sorted(faults.PROFILES), default="short")
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=400, help="events/s the writers aim at")
    parser.add_argument("--poison-rate", type=float, default=0.002)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None, help="JSON report path")
    parser.add_argument("--png", type=Path, default=None,
                        help="timeline PNG path (default: the JSON report's, with .png)")
    parser.add_argument("--from-report", type=Path, default=None, metavar="JSON",
                        help="run nothing: print the table and draw the PNG of a saved report")
    parser.add_argument("--keep", action="store_true", help="keep tables and topics")
    return parser.parse_args(argv)


def router_config(names: Names, endpoints: Endpoints, workdir: Path) -> Path:
    (workdir / "payment.avsc").write_text(json.dumps(PAYMENT_SCHEMA))
    config = {
        "kafka": {"bootstrap_servers": endpoints.bootstrap},
        "source": {"topics": [names.raw], "group_id": names.run},
        "routes": [
            {"match": {"aggregate_type": "Order*"}, "topic": names.topic("orders")},
            {"match": {"type": "PaymentConfirmed"}, "topic": names.topic("payments"),
             "format": "avro", "schema": "payment.avsc"},
            {"match": {"type": "Broadcast"}, "topic": "{aggregate_type}"},
            {"topic": names.topic("events")},
        ],
        "dead_letter": {"topic": names.topic("dlq")},
        "dedup": {"changelog_topic": names.topic("dedup")},
        "cleanup": {"mode": "delete", "table": f"public.{names.table}"},
        "topics": [{"name": names.topic(t), "partitions": n} for t, n in PARTITIONS.items()],
    }
    path = workdir / "router.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def router_env(endpoints: Endpoints) -> dict[str, str]:
    """The secret part of the router's config, from the environment as in production."""
    return {"CDC_ROUTER__CLEANUP__DSN": endpoints.dsn}


def set_up(names: Names, endpoints: Endpoints, config: Path) -> None:
    create_tables(endpoints.dsn, names)
    admin = AdminClient({"bootstrap.servers": endpoints.bootstrap})
    # One raw partition: Debezium writes it in commit order, so per-aggregate order holds.
    for future in admin.create_topics([NewTopic(names.raw, 1, 1)]).values():
        future.result(timeout=60)
    applied = subprocess.run([sys.executable, "-m", "cdc_router", "topics", "apply", "-c",
                              str(config), "--yes"], capture_output=True, text=True, cwd=REPO,
                             check=False, env={**os.environ, **router_env(endpoints)})
    if applied.returncode != 0:
        raise RuntimeError(f"chaos: topics apply failed: {applied.stderr.strip()}")


def drain(progress: faults.Progress, endpoints: Endpoints, names: Names) -> float:
    """Wait until the router has consumed the raw topic to its end and the cleanup caught up."""
    started = time.monotonic()
    deadline = started + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        end, committed = progress.raw_end(), progress.committed()
        # The last offset may be a transaction marker, which no consumer position passes.
        if end is not None and committed is not None and committed >= end - 1:
            leaked, _ = verifier.leaked_rows(endpoints.dsn, names.table, names.ledger)
            if leaked == 0:
                break
        time.sleep(1)
    return round(time.monotonic() - started, 1)


def tear_down(connect: Connect, names: Names, endpoints: Endpoints) -> None:
    """Remove the connector, slot, publication, tables and topics of the run."""
    connect.delete(names.run)
    drop_run(endpoints.dsn, names.table, names.ledger)
    admin = AdminClient({"bootstrap.servers": endpoints.bootstrap})
    ours = [t for t in admin.list_topics(timeout=30).topics if t.startswith(names.run)]
    if ours:
        for future in admin.delete_topics(ours).values():
            future.result(timeout=60)


def run(args: argparse.Namespace) -> dict[str, object]:
    endpoints = Endpoints.from_env()
    stack = LocalStack(endpoints.home)
    names = Names(f"chaos-{uuid.uuid4().hex[:8]}")
    workdir = args.workdir or Path("/tmp") / names.run
    workdir.mkdir(parents=True, exist_ok=True)
    plan = faults.schedule(args.profile, args.seed)
    print(f"chaos: run {names.run}, seed {args.seed}, workdir {workdir}", flush=True)
    for number, planned in enumerate(plan, 1):
        print(f"  plan {number:>2}: {planned.kind} at {planned.at_fraction:.0%} of its "
              f"segment (pause {planned.pause_s}s)", flush=True)
    kafka_log_from = stack.log_size("kafka")
    # Alive through the broker's kills: no librdkafka line per refused reconnect (chaos 53-e F3)
    admin = AdminClient({"bootstrap.servers": endpoints.bootstrap, "log_level": 0})
    topics_before = set(admin.list_topics(timeout=30).topics)
    config = router_config(names, endpoints, workdir)
    connect = Connect(endpoints.connect_url)
    try:
        set_up(names, endpoints, config)
        connector = faults.register_connector(connect, endpoints.dsn, names.table, names.run)
    except BaseException:
        tear_down(connect, names, endpoints)
        raise
    fleet = RouterFleet(config, workdir, names.run,
                        router_env(endpoints))
    progress = faults.Progress(endpoints.bootstrap, names.raw, names.run)
    load = Load(endpoints.dsn, names, writers=args.writers, seed=args.seed,
                poison_rate=args.poison_rate, rate_per_s=args.rate)
    started = time.monotonic()
    sampler = faults.ProgressSampler(endpoints.bootstrap, names.raw, names.run, started)

    injector = faults.Injector(stack, connect, fleet, progress, connector, workdir,
                               lambda: time.monotonic() - started, load.write_more,
                               endpoints.dsn)
    records: list[faults.FaultRecord] = []
    try:
        fleet.start(faults.MAIN)
        load.start()
        sampler.start()
        segment = args.events // (len(plan) + 1)
        for planned in plan:
            base = load.written
            load.raise_budget(segment)
            load.wait_written(base + int(segment * planned.at_fraction))
            print(f"chaos: t={time.monotonic() - started:.0f}s {load.written} events, "
                  f"injecting {planned.kind}", flush=True)
            records.append(injector.inject(planned))
            print(f"chaos: {planned.kind} recovered in {records[-1].recovery_s}s "
                  f"{records[-1].findings or ''}", flush=True)
            load.wait_written(base + segment)
        # The replay phase writes what it needs on top of the plan, so this may be nothing.
        load.write_more(max(0, args.events - load.written))
        load.stop()
        drain_s = drain(progress, endpoints, names)
        sampler.stop()
        print(f"chaos: drained in {drain_s}s; verifying", flush=True)
        fleet.stop_all()
        elapsed = time.monotonic() - started
        allowed = topics_before | {names.raw, *(names.topic(t) for t in PARTITIONS),
                                   names.topic("dlq"), names.topic("dedup"),
                                   *injector.extra_topics}
        verdict = verifier.verify(verifier.Target(
            endpoints.bootstrap, endpoints.dsn, names.table, names.ledger, names.raw,
            tuple(names.topic(t) for t in PARTITIONS), names.topic("dlq"),
            frozenset(allowed), names.topic("dedup"),
            tuple(abort for record in records for abort in record.hanging_aborts
                  if abort.topic == names.topic("dedup"))))
        header = {"run": names.run, "profile": args.profile, "seed": args.seed,
                  "command": "python -m tests.chaos " + shlex.join(sys.argv[1:]),
                  "events_requested": args.events, "elapsed_s": round(elapsed, 1),
                  "drain_s": drain_s, "plan": [vars(p) for p in plan]}
        return report.build(header=header, faults=records, verdict=verdict,
                            duplicates_dropped=fleet.duplicates_dropped(),
                            write_errors=load.write_errors,
                            timeline=report.throughput(load.timeline, started),
                            router_progress=sampler.samples)
    finally:
        load.stop()
        sampler.stop()
        fleet.stop_all()
        progress.close()
        stack.keep_log("kafka", kafka_log_from, workdir / "kafka.log")
        if not args.keep:
            tear_down(connect, names, endpoints)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # so that the run's tear-down runs


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.from_report:
        path = args.from_report
        result = json.loads(path.read_text())
    else:
        signal.signal(signal.SIGTERM, _interrupt)
        result = run(args)
        path = args.report or Path("/tmp") / f"{result['run']}.json"
        report.save(result, path)
    png = args.png or path.with_suffix(".png")
    timeline.draw(result, png)
    print(report.render(result))
    print(f"report: {path}\ntimeline: {png}")
    sys.exit(0 if result["passed"] else 1)
