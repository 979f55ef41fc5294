"""The cleanup's bookkeeping, without Postgres: what is due when, bounds."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pydantic
import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import CollectorRegistry

from cdc_router.config import cleanup as cleanup_settings
from cdc_router.config.cleanup import CleanupSettings
from cdc_router.config.config_warnings import config_warnings
from cdc_router.config.model import RouterConfig
from cdc_router.errors import ConfigError
from cdc_router.outbox import age as cleanup_age
from cdc_router.router import cleanup
from cdc_router.router.cleanup import OutboxCleaner
from cdc_router.router.committed_ids import CommittedIds
from cdc_router.router.values import Delivered


def _cleaner(created_at_column: str | None = "created_at", **settings: object) -> OutboxCleaner:
    return OutboxCleaner(CleanupSettings(dsn="postgresql://unused", **settings),
                         id_column="id", created_at_column=created_at_column,
                         registry=CollectorRegistry())


def test_delete_mode_makes_delivered_ids_due_at_once():
    cleaner = _cleaner(mode="delete")
    cleaner.delivered([Delivered("a", "t", 1), Delivered("b", "t", None)])
    assert cleaner.pending_count() == 2
    assert cleaner._due_count() == 2


def test_retention_mode_waits_until_created_at_plus_retention():
    cleaner = _cleaner(mode="retention", retention_ms=60_000)
    now_ms = int(time.time() * 1000)
    cleaner.delivered([Delivered("old", "t", now_ms - 120_000), Delivered("new", "t", now_ms)])
    assert cleaner.pending_count() == 2
    assert cleaner._due_count() == 1


class _Result:
    def __init__(self, rows: list[tuple[object, ...]]) -> None:
        self.rowcount = len(rows)
        self._rows = rows

    def fetchall(self) -> list[tuple[object, ...]]:
        return self._rows


class _Outbox:
    """A faithful stand-in for the connection: a table of ids, DELETE ... = ANY(%s) by id."""

    def __init__(self, ids: list[str]) -> None:
        self.rows = set(ids)
        self.deletes: list[list[str]] = []
        self.locked: set[str] = set()  # rows another transaction holds: lock_timeout

    def execute(self, query: object, params: tuple[list[str], ...]) -> _Result:
        text = query.as_string(None) if hasattr(query, "as_string") else str(query)
        assert text.startswith("DELETE"), text
        batch = list(params[0])
        self.deletes.append(batch)
        if any(event_id.startswith("bad") for event_id in batch):
            raise psycopg.errors.InvalidTextRepresentation(
                f"invalid input syntax for type uuid: {batch}")
        if self.locked.intersection(batch):
            raise psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
        gone = [event_id for event_id in batch if event_id in self.rows]
        self.rows -= set(gone)
        return _Result([(event_id,) for event_id in gone])


def _attach(cleaner: OutboxCleaner, outbox: _Outbox) -> None:
    cleaner._connection = lambda: outbox  # type: ignore[method-assign,assignment,return-value]
    cleaner._types = lambda conn: {  # type: ignore[method-assign]
        "id": "uuid", "created_at": "timestamp without time zone"}


def test_an_id_the_id_column_cannot_hold_is_left_and_the_rest_of_its_batch_deleted():
    # One such id failed the whole DELETE, and every round took the same batch again: no
    # delivered row was deleted any more (review, session 25).
    cleaner = _cleaner(mode="delete")
    outbox = _Outbox(["a", "b", "c"])
    _attach(cleaner, outbox)
    cleaner.delivered([Delivered(event_id, "t", None) for event_id in ("a", "bad-1", "b")])
    assert cleaner._delete_due()
    assert outbox.rows == {"c"}
    assert cleaner.pending_count() == 0
    cleaner.delivered([Delivered("c", "t", None)])
    assert cleaner._delete_due() and outbox.rows == set()


def test_rows_kept_are_counted_and_named_in_one_warning_a_batch(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 45-2: a trigger refusing every delete logged one warning per id, and no gauge
    # moved while the outbox grew.
    cleaner = _cleaner(mode="delete")
    outbox = _Outbox(["a"])
    _attach(cleaner, outbox)
    cleaner.delivered([Delivered(event_id, "t", None) for event_id in ("bad-1", "a", "bad-2")])
    assert cleaner._delete_due() and outbox.rows == set()
    [line] = [r.getMessage() for r in caplog.records if "cleanup_rows_kept" in r.getMessage()]
    assert "rows=2 ids='bad-1','bad-2'" in line and "invalid input syntax" in line
    assert cleaner.kept._value.get() == 2


def test_an_id_twice_in_a_batch_is_tried_once_and_a_kept_row_reported_once(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 50-b F6: the live id and the changelog sweep's copy of it shared a batch; each
    # copy failed alone: `rows=2 ids='bad-1','bad-1'` and the kept counter +2 for one row.
    cleaner = _cleaner(mode="delete")
    outbox = _Outbox(["a", "b"])
    _attach(cleaner, outbox)
    cleaner.delivered([Delivered(event_id, "t", None)
                       for event_id in ("bad-1", "a", "bad-1", "b", "a")])
    assert cleaner._delete_due() and outbox.rows == set()
    [line] = [r.getMessage() for r in caplog.records if "cleanup_rows_kept" in r.getMessage()]
    assert "rows=1 ids='bad-1' " in line
    assert (cleaner.kept._value.get(), cleaner.deleted._value.get()) == (1, 2)
    assert [batch for batch in outbox.deletes if len(batch) == 1] == [["bad-1"], ["a"], ["b"]]
    assert cleaner.pending_count() == 0


def test_rows_kept_before_a_later_id_fails_otherwise_are_reported_once(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 46: a lock timeout at a later id of the batch raised past the kept-rows line: no
    # line, no count, and every retry while the lock lasted found the same rows again.
    cleaner = _cleaner(mode="delete")
    outbox = _Outbox(["a", "locked", "c"])
    outbox.locked = {"locked"}
    _attach(cleaner, outbox)
    cleaner.delivered([Delivered(event_id, "t", None)
                       for event_id in ("bad-1", "a", "locked", "c")])
    with pytest.raises(psycopg.errors.LockNotAvailable):
        cleaner._delete_due()
    [line] = [r.getMessage() for r in caplog.records if "cleanup_rows_kept" in r.getMessage()]
    assert "rows=1 ids='bad-1'" in line and "invalid input syntax" in line
    assert (cleaner.kept._value.get(), cleaner.deleted._value.get()) == (1, 1)
    assert outbox.rows == {"locked", "c"} and cleaner.pending_count() == 2

    outbox.locked = set()  # the lock is released: the retry takes only the rest
    assert cleaner._delete_due() and outbox.rows == set() and cleaner.pending_count() == 0
    assert outbox.deletes[-1] == ["locked", "c"]
    assert (cleaner.kept._value.get(), cleaner.deleted._value.get()) == (1, 3)


def test_delete_mode_ignores_created_at_so_a_future_row_blocks_nothing():
    cleaner = _cleaner(mode="delete")
    outbox = _Outbox(["future", "a", "b"])
    _attach(cleaner, outbox)
    in_3_hours = int(time.time() * 1000) + 3 * 3_600_000
    cleaner.delivered([Delivered("future", "t", in_3_hours), Delivered("a", "t", 1),
                       Delivered("b", "t", None)])

    assert cleaner._delete_due()
    assert outbox.deletes == [["future", "a", "b"]]
    assert cleaner.pending_count() == 0


def test_retention_mode_deletes_due_rows_behind_one_that_is_not_due():
    cleaner = _cleaner(mode="retention", retention_ms=60_000, created_at_column=None)
    outbox = _Outbox(["future", "old", "older"])
    _attach(cleaner, outbox)
    now_ms = int(time.time() * 1000)
    cleaner.delivered([Delivered("future", "t", now_ms + 3 * 3_600_000),
                       Delivered("old", "t", now_ms - 120_000),
                       Delivered("older", "t", now_ms - 180_000)])

    assert cleaner._delete_due()
    assert sorted(outbox.deletes[0]) == ["old", "older"]
    assert outbox.rows == {"future"}
    assert cleaner.pending_count() == 1 and cleaner._due_count() == 0


def test_mode_none_keeps_nothing():
    cleaner = OutboxCleaner(
        CleanupSettings(), id_column="id", created_at_column=None, registry=CollectorRegistry())
    cleaner.delivered([Delivered("a", "t", 1)])
    assert cleaner.pending_count() == 0


def test_pending_ids_are_bounded_oldest_given_up(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cleanup, "MAX_PENDING_IDS", 3)
    cleaner = _cleaner(mode="delete")
    cleaner.delivered([Delivered(str(i), "t", 1) for i in range(5)])
    assert cleaner.pending_count() == 3
    assert cleaner._pending.take(0, 10) == ["2", "3", "4"]


def test_retention_ids_beyond_the_bound_are_given_up_with_a_line_a_minute(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Review 47-b F5: 25 events/s for a day's retention fill the queue with Postgres up; the
    # ids given up were only counted, the metric's help saying "while Postgres was unreachable".
    monkeypatch.setattr(cleanup, "MAX_PENDING_IDS", 3)
    cleaner = _cleaner(mode="retention", retention_ms=86_400_000)
    with caplog.at_level(logging.WARNING, logger="cdc_router.router.cleanup"):
        for batch in range(3):
            cleaner.delivered([Delivered(f"{batch}-{i}", "t", 1000 + batch) for i in range(2)])
    assert cleaner.pending_count() == 3 and cleaner.given_up._value.get() == 3
    [line] = [record.getMessage() for record in caplog.records]
    assert line.startswith("event=cleanup_ids_given_up count=1 pending=3: delivered ids "
                           "beyond what the cleanup holds in memory")


def test_a_bad_table_name_is_refused_with_the_settings():
    # At load now (QA, session 26: `rules check` said valid, `run` refused it).
    with pytest.raises(pydantic.ValidationError, match=r"expected schema.table or table"):
        _cleaner(mode="delete", table="a.b.c")


class _Changelog:
    """Stands in for CommittedIds: hands out prepared chunks, or raises what it is given."""

    def __init__(self, *chunks: list[tuple[str, int]] | Exception) -> None:
        self.chunks = list(chunks)
        self.calls = 0

    def next(self, max_ids: int) -> list[tuple[str, int]]:
        self.calls += 1
        chunk = self.chunks.pop(0) if self.chunks else []
        if isinstance(chunk, Exception):
            raise chunk
        return chunk[:max_ids]

    def close(self) -> None:
        pass


def _swept(changelog: _Changelog, **settings: object) -> OutboxCleaner:
    return OutboxCleaner(CleanupSettings(dsn="postgresql://unused", **settings), id_column="id",
                         created_at_column=None, registry=CollectorRegistry(), sweep=changelog)


def test_ids_read_back_from_the_changelog_are_deleted():
    cleaner = _swept(_Changelog([("x", 1), ("y", 2)]), mode="delete")
    outbox = _Outbox(["x", "y", "undelivered"])
    _attach(cleaner, outbox)

    assert cleaner._sweep()
    assert cleaner._delete_due()
    assert outbox.rows == {"undelivered"}
    assert cleaner.swept._value.get() == 2  # type: ignore[attr-defined]


def test_a_kafka_failure_of_the_sweep_backs_off_and_deletes_go_on():
    changelog = _Changelog(KafkaException(KafkaError(KafkaError._TRANSPORT)), [("x", 1)])
    cleaner = _swept(changelog, mode="delete")
    outbox = _Outbox(["live", "x"])
    _attach(cleaner, outbox)
    cleaner.delivered([Delivered("live", "t", None)])

    assert not cleaner._sweep()
    assert cleaner._delete_due()
    assert not cleaner._sweep() and changelog.calls == 1  # still backing off
    cleaner._sweep_retry_at = 0.0
    assert cleaner._sweep() and cleaner._delete_due()
    assert outbox.rows == set()


def test_the_sweep_waits_while_the_queue_is_long():
    changelog = _Changelog([("x", 1)])
    cleaner = _swept(changelog, mode="delete", batch_size=2)
    cleaner.delivered([Delivered("a", "t", None), Delivered("b", "t", None)])

    assert not cleaner._sweep()
    assert changelog.calls == 0


def test_swept_ids_wait_for_the_retention_after_their_delivery():
    now_ms = int(time.time() * 1000)
    changelog = _Changelog([("old", now_ms - 120_000), ("new", now_ms)])
    cleaner = _swept(changelog, mode="retention", retention_ms=60_000)

    assert cleaner._sweep()
    assert cleaner.pending_count() == 2 and cleaner._due_count() == 1


@pytest.mark.parametrize(("overrides", "sweeps"), [
    ({}, True),
    ({"delivery": {"guarantee": "at_least_once"}}, False),  # its marks prove no delivery
    ({"dedup": {"enabled": False}}, False),  # no changelog
    ({"cleanup": {"mode": "none"}}, False),
])
def test_run_sweeps_the_changelog_only_where_its_marks_prove_a_delivery(
        overrides: dict[str, dict[str, object]], sweeps: bool):
    from cdc_router.cli.run import sweep_of

    raw: dict[str, object] = {"source": {"topics": ["raw"]}, "routes": [{"topic": "out"}],
                              "cleanup": {"mode": "delete", "dsn": "postgresql://unused"}}
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value}  # type: ignore[dict-item]
    found = sweep_of(RouterConfig.model_validate(raw))
    assert isinstance(found, CommittedIds) if sweeps else found is None


def test_a_dsn_that_cannot_connect_is_named_in_the_warning(caplog: pytest.LogCaptureFixture):
    # QA, session 28: a wrong cleanup.dsn retried for ever with a warning that did not say
    # which setting to fix.
    cleaner = OutboxCleaner(CleanupSettings(mode="delete", dsn="postgresql://u@127.0.0.1:1/db"),
                            id_column="id", created_at_column=None,
                            registry=CollectorRegistry())
    cleaner.delivered([Delivered("a", "t", None)])
    with caplog.at_level("WARNING", logger="cdc_router.router.cleanup"):
        cleaner.start()
        deadline = time.monotonic() + 10
        while "cleanup_failed" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        cleaner.stop(drain_timeout_s=0)
    assert "cannot connect with cleanup.dsn (CDC_ROUTER__CLEANUP__DSN)" in caplog.text


@pytest.mark.parametrize("refusal", [
    'pg_hba.conf rejects connection for host "127.0.0.1", user "rejected", database "app", '
    "no encryption", 'role "nolog" is not permitted to log in'])
def test_a_dsn_pg_hba_or_the_role_refuses_stops_the_start_as_a_wrong_password_does(
        monkeypatch: pytest.MonkeyPatch, refusal: str):
    # Review 51-d F7: the router started, and its cleanup retried such a DSN for ever.
    def refused(*args: object, **kwargs: object) -> None:
        raise psycopg.OperationalError('connection failed: connection to server at '
                                       f'"127.0.0.1", port 5432 failed: FATAL:  {refusal}')

    monkeypatch.setattr(cleanup.psycopg, "connect", refused)
    cleaner = OutboxCleaner(CleanupSettings(mode="delete", dsn="postgresql://u@127.0.0.1/app"),
                            id_column="id", created_at_column=None,
                            registry=CollectorRegistry())
    with pytest.raises(ConfigError) as stopped:
        cleaner.check()
    assert str(stopped.value).startswith("field 'cleanup.dsn': Postgres refuses the cleanup: ")
    assert refusal in str(stopped.value) and "(CDC_ROUTER__CLEANUP__DSN)" in str(stopped.value)


def test_a_pg_variable_libpq_refuses_stops_the_start_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Reread 59 F-2: it read "Postgres refuses the cleanup", check the user and password.
    monkeypatch.setenv("PGSSLMODE", "bogus")
    cleaner = OutboxCleaner(CleanupSettings(mode="delete", dsn="host=127.0.0.1 port=1"),
                            id_column="id", created_at_column=None,
                            registry=CollectorRegistry())
    with pytest.raises(ConfigError) as stopped:
        cleaner.check()
    assert str(stopped.value) == (
        "field 'cleanup.dsn': its sslmode 'bogus' is not one libpq takes: disable, allow, "
        "prefer, require, verify-ca, verify-full (from the environment variable PGSSLMODE: fix "
        "or unset it)")


@pytest.mark.parametrize(("field", "value"), [("batch_size", 100_001), ("interval_ms", 10**30),
                                              ("retention_ms", 10**30), ("batch_size", 0)])
def test_cleanup_sizes_and_times_are_bounded(field: str, value: int):
    # QA 33-b: batch_size 100,001 and interval_ms 1e30 loaded, then ended the cleanup thread.
    with pytest.raises(pydantic.ValidationError, match=field):
        CleanupSettings(**{"mode": "retention", "retention_ms": 1000, field: value})


def test_a_worker_ended_by_the_unforeseen_stops_the_router_at_its_next_commit():
    # QA 33-b: the thread died with a traceback, the router went on, the outbox grew.
    class Broken:
        def next(self, max_ids: int) -> list[tuple[str, int]]:
            raise ValueError("num_messages must be between 0 and 1000000 (1M)")

        def close(self) -> None:
            pass

    cleaner = OutboxCleaner(CleanupSettings(dsn="postgresql://unused", mode="delete"),
                            id_column="id", created_at_column=None, sweep=Broken(),
                            registry=CollectorRegistry())
    cleaner.start()
    assert cleaner._thread is not None
    cleaner._thread.join(10)
    with pytest.raises(cleanup.CdcRouterError, match=r"the outbox cleanup stopped \(ValueError: "
                       r"num_messages must be between 0 and 1000000 \(1M\)\): delivered rows"):
        cleaner.delivered([Delivered("a", "t", None)])
    cleaner._enqueue([("b", 0)], 0)  # due, and nobody left to delete it
    started = time.monotonic()
    cleaner.stop(drain_timeout_s=10)
    assert time.monotonic() - started < 2, "review 33-3: the stop waited its whole drain"


def test_a_stop_does_not_wait_for_a_changelog_read_held_up_by_a_broker_outage():
    # QA 41-a F-4: the worker sat in a changelog read against a stopped broker (a lookup waits
    # up to 30 s); the stop waited its whole 10 s drain for deletes that could not come, then
    # up to 10 s more for the thread.
    class HeldUp:
        def __init__(self) -> None:
            self.entered, self.release, self.calls, self.closed = (
                threading.Event(), threading.Event(), 0, False)

        def next(self, max_ids: int) -> list[tuple[str, int]]:
            self.calls += 1
            self.entered.set()
            self.release.wait(60)
            return []

        def close(self) -> None:
            self.closed = True

    changelog = HeldUp()
    cleaner = OutboxCleaner(CleanupSettings(dsn="postgresql://unused", mode="delete"),
                            id_column="id", created_at_column=None, sweep=changelog,
                            registry=CollectorRegistry())
    outbox = _Outbox(["a", "b"])
    _attach(cleaner, outbox)
    cleaner.start()
    assert changelog.entered.wait(10)
    cleaner.delivered([Delivered("a", "t", None), Delivered("b", "t", None)])
    started = time.monotonic()
    cleaner.stop(drain_timeout_s=10)
    took = time.monotonic() - started
    assert cleanup._STALLED_S <= took < cleanup._STALLED_S + 1.5, took
    assert cleaner._thread is not None and cleaner._thread.is_alive()
    assert not changelog.closed, "closed under the read still using it"
    changelog.release.set()
    cleaner._thread.join(10)
    assert not cleaner._thread.is_alive()
    assert changelog.calls == 1 and outbox.deletes == [], "worked on after its stop"


def test_a_stop_deletes_what_is_due_first():
    changelog = _Changelog(*([[]] * 1000))
    cleaner = _swept(changelog, mode="delete", interval_ms=50)
    outbox = _Outbox(["a", "b", "kept"])
    _attach(cleaner, outbox)
    cleaner.start()
    cleaner.delivered([Delivered("a", "t", None), Delivered("b", "t", None)])
    cleaner.stop(drain_timeout_s=10)
    assert outbox.rows == {"kept"}
    assert cleaner._thread is not None and not cleaner._thread.is_alive()


def test_a_table_dropped_under_the_worker_stops_the_router_with_the_config_error():
    cleaner = _cleaner(mode="delete")

    def dropped(conn: object) -> dict[str, str]:
        raise cleanup.ConfigError("the outbox table does not exist (or is not readable)",
                                  field="cleanup.table", value="public.outbox")

    cleaner._connection = lambda: object()  # type: ignore[method-assign,assignment,return-value]
    cleaner._types = dropped  # type: ignore[method-assign,assignment]
    cleaner.delivered([Delivered("a", "t", None)])
    cleaner.start()
    assert cleaner._thread is not None
    cleaner._thread.join(10)
    with pytest.raises(cleanup.ConfigError, match="field 'cleanup.table': the outbox table does "
                       r"not exist \(or is not readable\) \(got 'public.outbox'\)$"):
        cleaner.delivered([Delivered("b", "t", None)])


class _Refusing(_Outbox):
    """A connection whose every DELETE fails with `error`, as a revoked grant or a read-only
    server does (it stays open: the worker closes it after a failure)."""

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(["a"])
        self.error = error

    def execute(self, query: object, params: tuple[list[str], ...]) -> _Result:
        raise self.error

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("error", "wanted"), [
    (psycopg.errors.InsufficientPrivilege("permission denied for table outbox"),
     "field 'cleanup.table': the role of cleanup.dsn (CDC_ROUTER__CLEANUP__DSN) may not DELETE "
     "from public.outbox (or SELECT its columns): GRANT SELECT, DELETE ON public.outbox TO "
     "that role"),
    (psycopg.errors.ReadOnlySqlTransaction("cannot execute DELETE in a read-only transaction"),
     "point CDC_ROUTER__CLEANUP__DSN at the primary (with several hosts, add "
     "target_session_attrs=read-write)"),
])
def test_a_lasting_refusal_of_the_deletes_names_the_setting_and_the_fix(
        caplog: pytest.LogCaptureFixture, error: psycopg.Error, wanted: str) -> None:
    # Review 49-b F4: a revoked DELETE grant, or cleanup.dsn on a hot standby, logged only
    # Postgres's message, every retry, for ever. It is still retried: a failover may mend it.
    cleaner = _cleaner(mode="delete")
    refusing = _Refusing(error)

    def connection() -> _Refusing:
        cleaner._conn = refusing  # type: ignore[assignment]
        return refusing

    cleaner._connection = connection  # type: ignore[method-assign,assignment]
    cleaner._types = lambda conn: {"id": "uuid"}  # type: ignore[method-assign]
    cleaner.delivered([Delivered("a", "t", None)])
    with caplog.at_level("WARNING", logger="cdc_router.router.cleanup"):
        cleaner.start()
        deadline = time.monotonic() + 10
        while caplog.text.count("cleanup_failed") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        cleaner.stop(drain_timeout_s=0)
    lines = [r.getMessage() for r in caplog.records if "cleanup_failed" in r.getMessage()]
    assert len(lines) >= 2 and all(wanted in line for line in lines), lines
    assert cleaner.pending_count() == 1  # the id waits for the fix
    # QA 54-b F-3: the lag gauge stayed 0 for as long as the deletes failed.
    assert cleaner.lag._value.get() >= 0.4  # type: ignore[attr-defined]


@pytest.mark.parametrize(("unit", "as_millis"), [
    ("millis", '"created_at"::bigint'), ("micros", '("created_at"::bigint / 1000)'),
    ("auto", '(CASE WHEN "created_at" >= 1000000000000000000 THEN "created_at"::bigint / '
             '1000000 WHEN "created_at" >= 100000000000000 OR "created_at" <= '
             '-100000000000000 THEN "created_at"::bigint / 1000 ELSE "created_at"::bigint END)')])
def test_retention_compares_an_integer_created_at_with_the_epoch_in_its_unit(
        unit: str, as_millis: str) -> None:
    # Review 49-b F5: `bigint < timestamp` failed every DELETE for ever. The integration test
    # (test_retention_ages_an_integer_created_at_in_its_unit) runs these on Postgres.
    column = psycopg.sql.Identifier("created_at")
    assert cleanup_age.older_than(column, "bigint", unit).as_string(None) == (
        f"{as_millis} < (extract(epoch FROM now()) * 1000)::bigint - %s")
    assert cleanup_age.created_ms(column, "bigint", unit).as_string(None) == as_millis


def test_retention_refuses_a_created_at_no_time_compares_with(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cleaner = _cleaner(mode="retention", retention_ms=1000)
    monkeypatch.setattr(cleanup.postgres, "table_columns",
                        lambda *args: {"id": "uuid", "created_at": "text"})
    with pytest.raises(cleanup.ConfigError, match=r"field 'source.outbox.created_at': "
                       r"cleanup.mode retention compares created_at with Postgres's clock, and "
                       r"public.outbox.created_at is text"):
        cleaner._types(None)  # type: ignore[arg-type]
    monkeypatch.setattr(cleanup.postgres, "table_columns",
                        lambda *args: {"id": "uuid", "created_at": "bigint"})
    assert cleaner._types(None)["created_at"] == "bigint"  # type: ignore[arg-type]


_MONTH_MS, _WEEK_MS = 30 * 86_400_000, 7 * 86_400_000


def _retention_config(**overrides: dict[str, object]) -> RouterConfig:
    raw: dict[str, object] = {"source": {"topics": ["raw"]}, "routes": [{"topic": "out"}],
                              "dedup": {"window_ms": _WEEK_MS},
                              "cleanup": {"mode": "retention", "retention_ms": _MONTH_MS,
                                          "dsn": "postgresql://unused"}}
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value}  # type: ignore[dict-item]
    return RouterConfig.model_validate(raw)


def _changelog_retention(config: RouterConfig) -> str:
    [spec] = [spec for spec in config.topic_specs() if spec.name == config.dedup.changelog_topic]
    return spec.config["retention.ms"]


def test_the_changelog_keeps_its_marks_as_long_as_the_retention_cleanup_needs_them() -> None:
    # Review 49-b F2: the sweep is all that finds, after a restart, the rows delivered before
    # it; the changelog kept its marks for dedup.window_ms only, so rows delivered more than
    # the window before a restart, younger than cleanup.retention_ms, stayed for good.
    config = _retention_config()
    assert _changelog_retention(config) == str(_MONTH_MS + cleanup_settings.SWEEP_MARGIN_MS)
    assert config.config_floors() == {config.dedup.changelog_topic: frozenset({"retention.ms"})}
    assert not [w for w in config_warnings(config) if "cleanup.mode retention" in w]
    from cdc_router.cli.run import sweep_of

    sweep = sweep_of(config)  # dead-lettered ids are kept as long as their marks live
    assert sweep is not None and sweep._keep_dead_ms > _MONTH_MS
    # The window decides where it is the longer, or where no sweep reads the marks.
    assert _changelog_retention(_retention_config(
        dedup={"window_ms": _MONTH_MS * 2})) == str(_MONTH_MS * 2)
    for mode in ({"mode": "delete"}, {"mode": "none"}):
        assert _changelog_retention(_retention_config(cleanup=mode)) == str(_WEEK_MS)
    assert _changelog_retention(_retention_config(
        delivery={"guarantee": "at_least_once"})) == str(_WEEK_MS)


@pytest.mark.parametrize(("overrides", "named"), [
    ({"dedup": {"enabled": False}}, "cleanup.mode retention with dedup.enabled false"),
    ({"delivery": {"guarantee": "at_least_once"}},
     "cleanup.mode retention with delivery.guarantee at_least_once"),
    ({"dedup": {"changelog_config": {"retention.ms": str(_WEEK_MS)}}},
     f"dedup.changelog_config retention.ms ({_WEEK_MS}) is below cleanup.retention_ms "
     f"({_MONTH_MS}) + 1 h"),
])
def test_a_retention_cleanup_that_would_leak_rows_after_a_restart_is_warned_about(
        overrides: dict[str, dict[str, object]], named: str) -> None:
    [warning] = [w for w in config_warnings(_retention_config(**overrides)) if named in w]
    assert "stay in the table for good" in warning or "in the table for good" in warning


def test_a_second_start_starts_no_second_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # Review rv62b: start() is the router's and relay's on_started (QA 61-a F-5); a second
    # call (an embedder's second run()) started a second worker on the same queue.
    cleaner = _cleaner(mode="delete")
    monkeypatch.setattr(cleaner, "_work", lambda: cleaner._stop.wait(5))

    def workers() -> set[threading.Thread]:
        return {thread for thread in threading.enumerate() if thread.name == "outbox-cleanup"}

    before = workers()  # other tests' left running, if any
    cleaner.start()
    first = cleaner._thread
    cleaner.start()
    try:
        assert cleaner._thread is first and workers() - before == {first}
    finally:
        cleaner.stop(drain_timeout_s=0.5)
