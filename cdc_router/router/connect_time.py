"""Debezium's timestamp encodings (Kafka Connect JsonConverter) as epoch milliseconds."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from cdc_router.errors import show

_MILLIS_SCHEMAS = frozenset(
    {"io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp"})
_MICROS_SCHEMA = "io.debezium.time.MicroTimestamp"
_NANOS_SCHEMA = "io.debezium.time.NanoTimestamp"
# Without a schema an integer timestamp is micros or millis; 1e14 µs is 1973, 1e14 ms is 5138.
MICROS_THRESHOLD = 10**14
# ... or nanos (time.precision.mode=nanoseconds): 1e18 ns is 2001, 1e18 µs the year 33658,
# and Debezium's int64 ends at 2^63 (review 49-f F1: nanoseconds were read as microseconds,
# the year 58900). A microsecond value of the years 5138 to 33657 stays one (a hostile row).
NANOS_THRESHOLD = 10**18
# Without a schema (or with one not a timestamp's), an integer below this is no outbox row's
# time in milliseconds (1973-03-03): days or seconds are, and source.created_at_unit says
# otherwise for rows that old.
_IMPLAUSIBLE_MILLIS = 10**11
# ... and from this one up (2200-01-01 in milliseconds, 1970-03-26 in microseconds) it is no
# outbox row's time either, but a timestamp(6) column dated before 1973 (QA 36-b F2: 1973-01-01
# was stamped the year 4970, and the reason named only delivery.record_timestamp).
_IMPLAUSIBLE_FUTURE_MILLIS = 7_258_118_400_000
# source.created_at_unit -> the schema name it stands for when the connector sends none.
UNIT_SCHEMAS = {"micros": _MICROS_SCHEMA, "millis": "io.debezium.time.Timestamp"}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Java's ISO formatter writes years past 9999 with a sign ("+12000-01-01T00:00:00Z"), and
# years before 1 as negative; Python's datetime holds years 1 to 9999 only.
# The year 0000 is Postgres's 1 BC (review 47-a F8: it was "not an ISO-8601 timestamp").
_EXPANDED_YEAR = re.compile(r"[+-]\d{4,}-|\d{5,}-|0000-")
_INT64 = 2**63  # a Kafka timestamp is a signed 64-bit count of milliseconds
# Postgres' infinity and -infinity in a `timestamp` column, as Debezium 3 sends them (QA 60-c
# F-4): PostgresValueConverter makes them the instants pgjdbc's PGStatement.DATE_POSITIVE_ /
# DATE_NEGATIVE_INFINITY count in microseconds (294247-01-10T04:00:25.2Z,
# -290308-12-21T19:59:27.6Z), which MicroTimestamp sends as these microseconds, Timestamp and
# Connect's Timestamp (timestamp(0) to (3), time.precision.mode=connect) as their milliseconds,
# isostring as that text; a `timestamptz` column's are the strings 'infinity' and '-infinity'
# in every mode but structured. Read as times they were the year 2262 (its letter blamed the
# clock) and a time before 1970.
_PG_INFINITY_MICROS = {9_223_372_036_825_200_000: "infinity",
                       -9_223_372_036_832_400_000: "-infinity"}
_PG_INFINITY_MILLIS = {micros // 1000: word for micros, word in _PG_INFINITY_MICROS.items()}
# From here up a schema-less integer is no microsecond value of a row (the year 2262 as one):
# the fast path below stops there, so that DATE_POSITIVE_INFINITY's milliseconds are told.
_FAR_MICROS = max(_PG_INFINITY_MILLIS)
_PG_INFINITY_TEXT = {"infinity": "infinity", "-infinity": "-infinity",
                     "+294247-01-10T04:00:25.2Z": "infinity",
                     "-290308-12-21T19:59:27.6Z": "-infinity"}


def epoch_millis(value: int | str, schema_name: str | None, *, via_connect: bool = True) -> int:
    """A timestamp column's value in epoch milliseconds: an integer of any of Debezium's
    encodings (`schema_name`: its Connect schema's name, when known), or an ISO-8601 string
    (isostring; without an offset it is UTC). ValueError says what is wrong with it, as the
    end of a sentence that names the column. Exactly 0 is refused `via_connect` only: there it
    may be JsonConverter's stand-in for a NULL (_ZERO); the relay reads Postgres itself, where
    1970-01-01 is the row's own time (QA 53-a F1)."""
    if isinstance(value, int):
        if schema_name is None and MICROS_THRESHOLD <= value < _FAR_MICROS:
            return value // 1000  # _integer_millis's answer for the shipped connector's rows
        if value == 0 and via_connect:  # whatever its schema (review 49-f F5)
            raise ValueError(_ZERO)
        if value == _INT64 - 1 or value == -_INT64:
            raise ValueError(_infinity(value))
        if value in _PG_INFINITY_MICROS and schema_name in (None, _MICROS_SCHEMA):
            raise ValueError(_pg_infinity(value, "microseconds"))
        if value in _PG_INFINITY_MILLIS and (schema_name is None or
                                             schema_name in _MILLIS_SCHEMAS):
            raise ValueError(_pg_infinity(value, "milliseconds"))
        millis = _integer_millis(value, schema_name)
        if not -_INT64 <= millis < _INT64:
            raise ValueError(f"is {value}, beyond any Kafka timestamp (64-bit milliseconds)")
        return millis
    if value in _PG_INFINITY_TEXT:
        word = _PG_INFINITY_TEXT[value]
        # QA 61-a F-5: the relay reads Postgres itself; no Debezium is involved there.
        read = f"Debezium sends Postgres' {word!r} as {show(value)}" if via_connect else \
            f"the relay reads Postgres' {word!r}"
        raise ValueError(f"holds {word} ({read}), {_NO_TIME}")
    if _EXPANDED_YEAR.match(value):
        raise ValueError(f"is {show(value)}, outside the years 1 to 9999 the router can "
                         "represent")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"is not an ISO-8601 timestamp: {show(value)}") from None
    millis = (moment.replace(tzinfo=moment.tzinfo or UTC) - _EPOCH) // timedelta(milliseconds=1)
    if millis == 0 and via_connect:
        raise ValueError(_ZERO)
    return millis


_NO_TIME = "which is no point in time: write the event's time"


def _pg_infinity(value: int, unit: str) -> str:
    """The reason for one of Debezium's encodings of a `timestamp` column's infinity."""
    word = _PG_INFINITY_MICROS.get(value) or _PG_INFINITY_MILLIS[value]
    return (f"holds {word} (Debezium sends Postgres' {word!r} in a timestamp column as "
            f"{value}, pgjdbc's DATE_{'POSITIVE' if value > 0 else 'NEGATIVE'}_INFINITY in "
            f"{unit}), {_NO_TIME}")


def _infinity(value: int) -> str:
    """QA 54-c F-6: Debezium sends Postgres' infinity and -infinity as Long.MAX_VALUE and
    Long.MIN_VALUE; read as a time they were the year 2262 (or -290308)."""
    word = "infinity" if value > 0 else "-infinity"
    return (f"holds {word} (Debezium sends Postgres' {word!r} as {value}, Long."
            f"{'MAX' if value > 0 else 'MIN'}_VALUE), which is no point in time: write the "
            "event's time")


# QA 48-a F-med-2: JsonConverter writes a NULL as the column's default in the Connect schema,
# which Debezium makes 0 (and its string encodings 1970-01-01T00:00:00Z).
_ZERO = ("is 0 (1970-01-01): a NULL in a column with a DEFAULT, which Kafka Connect's "
         "JsonConverter writes as Debezium's default, 0? Set the connector's "
         "value.converter.replace.null.with.default: false (connectors/outbox-connector.json "
         "does), or write the event's time")


def _integer_millis(value: int, schema_name: str | None) -> int:
    if schema_name == _MICROS_SCHEMA:
        return value // 1000
    if schema_name == _NANOS_SCHEMA:
        return value // 1_000_000
    if schema_name in _MILLIS_SCHEMAS:
        return value
    if 0 <= value < _IMPLAUSIBLE_MILLIS:
        # QA, session 29: a `date` column (days) or epoch seconds read as milliseconds gave
        # records of January 1970, delivered so where the topic keeps records for ever.
        moment = _iso(value)
        if schema_name:  # the connector's schema, which source.created_at_unit cannot outrank
            raise ValueError(f"is {value} (its schema: {schema_name}), not a timestamp: make "
                             "the column timestamp(6) or timestamptz")
        # QA 44-a: a timestamp(6) column dated 1970-01-01 00:00:00.001 reads 1000 too, and
        # the reason offered only `millis`, which would not have read it as that time.
        raise ValueError(
            f"is {value}, which as milliseconds is {moment} and as microseconds "
            f"{_iso(value // 1000)}: a date (days) or epoch seconds, not a timestamp? Make "
            "the column timestamp(6) or timestamptz. A timestamp(6) column dated in 1970 (a "
            "placeholder? write the event's time)? Set source.created_at_unit: micros. Epoch "
            "milliseconds of 1970? Set source.created_at_unit: millis")
    if _IMPLAUSIBLE_FUTURE_MILLIS <= value < MICROS_THRESHOLD and not schema_name:
        moment = _iso(value)
        raise ValueError(
            f"is {value}, which as milliseconds is {moment} and as microseconds "
            f"{_iso(value // 1000)}: a timestamp(6) column dated before 1973? Set "
            "source.created_at_unit: micros (without it, values below 10^14 are taken for "
            f"milliseconds), or millis if the year {moment[:4]} is meant")
    if NANOS_THRESHOLD <= value < _INT64:
        return value // 1_000_000
    return value // 1000 if abs(value) >= MICROS_THRESHOLD else value


def _iso(millis: int) -> str:
    return (_EPOCH + timedelta(milliseconds=millis)).isoformat(timespec="milliseconds")
