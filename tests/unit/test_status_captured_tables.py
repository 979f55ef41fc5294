"""`status` of a connector capturing several outbox tables checks each of them (QA 55-a F-4:
only cleanup.table was checked, and another table's 10,620 rows went unseen)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from cdc_router.cli._status_text import as_json, as_text
from cdc_router.config.load import load_config
from cdc_router.config.status import StatusSettings
from cdc_router.ops import probe
from cdc_router.ops.connector import Capture, capture_of
from cdc_router.ops.exporter import StatusCollector
from cdc_router.ops.report import OutboxState, PublicationState, Report, WalState
from cdc_router.ops.verdict import judge
from tests.unit.test_status_verdict import healthy

LEGACY = OutboxState(table="shop.legacy_events", rows=10_620, oldest_age_s=90_000.0,
                     size_bytes=4 * 1024 * 1024, reader="dbz", reader_may_select=True,
                     is_cleanup_table=False)
WARN = StatusSettings(outbox_age_warning_s=3600, outbox_rows_warning=1000)


def two_tables() -> Report:
    report = healthy()
    return replace(report, publication=replace(
        report.publication, tables=("public.outbox", "shop.legacy_events")),
        outbox=replace(report.outbox, others=(LEGACY,)))


def test_every_table_of_the_include_list_but_the_outbox_and_signals_is_another() -> None:
    capture = capture_of({"table.include.list": "shop.order_events, shop\\.legacy_events,"
                          'shop.archive_.*,"shop"."Quoted",public.signals,shop.order_events',
                          "signal.data.collection": "public.signals"})
    assert capture.table is None  # several tables: none is "the" table
    assert probe.other_tables(capture, "shop.order_events") == (
        ["shop.legacy_events"], ["shop.archive_.*"])
    # status.outbox_table naming a table the connector does not capture: all are others.
    assert probe.other_tables(capture, "public.outbox")[0] == [
        "shop.order_events", "shop.legacy_events"]
    one = capture_of({"table.include.list": "public.outbox"})
    assert probe.other_tables(one, "public.outbox") == ([], [])


def test_the_database_probe_is_asked_for_the_other_tables(tmp_path: Path,
                                                           monkeypatch: Any) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("source: {topics: [shop.shop.order_events, shop.shop.legacy_events]}\n"
                    "routes: [{topic: out}]\ncleanup: {table: shop.order_events}\n", "utf-8")
    config = load_config(path).config
    asked: dict[str, Any] = {}

    def database(dsn: str, slots: Any, publication: Any, outbox: Any,
                 **options: Any) -> tuple[WalState, PublicationState, OutboxState]:
        asked.update(options, table=outbox.table)
        return WalState(), PublicationState(), OutboxState(table=outbox.table, others=tuple(
            OutboxState(table=schema.table) for schema in options["others"]))

    monkeypatch.setattr(probe, "probe_database", database)
    capture = Capture("slot", "pub", None, tables=(
        "shop.order_events", "shop.legacy_events", "shop.archive_.*"))
    _, _, outbox = probe._database(config, probe.Endpoints("dsn", "url", {}), capture)
    assert asked["table"] == "shop.order_events" and asked["named_by"] == "cleanup.table"
    assert [schema.table for schema in asked["others"]] == ["shop.legacy_events"]
    assert outbox.not_checked == ("shop.archive_.*",)
    assert [(o.table, o.is_cleanup_table) for o in outbox.others] == [
        ("shop.legacy_events", False)]
    config = config.model_copy(update={"status": config.status.model_copy(
        update={"outbox_table": "shop.legacy_events"})})
    _, _, outbox = probe._database(config, probe.Endpoints("dsn", "url", {}), capture)
    assert asked["table"] == "shop.legacy_events"
    assert [(o.table, o.is_cleanup_table) for o in outbox.others] == [
        ("shop.order_events", True)]


def test_another_tables_backlog_warns_and_says_the_cleanup_does_not_delete_there() -> None:
    problems = [str(problem) for problem in judge(two_tables(), WARN)]
    assert len(problems) == 2, problems
    age, rows = problems
    assert "shop.legacy_events's oldest row is 90000s old (warning at 3600s)" in age
    assert "shop.legacy_events holds 10620 rows (warning at 1000)" in rows
    assert "cleanup deletes from cleanup.table alone" in rows
    # status.outbox_table named the other table: cleanup.table is checked as another one.
    cleaned = replace(two_tables(), outbox=replace(two_tables().outbox, others=(
        replace(LEGACY, is_cleanup_table=True),)))
    [_, rows] = [str(problem) for problem in judge(cleaned, WARN)]
    assert "holds 10620 rows (warning at 1000): check the cleanup (cleanup.mode)" in rows
    assert judge(healthy(), WARN) == []  # the outbox's own rows are under the limits


def test_another_table_unpublished_unreadable_or_unchecked_is_named() -> None:
    report = replace(two_tables(), publication=healthy().publication)
    [line] = [str(problem) for problem in judge(report, StatusSettings())]
    assert "critical" in line and "shop.legacy_events" in line and "ADD TABLE" in line
    report = replace(two_tables(), outbox=replace(two_tables().outbox, others=(
        replace(LEGACY, reader_may_select=False),)))
    [line] = [str(problem) for problem in judge(report, StatusSettings())]
    assert "dbz may not SELECT shop.legacy_events" in line
    failed = OutboxState(table="shop.legacy_events", answered=True,
                         error='Postgres: relation "shop.legacy_events" does not exist')
    report = replace(two_tables(), outbox=replace(two_tables().outbox, others=(failed,)))
    [problem] = judge(report, StatusSettings())
    assert problem.level == "warning" and "shop.legacy_events, another table the connector " \
        "captures, cannot be checked: Postgres: relation" in str(problem)


def test_the_text_json_and_metrics_show_each_table() -> None:
    report = replace(two_tables(), outbox=replace(two_tables().outbox,
                                                  not_checked=("shop.archive_.*",)))
    text = as_text(report, judge(report, WARN)).splitlines()
    at = text.index("outbox public.outbox: 3 rows, oldest 0.5s ago, 8.0 KiB on disk")
    assert text[at + 1].startswith("outbox shop.legacy_events: 10620 rows, oldest "), text
    assert text[at + 1].endswith(" ago, 4.0 MiB on disk")
    assert text[at + 2] == ("outbox shop.archive_.*: not checked (a regular expression in the "
                            "connector's table.include.list: status checks the tables it names "
                            "one by one)")
    document = as_json(report, judge(report, WARN))
    assert document["outbox"]["others"][0]["table"] == "shop.legacy_events"
    assert document["outbox"]["not_checked"] == ("shop.archive_.*",)
    collector, registry = StatusCollector(), CollectorRegistry()
    registry.register(collector)
    collector.update(report, judge(report, WARN))
    value = registry.get_sample_value
    assert value("cdc_router_outbox_rows", {"table": "public.outbox"}) == 3
    assert value("cdc_router_outbox_rows", {"table": "shop.legacy_events"}) == 10_620
    assert value("cdc_router_outbox_oldest_row_age_seconds",
                 {"table": "shop.legacy_events"}) == 90_000


def test_with_cleanup_off_a_default_cleanup_table_not_captured_is_not_the_outbox(
        tmp_path: Path) -> None:
    """QA 57-d F-2: cleanup off, connector capturing outbox2 and outbox3: status took the
    default cleanup.table public.outbox (another pipeline's) and advised adding it to the
    publication, critical."""
    capture = capture_of({"table.include.list": "public.outbox2,public.outbox3",
                          "slot.name": "s", "publication.name": "p"})
    path = tmp_path / "router.yaml"

    def table(cleanup: str, status: str = "{}") -> tuple[str, str]:
        path.write_text("source: {topics: [o.public.outbox2, o.public.outbox3]}\n"
                        f"routes: [{{topic: out}}]\ncleanup: {cleanup}\nstatus: {status}\n",
                        "utf-8")
        return probe.outbox_table(load_config(path).config, capture)

    by_list = "the connector's table.include.list"
    assert table("{mode: none}") == ("public.outbox2", by_list)
    assert table("{mode: none, table: public.outbox3}") == ("public.outbox3", "cleanup.table")
    assert table("{mode: none, table: outbox3}") == ("outbox3", "cleanup.table")
    assert table("{mode: none}", "{outbox_table: public.outbox3}") == (
        "public.outbox3", "status.outbox_table")
    # Cleanup on deletes from cleanup.table: a table the connector lacks stays the one named.
    assert table("{mode: delete, dsn: 'postgresql://h/db'}") == ("public.outbox",
                                                                "cleanup.table")
    signals = capture_of({"table.include.list": "public.signals,shop.a_.*,shop.events",
                          "signal.data.collection": "public.signals"})
    path.write_text("source: {topics: [o.shop.events]}\nroutes: [{topic: out}]\n", "utf-8")
    assert probe.outbox_table(load_config(path).config, signals) == ("shop.events", by_list)
