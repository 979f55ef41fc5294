"""The numbers Avro's date, time and timestamp logical types take in a reader with logical
types (fastavro's, so our decoder's): Python's date, time and datetime hold years 1 to 9999
only, and a time is after midnight (Avro specification)."""

from __future__ import annotations

from datetime import datetime, timedelta


def _time_range(unit: timedelta, meaning: str) -> tuple[int, int, str]:
    """The numbers a timestamp in `unit`s since the epoch takes in a reader's datetime."""
    epoch = datetime(1970, 1, 1)
    return (datetime.min - epoch) // unit, (datetime.max - epoch) // unit, meaning


# (low, high, what the number counts) by logicalType. Beyond: written, then no such reader reads
# the record (review 45 M5); a time of -1 read back as 00:00:00.999.
_MILLIS, _MICROS = timedelta(milliseconds=1), timedelta(microseconds=1)
TIME_RANGES = {
    "date": _time_range(timedelta(days=1), "days since 1970-01-01, years 1 to 9999"),
    "time-millis": (0, 86_399_999, "milliseconds after midnight"),
    "time-micros": (0, 86_399_999_999, "microseconds after midnight"),
    "timestamp-millis": _time_range(_MILLIS, "milliseconds since 1970-01-01, years 1 to 9999"),
    "timestamp-micros": _time_range(_MICROS, "microseconds since 1970-01-01, years 1 to 9999"),
}
TIME_RANGES["local-timestamp-millis"] = TIME_RANGES["timestamp-millis"]
TIME_RANGES["local-timestamp-micros"] = TIME_RANGES["timestamp-micros"]
