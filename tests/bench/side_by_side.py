"""Benchmark: Postgres outbox rows to a destination topic, every path side by side, in one run.

    python -m tests.bench.side_by_side [--rows 100000] [--latency-seconds 20] [--rate 200]
                                       [--json bench-results.json] [--png bench-results.png]

Runs against the stack named by CDC_ROUTER_BOOTSTRAP_SERVERS, CDC_ROUTER_CONNECT_URL and
CDC_ROUTER_PG_DSN (default: the local stack's addresses). Every object it creates there is
named for the run and removed at the end, also when the run fails.

Paths: Debezium (connectors/outbox-connector.json) then `cdc-router run` exactly-once and
at-least-once; Debezium with the EventRouter SMT (a second connector, its own slot);
`cdc-router relay` (exactly-once, cleanup delete); a naive polling relay and a tuned poller
(tests/bench/relays.py); and, on the raw topic Debezium filled,
the router alone and a plain consume-produce hop; then the router's memory with an empty dedup
changelog and with `--memory-ids` ids in it (tests/bench/replay_memory.py).

Throughput: a bulk of rows per path, rows/s between the first and the last record a
read_committed reader sees on the path's output. For the Debezium paths the connector is paused
while the bulk is inserted, then resumed, so that the rate is Debezium's and not the inserts'.
Latency: one writer commits a row a transaction at a steady rate into the tables of the paths
measured together (same id, same commit); latency = time the reader sees the row minus the time
right after COMMIT returned on the writer. Three phases, each with the SMT path beside it: the
exactly-once router, the at-least-once router, the three pollers (see latency()).
Ratios to Debezium's raw ingest rate in the same run are the numbers to compare across runs;
rates alone depend on what else the machine was doing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from cdc_router.local.versions import DEBEZIUM_VERSION
from cdc_router.postgres import table_identifier
from tests.bench import replay_memory, report
from tests.bench.bench_stack import EVENT_ROUTER as SMT_CLASS
from tests.bench.bench_stack import REPO, BenchStack, endpoints_from_env, leftover_objects
from tests.bench.report import Latency, Results, Throughput
from tests.bench.router_throughput import run_plain_loop
from tests.bench.watcher import Watcher

# Logical decoding messages are database-wide: another connector's heartbeat messages on the
# shared stack must not land on this run's raw topic and be counted as rows.
NO_MESSAGES = {"message.prefix.exclude.list": ".*"}
# Each latency phase first writes rows for this long, not counted: a path restarted for the
# phase catches up, every process is past its start-up, and the machine has settled after the
# bulk runs (with 3 s, the first phase's raw topic alone had twice the next phases' SMT p99).
WARM_UP_S = 10.0
# Rows through a connector of their own before Debezium's raw ingest is timed (warm_up_connect).
WARM_UP_ROWS = 20_000
# The SMT path measured beside the other latency phases (the exactly-once phase's is report.SMT).
SMT_BESIDE_ALO = f"{report.SMT} (ALO phase)"
SMT_BESIDE_POLLERS = f"{report.SMT} (pollers)"


@dataclass(frozen=True)
class Options:
    rows: int
    naive_rows: int
    rate: float
    latency_seconds: float
    timeout_s: float  # per path: a path still short of its rows after this is cut off
    memory_ids: int  # dedup ids for the router's memory (0: not measured)


@dataclass
class Paths:
    """The run's tables, topics, connectors and router configs, once set up."""

    router_table: str
    smt_table: str
    naive_table: str
    tuned_table: str
    raw: str
    smt_topic: str
    naive_topic: str
    tuned_topic: str
    router_connector: str
    smt_connector: str
    eos_config: Path
    eos_topic: str
    alo_config: Path
    alo_topic: str
    relay_table: str
    relay_config: Path
    relay_topic: str


@dataclass(frozen=True)
class RouterPids:
    """The two `cdc-router run` processes the throughput phase leaves running."""

    eos: int
    alo: int


def log(text: str) -> None:
    print(f"{datetime.now(UTC):%H:%M:%S} {text}", flush=True)


def set_up(bench: BenchStack) -> Paths:
    router_table, smt_table = bench.outbox("r"), bench.outbox("s")
    naive_table, tuned_table = bench.polled_table("n"), bench.polled_table("t")
    # Debezium names its topic <prefix>.<schema>.<table>; created here with the one partition
    # the shipped config gives it, so that readers can be assigned before the first record.
    raw = bench.topic(f"{bench.dashed}-r.{router_table}")
    smt_topic = bench.topic(f"{bench.dashed}-smt-out")
    router_connector = bench.connector("r", router_table, **NO_MESSAGES)
    smt_connector = bench.connector("s", smt_table, **NO_MESSAGES, **{
        "transforms": "outbox", "transforms.outbox.type": SMT_CLASS,
        # Keyed by the event id, as the router keys its records.
        "transforms.outbox.table.field.event.key": "id",
        "transforms.outbox.route.topic.replacement": smt_topic})
    eos_config, eos_topic = bench.router_config("eos", raw, "exactly_once")
    alo_config, alo_topic = bench.router_config("alo", raw, "at_least_once")
    relay_table = bench.relay_table("c")
    relay_config, relay_topic = bench.relay_config("relay", relay_table)
    return Paths(router_table, smt_table, naive_table, tuned_table, raw, smt_topic,
                 bench.topic(f"{bench.dashed}-naive"), bench.topic(f"{bench.dashed}-tuned"),
                 router_connector, smt_connector, eos_config, eos_topic, alo_config, alo_topic,
                 relay_table, relay_config, relay_topic)


def seen(watcher: Watcher, path: str, topic: str, expected: int, note: str = "") -> Throughput:
    found = watcher.seen[topic]
    return Throughput(path, found.count, found.span(), expected, note)


def bulk_pass(bench: BenchStack, connector: str, table: str, topics: dict[str, str],
              options: Options) -> list[Throughput]:
    """Insert the bulk with the connector paused, resume it, and time each path's output."""
    bench.pause(connector)
    watcher = Watcher(bench.stack.bootstrap_servers, topics.values())
    try:
        inserted = bench.bulk_insert(table, options.rows)
        log(f"  {options.rows:,} rows inserted in {inserted:.1f}s; resuming {connector}")
        bench.resume(connector)
        deadline = time.monotonic() + options.timeout_s
        expected = options.rows
        for topic in topics.values():
            watcher.wait_for(topic, expected, max(0.0, deadline - time.monotonic()))
            # Downstream of the raw topic, only what reached it can arrive.
            expected = min(expected, watcher.count(topic))
    finally:
        watcher.stop()
    return [seen(watcher, path, topic, options.rows) for path, topic in topics.items()]


def warm_up_connect(bench: BenchStack, rows: int, options: Options) -> None:
    """Run `rows` through a connector of their own, not timed, then pause it. On a Connect
    worker just started, Debezium's first bulk runs before the JIT has compiled it: raw ingest
    measured 8.5k rows/s on a stack started minutes before, 14.5k to 18.3k on a warm one."""
    log(f"warming up Connect: {rows:,} rows through a connector of their own (not timed)")
    table = bench.outbox("w")
    topic = bench.topic(f"{bench.dashed}-w.{table}")
    connector = bench.connector("w", table, **NO_MESSAGES)
    watcher = Watcher(bench.stack.bootstrap_servers, [topic])
    try:
        bench.bulk_insert(table, rows)
        if not watcher.wait_for(topic, rows, options.timeout_s):
            log(f"  warm-up incomplete: {watcher.count(topic):,} of {rows:,} rows arrived")
    finally:
        watcher.stop()
    bench.pause(connector)  # idle from now on; its slot goes with the run's other objects


def drain(bench: BenchStack, start: Any, path: str, topic: str, rows: int,
          options: Options, note: str) -> tuple[Throughput, int]:
    """Start a process (`start()` returns its pid) on a backlog of `rows`; time its output."""
    watcher = Watcher(bench.stack.bootstrap_servers, [topic])
    try:
        pid = start()
        watcher.wait_for(topic, rows, options.timeout_s)
    finally:
        watcher.stop()
    return seen(watcher, path, topic, rows, note), pid


def throughput(bench: BenchStack, paths: Paths,
               options: Options) -> tuple[list[Throughput], RouterPids]:
    """Every path's bulk run, one after the other, Debezium's raw ingest alone first; the two
    routers are left running (their pids)."""
    raw, connector, table = report.RAW, paths.router_connector, paths.router_table
    filled = "cdc-router run on the raw topic Debezium filled"
    warm_up_connect(bench, min(options.rows, WARM_UP_ROWS), options)
    log("debezium raw ingest alone: bulk pass 0, no router running")
    (raw_alone,) = bulk_pass(bench, connector, table, {raw: paths.raw}, options)
    log("router alone, exactly-once: a new group drains pass 0 from the raw topic")
    alone_eos, eos_pid = drain(bench, lambda: bench.start_router(paths.eos_config, "eos"),
                               report.ALONE_EOS, paths.eos_topic, raw_alone.rows, options,
                               filled)
    log("router path, exactly-once: bulk pass 1")
    raw_1, eos_path = bulk_pass(bench, connector, table, {
        report.RAW_BESIDE_EOS: paths.raw, report.ROUTER_EOS: paths.eos_topic},
        options)
    log("router alone, at-least-once: a new group drains passes 0 and 1")
    alone_alo, alo_pid = drain(bench, lambda: bench.start_router(paths.alo_config, "alo"),
                               report.ALONE_ALO, paths.alo_topic,
                               raw_alone.rows + raw_1.rows, options, filled)
    bench.stop(eos_pid)
    log("router path, at-least-once: bulk pass 2")
    raw_2, alo_path = bulk_pass(bench, connector, table, {
        report.RAW_BESIDE_ALO: paths.raw, report.ROUTER_ALO: paths.alo_topic},
        options)
    log("the exactly-once router catches up on pass 2 (not timed)")
    _, eos_pid = drain(bench, lambda: bench.start_router(paths.eos_config, "eos"),
                       report.ALONE_EOS, paths.eos_topic, raw_2.rows, options, filled)
    on_raw = raw_alone.rows + raw_1.rows + raw_2.rows  # fewer than 3 x rows if some were lost
    log(f"plain consume-produce hop over the three passes ({on_raw:,} records)")
    plain_rate = run_plain_loop(bench.stack.bootstrap_servers, paths.raw, on_raw,
                                name=bench.group("plain"))
    plain = Throughput(report.PLAIN, on_raw, on_raw / plain_rate, on_raw,
                       "tests/bench/router_throughput.py's loop, no transformation")
    log("EventRouter SMT: bulk pass")
    (smt,) = bulk_pass(bench, paths.smt_connector, paths.smt_table,
                       {report.SMT: paths.smt_topic}, options)
    return [raw_alone, raw_1, raw_2, eos_path, alo_path, alone_eos, alone_alo, plain, smt,
            *relay_throughput(bench, paths, options)], RouterPids(eos=eos_pid, alo=alo_pid)


def relay_throughput(bench: BenchStack, paths: Paths, options: Options) -> list[Throughput]:
    """The pollers on a backlog: cdc-router relay, the naive relay, the tuned poller."""
    pollers = [
        (report.RELAY, paths.relay_table, paths.relay_topic, options.rows,
         lambda: bench.start_cdc_relay(paths.relay_config),
         "visibility guard, Kafka transactions, DELETE once the next commit confirms a batch"),
        (report.NAIVE, paths.naive_table, paths.naive_topic, options.naive_rows,
         lambda: bench.start_relay("naive", paths.naive_table, paths.naive_topic),
         "500 ms tick, LIMIT 100, UPDATE per row"),
        (report.TUNED, paths.tuned_table, paths.tuned_topic, options.rows,
         lambda: bench.start_relay("tuned", paths.tuned_table, paths.tuned_topic),
         "adaptive, 2,000 a batch, DELETE ... RETURNING"),
    ]
    results = []
    for path, table, topic, rows, start, note in pollers:
        log(f"{path}: {rows:,} rows")
        bench.bulk_insert(table, rows)
        result, pid = drain(bench, start, path, topic, rows, options, note)
        bench.stop(pid)
        results.append(result)
    with psycopg.connect(bench.stack.postgres_dsn, autocommit=True) as conn:
        for table in (paths.naive_table, paths.tuned_table, paths.relay_table):
            # A cut-off relay leaves rows.
            conn.execute(psycopg.sql.SQL("TRUNCATE {}").format(table_identifier(table)))
    return results


def latency(bench: BenchStack, paths: Paths, options: Options,
            routers: RouterPids) -> list[Latency]:
    """Each alternative on its own, beside Debezium's two connectors, on the same commits as
    the SMT path: the exactly-once router, then the at-least-once router, then the three
    pollers. A deployment runs one of them; run all at once on two cores, their CPU fell on
    each other (the Python processes most), and the router's p99 measured the pollers' load.

    `routers`: the two routers still running from the throughput phase. The raw and SMT rows
    are the exactly-once phase's (the goal's pair); the SMT of each other phase has a row of its
    own.
    """
    bench.stop(routers.alo)
    measured = latency_phase(bench, options, [paths.router_table, paths.smt_table], {
        report.RAW: paths.raw, report.ROUTER_EOS: paths.eos_topic, report.SMT: paths.smt_topic})
    bench.stop(routers.eos)
    alo_pid = bench.start_router(paths.alo_config, "alo")  # catches up in the warm-up
    try:
        alo = latency_phase(bench, options, [paths.router_table, paths.smt_table], {
            report.ROUTER_ALO: paths.alo_topic, report.SMT: paths.smt_topic})
    finally:
        bench.stop(alo_pid)
    measured[report.ROUTER_ALO] = alo[report.ROUTER_ALO]
    measured[SMT_BESIDE_ALO] = replace(alo[report.SMT], path=SMT_BESIDE_ALO)
    relays = [bench.start_relay("naive", paths.naive_table, paths.naive_topic),
              bench.start_relay("tuned", paths.tuned_table, paths.tuned_topic),
              bench.start_cdc_relay(paths.relay_config)]
    try:
        pollers = latency_phase(
            bench, options, [paths.naive_table, paths.tuned_table, paths.relay_table,
                             paths.smt_table],
            {report.RELAY: paths.relay_topic, report.NAIVE: paths.naive_topic,
             report.TUNED: paths.tuned_topic, report.SMT: paths.smt_topic})
    finally:
        for pid in relays:
            bench.stop(pid)
    measured.update({path: pollers[path] for path in (report.RELAY, report.NAIVE, report.TUNED)})
    measured[SMT_BESIDE_POLLERS] = replace(pollers[report.SMT], path=SMT_BESIDE_POLLERS)
    order = (report.RAW, report.ROUTER_EOS, report.SMT, report.ROUTER_ALO, SMT_BESIDE_ALO,
             report.RELAY, report.NAIVE, report.TUNED, SMT_BESIDE_POLLERS)
    return [measured[path] for path in order]


def latency_phase(bench: BenchStack, options: Options, tables: list[str],
                  topics: dict[str, str]) -> dict[str, Latency]:
    """One row a transaction into every one of `tables` at options.rate: a warm-up (not
    counted) until every path delivers it, then options.latency_seconds measured."""
    names = ", ".join(topics)
    log(f"latency: {names}: {options.rate:g} rows/s, {WARM_UP_S:g}s warm-up, "
        f"{options.latency_seconds:g}s measured")
    watcher = Watcher(bench.stack.bootstrap_servers, topics.values(), ids=True)
    try:
        warm = bench.steady_insert(tables, options.rate, WARM_UP_S)
        if not watcher.wait_for_ids(topics.values(), set(warm), options.timeout_s):
            log(f"  warm-up incomplete after {options.timeout_s:g}s: a path is still catching "
                "up, and its latency counts that")
        commits = bench.steady_insert(tables, options.rate, options.latency_seconds)
        watcher.wait_for_ids(topics.values(), set(commits), options.timeout_s)
    finally:
        watcher.stop()
    results = {}
    for path, topic in topics.items():
        visible = watcher.seen[topic].ids
        samples = [(visible[row] - committed) * 1000 for row, committed in commits.items()
                   if row in visible]
        results[path] = Latency(path, samples, len(commits) - len(samples))
    log("  p99: " + ", ".join(f"{path} {result.percentile(99) or 0:.0f} ms"
                              for path, result in results.items()))
    return results


def describe_setup(options: Options) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=REPO, check=False).stdout.strip()
    return {"rows": options.rows, "naive_rows": options.naive_rows, "rate": options.rate,
            "latency_seconds": options.latency_seconds, "memory_ids": options.memory_ids,
            "git_commit": commit,
            "started": f"{datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC",
            "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start",
            "debezium": DEBEZIUM_VERSION, "command": " ".join(["python", "-m",
                                                                "tests.bench.side_by_side",
                                                                *sys.argv[1:]])}


def parse_options() -> tuple[Options, Path, Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="bulk rows per path")
    parser.add_argument("--naive-rows", type=int, default=3_000,
                        help="bulk rows for the naive relay (it does 200 rows/s at most)")
    parser.add_argument("--rate", type=float, default=200, help="rows/s in the latency phase")
    parser.add_argument("--latency-seconds", type=float, default=20)
    parser.add_argument("--timeout", type=float, default=120, help="seconds per path at most")
    parser.add_argument("--memory-ids", type=int, default=1_000_000,
                        help="ids in the dedup changelog for the router's memory (0: skip)")
    parser.add_argument("--json", type=Path, default=Path("bench-results.json"))
    parser.add_argument("--png", type=Path, default=Path("bench-results.png"))
    args = parser.parse_args()
    return (Options(args.rows, min(args.naive_rows, args.rows), args.rate,
                    args.latency_seconds, args.timeout, args.memory_ids), args.json, args.png)


def main() -> None:
    options, json_path, png_path = parse_options()
    setup = describe_setup(options)
    with tempfile.TemporaryDirectory(prefix="cdc-router-bench-") as workdir:
        bench = BenchStack(endpoints_from_env(), Path(workdir))
        log(f"run {bench.name}: setting up tables, connectors, topics")
        try:
            paths = set_up(bench)
            bulk, routers = throughput(bench, paths, options)
            latencies = latency(bench, paths, options, routers)
            memory = None
            if options.memory_ids:
                log(f"router memory: an empty dedup changelog, then {options.memory_ids:,} ids")
                memory = replay_memory.measure(bench, options.memory_ids)
        finally:
            log("removing everything the run created")
            problems = bench.close()
            left = leftover_objects(bench.stack, bench.name)
            for problem in problems:
                print(f"cleanup: {problem}", file=sys.stderr)
            if left:
                print(f"cleanup: still there: {', '.join(left)}", file=sys.stderr)
    results = Results(setup, bulk, latencies, memory)
    print()
    print(report.render_table(results))
    json_path.write_text(json.dumps(report.to_json(results), indent=2) + "\n")
    from tests.bench.chart import draw  # matplotlib only once there is something to draw

    draw(results, png_path)
    print(f"\nwrote {json_path} and {png_path}")


if __name__ == "__main__":
    main()
