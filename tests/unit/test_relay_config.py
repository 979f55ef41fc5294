"""router.yaml's `relay:` section: defaults, the position topic, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cdc_router.cli import main
from cdc_router.cli.run import _STALL_S
from cdc_router.config.config_warnings import config_warnings, relay_warnings
from cdc_router.config.load import load_config
from cdc_router.config.model import RouterConfig
from cdc_router.config.relay import MAX_POLL_INTERVAL_MS
from cdc_router.errors import ConfigError
from cdc_router.outbox.relay_columns import (
    relay_columns_ddl,
    relay_trigger,
    render_ddl,
    txid_index,
    unique_seq_index,
)
from cdc_router.postgres import split_table
from tests.unit.test_settings import error_of, write

RELAY = "source: {group_id: shop}\nroutes:\n  - topic: orders\nrelay: {table: public.outbox}\n"


def test_a_relay_config_needs_no_source_topic_and_names_its_position_topic(
        tmp_path: Path) -> None:
    config = load_config(write(tmp_path, RELAY), {"CDC_ROUTER__RELAY__DSN": "postgresql://x"}
                         ).config
    assert config.relay is not None
    assert (config.relay.poll_interval_ms, config.relay.batch_rows) == (200, 1000)
    assert config.relay.dsn == "postgresql://x"
    assert config.relay_position_topic == "shop.relay-position"
    position = next(spec for spec in config.topic_specs() if spec.name == "shop.relay-position")
    # Session 61: with the broker's segments (7 days or 1 GiB) the relay's read-backs read
    # up to ~3.6M commits; a segment of 10 minutes is compacted after them.
    assert position.partitions == 1 and position.config == {
        "cleanup.policy": "compact", "segment.ms": "600000", "delete.retention.ms": "600000"}
    assert "relay position topic" in str(config.topic_guard().problem("shop.relay-position"))


def test_a_protected_default_position_topic_names_source_group_id_and_the_fix(
        tmp_path: Path) -> None:
    # Reread 55-r F-8: the refusal named field 'relay.position_topic', which the file lacked.
    text = ("protected_topics: ['connect-*']\nsource: {group_id: connect-outbox}\n"
            "routes:\n  - topic: orders\nrelay: {table: public.outbox}\n")
    assert ("field 'source.group_id': relay.position_topic's default "
            "'connect-outbox.relay-position' is protected by protected_topics entry "
            "'connect-*': the router must not write to it nor topics apply create or alter it; "
            "set relay.position_topic to another topic (or change source.group_id) (got "
            "'connect-outbox')") in error_of(tmp_path, text)
    assert load_config(write(tmp_path, text.replace(
        "{table: public.outbox}", "{table: public.outbox, position_topic: outbox-position}")))


def test_without_a_relay_section_source_topics_are_required(tmp_path: Path) -> None:
    message = error_of(tmp_path, "source: {group_id: shop}\nroutes:\n  - topic: orders\n")
    assert "source.topics" in message and "relay" in message


def test_bad_relay_settings_are_one_line_naming_the_field(tmp_path: Path) -> None:
    assert "relay.batch_rows" in error_of(tmp_path, RELAY.replace(
        "{table: public.outbox}", "{batch_rows: 0}"))
    assert "relay.poll_interval_ms" in error_of(tmp_path, RELAY.replace(
        "{table: public.outbox}", "{poll_interval_ms: -5}"))
    assert "relay.position_topic" in error_of(tmp_path, RELAY.replace(
        "{table: public.outbox}", "{position_topic: cdc-router.dlq}"))
    assert "field 'relay.position_topic': 'connect-offsets' is protected by " \
        "protected_topics entry 'connect-offsets'" in error_of(tmp_path, RELAY.replace(
            "{table: public.outbox}", "{table: public.outbox, position_topic: connect-offsets}"))
    assert "cleanup.policy compact" in error_of(tmp_path, RELAY.replace(
        "{table: public.outbox}", "{position_config: {cleanup.policy: delete}}"))
    message = error_of(tmp_path, RELAY.replace("public.outbox", "a.b.c"))
    assert "'relay.table'" in message and "expected schema.table or table" in message
    assert "relay.seq_column" in error_of(tmp_path, RELAY.replace(
        "{table: public.outbox}", "{seq_column: ''}"))


def test_the_cleanup_must_clean_the_relayed_table(tmp_path: Path) -> None:
    message = error_of(tmp_path, RELAY + "cleanup: {mode: delete, dsn: 'postgresql://x', "
                                         "table: public.other}\n")
    assert "cleanup.table" in message and "public.outbox" in message
    same = RELAY + "cleanup: {mode: delete, dsn: 'postgresql://x', table: outbox}\n"
    assert load_config(write(tmp_path, same)).config.cleanup.table == "outbox"


def test_the_relay_columns_ddl_is_idempotent_and_quoted() -> None:
    script = render_ddl(relay_columns_ddl('public."Out Box"', "txid", "seq"))
    assert script == (
        'ALTER TABLE "public"."Out Box" ADD COLUMN IF NOT EXISTS "seq" bigint GENERATED '
        'ALWAYS AS IDENTITY;\n'
        'ALTER TABLE "public"."Out Box" ALTER COLUMN "seq" SET NOT NULL;\n'
        'ALTER TABLE "public"."Out Box" ADD COLUMN IF NOT EXISTS "txid" xid8 NOT NULL DEFAULT '
        'pg_current_xact_id();\n'
        'CREATE INDEX CONCURRENTLY IF NOT EXISTS "Out Box_txid_idx" ON "public"."Out Box" '
        '("txid");\n'
        'CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS "Out Box_seq_key" ON "public"."Out Box" '
        '("seq");\n'
        'CREATE OR REPLACE FUNCTION "public"."Out Box_txid_fn"() RETURNS trigger LANGUAGE '
        'plpgsql AS $cdc_router$BEGIN NEW."txid" := pg_current_xact_id(); RETURN NEW; '
        'END$cdc_router$;\n'
        'CREATE OR REPLACE TRIGGER "Out Box_txid" BEFORE INSERT ON "public"."Out Box" FOR EACH '
        'ROW EXECUTE FUNCTION "public"."Out Box_txid_fn"();\n')
    # An ALTER TABLE locks the table even when its column is there: left out then.
    kept = render_ddl(relay_columns_ddl("public.o", "txid", "seq", existing={"seq", "txid"}))
    assert "ALTER TABLE" not in kept and kept.count(";\n") == 4


@pytest.mark.parametrize("table", ["public." + "o" * 62, "o" * 63, "public." + "é" * 31,
                                   "public." + "o" * 54])
def test_the_relay_indexes_of_a_long_table_name_are_distinct_and_fit_postgres(
        table: str) -> None:
    # Review 46 F5: cut to 63 bytes, a 62-character table's two indexes had one name and a
    # 63-character one's was the table's: the unique index was never made.
    names = {txid_index(table, "txid"), unique_seq_index(table, "seq"),
             txid_index(table, "c" * 60), unique_seq_index(table, "c" * 60)}
    assert len(names) == 4 and split_table(table)[1] not in names
    assert all(len(name.encode()) <= 63 for name in names)
    assert txid_index(table, "txid").endswith("_txid_idx")
    assert txid_index(table[:-1] + "p", "txid") != txid_index(table, "txid")


def test_the_relay_trigger_of_a_long_non_ascii_table_name_is_cut_to_63_bytes() -> None:
    # Review 46-3: cut to 63 characters, 30 x 'é' (60 bytes) made a 66-byte name, refused.
    name = relay_trigger("public." + "é" * 30, "txid")
    assert name == "é" * 30 + "_tx" and len(name.encode()) == 63
    assert relay_trigger("public.outbox", "txid") == "outbox_txid"  # a name that fits: as ever


def test_the_relay_index_names_of_a_table_whose_names_fit_are_unchanged() -> None:
    # Existing installs keep their indexes: `outbox init --relay` makes no second one.
    table = "public." + "o" * 53
    assert (txid_index(table, "txid"), unique_seq_index(table, "seq")) == (
        "o" * 53 + "_txid_idx", "o" * 53 + "_seq_key")


def test_an_env_override_of_position_config_names_a_topic_property(tmp_path: Path) -> None:
    # Review, session 27: RETENTION_MS became `retention_ms`, which Kafka does not know.
    config = load_config(write(tmp_path, RELAY), {
        "CDC_ROUTER__RELAY__POSITION_CONFIG__MIN_COMPACTION_LAG_MS": "60000"}).config
    assert config.relay is not None
    assert config.relay.position_config == {"min.compaction.lag.ms": "60000"}


def test_poll_interval_ms_is_bounded_below_the_relays_health_threshold(tmp_path: Path) -> None:
    # QA 36-b F3: 180,000 failed /healthz on every idle wait (a liveness probe restarts a
    # healthy relay); 1e20 made an idle relay never read its table again. Both passed.
    for value in (60_001, 99_999_999_999, 10**20):
        message = error_of(tmp_path, RELAY.replace("{table: public.outbox}",
                                                   f"{{poll_interval_ms: {value}}}"))
        assert (f"field 'relay.poll_interval_ms': must be at most 60000 (a minute): /healthz "
                f"reports a relay stalled when it has not polled for 120 s (got {value})"
                in message)
    most = RELAY.replace("{table: public.outbox}", "{poll_interval_ms: 60000}")
    relay = load_config(write(tmp_path, most)).config.relay
    assert relay is not None and relay.poll_interval_ms == MAX_POLL_INTERVAL_MS
    # The wait plus a batch stays under /healthz's threshold, which the error names.
    assert 2 * MAX_POLL_INTERVAL_MS / 1000 <= _STALL_S == 120


def test_a_config_without_a_relay_section_is_refused_by_the_relay_naming_the_field() -> None:
    config = RouterConfig.model_validate({"source": {"topics": ["outbox.public.outbox"]},
                                          "routes": [{"topic": "orders"}]})
    with pytest.raises(ConfigError, match=r"^field 'relay': no relay: section; add `relay: "
                       r"\{table: public.outbox\}` \(see README, The relay\)$"):
        config.relay_settings()


def test_rules_check_warns_of_a_relay_without_its_dsn(tmp_path: Path) -> None:
    # Review 46-2 F6: `rules check` said nothing, and `cdc-router relay` then refused to start.
    path = write(tmp_path, RELAY)
    checked = CliRunner().invoke(main, ["rules", "check", "-c", str(path)])
    assert checked.exit_code == 0, checked.output
    assert "warning: relay: the relay needs the Postgres DSN (relay.dsn or cleanup.dsn, or the " \
        "environment variable CDC_ROUTER__CLEANUP__DSN); `cdc-router relay` refuses to start " \
        "without it" in checked.output
    for variable in ("CDC_ROUTER__RELAY__DSN", "CDC_ROUTER__CLEANUP__DSN"):
        config = load_config(path, {variable: "postgresql://x"}).config
        assert relay_warnings(config) == []
    # Not the router's start: it runs without the relay's secret.
    assert not any("relay" in warning for warning in config_warnings(load_config(path, {}).config))


def test_a_position_topics_cleanup_policy_is_read_as_kafkas_list(tmp_path: Path) -> None:
    # Reread 50-i F6: "compact " (as Kafka takes it) was refused; read as the other
    # cleanup.policy settings are, a set of items without blanks.
    relay = RELAY.replace("{table: public.outbox}",
                          "{position_config: {cleanup.policy: 'compact '}}")
    config = load_config(write(tmp_path, relay), {"CDC_ROUTER__RELAY__DSN": "postgresql://x"}
                         ).config
    assert config.relay is not None
