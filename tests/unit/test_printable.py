"""Row data in log lines and tables: one line per fact, whatever the row holds (QA 33-c)."""

from __future__ import annotations

from cdc_router.cli._output import table
from cdc_router.errors import DecodeError, printable
from cdc_router.router.step import DeadLettered


def test_printable_text_is_left_alone_and_the_rest_escaped() -> None:
    assert printable("ord-1 é ü 北京") == "ord-1 é ü 北京"
    assert printable("x\r\nlevel=ERROR event=forged") == "x\\r\\nlevel=ERROR event=forged"
    assert printable("\x1b[31mred") == "\\x1b[31mred"
    assert printable("a\u2028b") == "a\\u2028b"


def test_a_dead_letters_id_in_a_log_line_stays_on_its_line() -> None:
    letter = DeadLettered("route", DecodeError("no route"), "x\nevent=forged")
    assert letter.shown_id == "x\\nevent=forged"
    assert DeadLettered("decode", DecodeError("bad")).shown_id == "None"


def test_a_table_cell_with_a_line_break_keeps_the_table_one_row_a_line() -> None:
    rendered = table(["offset", "event id"], [[7, "a\r\nb"], [8, "c"]])
    assert rendered.splitlines() == ["offset  event id", "7       a\\r\\nb", "8       c"]
