"""Blank names and counts past any use are refused (QA 57-d F-6: a transactional id prefix of
three spaces, an empty client id, dedup.max_ids 10^30 loaded as valid)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_router.config.load import load_config
from cdc_router.errors import ConfigError

BASE = "source: {topics: [outbox.public.outbox], group_id: g}\nroutes:\n  - topic: other\n"
BLANK = "must not be empty or blank: give a value, or leave the key out for its default"


@pytest.mark.parametrize(("extra", "expected"), [
    ("delivery: {transactional_id: '   '}",
     f"field 'delivery.transactional_id': {BLANK} (got '   ')"),
    ("kafka: {client_id: ''}", f"field 'kafka.client_id': {BLANK} (got '')"),
    ("status: {connector: '  '}", f"field 'status.connector': {BLANK}"),
    ("source: {topics: [outbox.public.outbox], heartbeat_topic_prefix: '  '}",
     f"field 'source.heartbeat_topic_prefix': {BLANK}"),
    ("cleanup: {mode: none, table: '   '}", f"field 'cleanup.table': {BLANK}"),
    # review 57-b F-7: '' was taken as unset, '  ' failed later inside `status`
    ("status: {outbox_table: ''}", f"field 'status.outbox_table': {BLANK}"),
    ("status: {outbox_table: '  '}", f"field 'status.outbox_table': {BLANK}"),
    # review 57-b F-11: the group id's blank check is the shared one, '' included
    ("source: {topics: [outbox.public.outbox], group_id: ''}",
     "field 'source.group_id': must not be empty or blank: give the router's Kafka consumer "
     "group, e.g. cdc-router (the default) (got '')"),
    ("dedup: {max_ids: 1000000000000000000000000000000}",
     "field 'dedup.max_ids': Input should be less than or equal to 1000000000"),
    ("delivery: {max_payload_bytes: 1000000000000000000000000000000}",
     "field 'delivery.max_payload_bytes': Input should be less than or equal to 1000000000"),
    ("delivery: {commit_max_records: 1000000000000000000000000000000}",
     "field 'delivery.commit_max_records': Input should be less than or equal to 2147483647"),
])
def test_blank_names_and_unbounded_counts_are_refused(tmp_path: Path, extra: str,
                                                      expected: str) -> None:
    path = tmp_path / "router.yaml"
    text = BASE.replace("source: {topics: [outbox.public.outbox], group_id: g}\n", "") \
        if extra.startswith("source:") else BASE
    path.write_text(text + extra + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    assert expected in str(caught.value)


def test_names_and_counts_within_bounds_load(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(BASE + "delivery: {transactional_id: tx, max_payload_bytes: 1000000000, "
                    "commit_max_records: 2147483647}\nkafka: {client_id: c}\n"
                    "dedup: {max_ids: 1000000000}\n", encoding="utf-8")
    config = load_config(path, {}).config
    assert (config.delivery.transactional_id, config.kafka.client_id) == ("tx", "c")
