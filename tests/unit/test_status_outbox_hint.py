"""status's hint on an outbox table the database lacks names the setting that named it."""

from __future__ import annotations

from pathlib import Path

import psycopg

from cdc_router.config.load import load_config
from cdc_router.ops.database import _outbox_hint
from cdc_router.ops.probe import outbox_table
from cdc_router.outbox.table import OutboxSchema


def test_a_relay_only_configs_missing_table_names_relay_table(tmp_path: Path) -> None:
    # Review 54-k F-8: the hint named status.outbox_table, the connector's include list and
    # cleanup.table, never relay.table, where a relay-only config's table comes from.
    path = tmp_path / "relay.yaml"
    path.write_text("source: {group_id: shop}\nroutes: [{topic: 'outbox.event.{type}'}]\n"
                    "relay: {table: public.relayed}\n", "utf-8")
    config = load_config(path).config
    table, named_by = outbox_table(config, None)
    assert (table, named_by) == ("public.relayed", "relay.table")
    missing = psycopg.errors.UndefinedTable('relation "public.relayed" does not exist')
    assert _outbox_hint(missing, OutboxSchema(table), named_by) == (
        " (renamed?): fix relay.table, which names public.relayed, or name the outbox with "
        "status.outbox_table")
    assert _outbox_hint(missing, OutboxSchema(table), "status.outbox_table") == (
        " (renamed?): fix status.outbox_table, which names public.relayed")
