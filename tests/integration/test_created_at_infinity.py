"""A created_at of Postgres' infinity or -infinity through the real Debezium and router (QA 60-c
F-4): in a timestamp(6), a timestamp(3) and a timestamptz column, each is a decode dead letter
that says what the column holds, while the rows around it are delivered."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from tests.integration.pipeline import Pipeline, pipeline
from tests.integration.support import StackEndpoints

pytestmark = pytest.mark.integration

# What each column type's infinity and -infinity become in the letter: Debezium 3 sends a
# timestamp(6) column's as pgjdbc's DATE_POSITIVE/NEGATIVE_INFINITY microseconds, a
# timestamp(3) column's as their milliseconds, a timestamptz column's as the text.
REASONS = {
    "timestamp(6)": {
        "infinity": "holds infinity (Debezium sends Postgres' 'infinity' in a timestamp column "
                    "as 9223372036825200000, pgjdbc's DATE_POSITIVE_INFINITY in microseconds)",
        "-infinity": "holds -infinity (Debezium sends Postgres' '-infinity' in a timestamp "
                     "column as -9223372036832400000, pgjdbc's DATE_NEGATIVE_INFINITY in "
                     "microseconds)"},
    "timestamp(3)": {
        "infinity": "holds infinity (Debezium sends Postgres' 'infinity' in a timestamp column "
                    "as 9223372036825200, pgjdbc's DATE_POSITIVE_INFINITY in milliseconds)",
        "-infinity": "holds -infinity (Debezium sends Postgres' '-infinity' in a timestamp "
                     "column as -9223372036832400, pgjdbc's DATE_NEGATIVE_INFINITY in "
                     "milliseconds)"},
    "timestamptz": {
        "infinity": "holds infinity (Debezium sends Postgres' 'infinity' as 'infinity')",
        "-infinity": "holds -infinity (Debezium sends Postgres' '-infinity' as '-infinity')"},
}
NOW_UTC = "(now() AT TIME ZONE 'utc')"


def _insert(pipe: Pipeline, column_type: str) -> dict[str, str]:
    """With created_at of `column_type`: an ordinary row, one at infinity, one at -infinity;
    their ids by created_at ('now' for the ordinary one)."""
    table = f"public.{pipe.table}"
    ids = {}
    with psycopg.connect(pipe.stack.postgres_dsn) as conn:
        # The default stays UTC's now: a timestamptz read in another zone would be hours off.
        conn.execute(f"ALTER TABLE {table} ALTER COLUMN created_at TYPE {column_type} USING "
                     "created_at AT TIME ZONE 'utc', ALTER COLUMN created_at SET DEFAULT "
                     f"{'now()' if column_type == 'timestamptz' else NOW_UTC}")
        conn.commit()
        for created in ("now", "infinity", "-infinity"):
            ids[created] = str(conn.execute(
                f"INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload, "
                f"created_at) VALUES (gen_random_uuid(), 'Order', 'o-1', 'OrderPaid', "
                f"jsonb_build_object('column', %s::text), "
                f"{'DEFAULT' if created == 'now' else '%s'}) RETURNING id",
                (column_type,) if created == "now" else (column_type, created)
            ).fetchone()[0])  # type: ignore[index]
        conn.commit()
    return ids


def test_a_created_at_of_infinity_is_a_decode_letter_in_each_column_type(
        stack: StackEndpoints, tmp_path: Path) -> None:
    with pipeline(stack, tmp_path, partitions=1) as pipe:
        pipe.start_router(wait=True)
        started_ms = time.time() * 1000
        ids = {column_type: _insert(pipe, column_type) for column_type in REASONS}
        letters = pipe.read(pipe.dlq_topic, 2 * len(REASONS), timeout_s=90)
        delivered = pipe.read(pipe.orders_topic, len(REASONS), timeout_s=60)
        assert pipe.routers["a"].poll() is None, pipe.router_log()[-3000:]
        ended_ms = time.time() * 1000
    headers = [{name: value.decode() for name, value in letter.headers()} for letter in letters]
    by_id = {h["dlq.event.id"]: h for h in headers}
    assert len(by_id) == len(headers) == 2 * len(REASONS)
    for column_type, reasons in REASONS.items():
        for word, reason in reasons.items():
            letter = by_id[ids[column_type][word]]
            assert letter["dlq.stage"] == "decode", (column_type, letter)
            assert f"created_at column 'created_at' {reason}, which is no point in time: write " \
                   "the event's time" in letter["dlq.error.message"], (column_type, letter)
    assert sorted(dict(record.headers())["id"].decode() for record in delivered) == \
        sorted(ids[column_type]["now"] for column_type in REASONS)
    # Their Kafka timestamps are the rows' created_at: while the test ran (a minute's slack
    # for the clocks of Postgres and this process).
    stamps = [record.timestamp()[1] for record in delivered]
    assert all(started_ms - 60_000 <= stamp <= ended_ms + 60_000 for stamp in stamps), stamps
